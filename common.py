"""
What train.py, sample.py, eval.py, bench.py, sweep.py and prepare.py share: options, the error boundary, the
device, prepared data and checkpoints.

Options. Every script declares its options once, as the fields of a dataclass made with option() (the same
helper the model files use for their GPTConfig): default, --help text and constraints side by side. The
parsers turn those dataclasses into one command line, and checked() applies the constraints, to values from
config files too, before the dataclass is built (its __post_init__ keeps only the rules across fields). Only
leading arguments are config files (`train.py config/x.py --max_iters 10`): a value such as `--out_dir run.py`
is a value.

Errors. A mistake in the user's input raises ConfigError; main_boundary() turns it, and the other failures
the user can fix (a file that cannot be written: disk full, read-only folder), into one `error: ...` line and
exit code 1. Anything else keeps its traceback: that is a bug to fix.
"""
import argparse
import dataclasses
import errno
import glob
import importlib
import json
import math
import os
import re
import sys
import time
import types
from contextlib import nullcontext

import numpy as np
import torch

from model_vanilla import option  # noqa: F401 (the scripts declare their options with the model files' helper)

HERE = os.path.dirname(os.path.abspath(__file__))

# dense bf16 peak FLOP/s by GPU name, for MFU; the first name found in the device's name wins
PEAK_FLOPS = [
    ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("H20", 148e12), ("B200", 2250e12),
    ("A100", 312e12), ("A10G", 70e12), ("A10", 125e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12),
    ("RTX 4090", 165e12), ("RTX 3090", 71e12), ("A6000", 155e12), ("V100", 125e12), ("T4", 65e12),
]

# size presets from the Vertical Attention paper's Table 2 (its names; the counts change with the vocabulary)
SIZES = {
    "50m": dict(n_embd=192, ffn_hidden=768, n_head=3, n_layer=6, n_kv_head=1),
    "100m": dict(n_embd=384, ffn_hidden=1536, n_head=6, n_layer=8, n_kv_head=3),
    "300m": dict(n_embd=768, ffn_hidden=3072, n_head=12, n_layer=12, n_kv_head=4),
}


class ConfigError(Exception):
    """A mistake in the user's input (or a failure the user can fix), reported as one line."""


class RunError(Exception):
    """A run that failed while it ran (out of memory, a diverged loss, an interruption), reported as one line that
    says what is kept."""


class Interrupted(RunError):
    """Ctrl-C or SIGTERM stopped a run between two steps."""


class PeerLost(RunError):
    """Another process of a distributed run stopped; each process that is left says so (rank 0 may be the lost
    one)."""


def fail(message, every_rank=False):
    if every_rank or os.environ.get("RANK", "0") == "0":  # under torchrun every process fails alike: one line
        print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def main_boundary(main):
    """Run main(argv) as a script: the expected failure classes end in one `error:` line, the rest in a traceback."""
    try:
        main(sys.argv[1:])
    except (ConfigError, RunError) as e:
        if torch.distributed.is_initialized() and not isinstance(e, PeerLost):
            torch.distributed.destroy_process_group()
        fail(str(e), every_rank=isinstance(e, PeerLost))
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
                           errno.EISDIR, errno.ENOTDIR):
            raise
        fail(f"cannot write or read {e.filename or 'a file'}: {e.strerror}; free some space or choose another "
             "folder, then run the same command again")
    except KeyboardInterrupt:
        fail("interrupted; nothing was lost that had been saved")


# ----------------------------------------------------------------------------------------------------------
# files: every file a script reads goes through these, so that a bad one ends in one line naming it

def read_bytes(path, what, fix):
    """The bytes of the file at path; ConfigError (naming what it is and the fix) if it is missing, a folder or
    unreadable."""
    if os.path.isdir(path):
        raise ConfigError(f"{what} {path} is a folder, not a file; {fix}")
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist; {fix}")
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path} ({e.strerror}); {fix}")


def read_text(path, what, fix):
    """The UTF-8 text of the file at path (read_bytes' checks, and not UTF-8)."""
    data = read_bytes(path, what, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(f"{what} {path} is not UTF-8 text (line {line}); {fix}")


def _not_json(name):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text):
    """json.loads, refusing NaN and Infinity (Python's json takes them; JSON has no such numbers)."""
    return json.loads(text, parse_constant=_not_json)


def read_json(path, what, fix):
    """The JSON value in the file at path; ConfigError for every way it can be wrong, naming where."""
    text = read_text(path, what, fix)
    try:
        return parse_json(text)
    except ValueError as e:
        raise ConfigError(f"{what} {path} is not readable JSON ({' '.join(str(e).split())[:120]}); {fix}")


def finite(value):
    """value with every float that is not finite replaced by None, in dicts, lists and tuples too."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def has_nonfinite(value):
    """Whether value holds a float that is not finite (which dumps() writes as null)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return any(has_nonfinite(v) for v in items)


def dumps(value, **kwargs):
    """Strict JSON, which every tool reads: a value that is not finite becomes null (finite())."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)


# ----------------------------------------------------------------------------------------------------------
# options

class ArgumentParser(argparse.ArgumentParser):
    """argparse with its errors as one line (the usage block hides the message)."""

    def error(self, message):
        if message.startswith("unrecognized arguments") and ".py" in message:
            message += " (preset files go first, before every --option)"
        raise ConfigError(f"{message}; see {os.path.basename(sys.argv[0])} --help")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows the docstring as written and every option's default."""


def str2bool(s):
    if isinstance(s, bool):
        return s
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def add_options(parser, config_class, title, defaults=None):
    """One --name option per field of config_class, typed, with its help text, choices and default."""
    group = parser.add_argument_group(title)
    for f in dataclasses.fields(config_class):
        default = (defaults or {}).get(f.name, f.default)
        rule, kind = f.metadata, f.type
        doc = rule.get("doc", "")
        if "choices" in rule:
            doc += f" (choices: {', '.join(map(str, rule['choices']))})"
        if kind is bool:
            group.add_argument(f"--{f.name}", type=str2bool, nargs="?", const=True, default=default, help=doc,
                               metavar="BOOL")
        elif kind is tuple:  # one or more strings
            group.add_argument(f"--{f.name}", nargs="+", default=default, help=doc, metavar="STR")
        else:
            group.add_argument(f"--{f.name}", type=kind, default=default, help=doc, metavar=kind.__name__.upper())


def parse_model_options(config_class, argv, doc):
    """A training script's options: config_class (train.py's TrainConfig: with model, dataset, data_dir and size
    fields) and the fields of the chosen model file's GPTConfig, from defaults < preset files < the command line.
    Returns (config, model options as a dict, model module, names set explicitly); ConfigError on bad input."""
    files, rest = split_config_files(argv)
    from_files, origin = {}, {}
    for path in files:
        values = read_config_file(path)
        from_files.update(values)
        origin.update(dict.fromkeys(values, path))
    pre = argparse.ArgumentParser(add_help=False)
    for name in ("model", "dataset", "data_dir"):
        pre.add_argument(f"--{name}", default=from_files.get(name, getattr(config_class, name)))
    early = pre.parse_known_args(rest)[0]
    module = load_model_module(early.model)
    train_fields = {f.name for f in dataclasses.fields(config_class)}
    model_fields = {f.name for f in dataclasses.fields(module.GPTConfig)}
    unknown = set(from_files) - train_fields - model_fields
    if unknown:
        raise ConfigError(f"{', '.join(files)} sets unknown option(s) {', '.join(sorted(unknown))}; a preset sets "
                          "options, and names starting with _ (and imports and functions) are its own helpers")
    for cls, names in ((config_class, train_fields), (module.GPTConfig, model_fields)):
        try:  # a preset's values are Python values: their types are checked here, not parsed by argparse
            check_config(cls, {k: v for k, v in from_files.items() if k in names})
        except ValueError as e:
            raise ConfigError(f"{e} (set in {origin[str(e).split()[0][2:]]})")
    parser = ArgumentParser(description=doc, formatter_class=HelpFormatter,
                            usage="%(prog)s [preset.py ...] [--option value ...]")
    add_options(parser, config_class, "training", from_files)
    try:  # --help shows the vocabulary a new run takes: the data set's, where it is prepared
        data_vocab = {"vocab_size": read_meta(early.data_dir, early.dataset)["vocab_size"]}
    except ConfigError:
        data_vocab = {}
    add_options(parser, module.GPTConfig, f"model_{module.__name__[6:]}.py", {**data_vocab, **from_files})
    args = vars(parser.parse_args(rest))
    explicit = set(from_files) | explicit_options(rest)
    if args["size"] in SIZES:  # the preset fills the shape fields nobody set, and the model file's own settings
        sized = {**SIZES[args["size"]], **getattr(module, "SIZE_DEFAULTS", {}).get(args["size"], {})}
        args.update({k: v for k, v in sized.items() if k not in explicit})
        explicit |= set(sized)

    def where(name):
        return f" (set in {origin[name]})" if name in origin and name not in explicit_options(rest) else ""
    try:
        cfg = checked(config_class, **{k: v for k, v in args.items() if k in train_fields})
        model_args = {k: v for k, v in args.items() if k in model_fields}
        checked(module.GPTConfig, **model_args)  # its constraints, before any data is read
    except (ValueError, TypeError) as e:
        name = str(e).split()[0][2:] if str(e).startswith("--") else ""
        raise ConfigError(f"{e}{where(name)}")
    check_paths(cfg)
    return cfg, model_args, module, explicit


def split_config_files(argv):
    """(config files, the rest): config files are the leading arguments that are not options."""
    n = 0
    while n < len(argv) and not argv[n].startswith("-"):
        n += 1
    return argv[:n], argv[n:]


PRESET_HELPERS = (types.ModuleType, types.FunctionType, type)


def read_config_file(path, within=()):
    """The assignments of a preset file (python), without names starting with _. `base = "other.py"` (a file
    beside it) layers the file on another preset: the base's values first, then this file's."""
    values = {}
    source = read_text(path, "the config file", "pass a preset file of python assignments, such as config/*.py")
    try:  # one namespace, as a module has: a comprehension or a function in the file reads its names
        exec(compile(source, path, "exec"), values)
    except SyntaxError as e:
        raise ConfigError(f"config file {path} line {e.lineno}: {e.msg}; fix the file (it holds python assignments)")
    except (Exception, SystemExit) as e:
        raise ConfigError(f"config file {path} fails: {type(e).__name__}: {e}; fix the file")
    # options are its plain values; modules, functions and classes it uses, and _private names, are its own
    values = {k: v for k, v in values.items() if not k.startswith("_") and not isinstance(v, PRESET_HELPERS)}
    base = values.pop("base", None)
    if base is None:
        return values
    if not isinstance(base, str) or os.path.basename(base) != base or not base.endswith(".py"):
        raise ConfigError(f"config file {path}: base must name a preset file beside it, e.g. base = \"x.py\"")
    base = os.path.join(os.path.dirname(path), base)
    if os.path.abspath(base) in within:
        raise ConfigError(f"config file {path}: its base {base} leads back to it; fix the files")
    return {**read_config_file(base, (*within, os.path.abspath(path))), **values}


def explicit_options(argv):
    """The option names given on a command line."""
    return {a.split("=")[0][2:] for a in argv if a.startswith("--")}


def check_config(config_class, values):
    """ValueError naming the first field of config_class whose value in values (a dict; a missing field has its
    default) breaks its type or its declared constraints: min / max (inclusive), above / below (exclusive),
    choices; a float must also be finite, an int fit in 64 bits."""
    for f in dataclasses.fields(config_class):
        value, rule, name = values.get(f.name, f.default), f.metadata, f"--{f.name}"
        if value is None and f.default is None:
            continue  # a None default means "not given"
        kind = f.type
        if type(value) is not kind and not (kind is float and type(value) is int):  # an int is a fine float
            raise ValueError(f"{name} must be {kind.__name__}, not {value!r}")
        if type(value) is float and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, not {value}")
        if type(value) is int and not -2**63 <= value < 2**63:
            raise ValueError(f"{name} must fit in 64 bits, not {value}")
        low, high, above, below = (rule.get(k) for k in ("min", "max", "above", "below"))
        if "choices" in rule and value not in rule["choices"]:
            raise ValueError(f"{name} {value} is not one of: {', '.join(map(str, rule['choices']))}")
        if low is not None and high is not None and not low <= value <= high:
            raise ValueError(f"{name} must be between {low} and {high}, not {value}")
        if low is not None and below is not None and not low <= value < below:
            raise ValueError(f"{name} must be at least {low} and below {below}, not {value}")
        if above is not None and below is not None and not above < value < below:
            raise ValueError(f"{name} must be between {above} and {below}, both excluded, not {value}")
        if low is not None and value < low:
            raise ValueError(f"{name} must be {low} or more, not {value}")
        if high is not None and value > high:
            raise ValueError(f"{name} must be {high} or less, not {value}")
        if above is not None and not value > above:
            raise ValueError(f"{name} must be above {above}, not {value}")
        if below is not None and not value < below:
            raise ValueError(f"{name} must be below {below}, not {value}")


def checked(config_class, **values):
    """config_class(**values) after check_config(): each field's constraints first, then its __post_init__'s
    rules across fields (which may divide by a field that the first check keeps from being 0)."""
    check_config(config_class, values)
    return config_class(**values)


def make_config(config_class, values, source=""):
    """checked(config_class, **values); ConfigError names the option (and where it came from)."""
    try:
        return checked(config_class, **values)
    except ValueError as e:
        raise ConfigError(f"{e}{source}")


def check_paths(config):
    """The options declared with path=True name files or folders the file system can hold: no NUL byte, and no
    part of the path longer than 255 bytes (the limit of common file systems)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        for path in (value if isinstance(value, tuple) else (value,)) if f.metadata.get("path") else ():
            if "\0" in path or any(len(os.fsencode(part)) > 255 for part in path.replace(",", os.sep).split(os.sep)):
                raise ConfigError(f"--{f.name} {path[:40]!r}...: no file or folder can have that name (a NUL byte, "
                                  "or a part longer than 255 bytes); choose another")


def attach_option_values(argv, config_class):
    """argv with `--name VALUE` joined into `--name=VALUE` where --name takes a string and VALUE starts with a dash
    but is no option of config_class, or several words (argparse would read `--train_args "--learning_rate=1e-3"`
    as two options)."""
    strings = {f"--{f.name}" for f in dataclasses.fields(config_class) if f.type is str}
    known = {f"--{f.name}" for f in dataclasses.fields(config_class)} | {"-h", "--help"}
    out, i = [], 0
    while i < len(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if argv[i] in strings and nxt.startswith("-") and (nxt.split("=")[0] not in known or len(nxt.split()) > 1):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def parse_simple(config_class, argv, doc):
    """The options of a script without config files: its dataclass from the command line, checked."""
    parser = ArgumentParser(description=doc, formatter_class=HelpFormatter)
    add_options(parser, config_class, "options")
    argv = attach_option_values(list(argv), config_class)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(parser.parse_args(argv)).items()}
    config = make_config(config_class, values)
    check_paths(config)
    return config


# ----------------------------------------------------------------------------------------------------------
# models

def model_names():
    return sorted(os.path.basename(p)[6:-3] for p in glob.glob(os.path.join(HERE, "model_*.py")))


def load_model_module(name):
    if name not in model_names():
        raise ConfigError(f"unknown --model {name!r}; choose one of: {', '.join(model_names())}")
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    return importlib.import_module(f"model_{name}")


def build_model(module, model_args, source):
    """module.GPT of model_args (a dict); ConfigError names the option the model file rejects."""
    known = {f.name for f in dataclasses.fields(module.GPTConfig)}
    extra = set(model_args) - known
    if extra:
        raise ConfigError(f"{source} has config fields {', '.join(sorted(extra))} that {module.__name__}.py "
                          "does not know; it was saved by another version of that file")
    config = make_config(module.GPTConfig, model_args, f" ({module.__name__}.py, from {source})")
    return module.GPT(config)


# ----------------------------------------------------------------------------------------------------------
# device and precision, for every script

def resolve_device(name):
    """The torch.device of a --device option (auto: CUDA where there is a GPU, else CPU), or ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown --device {name!r}; use auto, cpu, cuda, cuda:N or mps")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = " (this torch is a CPU build)" if torch.version.cuda is None else ""
            raise ConfigError(f"--device {name}: no CUDA GPU is available here{build}; use --device cpu or auto")
        if (device.index or 0) >= count:
            raise ConfigError(f"--device {name}: there are {count} GPU(s) here, cuda:0 to cuda:{count - 1}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("--device mps: MPS is not available here; use --device cpu or auto")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {name} is not supported; use auto, cpu, cuda, cuda:N or mps")
    return device


DTYPES = ("auto", "float32", "bfloat16")  # float16 would need loss scaling, which train.py does not do


def resolve_dtype(name, device):
    """'float32' or 'bfloat16' for a --dtype option (auto: bfloat16 on a CUDA GPU that has it)."""
    if name == "auto":
        return "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if name == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("--dtype bfloat16: this GPU has no bfloat16; use float32")
    return name


def synchronize(device):
    """Wait for the work queued on device (CUDA, MPS); a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def autocast(device, dtype):
    """The mixed-precision context of a resolved dtype: bf16 autocast, or nothing for float32."""
    return nullcontext() if dtype == "float32" else torch.autocast(device.type, dtype=torch.bfloat16)


def peak_flops(device, given):
    if given > 0:
        return given
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((flops for key, flops in PEAK_FLOPS if key in name), 0.0)
    return 0.0  # unknown: MFU is not reported


def hardware_name(device):
    """The GPU's name, or the CPU and its threads; "CUDA" for a CUDA device on a machine without one (sweep.py
    rewrites a GPU sweep's tables anywhere)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device) if torch.cuda.is_available() else "CUDA"
    import platform
    threads = torch.get_num_threads()
    return f"CPU ({platform.processor() or platform.machine()}, {threads} thread{'s' if threads > 1 else ''})"


# ----------------------------------------------------------------------------------------------------------
# prepared data: data/<dataset>/{train,val}.bin + meta.json from prepare.py

REDO = "run prepare.py again to remake the data set"


def read_meta(data_dir, dataset):
    """meta.json of a prepared data set, checked; ConfigError names the fix."""
    folder = os.path.join(data_dir, dataset)
    meta_path = os.path.join(folder, "meta.json")
    if not (os.path.exists(meta_path) and os.path.exists(os.path.join(folder, "train.bin"))):
        raise ConfigError(f"no prepared data in {folder} (--data_dir {data_dir}, --dataset {dataset}); run "
                          f"`python prepare.py --dataset {dataset}` first, or point --data_dir at its folder")
    meta = read_json(meta_path, "the data set's meta.json", REDO)
    if not isinstance(meta, dict):
        raise ConfigError(f"{meta_path} is not a JSON object; {REDO}")
    missing = [k for k in ("tokenizer", "vocab_size", "dtype") if k not in meta]
    if missing:
        raise ConfigError(f"{meta_path} lacks {', '.join(missing)}; {REDO}")
    if meta["dtype"] not in ("uint16", "uint32"):
        raise ConfigError(f"{meta_path} names dtype {meta['dtype']!r}; prepare.py writes uint16 or uint32; {REDO}")
    if type(meta["vocab_size"]) is not int or meta["vocab_size"] < 1:
        raise ConfigError(f"{meta_path} names vocab_size {meta['vocab_size']!r}; {REDO}")
    return meta


def split_tokens(data_dir, dataset, split, meta):
    """The number of tokens in split.bin, after checking that the file is whole and matches meta.json."""
    path = os.path.join(data_dir, dataset, f"{split}.bin")
    if not os.path.isfile(path):
        raise ConfigError(f"no {path}; {REDO}")
    size, itemsize = os.path.getsize(path), np.dtype(meta["dtype"]).itemsize
    if size % itemsize:
        raise ConfigError(f"{path} holds {size} bytes, not a whole number of {meta['dtype']} tokens: it is cut "
                          f"short or meta.json names the wrong dtype; {REDO}")
    n = size // itemsize
    if meta.get(f"{split}_tokens", n) != n:  # a wrong dtype in meta.json shows here too
        raise ConfigError(f"{path} holds {n} {meta['dtype']} tokens but meta.json says {meta[f'{split}_tokens']}; "
                          f"{REDO}")
    return n


def check_splits(data_dir, dataset, meta, block_size, vocab_size):
    """Both splits are whole, long enough for block_size, and hold only ids a model of vocab_size can embed."""
    for split in ("train", "val"):
        n = split_tokens(data_dir, dataset, split, meta)
        if n < block_size + 2:  # a window reads T + 1 tokens, drawn from at least 1 offset
            raise ConfigError(f"the {split} split of {dataset} holds {n} tokens, too few for --block_size "
                              f"{block_size}; lower --block_size to {max(1, n - 2)} or less, or prepare more data")
        data = open_split(data_dir, dataset, split, meta)
        stretch = max(1, min(len(data), 1 << 24) // 64)  # all of a small split, else 64 evenly spread stretches
        top = max(int(data[i:i + stretch].max()) for i in range(0, len(data), max(stretch, len(data) // 64)))
        if top >= vocab_size:
            raise ConfigError(f"{os.path.join(data_dir, dataset, split + '.bin')} holds token id {top} but the "
                              f"model's vocab_size is {vocab_size} (meta.json: {meta['vocab_size']}); run prepare.py "
                              "again to remake the data set")


def open_split(data_dir, dataset, split, meta):
    # a fresh memmap per call: numpy's memmap otherwise holds pages and leaks memory over long runs
    return np.memmap(os.path.join(data_dir, dataset, f"{split}.bin"), dtype=np.dtype(meta["dtype"]), mode="r")


# ----------------------------------------------------------------------------------------------------------
# generated tables: README.md's copies

def update_readme(table, results):
    """Replace README.md's copy of a generated table between its markers for `results` (a results folder or file):
    <!-- results:start --> and <!-- results:end -->."""
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")
    text = open(readme).read()
    tag = os.path.normpath(results)
    marked = re.compile(rf"(<!-- {re.escape(tag)}:start -->\n).*?(<!-- {re.escape(tag)}:end -->)", re.S)
    if not marked.search(text):
        print(f"note: README.md has no <!-- {tag}:start --> marker; its table is left alone", file=sys.stderr)
        return
    with open(readme, "w") as f:
        f.write(marked.sub(lambda m: m.group(1) + table + m.group(2), text))


# ----------------------------------------------------------------------------------------------------------
# checkpoints: out_dir/ckpt.pt, written by train.py

def checkpoint_path(out_dir):
    return out_dir if out_dir.endswith(".pt") else os.path.join(out_dir, "ckpt.pt")


def read_checkpoint(path, keys=("model_name", "model_args", "model")):
    """The dict train.py saved at path, holding at least `keys`; ConfigError for a missing, truncated, empty or
    foreign file (a bare state_dict), so that train --resume, sample.py and eval.py all say it in one line."""
    if os.path.isdir(path):
        raise ConfigError(f"the checkpoint {path} is a folder, not a file; move it away, or pass the run folder "
                          "that holds train.py's ckpt.pt")
    if not os.path.isfile(path):
        raise ConfigError(f"no checkpoint at {path}; train one with `python train.py --out_dir "
                          f"{os.path.dirname(path) or '.'}`")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch.load's errors differ by damage: zip reader, unpickler, EOF
        reason = " ".join(str(e).split())[:120] or type(e).__name__
        raise ConfigError(f"cannot read the checkpoint {path} ({reason}): the file is truncated, empty or not a "
                          "checkpoint; restore it from a copy or train again")
    if not isinstance(ckpt, dict) or "model_name" not in ckpt:
        bare = isinstance(ckpt, dict) and ckpt and all(torch.is_tensor(v) for v in ckpt.values())
        raise ConfigError(f"{path} is not a checkpoint of train.py: it has no model_name"
                          f"{' (it is a bare state_dict)' if bare else ''}; train.py saves the model name, both "
                          "configs and the weights together")
    missing = [k for k in keys if k not in ckpt]
    if missing:
        raise ConfigError(f"{path} lacks {', '.join(missing)}: it was not saved by this version of train.py")
    return ckpt


def check_resume(cfg, model_args, explicit, ckpt, meta, path):
    """--resume continues the saved model on data of the same tokenizer. A model option that differs from the
    checkpoint's would be ignored, so it is refused: changing the model needs a new run."""
    if ckpt["model_name"] != cfg.model:
        raise ConfigError(f"{path} was trained with --model {ckpt['model_name']}, not {cfg.model}; "
                          f"pass --model {ckpt['model_name']} or choose another --out_dir")
    saved = ckpt["model_args"]
    differ = [f"--{k} {v} (saved: {saved.get(k)})" for k, v in model_args.items()
              if k in explicit and v != saved.get(k)]
    if differ:
        raise ConfigError(f"--resume continues the model saved in {path}, and these options would change it: "
                          f"{', '.join(differ)}; drop them, or start a new run in another --out_dir")
    trained = ckpt["meta"]
    if (trained["tokenizer"], trained["vocab_size"]) != (meta["tokenizer"], meta["vocab_size"]):
        raise ConfigError(f"{path} was trained on data of the {trained['tokenizer']} tokenizer (vocab "
                          f"{trained['vocab_size']}) but {os.path.join(cfg.data_dir, cfg.dataset)} uses "
                          f"{meta['tokenizer']} (vocab {meta['vocab_size']}); pass the --dataset it was trained on "
                          f"({ckpt.get('train_config', {}).get('dataset', '?')}) or one prepared with "
                          f"--tokenizer {trained['tokenizer']}")


def load_state(model, state, model_name, path):
    """The weights of a checkpoint into model; ConfigError if they do not fit it or are not all finite."""
    if not isinstance(state, dict) or not all(torch.is_tensor(t) for t in state.values()):
        raise ConfigError(f"the weights in {path} are not a state_dict of tensors; restore it from a copy or train "
                          "again")
    bad = next((name for name, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if bad is not None:
        raise ConfigError(f"the weights in {path} hold NaN or infinity ({bad}); restore it from a copy or train again")
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[1].strip() if "\n" in str(e) else str(e)
        raise ConfigError(f"{path} does not fit model_{model_name}.py ({first[:200]}); "
                          "it was saved by another version of that file")


def load_checkpoint(out_dir, device="cpu", keys=("model_name", "model_args", "model")):
    """(model, module, checkpoint dict) from out_dir/ckpt.pt (or a .pt path), or ConfigError with the fix."""
    path = checkpoint_path(out_dir)
    ckpt = read_checkpoint(path, keys)
    module = load_model_module(ckpt["model_name"])
    model = build_model(module, ckpt["model_args"], path)
    load_state(model, ckpt["model"], ckpt["model_name"], path)
    return model.to(device), module, ckpt


def describe_run(ckpt):
    """'step N, T tokens seen' of a checkpoint, for the scripts that read one."""
    step = ckpt.get("iter_num")
    if step is None:
        return "step unknown"
    tokens = ckpt.get("tokens_seen")
    return f"step {step:,}" + (f", {tokens:,} tokens seen" if tokens is not None else "")


# ----------------------------------------------------------------------------------------------------------
# the run folder train.py writes: a lock, an append-only log, atomic checkpoints

def lock_out_dir(out_dir):
    """Create out_dir and hold its lock for the life of the process; ConfigError when another run holds it."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        handle = open(os.path.join(out_dir, ".lock"), "a")
    except OSError as e:
        raise ConfigError(f"cannot create --out_dir {out_dir} ({e.strerror}); choose another --out_dir")
    try:
        import fcntl
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:
        pass  # no fcntl (Windows): no lock
    except OSError:
        handle.close()
        raise ConfigError(f"another run is writing to {out_dir}; wait for it to end or choose another --out_dir")
    return handle


def settle_log(out_dir, resume_step):
    """log.jsonl keeps the records up to resume_step (a new run: none); the others, and lines that are not
    records (cut short by a crash), move to log.superseded.jsonl. Nothing is deleted."""
    log_path = os.path.join(out_dir, "log.jsonl")
    if os.path.exists(os.path.join(out_dir, "ckpt.pt.tmp")):
        os.remove(os.path.join(out_dir, "ckpt.pt.tmp"))  # half a checkpoint from a run killed while saving
    if not os.path.exists(log_path):
        return
    keep, move = [], []
    with open(log_path, "rb") as f:
        for line in f:
            try:
                step = json.loads(line)["iter"]
            except (ValueError, TypeError, KeyError, UnicodeDecodeError):
                step = None
            keep_it = resume_step is not None and isinstance(step, int) and step <= resume_step
            (keep if keep_it else move).append(line if line.endswith(b"\n") else line + b"\n")
    if move:
        with open(os.path.join(out_dir, "log.superseded.jsonl"), "ab") as f:
            f.writelines(move)
    with open(log_path + ".tmp", "wb") as f:
        f.writelines(keep)
    os.replace(log_path + ".tmp", log_path)


class Log:
    """log.jsonl (append-only), the progress bar and wandb; tokens/s and MFU over the training time since the last
    record. The clock runs from start_clock() to stop_clock() or the next train_record(), each of which waits for
    the device: the time includes the GPU's queued work, and the device is synchronised only there."""

    def __init__(self, cfg, model_args, raw_model, proc, start):
        from tqdm import tqdm
        T = model_args["block_size"]
        self.master, self.path, self.device = proc.rank == 0, os.path.join(cfg.out_dir, "log.jsonl"), proc.device
        self.tokens_per_step = proc.world * proc.accum * cfg.batch_size * T
        self.run = {"world": proc.world, "gradient_accumulation_steps": proc.world * proc.accum,
                    "device": str(proc.device), "dtype": proc.dtype, "tokens_per_step": self.tokens_per_step}
        self.flops, self.peak = raw_model.flops_per_token(T), peak_flops(proc.device, cfg.peak_flops) * proc.world
        self.seconds, self.tokens, self.t0, self.wandb = 0.0, 0, None, None
        self.bar = tqdm(total=cfg.max_iters, initial=start, disable=not self.master, dynamic_ncols=True)
        if self.master:
            self.bar.write(f"model_{cfg.model}.py: {sum(p.numel() for p in raw_model.parameters()):,} parameters | "
                           f"{proc.world} process(es) x {proc.accum} micro-steps x {cfg.batch_size} x {T} tokens | "
                           f"{proc.device} {proc.dtype}")
        if self.master and cfg.wandb_log:
            import wandb
            self.wandb = wandb
            wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or None,
                       config={**dataclasses.asdict(cfg), **model_args})

    def start_clock(self):
        if self.t0 is None:
            synchronize(self.device)
            self.t0 = time.perf_counter()

    def stop_clock(self):
        if self.t0 is not None:
            synchronize(self.device)
            self.seconds, self.t0 = self.seconds + time.perf_counter() - self.t0, None

    def step_done(self):
        self.tokens += self.tokens_per_step
        self.bar.update(1)

    def train_record(self, step, loss, lr):
        self.stop_clock()
        tok_s = self.tokens / self.seconds
        self.seconds, self.tokens = 0.0, 0
        self.start_clock()
        return {"iter": step, "loss": loss, "lr": lr, "tok_per_s": tok_s,
                **({"mfu": self.flops * tok_s / self.peak} if self.peak else {})}

    def write(self, record, show=False):
        if not self.master:
            return
        with open(self.path, "a") as f:
            f.write(dumps(record) + "\n")
        if self.wandb is not None:
            self.wandb.log(record, step=record["iter"])
        text = " | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items())
        self.bar.write(text) if show else self.bar.set_postfix_str(text[len(f"iter {record['iter']} | "):])

    def close(self):
        self.bar.close()  # before any error line, so that it does not share the bar's line


def save_checkpoint(path, ckpt):
    """Atomically: a crash or a full disk mid-write never leaves a half-written ckpt.pt."""
    tmp = path + ".tmp"
    try:
        torch.save(ckpt, tmp)
    except (OSError, RuntimeError) as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise ConfigError(f"cannot write the checkpoint {path} ({' '.join(str(e).split())[:100]}); free some space "
                          "or choose another --out_dir; the previous checkpoint is kept")
    os.replace(tmp, path)
