"""
Plumbing a learner may skip: the one validator, and the model files. option() declares a field's default, --help text
and rules, which check_config() applies, to a file's fields too (check_record); make_config() builds only from values
that pass. `--model NAME` is model_NAME.py beside the scripts; a model is built only from options that its GPTConfig's
rules pass and that fit in memory (build_model), so a bad value ends in one line naming it.
"""
import dataclasses
import glob
import importlib
import math
import os
import sys

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/config.py is a library module (every option's rules); run `python train.py --help`")

from plumbing.errors import ROOT, ConfigError, printable

PER_BLOCK = 16 << 10  # bytes of Python objects per block (its modules and parameters), measured on tiny models


def option(default, doc, **rules):
    """A config field with its --help text and rules: min / max, above / below, choices, path, out, required."""
    return dataclasses.field(default=default, metadata=dict(doc=doc, **rules))


def shown(value, quote=True):
    """value as a message shows it: a huge integer by its size, a long text cut short."""
    try:
        text = f"an integer of {value.bit_length():,} bits" if type(value) is int and value.bit_length() > 64 else \
            repr(value) if quote else str(value)
    except ValueError:  # a huge integer inside a list or dict: too long for Python to print
        text = f"a {type(value).__name__} that holds an integer too long to print"
    return text if len(text) <= 60 else text[:57] + "..."


def check_config(config_class, values):
    """ValueError, its .name the field's, for the first field of config_class whose value breaks its rules."""
    for f in dataclasses.fields(config_class):
        try:
            check_field(f, values.get(f.name, f.default))
        except ValueError as e:
            e.name = f.name
            raise


def check_field(f, value, label="--"):
    """ValueError if value breaks the type or the rules of field f, named label + its name (--n_layer, its field x)."""
    rule, name, kind = f.metadata, f"{label}{f.name}", f.type
    if value is None and f.default is None and not rule.get("required"):
        return  # a None default means "not given"
    if not (type(value) is kind or kind is float and type(value) is int  # an int is a fine float
            or kind in (dict, list) and isinstance(value, kind)):  # a file's OrderedDict is a dict
        raise ValueError(f"{name} must be {kind.__name__}, not {shown(value)}")
    if type(value) is float and not math.isfinite(value) or type(value) is int and not -2**63 <= value < 2**63:
        raise ValueError(f"{name} must be a finite number that fits in 64 bits, not {shown(value)}")
    for text in value if type(value) is tuple else [value] if type(value) is str else []:
        try:  # a lone surrogate (a preset's "\ud800") is no text; command-line bytes that are not UTF-8 arrive as
            text.encode("utf-8", "surrogateescape")  # \udc80..\udcff, which encode back to them
        except UnicodeEncodeError:
            raise ValueError(f"{name} is not text (it holds a lone surrogate, {shown(text)}); write it as text")
    if "choices" in rule and value not in rule["choices"]:
        raise ValueError(f"{name} {shown(value, quote=False)} is not one of: {', '.join(map(str, rule['choices']))}")
    low, high = rule.get("min", rule.get("above")), rule.get("max", rule.get("below"))  # above, below: excluded
    if low is not None and (value < low or value == low and "above" in rule) or \
            high is not None and (value > high or value == high and "below" in rule):
        raise ValueError(f"{name} must be {bounds(rule, low, high)}, not {shown(value)}")


def bounds(rule, low, high):
    """A field's range in words: "between 0 and 1 (1 excluded)", "1 or more", "below 2"."""
    out = " and ".join(str(rule[k]) for k in ("above", "below") if k in rule)
    return (f"between {low} and {high}{out and f' ({out} excluded)'}" if None not in (low, high)
            else f"{low} or more" if "min" in rule else f"above {low}" if "above" in rule
            else f"{high} or less" if "max" in rule else f"below {high}")


def check_record(record_class, value, path, fix):
    """value, a file's object of fields, once the fields record_class declares (required=True: must be there) and
    its __post_init__ hold (other fields are another version's); else ConfigError naming path, the field and fix."""
    try:
        if not isinstance(value, dict):
            raise ValueError(f"it is {shown(type(value).__name__, False)}, not an object of fields")
        declared = [f for f in dataclasses.fields(record_class) if f.name in value or f.metadata.get("required")]
        for f in declared:
            if f.name not in value:
                raise ValueError(f"its field {f.name} is missing")
            check_field(f, value[f.name], "its field ")
        record_class(**{f.name: value[f.name] for f in declared})
    except ValueError as e:
        raise ConfigError(f"{printable(path)}: {e}; {fix}")
    return value


def make_config(config_class, **values):
    """config_class(**values) once check_config() passes (so __post_init__ may divide by a field kept from 0)."""
    check_config(config_class, values)
    return config_class(**values)


# ---- the model files: model_NAME.py, and a model built from its checked options

def model_names():
    return sorted(os.path.basename(p)[6:-3] for p in glob.glob(os.path.join(ROOT, "model_*.py")))


def load_model_module(name):
    if name not in model_names():
        raise ConfigError(f"unknown --model {name!r}; choose one of: {', '.join(model_names())}")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    return importlib.import_module(f"model_{name}")


def labelled_models():
    """[(label, model file, config overrides)]: vanilla, the reference, first, then every other model file by name,
    each at its defaults (label: its name) and with each of the VARIANTS its file declares, the comparisons of its
    paper (label: name-variant). The tables, the figures and --model use these labels."""
    runs = []
    for name in sorted(model_names(), key=lambda n: n != "vanilla"):
        module = load_model_module(name)
        runs.append((name, name, {}))
        runs += [(f"{name}-{variant}", name, dict(o)) for variant, o in getattr(module, "VARIANTS", {}).items()]
    return runs


def model_of(label):
    """(the module of model_NAME.py, config overrides) of a --model value: a model file's NAME, or a label of the
    tables, NAME-VARIANT, that file with its VARIANTS[VARIANT] (mhc-hc: model_mhc.py with hc_kind hc)."""
    if label in model_names():
        return load_model_module(label), {}
    name = max((n for n in model_names() if label.startswith(n + "-")), key=len, default=None)
    variants = getattr(load_model_module(name), "VARIANTS", {}) if name else {}
    if label[len(name or "") + 1:] not in variants:
        raise ConfigError(f"unknown --model {label!r}; choose one of: {', '.join(l for l, *_ in labelled_models())}")
    return load_model_module(name), dict(variants[label[len(name) + 1:]])


def build_model(module, model_args, source="the options"):
    """module.GPT(check_model_args(...)). Under `with torch.device("meta")` it allocates nothing."""
    return module.GPT(check_model_args(module, model_args, source))


def check_model_args(module, model_args, source):
    """module.GPTConfig of model_args once its rules pass and the model fits in memory (float32 weights and one
    window's logits, from the options alone: building one too large would fail, or take minutes first)."""
    try:
        c = make_config(module.GPTConfig, **model_args)
    except TypeError as e:  # "GPTConfig.__init__() got an unexpected keyword argument 'x'"
        raise ConfigError(f"{source}: {e}: it was saved by another version of {module.__name__}.py")
    except ValueError as e:
        raise ConfigError(f"{e} ({module.__name__}.py, from {source})")
    head_dim = c.head_dim or c.n_embd // c.n_head  # float32 bytes of vanilla's weights, which every model file has
    block = 4 * (2 * (c.n_head + c.n_kv_head) * head_dim * c.n_embd + 3 * c.n_embd * c.ffn_hidden) + PER_BLOCK
    need = {"--vocab_size": 4 * c.vocab_size * c.n_embd * (2 - c.tie_embeddings), "--n_layer": c.n_layer * block,
            "--block_size": 4 * c.block_size * (head_dim + c.vocab_size)}  # one window's rotary tables and logits
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else math.inf
    if sum(need.values()) > have:  # (checked where the system reports its memory: Linux, macOS; Windows does not)
        raise ConfigError(f"a model of {(name := max(need, key=need.get))} {getattr(c, name[2:])} needs at least "
                          f"{sum(need.values()) / 2**30:,.1f} GiB ({need[name] / 2**30:,.1f} GiB for {name}), more "
                          f"than the {have / 2**30:.1f} GiB of memory here; lower {name} (from {source})")
    return c
