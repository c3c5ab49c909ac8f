"""
What every script shares about models, devices, data and checkpoints:
    models       --model NAME is model_NAME.py; the shapes of the Vertical Attention paper's Table 2 (--size)
    device       --device and --dtype resolved, bf16 autocast, waiting for the GPU, its peak FLOP/s for MFU
    data         a prepared data set's token split as a memory map (prepare.py writes data/<name>/)
    checkpoints  a model rebuilt from train.py's ckpt.pt: the model file and options it names, and its weights
What a bad option, data set or checkpoint ends in (one line naming the fix) is in plumbing/, which a learner may
skip: every file is checked there where it is read, so that the code here can be plain.
"""
import glob
import importlib
import os
import sys
from contextlib import nullcontext

import numpy as np
import torch

from plumbing.checkpoints import checkpoint_path, read_checkpoint
from plumbing.errors import ConfigError
from plumbing.files import split_tokens

HERE = os.path.dirname(os.path.abspath(__file__))

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


def build_model(module, model_args):
    """module.GPT of model_args, a dict of its GPTConfig's fields (checked where they were read)."""
    return module.GPT(module.GPTConfig(**model_args))


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


# ----------------------------------------------------------------------------------------------------------
# data: data/<dataset>/{train,val}.bin + meta.json from prepare.py (read and checked by plumbing/files.py)

def open_split(data_dir, dataset, split, meta):
    """split.bin as a read-only memmap of meta's dtype, once split_tokens() has found it a whole regular file that
    matches meta.json (opening a FIFO would wait for a writer). Every reader of a split opens it here."""
    split_tokens(data_dir, dataset, split, meta)
    return np.memmap(os.path.join(data_dir, dataset, f"{split}.bin"), dtype=np.dtype(meta["dtype"]), mode="r")


# ----------------------------------------------------------------------------------------------------------
# checkpoints: out_dir/ckpt.pt, written by train.py

def model_from_checkpoint(out_dir, device="cpu", keys=("model_name", "model_args", "model")):
    """(model, module, checkpoint dict) of a run folder's ckpt.pt (or a .pt file): the model file it names, built
    with its options, and its weights. read_checkpoint checks every field first, against that model file too."""
    ckpt = read_checkpoint(checkpoint_path(out_dir), keys)
    module = load_model_module(ckpt["model_name"])
    model = build_model(module, ckpt["model_args"])
    model.load_state_dict(ckpt["model"])
    return model.to(device), module, ckpt


def describe_run(ckpt):
    """'step N, T tokens seen' of a checkpoint, for the scripts that read one."""
    step = ckpt.get("iter_num")
    if step is None:
        return "step unknown"
    tokens = ckpt.get("tokens_seen")
    return f"step {step:,}" + (f", {tokens:,} tokens seen" if tokens is not None else "")


if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("common.py is a library module: what the scripts share about models, devices, data and checkpoints; "
             "run a script, e.g. `python train.py --help`")
