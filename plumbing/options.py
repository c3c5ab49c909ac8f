"""
Plumbing a learner may skip: every script's options. A script declares its options once, as the fields of a
dataclass made with option(): default, --help text and constraints side by side. The parsers turn them into one
command line with exact names, and check_config() applies the constraints (to preset files' values too) before
make_config() builds the dataclass. Only leading arguments are preset files (`train.py config/x.py --max_iters
10`): a value such as `--out_dir run.py` is a value. A preset is read, not run: `name = literal` lines.
"""
import argparse
import ast
import dataclasses
import difflib
import os
import sys
import tempfile

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/options.py is a library module (every script's option parsing); run a script, "
             "e.g. `python train.py --help`")

from plumbing.config import OptionError, check_config, make_config
from plumbing.errors import OPTION_PATHS, ConfigError, printable, script_command
from plumbing.files import output_file, read_meta, read_text
from plumbing.models import load_model_module, model_names


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
            message += "".join(f" ({h})" for h in map(self.hint, args) if h)
        raise ConfigError(f"{message}; see {self.prog} --help")

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
        if close and close[0][2:] in self.owned:  # its caller sets that one: say what to use instead, only
            return self.owned[close[0][2:]]
        return f"did you mean {close[0]}?" if close else ""

    def add_options(self, config_class, title, defaults=None):
        """One --name option per field of config_class, typed, with its help text, choices and default."""
        group = self.add_argument_group(title) if title else self
        for f in dataclasses.fields(config_class):
            default = (defaults or {}).get(f.name, f.default)
            rule, kind = f.metadata, f.type
            doc = rule.get("doc", "")
            if rule.get("required"):  # no default to show: the option must be given
                group.add_argument(f"--{f.name}", type=kind, required=True, default=argparse.SUPPRESS, help=doc,
                                   metavar=kind.__name__.upper())
                continue
            if "choices" in rule:  # '' shown as itself, not as nothing
                doc += f" (choices: {', '.join(str(c) if c != '' else repr(c) for c in rule['choices'])})"
            if kind is bool:
                group.add_argument(f"--{f.name}", type=str2bool, nargs="?", const=True, default=default, help=doc,
                                   metavar="BOOL")
            elif kind is tuple:  # one or more strings
                group.add_argument(f"--{f.name}", nargs="+", default=default, help=doc, metavar="STR")
            else:
                group.add_argument(f"--{f.name}", type=kind, default=default, help=doc,
                                   metavar=kind.__name__.upper())


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows the docstring as written and every option's default (a blank one as '' or '\\n')."""

    def _get_help_string(self, action):
        blank = isinstance(action.default, str) and (not action.default or action.default.isspace())
        return f"{action.help} (default: {action.default!r})" if blank else super()._get_help_string(action)


def str2bool(s):
    if isinstance(s, bool):
        return s
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def parse_model_options(config_class, argv, doc, prog="train.py", owned=None):
    """A training script's options: config_class (train.py's TrainConfig: with model, dataset and data_dir fields)
    and the fields of the chosen model file's GPTConfig, from defaults < preset files < the command line. Returns
    (config, model options as a dict, model module, names set explicitly); ConfigError on bad input, which names
    prog's --help (also when another script, sweep.py, checks train.py's options) and, for an unknown option, no
    option of owned (ArgumentParser)."""
    files, rest = split_config_files(argv)
    from_files, origin = {}, {}  # origin: where each value of a preset was set ("file line N")
    for path in files:
        values, where = read_config_file(path)
        from_files.update(values)
        origin.update(where)
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
        except OptionError as e:
            raise ConfigError(f"{e} (set in {origin[e.name]})")
    parser = ArgumentParser(prog=prog, description=doc, formatter_class=HelpFormatter, model=early.model,
                            owned=owned, usage="%(prog)s [preset.py ...] [--option value ...]")
    parser.add_options(config_class, "training", from_files)
    try:  # the vocabulary of the data set, where it is prepared: a new run's (--help shows it), and the least it takes
        data_vocab = {"vocab_size": read_meta(early.data_dir, early.dataset)["vocab_size"]}
    except ConfigError:
        data_vocab = {}
    parser.add_options(module.GPTConfig, f"model_{module.__name__[6:]}.py", {**data_vocab, **from_files})
    unknown = sorted(set(from_files) - train_fields - model_fields)
    if unknown:  # named as on the command line: the closest option, or the model file that has it
        hints = "".join(f" ({h})" for h in map(parser.hint, (f"--{name}" for name in unknown)) if h)
        raise ConfigError(f"{', '.join(files)} sets unknown option(s) {', '.join(unknown)}{hints}; a preset "
                          "sets options only (base = \"x.py\" layers it on another preset)")
    args = vars(parser.parse_args(rest))
    explicit = set(from_files) | explicit_options(rest)

    def where(name):
        return f" (set in {origin[name]})" if name in origin and name not in explicit_options(rest) else ""
    try:
        cfg = make_config(config_class, **{k: v for k, v in args.items() if k in train_fields})
        model_args = {k: v for k, v in args.items() if k in model_fields}
        make_config(module.GPTConfig, **model_args)  # its constraints, before any data is read
    except (ValueError, TypeError) as e:  # an option's own rules (OptionError), or those across options
        name = e.name if isinstance(e, OptionError) else str(e).split()[0][2:] if str(e).startswith("--") else ""
        raise ConfigError(f"{e}{where(name)}")
    if "vocab_size" in explicit and data_vocab and model_args["vocab_size"] < data_vocab["vocab_size"]:
        raise ConfigError(f"--vocab_size {model_args['vocab_size']} is smaller than the data's "
                          f"{data_vocab['vocab_size']}; drop the option{where('vocab_size')}")
    check_paths(cfg)
    check_outputs(cfg)
    return cfg, model_args, module, explicit


def split_config_files(argv):
    """(config files, the rest): config files are the leading arguments that are not options."""
    n = 0
    while n < len(argv) and not argv[n].startswith("-"):
        n += 1
    return argv[:n], argv[n:]


# what a preset may hold: a file read whole must be small, a base chain short, a number one an option can take
PRESET_BYTES, PRESET_DEPTH, PRESET_INT_BITS = 1_000_000, 16, 64


def read_config_file(path, within=()):
    """(the assignments of a preset file, where each was set: "file line N"), read and not run: every statement is
    one `name = literal` (a number, string, bool, None, or a list, tuple or dict of them, as ast.literal_eval reads
    it), and anything else is refused with its line number, so that a preset someone hands you runs no code, not
    even for --help. `base = "other.py"` (a file beside it) layers the file on another preset: the base's values
    first, then this file's. Within limits: PRESET_BYTES per file, PRESET_DEPTH presets in a base chain, integers of
    PRESET_INT_BITS; each breach is one line naming the file (and line)."""
    fix = "pass a preset file of `name = value` lines, such as config/*.py"
    source = read_text(path, "the config file", fix, limit=PRESET_BYTES)
    try:
        tree = ast.parse(source, path)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        line = f" line {e.lineno}" if getattr(e, "lineno", None) else ""
        reason = " ".join(str(getattr(e, "msg", e)).split())[:100]
        raise ConfigError(f"config file {path}{line}: {reason}; fix the file (it holds `name = value` lines)")
    values, where = {}, {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if not isinstance(target, ast.Name):
            line = source.splitlines()[node.lineno - 1].strip()
            raise ConfigError(f"config file {path} line {node.lineno}: {line[:60]!r} is not a `name = value` "
                              "assignment; a preset is read, not run: write each option as `name = value`")
        at = f"config file {path} line {node.lineno}"
        try:
            values[target.id] = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ConfigError(f"{at}: the value of {target.id} is not a literal (a number, string, True/False/None, "
                              "or a list, tuple or dict of them); a preset is read, not run: write the value itself")
        big = [n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant) and type(n.value) is int
               and n.value.bit_length() > PRESET_INT_BITS]
        if big:
            raise ConfigError(f"{at}: the value of {target.id} holds an integer of {big[0].bit_length():,} bits, more "
                              f"than an option takes ({PRESET_INT_BITS}); write the number an option takes")
        where[target.id] = f"{path} line {node.lineno}"
    base = values.pop("base", None)
    where.pop("base", None)
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
    # a value this file sets is this file's; the others, where the base set them
    return {**below, **values}, {**inherited, **where}


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


# the most bytes the scripts add to a name they derive from a user's: the temporary sibling of a file or a folder
# they write (NAME.tmp-PID, .NAME.tmp-PID, .NAME.old-PID with a PID of up to 7 digits), a lock, a figure's name
DERIVED = 16


def check_name(name, path, output=True):
    """path, and every name the scripts derive from it (DERIVED bytes longer), is a name the file system can hold: no
    NUL byte, no part longer than 255 bytes, no path longer than os.pathconf's PC_PATH_MAX (or 4096); else ConfigError
    naming the option, before any work."""
    extra = DERIVED if output else 0
    parts = [os.fsencode(part) for part in path.replace(",", os.sep).split(os.sep)]
    try:
        longest = os.pathconf(".", "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        longest = 4096
    if "\0" in path or any(len(part) + extra > 255 for part in parts) or \
            len(os.fsencode(os.path.abspath(path))) + extra >= longest:
        raise ConfigError(f"{name} {printable(path[:40])!r}...: the scripts cannot write or read a file of that name "
                          f"(a NUL byte, a part over {255 - extra} bytes or a path over {longest - extra - 1}); choose "
                          "a shorter one")


def check_paths(config):
    """check_name() of every option declared with path=True, or path="out" (outputs and a name the script writes
    under: with their derived names), which the boundary
    then names in the fix of a file under it (plumbing/errors.py's OPTION_PATHS)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        for path in (value if isinstance(value, tuple) else (value,)) if f.metadata.get("path") else ():
            check_name(f"--{f.name}", path, f.metadata.get("out") or f.metadata["path"] == "out")
            if path:
                OPTION_PATHS[path] = f"--{f.name}"


def check_outputs(config):
    """check_output() of every option declared with out="file" or out="folder" that is set."""
    for f in dataclasses.fields(config):
        if f.metadata.get("out") and getattr(config, f.name):
            check_output(f"--{f.name}", getattr(config, f.name), f.metadata["out"])


def check_output(name, path, kind):
    """Before any work: ConfigError in one line naming the option when path cannot become the file (kind "file")
    or the folder ("folder") a script will write: it is a folder, a FIFO, a socket or a device where a file goes, or
    a file where a folder goes, a part of it is a file, or the nearest folder that exists cannot be written (tried
    with a temporary file, which also finds a read-only file system and holds for root)."""
    check_name(name, path)
    if kind == "file":  # a regular file or nothing yet: a folder is refused, and a FIFO, which opening could wait on
        output_file(path, name, "name a file")
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
    command = script_command()  # its usage line shows how it is run: sample.py, python -m tools.bench
    parser = ArgumentParser(prog=command[len("python "):] if " -m " not in command else command, description=doc,
                            formatter_class=HelpFormatter)
    parser.add_options(config_class, None)  # under argparse's own "options:", beside --help
    argv = attach_option_values(list(argv), config_class)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(parser.parse_args(argv)).items()}
    try:
        config = make_config(config_class, **values)
    except ValueError as e:
        raise ConfigError(str(e))
    check_paths(config)
    check_outputs(config)
    return config


