"""
Plumbing a learner may skip: the model files. `--model NAME` is model_NAME.py beside the scripts, and a model is
built from its options (a dict of its GPTConfig's fields) only after they are checked, so that an unknown field or
a value outside its rules ends in one line naming it and where it came from.
"""
import dataclasses
import glob
import importlib
import os
import sys

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/models.py is a library module (the model files, and a model built from its options); run a "
             "script, e.g. `python train.py --help`")

from plumbing.config import make_config
from plumbing.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: the model files are there


def model_names():
    """The NAME of every model_NAME.py, sorted."""
    return sorted(os.path.basename(p)[6:-3] for p in glob.glob(os.path.join(ROOT, "model_*.py")))


def load_model_module(name):
    """The module model_NAME.py; ConfigError naming the choices for a name that has no file."""
    if name not in model_names():
        raise ConfigError(f"unknown --model {name!r}; choose one of: {', '.join(model_names())}")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    return importlib.import_module(f"model_{name}")


def build_model(module, model_args, source="the options"):
    """module.GPT(check_model_args(...)). Under `with torch.device("meta")` it allocates nothing."""
    return module.GPT(check_model_args(module, model_args, source))


def check_model_args(module, model_args, source):
    """module.GPTConfig(**model_args), once model_args are fields of that GPTConfig within their rules and the model
    fits in this machine's memory (check_size); ConfigError names the field or the option, and source, where the
    values came from."""
    extra = set(model_args) - {f.name for f in dataclasses.fields(module.GPTConfig)}
    if extra:
        raise ConfigError(f"{source} has config fields {', '.join(sorted(extra))} that {module.__name__}.py does "
                          "not know; it was saved by another version of that file")
    try:
        config = make_config(module.GPTConfig, **model_args)
    except ValueError as e:
        raise ConfigError(f"{e} ({module.__name__}.py, from {source})")
    check_size(config, source)
    return config


# the Python objects of one block (its modules and parameters), measured when building tiny models: at least this
PER_BLOCK = 16 << 10


def smallest_size(c):
    """{option: the bytes a model of config c needs at least for it}, from the options alone, before anything is
    built: float32 weights of the embedding and head (vocab_size), of the blocks and their Python objects (n_layer),
    and the rotary tables and the logits of one window (block_size). Every model file has at least vanilla's."""
    head_dim = c.head_dim or c.n_embd // c.n_head
    block = c.n_embd * (c.n_head + 2 * c.n_kv_head) * head_dim + c.n_head * head_dim * c.n_embd + 3 * c.n_embd * \
        c.ffn_hidden
    return {"--vocab_size": 4 * c.vocab_size * c.n_embd * (1 if c.tie_embeddings else 2),
            "--n_layer": c.n_layer * (4 * block + PER_BLOCK),
            "--block_size": 4 * c.block_size * (head_dim + c.vocab_size)}


def memory():
    """The bytes of memory this machine has (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
        return None


def check_size(config, source):
    """ConfigError, naming the option that needs the most, for a model that cannot fit in this machine's memory
    (smallest_size): building it would fail, or take minutes first."""
    need, have = smallest_size(config), memory()
    if have and sum(need.values()) > have:
        name = max(need, key=need.get)
        raise ConfigError(f"a model of {name} {getattr(config, name[2:])} needs at least "
                          f"{sum(need.values()) / 2**30:,.1f} GiB ({need[name] / 2**30:,.1f} GiB for {name}), more than "
                          f"the {have / 2**30:.1f} GiB of memory here; lower {name} (from {source})")
