"""
Plumbing a learner may skip: reading train.py's ckpt.pt, so that a missing, damaged, foreign or unsafe file ends in
one line naming it, and loading its weights into a model (with the q, k, v split and joined for older files and
Hugging Face's names).
"""
import os
import pickle
import re
import shlex
import sys

import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/checkpoints.py is a library module (the reader of train.py's checkpoints); run a script, "
             "e.g. `python train.py --help`")

from plumbing.errors import ConfigError, script_command
from plumbing.files import regular_file
from plumbing.models import build_model, load_model_module
from plumbing.schemas import CHECKPOINT, checked


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


def runs_in(*folders):
    """The run folders (holding a ckpt.pt) among the folders and the folders inside them, sorted."""
    found = set()
    for folder in folders:
        inside = [os.path.join(folder, d) for d in os.listdir(folder)] if os.path.isdir(folder) else []
        found |= {f for f in [folder, *inside] if os.path.isfile(os.path.join(f, "ckpt.pt"))}
    return sorted(found)


def missing_run_hint(folder):
    """What to do where --out_dir holds no checkpoint: use a run that exists nearby (in the folder, or in out/, where
    the README trains them), or train one there where that is sensible: a folder not there yet, or empty, never one
    that holds a data set or other files."""
    runs = runs_in(folder, "out")
    if runs:
        shown = ", ".join(runs[:4]) + (f" and {len(runs) - 4} more" if len(runs) > 4 else "")
        return (f"the runs here are {shown}: pass one, e.g. `{script_command()} --out_dir {shlex.quote(runs[0])}`")
    if os.path.isdir(folder) and os.listdir(folder):
        what = "a prepared data set" if os.path.isfile(os.path.join(folder, "meta.json")) else "files of other kinds"
        return f"{folder} holds {what}, not a run: pass the --out_dir of a run that train.py wrote"
    return f"train one with `python train.py --out_dir {shlex.quote(folder)}`"


def read_checkpoint(path, keys=("model_name", "model_args", "model"), mmap=False):
    """The dict train.py saved at path, holding at least `keys`; ConfigError for a missing, truncated, empty or
    foreign file (a bare state_dict), so that train --resume, sample.py, eval.py, hf/export.py, tools/bench.py and
    tools/sweep.py all say it in one line. The one reader of checkpoints: torch.load(weights_only=True) unpickles
    tensors and plain containers only (what train.py saves, in every version), so that a checkpoint someone hands
    you cannot run code; one that holds anything else is refused, naming it. mmap: the tensors stay in the file (a
    reader of a few numbers does not read the weights)."""
    if os.path.isdir(path):
        raise ConfigError(f"the checkpoint {path} is a folder, not a file; move it away, or pass the run folder "
                          "that holds train.py's ckpt.pt")
    if os.path.exists(path):  # a FIFO, a socket or a device is refused before it is opened
        regular_file(path, "the checkpoint", "pass a run folder that holds train.py's ckpt.pt")
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        if os.path.basename(path) != "ckpt.pt":  # a .pt file of the user's own: train.py would write ckpt.pt
            there = os.path.isfile(os.path.join(folder, "ckpt.pt"))
            raise ConfigError(f"no checkpoint at {path}; pass an existing .pt file or a run folder"
                              f"{f' (perhaps --out_dir {shlex.quote(folder)}, which holds ckpt.pt)' if there else ''}")
        raise ConfigError(f"no checkpoint at {path}; {missing_run_hint(folder)}")
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
    checked(ckpt, CHECKPOINT, path, "restore it from a copy, or train again")
    missing = [k for k in keys if k not in ckpt]
    if missing:
        raise ConfigError(f"{path} lacks {', '.join(missing)}: it was not saved by this version of train.py")
    if "model" in keys:  # the weights as the model file it names loads them (older files' joined)
        ckpt["model"] = checked_model_weights(ckpt, path)
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


def join_fused(state, names, config):
    """A new state dict: that of a checkpoint written before q, k and v (or w1 and w3) were one matmul, with its
    separate projections joined into the wqkv and w13 among names, the model's (the same numbers, so the same logits
    and the same greedy text); any other state as it is."""
    joined = dict(state)
    for name in names:
        parts, _ = separate(name, config)
        if parts and name not in joined and all(n in joined for n in parts):
            joined[name] = torch.cat([joined.pop(n) for n in parts])
    return joined


def check_weights(state, expected, config, path, what):
    """state (a dict of tensors) against expected (the state dict of the model that loads it, on the meta device or
    not), after joining older files' separate projections; ConfigError, naming path, if a name or shape differs, a
    floating-point weight is not (an integer or complex one would be cast silently) or is not finite. Returns the
    state dict the model loads."""
    if not isinstance(state, dict) or not all(isinstance(k, str) and torch.is_tensor(t) for k, t in state.items()):
        raise ConfigError(f"the weights in {path} are not a state_dict of tensors; restore it from a copy or train "
                          "again")
    state = join_fused(state, expected, config)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [n for n in expected if n in state and tuple(state[n].shape) != tuple(expected[n].shape)]
    if missing or unexpected or wrong:
        first = (f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}" if unexpected else
                 f"{wrong[0]} is {tuple(state[wrong[0]].shape)}, not {tuple(expected[wrong[0]].shape)}")
        raise ConfigError(f"{path} does not fit {what} ({first}); it was saved by another version of that file")
    kind = next((n for n, t in state.items() if expected[n].is_floating_point() and not t.is_floating_point()), None)
    if kind is not None:
        raise ConfigError(f"the weights in {path} hold {kind} as {state[kind].dtype}, not floating-point numbers; "
                          "restore it from a copy or train again")
    bad = next((name for name, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if bad is not None:
        raise ConfigError(f"the weights in {path} hold NaN or infinity ({bad}); restore it from a copy or train again")
    return state


def weights_for(model, state, path):
    """The weights of a checkpoint or a Hugging Face folder, checked against model (check_weights), as the state
    dict model.load_state_dict takes."""
    return check_weights(state, model.state_dict(), model.config, path, f"{type(model).__module__}.py")


def checked_model_weights(ckpt, path):
    """A checkpoint's weights against the model file it names: model_args are fields of its GPTConfig within their
    constraints, and the weights have the names and shapes of the model those options build (made on the meta
    device: no memory, no arithmetic). Returns the state dict that model loads."""
    module = load_model_module(ckpt["model_name"])
    with torch.device("meta"):
        model = build_model(module, ckpt["model_args"], f"the model_args of {path}")
    return weights_for(model, ckpt["model"], path)
