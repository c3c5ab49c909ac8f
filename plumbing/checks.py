"""
Plumbing a learner may skip: train.py's checks before it writes, where a later failure would lose data or waste the
run (the run folder's lock, a checkpoint that fits a --resume), and the run's append-only log.
"""
import contextlib
import dataclasses
import fcntl
import glob
import importlib.util
import os
import pathlib
import sys
import types

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/checks.py is a library module (train.py's checks before a run); run `python train.py --help`")

from plumbing.config import check_record
from plumbing.errors import ConfigError, arg, naming, note, printable
from plumbing.files import parse_json, read_checkpoint, regular_file, written

RUN_FILES = ("ckpt.pt", "log.jsonl", "log.superseded.jsonl")  # what a run writes in its folder
# what a resumed run may change of the saved run, said in a note: its data, optimiser, schedule, seed, dtype
CHANGES = ("dataset", "data_dir", "learning_rate", "weight_decay", "beta1", "beta2", "adam_eps", "grad_clip",
           "decay_lr", "warmup_iters", "min_lr", "warmup_start", "seed", "dtype", "eval_iters")


def check_run(cfg):
    """--wandb_log has wandb; no FIFO or folder where the run writes a file; a checkpoint there only with --resume."""
    if cfg.wandb_log and importlib.util.find_spec("wandb") is None:
        raise ConfigError("--wandb_log needs the wandb package; `pip install wandb` or drop the option")
    for name in RUN_FILES:
        regular_file(os.path.join(cfg.out_dir, name), "the run's file", "move it away", output=True)
    if not cfg.resume and os.path.exists(os.path.join(cfg.out_dir, "ckpt.pt")):
        raise ConfigError(f"{printable(cfg.out_dir)} already holds a checkpoint; pass --resume to continue it or "
                          "choose another --out_dir")


def read_resume(cfg, model_args, explicit, meta):
    """The checkpoint --resume continues, once its train_config, step, model and tokenizer fit this command."""
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    ckpt = read_checkpoint(path, ("model_args", "optimizer", "iter_num", "best_val_loss", "rng", "meta"))
    was = check_record(type(cfg), ckpt.get("train_config") or {}, f"{path}'s train_config", "restore it from a copy")
    if ckpt["iter_num"] > cfg.max_iters:
        raise ConfigError(f"the run in {printable(cfg.out_dir)} is at step {ckpt['iter_num']}, past --max_iters "
                          f"{cfg.max_iters}: nothing to train; pass --max_iters above {ckpt['iter_num']} to go on")
    if ckpt["model_name"] != cfg.model:
        raise ConfigError(f"{printable(path)} was trained with --model {ckpt['model_name']}, not {cfg.model}; drop "
                          "--model (a resumed run is the checkpoint's model) or choose another --out_dir")
    saved = ckpt["model_args"]
    differ = [f"--{k} {v} (saved: {saved.get(k)})" for k, v in model_args.items()
              if k in explicit and v != saved.get(k)]
    if differ:
        raise ConfigError(f"--resume continues the model saved in {printable(path)}, and these options would change "
                          f"it: {', '.join(differ)}; drop them, or start a new run in another --out_dir")
    trained = ckpt["meta"]
    if (trained["tokenizer"], trained["vocab_size"]) != (meta["tokenizer"], meta["vocab_size"]):
        there = f"{arg('dataset', was.get('dataset', '?'))} {arg('data_dir', was.get('data_dir', cfg.data_dir))}"
        raise ConfigError(f"{printable(path)} was trained on data of the {trained['tokenizer']} tokenizer (vocab "
                          f"{trained['vocab_size']}), not {meta['tokenizer']}'s (vocab {meta['vocab_size']}); pass "
                          f"its data ({there}) or data prepared with --tokenizer {trained['tokenizer']}")
    return ckpt


def note_changes(cfg, ckpt, lr_factor):
    """A note of each option of CHANGES that a resumed run sets otherwise than it saved, and of its learning rate."""
    saved, step = ckpt.get("train_config") or {}, ckpt["iter_num"]
    changed = {k: saved[k] for k in CHANGES if k in saved and saved[k] != getattr(cfg, k)}
    if not changed:
        return
    horizon = saved.get("lr_decay_iters") or saved.get("max_iters") or 0  # the saved run's cosine
    was = types.SimpleNamespace(**{**dataclasses.asdict(cfg), **changed, "lr_decay_iters": horizon})
    lr_now, lr_was = cfg.learning_rate * lr_factor(step, cfg), was.learning_rate * lr_factor(step, was)
    lr = f"; its learning rate at step {step} is {lr_now:.3g}, the saved run's {lr_was:.3g}" if lr_now != lr_was else ""
    note("the run resumes with options other than it saved: "
         + ", ".join(f"--{k} {getattr(cfg, k)} (saved: {v})" for k, v in changed.items()) + lr)


@contextlib.contextmanager
def run_folder(out_dir, take=True):
    """out_dir made and locked (flock) till the run ends: a second run in it is refused however the two are timed."""
    if not take:  # a torchrun process but rank 0's, which takes it for all
        return (yield)
    made = [p for p in [out_dir, *pathlib.Path(os.path.normpath(out_dir)).parents] if not os.path.exists(p)]
    os.makedirs(out_dir, exist_ok=True)  # an OSError here is the boundary's, naming --out_dir
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not os.path.samestat(os.fstat(fd), os.stat(out_dir)):  # a folder that the other run removed meanwhile
                raise BlockingIOError
        except OSError:
            made = []  # the other run's now
            raise ConfigError(f"another run is writing to {printable(out_dir)}; wait for it to end or choose another "
                              "--out_dir")
        yield
    finally:
        for folder in made:  # deepest first: a run that wrote nothing leaves no folder it made
            if os.path.isdir(folder) and not os.listdir(folder):
                os.rmdir(folder)
        os.close(fd)  # the lock goes with it


def settle_log(out_dir, resume_step):
    """log.jsonl keeps the records up to resume_step; the rest move to log.superseded.jsonl: nothing is deleted."""
    for tmp in glob.glob(os.path.join(glob.escape(out_dir), "*.tmp*")):  # (the folder is this run's: locked)
        if os.path.isfile(tmp) and os.path.basename(tmp).split(".tmp")[0] in RUN_FILES:
            os.remove(tmp)
    log_path = os.path.join(out_dir, "log.jsonl")
    if not os.path.exists(log_path):
        return
    keep, move = [], []
    with open(log_path, "rb") as f:
        for line in f:
            try:  # (a new run's resume_step None, or a line that is no record: a TypeError, KeyError or ValueError)
                kept = parse_json(line)["iter"] <= resume_step
            except (ValueError, TypeError, KeyError):
                kept = False
            (keep if kept else move).append(line if line.endswith(b"\n") else line + b"\n")
    if move:
        superseded = os.path.join(out_dir, "log.superseded.jsonl")
        with naming(superseded), open(superseded, "ab") as f:  # a regular file (check_run)
            f.writelines(move)
    with written(log_path, "wb") as f:
        f.writelines(keep)
