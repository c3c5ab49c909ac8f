"""
What several scripts share (train.py, sample.py, eval.py, bench.py, sweep.py, prepare.py, export.py, hf.py), each
part under its heading below:
    errors       ConfigError, RunError and main_boundary(): a mistake the user can fix (bad input, a file that
                 cannot be written) ends in one `error: ...` line and exit code 1; anything else keeps its
                 traceback, as a bug to fix
    files        one reader per kind of file, so that a bad one ends in one line naming it; strict JSON (to_json)
    options      every script declares its options once, as the fields of a dataclass made with option():
                 default, --help text and constraints side by side; the parsers turn them into one command line
                 with exact names, and check_config() applies the constraints (to preset files' values too) before
                 make_config() builds the dataclass. Only leading arguments are preset files
                 (`train.py config/x.py --max_iters 10`): a value such as `--out_dir run.py` is a value
    models       the model files by name, and a model built from options
    device       the device, the precision (autocast), synchronize, the GPU's peak FLOP/s
    data         a prepared data set: meta.json and its token splits
    tables       the copies of generated tables in README.md and docs/, between their markers
    checkpoints  reading train.py's ckpt.pt, its weights into a model (q, k, v split and joined for older files and
                 Hugging Face's names), a model from a run folder
"""
import argparse
import ast
import dataclasses
import difflib
import errno
import glob
import importlib
import json
import math
import os
import pickle
import re
import shlex
import sys
import tempfile
from contextlib import nullcontext

import numpy as np
import torch


HERE = os.path.dirname(os.path.abspath(__file__))

# ----------------------------------------------------------------------------------------------------------
# errors

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


class OutOfMemory(RunError):
    """An allocation that failed while a run ran, with what the run keeps; main_boundary() adds what to lower."""


def allocation_failure(error):
    """For an error that is a failed allocation of memory (CUDA's OutOfMemoryError, the CPU allocator's or MPS's
    RuntimeError, Python's MemoryError): the size asked for, as " of 12.2 GiB" where the message says it, else "";
    None for any other error."""
    text = str(error)
    if not (isinstance(error, (torch.OutOfMemoryError, MemoryError)) or isinstance(error, RuntimeError) and (
            "can't allocate memory" in text or "out of memory" in text)):
        return None
    asked = re.search(r"(?:tried to allocate|Tried to allocate) (\d+) bytes", text)
    if asked:
        n = int(asked.group(1))
        return f" of {n / 2**30:.1f} GiB" if n >= 2**30 else f" of {n / 2**20:.0f} MiB"
    asked = re.search(r"Tried to allocate ([\d.]+ [KMGT]i?B)", text)
    return f" of {asked.group(1)}" if asked else ""


# what to lower, said by main_boundary() for a failed allocation in a script that names nothing of its own
MEMORY_FIX = "use a smaller batch or model, or a device with more memory"


def main_boundary(main, memory_fix=MEMORY_FIX):
    """Run main(argv) as a script: the expected failure classes end in one `error:` line, the rest in a traceback.
    It is also the one allocation boundary: memory that cannot be allocated, anywhere in a script, ends in one line
    with memory_fix, the script's options to lower."""
    try:
        main(sys.argv[1:])
    except (ConfigError, RunError) as e:
        if torch.distributed.is_initialized() and not isinstance(e, PeerLost):
            torch.distributed.destroy_process_group()
        fail(f"{e}; {memory_fix}" if isinstance(e, OutOfMemory) else str(e), every_rank=isinstance(e, PeerLost))
    except (MemoryError, RuntimeError) as e:
        size = allocation_failure(e)
        if size is None:
            raise
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        fail(f"out of memory: an allocation{size} failed; {memory_fix}")
    except OSError as e:
        fix = ("free some space or choose another folder" if e.errno in (errno.ENOSPC, errno.EDQUOT) else
               "check the path" if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR) else "choose another folder")
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
                           errno.EISDIR, errno.ENOTDIR):
            raise
        fail(f"cannot write or read {e.filename or 'a file'}: {e.strerror}; {fix}, then run the same command again")
    except KeyboardInterrupt:
        fail("interrupted; nothing was lost that had been saved")


# ----------------------------------------------------------------------------------------------------------
# files: every file a script reads goes through these, so that a bad one ends in one line naming it; strict JSON

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


def json_safe(value):
    """value with every float that is not finite replaced by None, in dicts, lists and tuples too."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def has_nonfinite(value):
    """Whether value holds a float that is not finite (which to_json() writes as null)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return any(has_nonfinite(v) for v in items)


def to_json(value, **kwargs):
    """Strict JSON, which every tool reads: a value that is not finite becomes null (json_safe())."""
    return json.dumps(json_safe(value), allow_nan=False, **kwargs)


# ----------------------------------------------------------------------------------------------------------
# options

def option(default, doc, **rules):
    """A config field with its --help text and its constraints (min / max, above / below, choices; path: a file
    name; out="file" or "folder": what the script writes there; required), which check_config() and the parsers
    apply before any work; the model files define the same helper for their GPTConfig."""
    return dataclasses.field(default=default, metadata=dict(doc=doc, **rules))


class ArgumentParser(argparse.ArgumentParser):
    """argparse with exact option names (no prefix of one is taken for it) and its errors as one line (the usage
    block hides the message), naming the closest option or the model file that has it. model: the model file whose
    options this parser holds, if any; owned: {option name: what to use instead} for the options its caller sets
    itself (sweep.py's --train_args are train.py's options less those), which a hint does not send the user to."""

    def __init__(self, *args, model=None, owned=None, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)
        self.model, self.owned = model, owned or {}

    def error(self, message):
        if message.startswith("unrecognized arguments"):
            args = message.split(":", 1)[1].split()
            if any(a.endswith(".py") for a in args):
                message += " (preset files go first, before every --option)"
            message += "".join(f"; {h}" for h in map(self.hint, args) if h)
        raise ConfigError(f"{message}; see {self.prog.split()[0]} --help")

    def hint(self, arg):
        """What an unknown --option probably meant: another model file's option, or the closest of this parser's."""
        name = arg.split("=")[0]
        if not name.startswith("--"):
            return ""
        if self.model is not None:
            owners = [m for m in model_names() if m != self.model and name[2:] in
                      {f.name for f in dataclasses.fields(load_model_module(m).GPTConfig)}]
            if owners:
                of = (f"{name} is an option of {' and '.join(f'model_{m}.py' for m in owners)}, not of "
                      f"model_{self.model}.py")
                return f"{of}: drop {name} ({self.owned['model']})" if "model" in self.owned else \
                    f"{of}: pass --model {owners[0]}, or drop {name}"
        close = difflib.get_close_matches(name, [o for o in self._option_string_actions if o.startswith("--") and
                                                 o != "--help"], 1, 0.75)
        if close and close[0][2:] in self.owned:
            return f"did you mean {close[0]}? {self.owned[close[0][2:]]}"
        return f"did you mean {close[0]}?" if close else ""


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
        if rule.get("required"):  # no default to show: the option must be given
            group.add_argument(f"--{f.name}", type=kind, required=True, default=argparse.SUPPRESS, help=doc,
                               metavar=kind.__name__.upper())
            continue
        if "choices" in rule:
            doc += f" (choices: {', '.join(map(str, rule['choices']))})"
        if kind is bool:
            group.add_argument(f"--{f.name}", type=str2bool, nargs="?", const=True, default=default, help=doc,
                               metavar="BOOL")
        elif kind is tuple:  # one or more strings
            group.add_argument(f"--{f.name}", nargs="+", default=default, help=doc, metavar="STR")
        else:
            group.add_argument(f"--{f.name}", type=kind, default=default, help=doc, metavar=kind.__name__.upper())


def parse_model_options(config_class, argv, doc, prog="train.py", owned=None):
    """A training script's options: config_class (train.py's TrainConfig: with model, dataset, data_dir and size
    fields) and the fields of the chosen model file's GPTConfig, from defaults < preset files < the command line.
    Returns (config, model options as a dict, model module, names set explicitly); ConfigError on bad input, which
    names prog's --help (also when another script, sweep.py, checks train.py's options) and, for an unknown option,
    no option of owned (ArgumentParser)."""
    files, rest = split_config_files(argv)
    from_files, origin = {}, {}
    for path in files:
        values = read_config_file(path)
        from_files.update(values)
        origin.update(dict.fromkeys(values, path))
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in ("model", "dataset", "data_dir"):
        pre.add_argument(f"--{name}", default=from_files.get(name, getattr(config_class, name)))
    early = pre.parse_known_args(rest)[0]
    module = load_model_module(early.model)
    train_fields = {f.name for f in dataclasses.fields(config_class)}
    model_fields = {f.name for f in dataclasses.fields(module.GPTConfig)}
    for cls, names in ((config_class, train_fields), (module.GPTConfig, model_fields)):
        try:  # a preset's values are Python values: their types are checked here, not parsed by argparse
            check_config(cls, {k: v for k, v in from_files.items() if k in names})
        except ValueError as e:
            raise ConfigError(f"{e} (set in {origin[str(e).split()[0][2:]]})")
    parser = ArgumentParser(prog=prog, description=doc, formatter_class=HelpFormatter, model=early.model,
                            owned=owned, usage="%(prog)s [preset.py ...] [--option value ...]")
    add_options(parser, config_class, "training", from_files)
    try:  # --help shows the vocabulary a new run takes: the data set's, where it is prepared
        data_vocab = {"vocab_size": read_meta(early.data_dir, early.dataset)["vocab_size"]}
    except ConfigError:
        data_vocab = {}
    add_options(parser, module.GPTConfig, f"model_{module.__name__[6:]}.py", {**data_vocab, **from_files})
    unknown = sorted(set(from_files) - train_fields - model_fields)
    if unknown:  # named as on the command line: the closest option, or the model file that has it
        hints = "".join(f"; {h}" for h in map(parser.hint, (f"--{name}" for name in unknown)) if h)
        raise ConfigError(f"{', '.join(files)} sets unknown option(s) {', '.join(unknown)}{hints}; a preset "
                          "sets options only (base = \"x.py\" layers it on another preset)")
    args = vars(parser.parse_args(rest))
    explicit = set(from_files) | explicit_options(rest)
    if args["size"] in SIZES:  # the preset fills the shape fields nobody set, and the model file's own settings
        sized = {**SIZES[args["size"]], **getattr(module, "SIZE_DEFAULTS", {}).get(args["size"], {})}
        args.update({k: v for k, v in sized.items() if k not in explicit})
        explicit |= set(sized)

    def where(name):
        return f" (set in {origin[name]})" if name in origin and name not in explicit_options(rest) else ""
    try:
        cfg = make_config(config_class, **{k: v for k, v in args.items() if k in train_fields})
        model_args = {k: v for k, v in args.items() if k in model_fields}
        make_config(module.GPTConfig, **model_args)  # its constraints, before any data is read
    except (ValueError, TypeError) as e:
        name = str(e).split()[0][2:] if str(e).startswith("--") else ""
        raise ConfigError(f"{e}{where(name)}")
    check_paths(cfg)
    check_outputs(cfg)
    return cfg, model_args, module, explicit


def split_config_files(argv):
    """(config files, the rest): config files are the leading arguments that are not options."""
    n = 0
    while n < len(argv) and not argv[n].startswith("-"):
        n += 1
    return argv[:n], argv[n:]


def read_config_file(path, within=()):
    """The assignments of a preset file, read and not run: every statement is one `name = literal` (a number,
    string, bool, None, or a list, tuple or dict of them, as ast.literal_eval reads it), and anything else is
    refused with its line number, so that a preset someone hands you runs no code, not even for --help.
    `base = "other.py"` (a file beside it) layers the file on another preset: the base's values first, then this
    file's."""
    source = read_text(path, "the config file", "pass a preset file of `name = value` lines, such as config/*.py")
    try:
        tree = ast.parse(source, path)
    except SyntaxError as e:
        raise ConfigError(f"config file {path} line {e.lineno}: {e.msg}; fix the file (it holds `name = value` "
                          "lines)")
    values = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if not isinstance(target, ast.Name):
            line = source.splitlines()[node.lineno - 1].strip()
            raise ConfigError(f"config file {path} line {node.lineno}: {line[:60]!r} is not a `name = value` "
                              "assignment; a preset is read, not run: write each option as `name = value`")
        try:
            values[target.id] = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ConfigError(f"config file {path} line {node.lineno}: the value of {target.id} is not a literal "
                              "(a number, string, True/False/None, or a list, tuple or dict of them); a preset is "
                              "read, not run: write the value itself")
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


def without(argv, *names):
    """argv less the options named, each with its value: --name=value, --name value, or a bool option alone."""
    out, i = [], 0
    while i < len(argv):
        if argv[i].split("=")[0] not in names:
            out.append(argv[i])
        elif "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            i += 1  # its value
        i += 1
    return out


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


def make_config(config_class, **values):
    """config_class(**values) after check_config(): each field's constraints first, then its __post_init__'s
    rules across fields (which may divide by a field that the first check keeps from being 0); ValueError naming
    the option."""
    check_config(config_class, values)
    return config_class(**values)


def check_name(name, path):
    """path is a name the file system can hold: no NUL byte, and no part longer than 255 bytes (the limit of common
    file systems); else ConfigError naming the option."""
    if "\0" in path or any(len(os.fsencode(part)) > 255 for part in path.replace(",", os.sep).split(os.sep)):
        raise ConfigError(f"{name} {path[:40]!r}...: no file or folder can have that name (a NUL byte, or a part "
                          "longer than 255 bytes); choose another")


def check_paths(config):
    """check_name() of every option declared with path=True."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        for path in (value if isinstance(value, tuple) else (value,)) if f.metadata.get("path") else ():
            check_name(f"--{f.name}", path)


def check_outputs(config):
    """check_output() of every option declared with out="file" or out="folder" that is set."""
    for f in dataclasses.fields(config):
        if f.metadata.get("out") and getattr(config, f.name):
            check_output(f"--{f.name}", getattr(config, f.name), f.metadata["out"])


def check_output(name, path, kind):
    """Before any work: ConfigError in one line naming the option when path cannot become the file (kind "file")
    or the folder ("folder") a script will write: it is a folder where a file goes, or a file where a folder goes,
    a part of it is a file, or the nearest folder that exists cannot be written (tried with a temporary file,
    which also finds a read-only file system and holds for root)."""
    check_name(name, path)
    if kind == "file" and os.path.isdir(path):
        raise ConfigError(f"{name} {path} is a folder, and the script writes a file there; name a file")
    if kind == "folder" and os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{name} {path} is a file, and the script writes a folder there; choose another {name}")
    folder = path if kind == "folder" else os.path.dirname(path) or "."
    while not os.path.exists(folder):
        folder = os.path.dirname(os.path.abspath(folder))
    if not os.path.isdir(folder):
        raise ConfigError(f"{name} {path}: {folder} is a file, so nothing can be written under it; choose another "
                          f"{name}")
    try:
        tempfile.TemporaryFile(dir=folder).close()
        if kind == "file" and os.path.exists(path):
            open(path, "ab").close()  # opened to append, nothing written
    except OSError as e:
        raise ConfigError(f"{name} {path}: {folder if kind == 'folder' or not os.path.exists(path) else path} cannot "
                          f"be written ({e.strerror}); choose another {name}")


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
    try:
        config = make_config(config_class, **values)
    except ValueError as e:
        raise ConfigError(str(e))
    check_paths(config)
    check_outputs(config)
    return config


# ----------------------------------------------------------------------------------------------------------
# models

# size presets from the Vertical Attention paper's Table 2 (its names; the counts change with the vocabulary)
SIZES = {
    "50m": dict(n_embd=192, ffn_hidden=768, n_head=3, n_layer=6, n_kv_head=1),
    "100m": dict(n_embd=384, ffn_hidden=1536, n_head=6, n_layer=8, n_kv_head=3),
    "300m": dict(n_embd=768, ffn_hidden=3072, n_head=12, n_layer=12, n_kv_head=4),
}


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
    try:
        config = make_config(module.GPTConfig, **model_args)
    except ValueError as e:
        raise ConfigError(f"{e} ({module.__name__}.py, from {source})")
    return module.GPT(config)


# ----------------------------------------------------------------------------------------------------------
# device and precision

# dense bf16 peak FLOP/s by GPU name, for MFU; the first name found in the device's name wins
PEAK_FLOPS = [
    ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("H20", 148e12), ("B200", 2250e12),
    ("A100", 312e12), ("A10G", 70e12), ("A10", 125e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12),
    ("RTX 4090", 165e12), ("RTX 3090", 71e12), ("A6000", 155e12), ("V100", 125e12), ("T4", 65e12),
]

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
# data: data/<dataset>/{train,val}.bin + meta.json from prepare.py

REDO = "run prepare.py again to remake the data set"


def prepare_hint(data_dir, dataset):
    """What to run for a data set that is not prepared: the command that makes it where prepare.py knows its name,
    else the nearest name (a typo) prepare.py knows or data_dir holds, else how to make one of your own files."""
    from prepare import DATASETS  # prepare.py imports this module: read its names when they are needed
    out = "" if os.path.normpath(data_dir) == "data" else f" --out_dir {shlex.quote(data_dir)}"
    if dataset in DATASETS:
        return f"run `python prepare.py --dataset {dataset}{out}` first"
    if os.path.basename(dataset) != dataset or dataset in ("", ".", ".."):
        return (f"--dataset names one folder inside --data_dir, without / or .. (prepare.py makes "
                f"{', '.join(DATASETS)}, or one of your own with --files and --name)")
    prepared = [d for d in (os.listdir(data_dir) if os.path.isdir(data_dir) else ()) if d != dataset and all(
        os.path.isfile(os.path.join(data_dir, d, f)) for f in ("meta.json", "train.bin", "val.bin"))]
    close = difflib.get_close_matches(dataset, [*prepared, *DATASETS], 1, 0.6)
    if close and close[0] in prepared:
        return f"did you mean --dataset {close[0]}? ({data_dir} holds it)"
    if close:
        return f"did you mean --dataset {close[0]}? run `python prepare.py --dataset {close[0]}{out}` first"
    return (f"prepare.py knows no data set of that name ({', '.join(DATASETS)}); to make {dataset} from text files of "
            f"your own, run `python prepare.py --files FILE ... --name {shlex.quote(dataset)}{out}`")


def read_meta(data_dir, dataset):
    """meta.json of a prepared data set, checked; ConfigError names the fix."""
    folder = os.path.join(data_dir, dataset)
    meta_path = os.path.join(folder, "meta.json")
    if not (os.path.exists(meta_path) and os.path.exists(os.path.join(folder, "train.bin"))):
        raise ConfigError(f"no prepared data in {folder} (--data_dir {data_dir}, --dataset {dataset}); "
                          + prepare_hint(data_dir, dataset))
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


def open_split(data_dir, dataset, split, meta):
    """split.bin as a read-only memmap of meta's dtype (eval.py and the pre-run checks; train.py's Data keeps its
    own pair open for the whole run)."""
    return np.memmap(os.path.join(data_dir, dataset, f"{split}.bin"), dtype=np.dtype(meta["dtype"]), mode="r")


# ----------------------------------------------------------------------------------------------------------
# tables: the copies of generated tables in README.md and docs/

def marked_pages():
    """The markdown files that may hold a generated table's copy: README.md, docs/*.md and results/*.md. The README
    keeps the tables a newcomer reads; the rest live in the page about them."""
    return [os.path.join(HERE, "README.md")] + sorted(glob.glob(os.path.join(HERE, "docs", "*.md"))) + \
        sorted(glob.glob(os.path.join(HERE, "results", "*.md")))


def update_readme(table, results):
    """Replace the copy of a generated table between its markers for `results` (a results folder or file),
    <!-- results:start --> and <!-- results:end -->, in whichever page holds them (marked_pages): a table moved
    from the README to a page of docs/ is still rewritten where it now is. Returns the pages written."""
    tag = os.path.normpath(results)
    marked = re.compile(rf"(<!-- {re.escape(tag)}:start -->\n).*?(<!-- {re.escape(tag)}:end -->)", re.S)
    written = []
    for page in marked_pages():
        text = open(page, encoding="utf-8").read()
        if marked.search(text):
            with open(page, "w", encoding="utf-8") as f:
                f.write(marked.sub(lambda m: m.group(1) + table + m.group(2), text))
            written.append(page)
    if not written:
        print(f"note: no page (README.md, docs/*.md, results/*.md) has a <!-- {tag}:start --> marker; the table is "
              "left alone", file=sys.stderr)
    return written


# ----------------------------------------------------------------------------------------------------------
# checkpoints: out_dir/ckpt.pt, written by train.py

def checkpoint_path(out_dir):
    """The checkpoint file of --out_dir: a run folder's ckpt.pt, or a .pt file itself."""
    if out_dir.endswith(".pt"):
        return out_dir
    if os.path.isfile(out_dir):  # its folder is named only where it holds a checkpoint: a hint that works
        folder = os.path.dirname(out_dir) or "."
        there = (f" (perhaps --out_dir {shlex.quote(folder)}, which holds one)"
                 if os.path.isfile(os.path.join(folder, "ckpt.pt")) else "")
        raise ConfigError(f"--out_dir {out_dir} is a file, not a run folder or a .pt checkpoint; pass the run folder "
                          f"that holds ckpt.pt{there}")
    return os.path.join(out_dir, "ckpt.pt")


def read_checkpoint(path, keys=("model_name", "model_args", "model"), mmap=False):
    """The dict train.py saved at path, holding at least `keys`; ConfigError for a missing, truncated, empty or
    foreign file (a bare state_dict), so that train --resume, sample.py, eval.py, export.py, bench.py and sweep.py
    all say it in one line. The one reader of checkpoints: torch.load(weights_only=True) unpickles tensors and
    plain containers only (what train.py saves, in every version), so that a checkpoint someone hands you cannot
    run code; one that holds anything else is refused, naming it. mmap: the tensors stay in the file (a reader of
    a few numbers does not read the weights)."""
    if os.path.isdir(path):
        raise ConfigError(f"the checkpoint {path} is a folder, not a file; move it away, or pass the run folder "
                          "that holds train.py's ckpt.pt")
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        if os.path.basename(path) != "ckpt.pt":  # a .pt file of the user's own: train.py would write ckpt.pt
            there = os.path.isfile(os.path.join(folder, "ckpt.pt"))
            raise ConfigError(f"no checkpoint at {path}; pass an existing .pt file or a run folder"
                              f"{f' (perhaps --out_dir {shlex.quote(folder)}, which holds ckpt.pt)' if there else ''}")
        raise ConfigError(f"no checkpoint at {path}; train one with `python train.py --out_dir {shlex.quote(folder)}`")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # torch.load's errors differ by damage: zip reader, unpickler, EOF
        found = re.search(r"GLOBAL (\S+)", str(e))
        if isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e):
            raise ConfigError(f"the checkpoint {path} holds {found.group(1) if found else 'an object'}, not only "
                              "tensors and plain containers: unpickling it could run code, so it was not loaded; use "
                              "a checkpoint written by train.py, from a source you trust")
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


def qkv_rows(config):
    """The rows of an attention's fused wqkv that are q, k and v: H, H_kv and H_kv heads of head_dim rows."""
    a = config if isinstance(config, dict) else vars(config)  # model_args or a GPTConfig
    head_dim = a["head_dim"] or a["n_embd"] // a["n_head"]
    return a["n_head"] * head_dim, a["n_kv_head"] * head_dim, a["n_kv_head"] * head_dim


FUSED = {"attn.wqkv": ("wq", "wk", "wv"), "mlp.w13": ("w1", "w3")}  # one matmul each, in that order of rows


def separate(name, config):
    """(names, rows) of the separate projections that the fused weight or bias `name` stacks: an attention's wqkv
    is Llama's wq, wk and wv (q_proj, k_proj, v_proj), an MLP's w13 its w1 and w3 (gate_proj, up_proj); else
    (None, None)."""
    linear, _, kind = name.rpartition(".")  # blocks.0.attn.wqkv, weight
    for fused, parts in FUSED.items():
        if linear == fused or linear.endswith("." + fused):
            base = linear[:-len(fused.split(".")[1])]  # blocks.0.attn.
            a = config if isinstance(config, dict) else vars(config)  # model_args or a GPTConfig
            rows = qkv_rows(a) if fused == "attn.wqkv" else (a["ffn_hidden"],) * 2
            return [f"{base}{part}.{kind}" for part in parts], rows
    return None, None


def split_fused(state, config):
    """state with each fused wqkv and w13 as the separate projections Llama and Qwen3 have: views of its rows, so
    that a copy into them writes the fused tensor."""
    out = {}
    for name, t in state.items():
        names, rows = separate(name, config)
        out.update(zip(names, t.split(rows)) if names else [(name, t)])
    return out


def join_fused(state, model):
    """A checkpoint written before q, k and v (or w1 and w3) were one matmul: its separate projections joined into
    the wqkv and w13 that model has (the same numbers, so the same logits and the same greedy text)."""
    for name in model.state_dict():
        names, _ = separate(name, model.config)
        if names and name not in state and all(n in state for n in names):
            state[name] = torch.cat([state.pop(n) for n in names])
    return state


def load_weights(model, state, model_name, path):
    """The weights of a checkpoint into model; ConfigError if they do not fit it or are not all finite."""
    if not isinstance(state, dict) or not all(torch.is_tensor(t) for t in state.values()):
        raise ConfigError(f"the weights in {path} are not a state_dict of tensors; restore it from a copy or train "
                          "again")
    state = join_fused(dict(state), model)
    bad = next((name for name, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if bad is not None:
        raise ConfigError(f"the weights in {path} hold NaN or infinity ({bad}); restore it from a copy or train again")
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[1].strip() if "\n" in str(e) else str(e)
        raise ConfigError(f"{path} does not fit model_{model_name}.py ({first[:200]}); "
                          "it was saved by another version of that file")


def model_from_checkpoint(out_dir, device="cpu", keys=("model_name", "model_args", "model")):
    """(model, module, checkpoint dict) from out_dir/ckpt.pt (or a .pt path), or ConfigError with the fix."""
    path = checkpoint_path(out_dir)
    ckpt = read_checkpoint(path, keys)
    module = load_model_module(ckpt["model_name"])
    model = build_model(module, ckpt["model_args"], path)
    load_weights(model, ckpt["model"], ckpt["model_name"], path)
    return model.to(device), module, ckpt


def describe_run(ckpt):
    """'step N, T tokens seen' of a checkpoint, for the scripts that read one."""
    step = ckpt.get("iter_num")
    if step is None:
        return "step unknown"
    tokens = ckpt.get("tokens_seen")
    return f"step {step:,}" + (f", {tokens:,} tokens seen" if tokens is not None else "")


if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("common.py is a library module: what the scripts share (options, errors, files, data, checkpoints); "
             "run a script, e.g. `python train.py --help`")
