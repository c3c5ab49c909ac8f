"""
Plumbing a learner may skip: every script's options, declared once as dataclass fields with option() and parsed into
one command line of exact names. Leading arguments are preset files, read and never run: `name = literal` lines.
"""
import argparse
import ast
import dataclasses
import difflib
import os
import sys
import tempfile

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/options.py is a library module (every script's options); run `python train.py --help`")

from plumbing.config import check_config, load_model_module, make_config, model_names, model_of
from plumbing.errors import OPTION_PATHS, ConfigError, printable, script_command
from plumbing.files import read_meta, read_text, regular_file

PRESET_BYTES, PRESET_DEPTH = 1_000_000, 16  # a preset's size, its chain of base presets


class ArgumentParser(argparse.ArgumentParser):
    """argparse with exact option names, each error one line with a hint (model: the file whose options it holds)."""

    def __init__(self, *args, model=None, owned=None, **kwargs):
        super().__init__(*args, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
        self.model, self.owned = model, owned or {}

    def error(self, message):
        if message.startswith("unrecognized arguments"):
            args = message.split(":", 1)[1].split()
            if any(a.endswith(".py") for a in args):
                message += " (preset files go first, before every --option)"
            message += "".join(f" ({h})" for h in map(self.hint, args) if h)
        raise ConfigError(f"{message}; see {self.prog} --help")

    def hint(self, arg):
        """What an unknown --option meant: another model file's, or the closest (one in owned: what to use instead)."""
        name = arg.split("=")[0]
        owners = [m for m in model_names() if self.model not in (None, m) and name[2:] in
                  {f.name for f in dataclasses.fields(load_model_module(m).GPTConfig)}]
        if owners:
            of = f"{name} is an option of {' and '.join(f'model_{m}.py' for m in owners)}, not of model_{self.model}.py"
            return f"{of}: drop {name} ({self.owned['model']})" if "model" in self.owned else \
                f"{of}: pass --model {owners[0]}, or drop {name}"
        close = difflib.get_close_matches(name, set(self._option_string_actions) - {"-h", "--help"}, 1, 0.75)
        return (self.owned.get(close[0][2:]) or f"did you mean {close[0]}?") if close else ""  # owned: what instead

    def add_options(self, config_class, title, defaults=None):
        """One typed --name option per field of config_class, with its help text, choices and default."""
        def shown(value):  # a blank string ('' or '\n') as itself, not as nothing
            return repr(value) if isinstance(value, str) and not value.strip() else str(value)
        group = self.add_argument_group(title) if title else self
        for f in dataclasses.fields(config_class):
            rule, kind, default = f.metadata, f.type, (defaults or {}).get(f.name, f.default)
            doc = rule.get("doc", "") + (f" (choices: {', '.join(map(shown, rule['choices']))})" if "choices" in rule
                                         else "") + ("" if rule.get("required") else f" (default: {shown(default)})")
            how = dict(type=str2bool, nargs="?", const=True, metavar="BOOL") if kind is bool else \
                dict(nargs="+", metavar="STR") if kind is tuple else dict(type=kind, metavar=kind.__name__.upper())
            group.add_argument(f"--{f.name}", default=argparse.SUPPRESS if rule.get("required") else default,
                               required=bool(rule.get("required")), help=doc.replace("%", "%%"), **how)


def str2bool(s):
    if s.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return s.lower() in ("1", "true", "yes", "on")
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def parse_model_options(config_class, argv, doc, prog="train.py", owned=None):
    """(config, model options as a dict, model module, names set explicitly): defaults < the --model label's variant
    < presets < command line; an option that contradicts the label's variant is refused."""
    n = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))  # the leading arguments: presets
    files, rest, given = argv[:n], argv[n:], explicit_options(argv[n:])
    from_files, origin = read_presets(files, config_class) if files else ({}, {})  # "file line N" of each value
    pre = ArgumentParser(prog=prog, add_help=False)  # the model, and the data set whose vocabulary --help shows
    pre.add_options(config_class, None, from_files)
    early = pre.parse_known_args(rest)[0]
    module, variant = model_of(early.model)  # a label of the tables, NAME-VARIANT, sets its variant's options
    if files:  # the model file's values too, before --help shows them
        checked(module.GPTConfig, from_files, origin)
    parser = ArgumentParser(prog=prog, description=doc, model=module.__name__[6:], owned=owned,
                            usage="%(prog)s [preset.py ...] [--option value ...]")
    parser.add_options(config_class, "training", from_files)
    try:  # the data set's vocabulary, where it is prepared: --help shows it, and the least it takes
        data_vocab = {"vocab_size": read_meta(early.data_dir, early.dataset)["vocab_size"]}
    except (ConfigError, TypeError, ValueError):  # none yet, or a preset's --data_dir is no path: said below
        data_vocab = {}
    parser.add_options(module.GPTConfig, f"model_{module.__name__[6:]}.py", {**data_vocab, **variant, **from_files})
    if files:
        check_unknown(parser, files, from_files, config_class, module.GPTConfig)
    args = vars(parser.parse_args(rest))
    args.update((k, v) for k, v in from_files.items() if k not in given)  # a preset's Python values, as they are
    where = lambda name: f" (set in {origin[name]})" if name in origin and name not in given else ""  # noqa: E731
    model_fields = {f.name for f in dataclasses.fields(module.GPTConfig)}
    try:
        cfg = make_config(config_class, **{k: v for k, v in args.items() if k not in model_fields})
        model_args = {k: v for k, v in args.items() if k in model_fields}
        make_config(module.GPTConfig, **model_args)  # its rules, before any data is read
    except (ValueError, TypeError) as e:  # a field's own rules (.name), or __post_init__'s, "--name ..."
        raise ConfigError(f"{e}{where(getattr(e, 'name', str(e).partition(' ')[0][2:]))}")
    if "vocab_size" in given | set(from_files) and data_vocab and model_args["vocab_size"] < data_vocab["vocab_size"]:
        raise ConfigError(f"--vocab_size {model_args['vocab_size']} is smaller than the data's "
                          f"{data_vocab['vocab_size']}; drop the option{where('vocab_size')}")
    contradicts = [f"--{k} {model_args[k]}{where(k)}" for k, v in variant.items() if model_args[k] != v]
    if contradicts:
        raise ConfigError(f"{', '.join(contradicts)} contradicts --model {early.model}, which sets "
                          f"{', '.join(f'--{k} {v}' for k, v in variant.items())}; drop it, or pass --model "
                          f"{module.__name__[6:]}")
    check_paths(cfg)
    return cfg, model_args, module, set(from_files) | given | set(variant)


def read_presets(files, config_class):
    """(the presets' values, where each was set), those of config_class checked: Python values, checked as they are,
    before the model they name is loaded."""
    values, origin = {}, {}
    for v, where in map(read_config_file, files):
        values.update(v)
        origin.update(where)
    checked(config_class, values, origin)
    return values, origin


def check_unknown(parser, files, values, config_class, model_config):
    """ConfigError naming the options the presets set that no field has, with the closest option or its model file."""
    unknown = sorted(set(values) - {f.name for c in (config_class, model_config) for f in dataclasses.fields(c)})
    if unknown:  # named as on the command line: the closest option, or the model file that has it
        hints = "".join(f" ({h})" for h in map(parser.hint, (f"--{name}" for name in unknown)) if h)
        raise ConfigError(f"{', '.join(files)} sets unknown option(s) {', '.join(unknown)}{hints}; a preset "
                          "sets options only (base = \"x.py\" layers it on another preset)")


def checked(config_class, values, origin):
    """ConfigError naming the preset line of the first of values that breaks its field's rules in config_class."""
    try:
        check_config(config_class, {f.name: values[f.name] for f in dataclasses.fields(config_class)
                                    if f.name in values})
    except ValueError as e:  # check_config's, with the field's .name
        raise ConfigError(f"{e} (set in {origin[e.name]})")


def read_config_file(path, within=()):
    """(a preset's values, where each was set: "file line N"): each statement `name = literal`, read with
    ast.literal_eval and never run; `base = "other.py"` (beside it) layers it on another preset; within limits."""
    source = read_text(path, "the config file", "pass a preset file of `name = value` lines, such as config/*.py",
                       limit=PRESET_BYTES)
    try:
        tree = ast.parse(source, path)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:  # "(file, line N)"; a NUL byte; too deep
        raise ConfigError(f"config file {path}: {' '.join(str(e).split())}; fix it (it holds `name = value` lines)")
    values, where = {}, {}
    for node in tree.body:
        at = f"config file {path} line {node.lineno}"
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if not isinstance(target, ast.Name):
            raise ConfigError(f"{at}: {source.splitlines()[node.lineno - 1].strip()[:60]!r} is not a `name = value` "
                              "assignment; a preset is read, not run: write each option as `name = value`")
        try:
            values[target.id] = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ConfigError(f"{at}: the value of {target.id} is not a literal (a number, string, True/False/None, "
                              "or a list, tuple or dict of them); a preset is read, not run: write the value itself")
        where[target.id] = f"{path} line {node.lineno}"
    base = values.pop("base", None)
    if base is None:
        return values, where
    if not isinstance(base, str) or os.path.basename(base) != base or not base.endswith(".py"):
        raise ConfigError(f"config file {path}: base must name a preset file beside it, e.g. base = \"x.py\"")
    base = os.path.join(os.path.dirname(path), base)
    if os.path.abspath(base) in within:
        raise ConfigError(f"config file {path}: its base {base} leads back to it; fix the files")
    if len(within) + 1 >= PRESET_DEPTH:
        raise ConfigError(f"config file {path}: its chain of base presets is more than {PRESET_DEPTH} files long; "
                          "layer fewer presets")
    below, inherited = read_config_file(base, (*within, os.path.abspath(path)))
    return {**below, **values}, {**inherited, **where}  # a value this file sets is this file's


def explicit_options(argv):
    """The option names given on a command line."""
    return {a.split("=")[0][2:] for a in argv if a.startswith("--")}


def without(argv, *names):
    """argv less the options named, each with its value: --name=value, --name value, or a bool option alone."""
    return [a for i, a in enumerate(argv) if a.split("=")[0] not in names and  # nor the value of one named
            not (i and argv[i - 1] in names and not a.startswith("--"))]


def check_name(name, path, output=True):
    """ConfigError naming the option, before any work, where the system cannot hold path or its derived names."""
    extra = 16 if output else 0  # what a derived name adds: NAME.tmp-PID, .NAME.old-PID with a 7-digit PID, a lock
    if "\0" in path or len(os.fsencode(os.path.abspath(path))) + extra >= 4096 or any(
            len(os.fsencode(part)) + extra > 255 for part in path.replace(",", os.sep).split(os.sep)):
        raise ConfigError(f"{name} {printable(path[:40])!r}...: no file can have that name (a NUL byte, a part over "
                          f"{255 - extra} bytes or a path over {4095 - extra}); choose a shorter one")


def check_paths(config):
    """Each path= option registered for the boundary's line (OPTION_PATHS), and checked: check_output, check_name."""
    for f in dataclasses.fields(config):
        value, rule = getattr(config, f.name), f.metadata
        for path in filter(None, value if isinstance(value, tuple) else (value,)) if rule.get("path") else ():
            OPTION_PATHS[path] = f"--{f.name}"
            if rule.get("out"):
                check_output(f"--{f.name}", path, rule["out"])
            else:
                check_name(f"--{f.name}", path, rule["path"] == "out")


def check_output(name, path, kind, fix=None):
    """ConfigError naming the option that chose path, and fix (else: choose another value of it), where path cannot
    become the file or folder (kind) a script writes, before the work that a failed write at its end would waste."""
    check_name(name, path)
    fix = fix or f"choose another {name}"
    if kind == "file":  # a folder is refused, and a FIFO, which opening would wait on
        regular_file(path, name, fix, output=True)
    elif os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{name} {path} is a file, and the script writes a folder there; {fix}")
    folder = path if kind == "folder" else os.path.dirname(path) or "."
    while not os.path.exists(folder):
        folder = os.path.dirname(os.path.abspath(folder))
    try:  # a temporary file finds a read-only file system and a file in the way, also for root
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise ConfigError(f"{name} {path}: {folder} cannot be written ({e.strerror}); {fix}")


def attach_option_values(argv, config_class):
    """argv with `--name VALUE` joined into `--name=VALUE` where --name takes a string and VALUE looks like an option
    of no config_class field, or is several words (argparse reads `--train_args "--lr=1"` as two options)."""
    strings = {f"--{f.name}" for f in dataclasses.fields(config_class) if f.type is str}
    known = {f"--{f.name}" for f in dataclasses.fields(config_class)} | {"-h", "--help"}
    out = []
    for a in argv:
        if out and out[-1] in strings and a.startswith("-") and (a.split("=")[0] not in known or len(a.split()) > 1):
            out[-1] += f"={a}"
        else:
            out.append(a)
    return out


def parse_simple(config_class, argv, doc):
    """The options of a script without preset files: its dataclass from the command line, checked."""
    command = script_command()  # its usage line shows how it is run: sample.py, python -m tools.bench
    parser = ArgumentParser(prog=command[len("python "):] if " -m " not in command else command, description=doc)
    parser.add_options(config_class, None)  # under argparse's own "options:", beside --help
    values = vars(parser.parse_args(attach_option_values(list(argv), config_class)))
    try:
        config = make_config(config_class, **{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    except ValueError as e:
        raise ConfigError(str(e))
    check_paths(config)
    return config
