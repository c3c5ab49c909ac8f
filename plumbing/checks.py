"""
Plumbing a learner may skip: what train.py checks before it writes anything, so that a run is a transaction: the
run folder, taken (locked) before the checks and held to the run's end, and the files the run writes there; the
options; --resume against its checkpoint (the model, the data's tokenizer, the optimiser state); the data splits;
then the run's append-only log. Each check returns what it read or raises a one-line error; what the run does with
it is decided in train.py.
"""
import contextlib
import dataclasses
import glob
import importlib.util
import os
import shlex
import sys
import types

import torch

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/checks.py is a library module (train.py's checks before a run); run a script, "
             "e.g. `python train.py --help`")

from plumbing.checkpoints import read_checkpoint
from plumbing.errors import ConfigError, note
from plumbing.files import open_split, output_file, parse_json, written
from plumbing.models import build_model


def check_options(cfg):
    """What the options need besides their own rules: wandb installed for --wandb_log."""
    if cfg.wandb_log and importlib.util.find_spec("wandb") is None:
        raise ConfigError("--wandb_log needs the wandb package; `pip install wandb` or drop the option")


# the files a run writes in its folder (through a temporary file beside each: plumbing/files.py's written())
RUN_FILES = ("ckpt.pt", "log.jsonl", "log.superseded.jsonl", "ckpt.pt.tmp")  # the last: an older version's, removed


def check_run_folder(cfg):
    """--out_dir is a folder (or not there yet), and each file the run writes in it is a regular file or not there
    yet; a checkpoint there only with --resume, and one there for --resume."""
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    if os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise ConfigError(f"--out_dir {cfg.out_dir} is a file, not a folder; choose another --out_dir")
    for name in RUN_FILES:  # a folder, a FIFO, a socket or a device there is refused before anything is opened
        output_file(os.path.join(cfg.out_dir, name), "the run's file", "move it away")
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


def check_optimizer_state(ckpt, module, model_args, cfg):
    """The saved optimiser state fits the model it resumes: the model file's parameter groups, group by group, and
    per parameter AdamW's step (0 or more) and moments of its shape (the model built on the meta device: no
    memory)."""
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
                and step.numel() == 1 and not step.is_complex() and float(step) >= 0
                and all(m.shape == shapes[i] for m in moments)):
            raise ConfigError(f"the optimiser state in {path} has no step (0 or more) and moments of the shape of "
                              f"parameter {i}; {fix}")


# what a resumed run may change of the saved one, said in a note: its data, its optimiser and schedule, seed, dtype
CHANGES = ("dataset", "data_dir", "learning_rate", "weight_decay", "beta1", "beta2", "adam_eps", "grad_clip",
           "decay_lr", "warmup_iters", "min_lr", "warmup_start", "seed", "dtype", "eval_iters")


def note_changes(cfg, ckpt, lr_factor):
    """One note naming every option of CHANGES that a resumed run (cfg) sets otherwise than its checkpoint's
    train_config, and the learning rate of the resumed step where lr_factor (train.py's schedule) gives another for
    the saved options (and the saved horizon of the cosine)."""
    saved, step = ckpt.get("train_config") or {}, ckpt["iter_num"]
    changed = {k: saved[k] for k in CHANGES if k in saved and saved[k] != getattr(cfg, k)}
    if not changed:
        return
    horizon = saved.get("lr_decay_iters") or saved.get("max_iters") or 0
    was = types.SimpleNamespace(**{**dataclasses.asdict(cfg), **changed, "lr_decay_iters": horizon})
    lr_now, lr_was = cfg.learning_rate * lr_factor(step, cfg), was.learning_rate * lr_factor(step, was)
    lr = f"; its learning rate at step {step} is {lr_now:.3g}, the saved run's {lr_was:.3g}" if lr_now != lr_was else ""
    note("the run resumes with options other than it saved: "
         + ", ".join(f"--{k} {getattr(cfg, k)} (saved: {v})" for k, v in changed.items()) + lr)


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


def read_splits(data_dir, dataset, meta, block_size, vocab_size):
    """{"train": memmap, "val": memmap}: both splits opened by open_split() (whole, and holding only ids a model of
    vocab_size can embed), each long enough for block_size."""
    splits = {}
    for split in ("train", "val"):
        data = splits[split] = open_split(data_dir, dataset, split, meta, vocab_size)
        n = len(data)
        if n < block_size + 2:  # a window reads T + 1 tokens, drawn from at least 1 offset
            fix = (f"lower --block_size to {n - 2} or less, or prepare more data" if n >= 3 else
                   "prepare more text (prepare.py --val_fraction sets the validation split's share)")
            raise ConfigError(f"the {split} split of {dataset} holds {n} tokens, too few for --block_size "
                              f"{block_size}; {fix}")
    return splits


@contextlib.contextmanager
def run_folder(out_dir, take=True):
    """out_dir taken for a run before the checks that decide what it does, and held until it ends: a second run in
    it, new or resumed, is refused in one line, however the two are timed. The folder is made where it is not there
    yet (with the folders above it) and locked itself (flock on the folder: nothing is created in it); a run that
    ends before it writes anything removes the folders it made. take=False (every process of a torchrun run but rank
    0's, which takes it for all): nothing."""
    if not take or fcntl is None:  # no fcntl (Windows): no lock
        yield
        return
    made = [p for p in [out_dir, *parents(out_dir)] if not os.path.exists(p)]  # deepest first
    try:
        os.makedirs(out_dir, exist_ok=True)
        fd = os.open(out_dir, os.O_RDONLY)
    except OSError as e:
        raise ConfigError(f"cannot create --out_dir {out_dir} ({e.strerror}); choose another --out_dir")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            same = os.path.samestat(os.fstat(fd), os.stat(out_dir))  # not a folder that a run removed meanwhile
        except OSError:
            same = False
        if not same:
            made = []  # the other run's now
            raise ConfigError(f"another run is writing to {out_dir}; wait for it to end or choose another --out_dir")
        yield
    finally:
        for folder in made:  # a run that wrote nothing leaves no folder it made
            if os.path.isdir(folder) and not os.listdir(folder):
                os.rmdir(folder)
        os.close(fd)  # the lock goes with it


def parents(path):
    """The folders above path, nearest first, up to the one the path starts from."""
    out, path = [], os.path.normpath(path)
    while os.path.dirname(path) not in ("", path):
        path = os.path.dirname(path)
        out.append(path)
    return out


def settle_log(out_dir, resume_step):
    """log.jsonl keeps the records up to resume_step (a new run: none); the others, and lines that are not
    records (cut short by a crash), move to log.superseded.jsonl. Nothing is deleted."""
    log_path = os.path.join(out_dir, "log.jsonl")
    for tmp in glob.glob(os.path.join(glob.escape(out_dir), "*.tmp*")):  # half a file of a run killed while writing
        if os.path.isfile(tmp) and os.path.basename(tmp).split(".tmp")[0] in RUN_FILES:  # (the folder is this run's)
            os.remove(tmp)
    if not os.path.exists(log_path):
        return
    keep, move = [], []
    with open(log_path, "rb") as f:
        for line in f:
            try:
                step = parse_json(line)["iter"]
            except (ValueError, TypeError, KeyError, UnicodeDecodeError):
                step = None
            keep_it = resume_step is not None and isinstance(step, int) and step <= resume_step
            (keep if keep_it else move).append(line if line.endswith(b"\n") else line + b"\n")
    if move:
        with open(os.path.join(out_dir, "log.superseded.jsonl"), "ab") as f:  # a regular file (check_run_folder)
            f.writelines(move)
    with written(log_path, "wb") as f:
        f.writelines(keep)
