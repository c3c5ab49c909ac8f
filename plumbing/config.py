"""
Plumbing a learner may skip: the one validator. A config dataclass's fields are made with option(): default, --help
text and rules side by side; check_config() applies the rules to a dict of values and make_config() builds the
dataclass only from values that pass, so that a bad value ends in one line naming it. The same declarations check
the files: check_record() holds a file's fields (a checkpoint's train_config, meta.json, a log record, a tool's
results) to the dataclass that declares them. The model files define the same option() helper for their GPTConfig
(they import nothing of the repository).
"""
import dataclasses
import math
import sys

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/config.py is a library module (the constraints of every script's options); run a script, "
             "e.g. `python train.py --help`")


def option(default, doc, **rules):
    """A config field with its --help text and its constraints (min / max, above / below, choices; path: a file
    name; out="file" or "folder": what the script writes there; required), which check_config() and the parsers
    apply before any work; the model files define the same helper for their GPTConfig."""
    return dataclasses.field(default=default, metadata=dict(doc=doc, **rules))


class OptionError(ValueError):
    """A value that breaks its option's rules; name: the option (its field's name)."""

    def __init__(self, name, message):
        super().__init__(message)
        self.name = name


def shown(value, quote=True):
    """value as a message shows it: a huge integer by its size, a long text cut short (a string in quotes)."""
    if type(value) is int and value.bit_length() > 64:
        return f"an integer of {value.bit_length():,} bits"
    text = repr(value) if quote and not isinstance(value, (int, float)) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_config(config_class, values, label="--"):
    """OptionError (a ValueError) naming the first field of config_class whose value in values (a dict; a missing
    field has its default) breaks its type or its declared constraints: min / max (inclusive), above / below
    (exclusive), choices; a float must also be finite, an int fit in 64 bits."""
    for f in dataclasses.fields(config_class):
        try:
            check_field(f, values.get(f.name, f.default), label)
        except ValueError as e:
            raise OptionError(f.name, str(e))


def check_field(f, value, label="--"):
    """ValueError if value breaks the type or the rules of the field f (named label + its name: --n_layer, or a
    file's field n_layer)."""
    rule, name = f.metadata, f"{label}{f.name}"
    if value is None and f.default is None and not rule.get("required"):
        return  # a None default means "not given"
    kind = f.type
    if not (type(value) is kind or kind is float and type(value) is int  # an int is a fine float
            or kind in (dict, list) and isinstance(value, kind)):  # a file's OrderedDict is a dict
        raise ValueError(f"{name} must be {kind.__name__}, not {shown(value)}")
    if type(value) is float and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {shown(value)}")
    if type(value) is int and not -2**63 <= value < 2**63:
        raise ValueError(f"{name} must fit in 64 bits, not {shown(value)}")
    for text in value if type(value) is tuple else [value] if type(value) is str else []:
        try:  # a lone surrogate (from a preset's "\ud800") is no text; bytes of the command line that are not UTF-8
            text.encode("utf-8", "surrogateescape")  # arrive as \udc80..\udcff, which encode back to them
        except UnicodeEncodeError:
            raise ValueError(f"{name} is not text (it holds a lone surrogate, {shown(text)}); write it as text")
    low, high, above, below = (rule.get(k) for k in ("min", "max", "above", "below"))
    if "choices" in rule and value not in rule["choices"]:
        raise ValueError(f"{name} {shown(value, quote=False)} is not one of: {', '.join(map(str, rule['choices']))}")
    if low is not None and high is not None and not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, not {shown(value)}")
    if low is not None and below is not None and not low <= value < below:
        raise ValueError(f"{name} must be at least {low} and below {below}, not {shown(value)}")
    if above is not None and below is not None and not above < value < below:
        raise ValueError(f"{name} must be between {above} and {below}, both excluded, not {shown(value)}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be {low} or more, not {shown(value)}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be {high} or less, not {shown(value)}")
    if above is not None and not value > above:
        raise ValueError(f"{name} must be above {above}, not {shown(value)}")
    if below is not None and not value < below:
        raise ValueError(f"{name} must be below {below}, not {shown(value)}")


def check_record(record_class, value, path, fix):
    """value, a file's object of fields, once every field that record_class declares holds to its rules (a field
    declared required=True must be there; one a file lacks is an older file's, and one record_class does not declare
    a newer file's, both left alone) and to the rules across fields of its __post_init__; else ConfigError in one line
    naming path, the field and fix."""
    from plumbing.errors import ConfigError, printable
    if not isinstance(value, dict):
        raise ConfigError(f"{printable(path)} is {shown(type(value).__name__, False)}, not an object of fields; {fix}")
    declared = [f for f in dataclasses.fields(record_class) if f.name in value or f.metadata.get("required")]
    try:
        for f in declared:
            if f.name not in value:
                raise ValueError(f"its field {f.name} is missing")
            check_field(f, value[f.name], "its field ")
        record_class(**{f.name: value[f.name] for f in declared})
    except ValueError as e:
        raise ConfigError(f"{printable(path)}: {e}; {fix}")
    return value


def make_config(config_class, **values):
    """config_class(**values) after check_config(): each field's constraints first, then its __post_init__'s
    rules across fields (which may divide by a field that the first check keeps from being 0); ValueError naming
    the option."""
    check_config(config_class, values)
    return config_class(**values)
