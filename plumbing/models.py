"""
Plumbing a learner may skip: the model files. `--model NAME` is model_NAME.py beside the scripts; a model is built only
from options that its GPTConfig's rules pass and that fit in memory, so a bad value ends in one line naming it.
"""
import dataclasses
import glob
import importlib
import os
import sys

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/models.py is a library module (the model files); run `python train.py --help`")

from plumbing.config import make_config
from plumbing.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: the model files are there
PER_BLOCK = 16 << 10  # bytes of Python objects per block (its modules and parameters), measured on tiny models


def model_names():
    return sorted(os.path.basename(p)[6:-3] for p in glob.glob(os.path.join(ROOT, "model_*.py")))


def load_model_module(name):
    if name not in model_names():
        raise ConfigError(f"unknown --model {name!r}; choose one of: {', '.join(model_names())}")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    return importlib.import_module(f"model_{name}")


def build_model(module, model_args, source="the options"):
    """module.GPT(check_model_args(...)). Under `with torch.device("meta")` it allocates nothing."""
    return module.GPT(check_model_args(module, model_args, source))


def check_model_args(module, model_args, source):
    """module.GPTConfig of model_args once its rules pass and the model fits in memory (float32 weights and one
    window's logits, from the options alone: building one too large would fail, or take minutes first)."""
    extra = set(model_args) - {f.name for f in dataclasses.fields(module.GPTConfig)}
    if extra:
        raise ConfigError(f"{source} has config fields {', '.join(sorted(extra))} that {module.__name__}.py does "
                          "not know; it was saved by another version of that file")
    try:
        c = make_config(module.GPTConfig, **model_args)
    except ValueError as e:
        raise ConfigError(f"{e} ({module.__name__}.py, from {source})")
    head_dim = c.head_dim or c.n_embd // c.n_head  # float32 bytes of vanilla's weights, which every model file has
    block = 4 * (2 * (c.n_head + c.n_kv_head) * head_dim * c.n_embd + 3 * c.n_embd * c.ffn_hidden) + PER_BLOCK
    need = {"--vocab_size": 4 * c.vocab_size * c.n_embd * (2 - c.tie_embeddings), "--n_layer": c.n_layer * block,
            "--block_size": 4 * c.block_size * (head_dim + c.vocab_size)}  # one window's rotary tables and logits
    have, name = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), max(need, key=need.get)  # Linux, macOS
    if sum(need.values()) > have:
        raise ConfigError(f"a model of {name} {getattr(c, name[2:])} needs at least {sum(need.values()) / 2**30:,.1f} "
                          f"GiB ({need[name] / 2**30:,.1f} GiB for {name}), more than the {have / 2**30:.1f} GiB of "
                          f"memory here; lower {name} (from {source})")
    return c
