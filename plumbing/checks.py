"""
Plumbing a learner may skip: what train.py checks before it writes anything, so that a run is a transaction: the
options, the run folder, --resume against its checkpoint (the model, the data's tokenizer, the optimiser state), a
new run's model against the data, the data splits; then the run folder's lock and append-only log. Each check
returns what it read or raises a one-line error; what the run does with it is decided in train.py.
"""
import importlib.util
import json
import os
import shlex
import sys

import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/checks.py is a library module (train.py's checks before a run); run a script, "
             "e.g. `python train.py --help`")

from plumbing.checkpoints import read_checkpoint
from plumbing.errors import ConfigError
from plumbing.files import open_split, regular_file
from plumbing.models import build_model


def check_options(cfg):
    """What the options need besides their own rules: wandb installed for --wandb_log."""
    if cfg.wandb_log and importlib.util.find_spec("wandb") is None:
        raise ConfigError("--wandb_log needs the wandb package; `pip install wandb` or drop the option")


def check_run_folder(cfg):
    """--out_dir is a folder (or not there yet), its log a regular file; a checkpoint there only with --resume, and
    one there for --resume."""
    path, log = os.path.join(cfg.out_dir, "ckpt.pt"), os.path.join(cfg.out_dir, "log.jsonl")
    if os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise ConfigError(f"--out_dir {cfg.out_dir} is a file, not a folder; choose another --out_dir")
    if os.path.exists(log):  # a folder, a FIFO, a socket or a device there is refused before it is opened
        regular_file(log, "the run's log", "move it away")
    if not cfg.resume and os.path.exists(path):
        raise ConfigError(f"{cfg.out_dir} already holds a checkpoint; pass --resume to continue it "
                          "or choose another --out_dir")
    if cfg.resume and not os.path.exists(path):
        raise ConfigError(f"--resume found no checkpoint at {path}; drop --resume to start a new run")


def read_resume(cfg, model_args, module, explicit, meta):
    """The checkpoint in out_dir that --resume continues, checked: a step below --max_iters, the same model file,
    no model option of the command line that would change its model, data of its tokenizer, and an optimiser state
    that fits its model."""
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    ckpt = read_checkpoint(path, ("model_name", "model_args", "model", "optimizer", "iter_num", "best_val_loss",
                                  "rng", "meta"))
    if ckpt["iter_num"] > cfg.max_iters:
        raise ConfigError(f"the run in {cfg.out_dir} is at step {ckpt['iter_num']}, past --max_iters {cfg.max_iters}: "
                          f"nothing to train; pass --max_iters above {ckpt['iter_num']} to go on")
    check_resume(cfg, model_args, explicit, ckpt, meta, path)
    check_optimizer_state(ckpt, module, ckpt["model_args"], cfg)
    return ckpt


def check_new_model(model_args, meta):
    """A new run's model embeds every token id of the data."""
    if model_args["vocab_size"] < meta["vocab_size"]:
        raise ConfigError(f"--vocab_size {model_args['vocab_size']} is smaller than the data's {meta['vocab_size']}; "
                          "drop the option")


def check_optimizer_state(ckpt, module, model_args, cfg):
    """The saved optimiser state fits the model it resumes: the model file's parameter groups, group by group, and
    per parameter AdamW's step and moments of its shape (the model built on the meta device: no memory)."""
    with torch.device("meta"):
        groups = build_model(module, model_args).param_groups(cfg.weight_decay)
    saved, path = ckpt["optimizer"], os.path.join(cfg.out_dir, "ckpt.pt")
    fix = f"it was saved by another version of model_{cfg.model}.py, or is damaged; restore it from a copy"
    if len(saved["param_groups"]) != len(groups) or any(
            len(s["params"]) != len(g["params"]) for s, g in zip(saved["param_groups"], groups)):
        raise ConfigError(f"the optimiser state in {path} does not fit model_{cfg.model}.py's parameter groups; {fix}")
    shapes = dict(zip((i for s in saved["param_groups"] for i in s["params"]),
                      (p.shape for g in groups for p in g["params"])))
    for i, state in saved["state"].items():
        step, *moments = (state.get(k) if isinstance(state, dict) else None for k in ("step", "exp_avg", "exp_avg_sq"))
        if not (i in shapes and all(torch.is_tensor(t) and torch.isfinite(t).all() for t in (step, *moments))
                and step.numel() == 1 and all(m.shape == shapes[i] for m in moments)):
            raise ConfigError(f"the optimiser state in {path} has no step and moments of the shape of parameter "
                              f"{i}; {fix}")


def check_shared_batch(saved, world):
    """The micro-steps per optimiser step a run was saved with can be shared by world processes."""
    if saved % world:
        raise ConfigError(f"the run was saved with {saved} micro-steps per optimiser step, which {world} "
                          f"processes cannot share; resume it on a number of processes that divides {saved}, or pass "
                          "--gradient_accumulation_steps (a new global batch)")


def check_resume(cfg, model_args, explicit, ckpt, meta, path):
    """--resume continues the saved model on data of the same tokenizer. A model option that differs from the
    checkpoint's would be ignored, so it is refused: changing the model needs a new run."""
    if ckpt["model_name"] != cfg.model:
        raise ConfigError(f"{path} was trained with --model {ckpt['model_name']}, not {cfg.model}; "
                          f"pass --model {ckpt['model_name']} or choose another --out_dir")
    saved = ckpt["model_args"]
    differ = [f"--{k} {v} (saved: {saved.get(k)})" for k, v in model_args.items()
              if k in explicit and v != saved.get(k)]
    if differ:
        raise ConfigError(f"--resume continues the model saved in {path}, and these options would change it: "
                          f"{', '.join(differ)}; drop them, or start a new run in another --out_dir")
    trained = ckpt["meta"]
    if (trained["tokenizer"], trained["vocab_size"]) != (meta["tokenizer"], meta["vocab_size"]):
        was = ckpt.get("train_config", {})
        where = f" --data_dir {shlex.quote(was['data_dir'])}" if was.get("data_dir", cfg.data_dir) != cfg.data_dir else ""
        raise ConfigError(f"{path} was trained on data of the {trained['tokenizer']} tokenizer (vocab "
                          f"{trained['vocab_size']}) but {os.path.join(cfg.data_dir, cfg.dataset)} uses "
                          f"{meta['tokenizer']} (vocab {meta['vocab_size']}); pass the --dataset it was trained on "
                          f"(--dataset {shlex.quote(was.get('dataset', '?'))}{where}) or one prepared with "
                          f"--tokenizer {trained['tokenizer']}")


def check_splits(data_dir, dataset, meta, block_size, vocab_size):
    """Both splits are whole, long enough for block_size, and hold only ids a model of vocab_size can embed."""
    for split in ("train", "val"):
        data = open_split(data_dir, dataset, split, meta)  # whole, and matching meta.json
        n = len(data)
        if n < block_size + 2:  # a window reads T + 1 tokens, drawn from at least 1 offset
            fix = (f"lower --block_size to {n - 2} or less, or prepare more data" if n >= 3 else
                   "prepare more text (prepare.py --val_fraction sets the validation split's share)")
            raise ConfigError(f"the {split} split of {dataset} holds {n} tokens, too few for --block_size "
                              f"{block_size}; {fix}")
        stretch = max(1, min(len(data), 1 << 24) // 64)  # all of a small split, else 64 evenly spread stretches
        top = max(int(data[i:i + stretch].max()) for i in range(0, len(data), max(stretch, len(data) // 64)))
        if top >= vocab_size:
            raise ConfigError(f"{os.path.join(data_dir, dataset, split + '.bin')} holds token id {top} but the "
                              f"model's vocab_size is {vocab_size} (meta.json: {meta['vocab_size']}); run prepare.py "
                              "again to remake the data set")


def lock_out_dir(out_dir):
    """Create out_dir and hold its lock for the life of the process; ConfigError when another run holds it."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        handle = open(os.path.join(out_dir, ".lock"), "a")
    except OSError as e:
        raise ConfigError(f"cannot create --out_dir {out_dir} ({e.strerror}); choose another --out_dir")
    try:
        import fcntl
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:
        pass  # no fcntl (Windows): no lock
    except OSError:
        handle.close()
        raise ConfigError(f"another run is writing to {out_dir}; wait for it to end or choose another --out_dir")
    return handle


def settle_log(out_dir, resume_step):
    """log.jsonl keeps the records up to resume_step (a new run: none); the others, and lines that are not
    records (cut short by a crash), move to log.superseded.jsonl. Nothing is deleted."""
    log_path = os.path.join(out_dir, "log.jsonl")
    if os.path.exists(os.path.join(out_dir, "ckpt.pt.tmp")):
        os.remove(os.path.join(out_dir, "ckpt.pt.tmp"))  # half a checkpoint from a run killed while saving
    if not os.path.exists(log_path):
        return
    keep, move = [], []
    with open(log_path, "rb") as f:
        for line in f:
            try:
                step = json.loads(line)["iter"]
            except (ValueError, TypeError, KeyError, UnicodeDecodeError):
                step = None
            keep_it = resume_step is not None and isinstance(step, int) and step <= resume_step
            (keep if keep_it else move).append(line if line.endswith(b"\n") else line + b"\n")
    if move:
        with open(os.path.join(out_dir, "log.superseded.jsonl"), "ab") as f:
            f.writelines(move)
    with open(log_path + ".tmp", "wb") as f:
        f.writelines(keep)
    os.replace(log_path + ".tmp", log_path)
