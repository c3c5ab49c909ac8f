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
    """module.GPT(module.GPTConfig(**model_args)), once model_args (a dict) pass check_model_args(). Under
    `with torch.device("meta")` it allocates nothing (a checker's shapes)."""
    return module.GPT(check_model_args(module, model_args, source))


def check_model_args(module, model_args, source):
    """module.GPTConfig(**model_args), once model_args are fields of that GPTConfig within their rules; ConfigError
    names the field it does not know or the option it rejects, and source, where the values came from."""
    extra = set(model_args) - {f.name for f in dataclasses.fields(module.GPTConfig)}
    if extra:
        raise ConfigError(f"{source} has config fields {', '.join(sorted(extra))} that {module.__name__}.py does "
                          "not know; it was saved by another version of that file")
    try:
        return make_config(module.GPTConfig, **model_args)
    except ValueError as e:
        raise ConfigError(f"{e} ({module.__name__}.py, from {source})")
