"""
Plumbing a learner may skip: what train.py checks before it writes anything, so that a run is a transaction: the
run folder and --resume against its checkpoint, the global batch and schedule a resumed run keeps, the data splits,
one forward pass on the first batch; and the run folder's lock and append-only log.
"""
import importlib.util
import json
import math
import os
import shlex
import sys

import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/checks.py is a library module (train.py's checks before a run); run a script, "
             "e.g. `python train.py --help`")

from common import build_model, open_split
from hf import convert
from plumbing.checkpoints import read_checkpoint
from plumbing.config import make_config
from plumbing.errors import ConfigError, diverged
from plumbing.files import regular_file


def before_run(cfg, model_args, module, explicit, meta, proc):
    """Every check of the options, the run folder, the checkpoint to resume and the data, before anything is
    written. Returns (the checkpoint to resume, or None for a new run; the model options, a resumed run's those of
    its checkpoint). A resumed run keeps its global batch (proc.accum may change) and counts its tokens on."""
    if cfg.wandb_log and importlib.util.find_spec("wandb") is None:
        raise ConfigError("--wandb_log needs the wandb package; `pip install wandb` or drop the option")
    ckpt, model_args = read_run(cfg, model_args, module, explicit, meta)
    if ckpt is not None:
        check_optimizer_state(ckpt, module, model_args, cfg)
    keep_global_batch(proc, cfg, ckpt)
    if ckpt is not None:
        keep_token_count(ckpt, proc.world * proc.accum * cfg.batch_size * model_args["block_size"], proc.rank)
    check_splits(cfg.data_dir, cfg.dataset, meta, model_args["block_size"], model_args["vocab_size"])
    return ckpt, model_args


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


def keep_global_batch(proc, cfg, ckpt):
    """A resumed run takes the micro-steps per optimiser step it was saved with, whatever the number of processes
    now, so that it reads the windows the uninterrupted run would have (unless --gradient_accumulation_steps says
    otherwise)."""
    saved = (ckpt.get("run") or {}).get("gradient_accumulation_steps") if ckpt else None
    if cfg.gradient_accumulation_steps or not isinstance(saved, int) or saved == proc.world * proc.accum:
        return
    if saved % proc.world:
        raise ConfigError(f"the run was saved with {saved} micro-steps per optimiser step, which {proc.world} "
                          f"processes cannot share; resume it on a number of processes that divides {saved}, or pass "
                          "--gradient_accumulation_steps (a new global batch)")
    proc.accum = saved // proc.world
    if proc.rank == 0:
        print(f"note: resumed on {proc.world} process(es), the run keeps its global batch: {saved} micro-steps per "
              f"optimiser step, {proc.accum} per process", file=sys.stderr)


def keep_token_count(ckpt, tokens_per_step, rank):
    """A resumed run counts its tokens on from the saved count (ckpt["tokens_seen"], set here from the saved steps
    and tokens per step where an older checkpoint lacks it), at its own tokens per step, which may differ from the
    saved run's (another --batch_size or --gradient_accumulation_steps): then it says so in one note."""
    saved = (ckpt.get("run") or {}).get("tokens_per_step")
    if "tokens_seen" not in ckpt:
        ckpt["tokens_seen"] = ckpt["iter_num"] * (saved or tokens_per_step)
    if saved and saved != tokens_per_step and rank == 0:
        print(f"note: the run resumes with {tokens_per_step:,} tokens per optimiser step where it saved {saved:,}; "
              f"its token count goes on from the saved {ckpt['tokens_seen']:,} at step {ckpt['iter_num']:,}",
              file=sys.stderr)


def read_run(cfg, model_args, module, explicit, meta):
    """The checkpoint to continue (None for a new run) and the model options, after checking out_dir."""
    path, log = os.path.join(cfg.out_dir, "ckpt.pt"), os.path.join(cfg.out_dir, "log.jsonl")
    if os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise ConfigError(f"--out_dir {cfg.out_dir} is a file, not a folder; choose another --out_dir")
    if os.path.exists(log):  # a folder, a FIFO, a socket or a device there is refused before it is opened
        regular_file(log, "the run's log", "move it away")
    if not cfg.resume:
        if os.path.exists(path):
            raise ConfigError(f"{cfg.out_dir} already holds a checkpoint; pass --resume to continue it "
                              "or choose another --out_dir")
        if cfg.init_from:  # the architecture from the folder's config.json; the folder is checked here
            model_args = convert.init_args(cfg.init_from, module, dict(model_args), explicit, meta)
            try:
                make_config(module.GPTConfig, **model_args)
            except ValueError as e:
                raise ConfigError(f"{e} (model_{cfg.model}.py, from {cfg.init_from}'s config.json)")
        elif "vocab_size" not in explicit:
            model_args = {**model_args, "vocab_size": meta["vocab_size"]}
        if model_args["vocab_size"] < meta["vocab_size"]:
            raise ConfigError(f"--vocab_size {model_args['vocab_size']} is smaller than the data's "
                              f"{meta['vocab_size']}; drop the option")
        return None, model_args
    if not os.path.exists(path):
        raise ConfigError(f"--resume found no checkpoint at {path}; drop --resume to start a new run")
    ckpt = read_checkpoint(path, ("model_name", "model_args", "model", "optimizer", "iter_num", "best_val_loss",
                                  "rng", "meta"))
    if ckpt["iter_num"] > cfg.max_iters:
        raise ConfigError(f"the run in {cfg.out_dir} is at step {ckpt['iter_num']}, past --max_iters {cfg.max_iters}: "
                          f"nothing to train; pass --max_iters above {ckpt['iter_num']} to go on")
    check_resume(cfg, model_args, explicit, ckpt, meta, path)
    keep_schedule(cfg, explicit, ckpt)
    return ckpt, ckpt["model_args"]  # the architecture is the checkpoint's


def keep_schedule(cfg, explicit, ckpt):
    """A resumed run whose cosine has begun keeps its horizon, the step where it reaches min_lr (saved in the
    checkpoint's train_config): with the default --lr_decay_iters 0 the horizon would follow a new --max_iters, and
    the learning rate, already decayed, would jump at the resumed step. cfg.lr_decay_iters is set to the saved
    horizon, which the next checkpoint saves again; --lr_decay_iters given on the command line sets another. A run
    saved within its warm-up, whose learning rates did not depend on the horizon, takes the new one: it then
    equals the uninterrupted run of the new --max_iters."""
    saved = ckpt.get("train_config") or {}
    horizon = saved.get("lr_decay_iters") or saved.get("max_iters")
    if (not cfg.decay_lr or not saved.get("decay_lr", True) or "lr_decay_iters" in explicit
            or type(horizon) is not int or horizon == (cfg.lr_decay_iters or cfg.max_iters)
            or ckpt["iter_num"] <= cfg.warmup_iters):
        return
    cfg.lr_decay_iters = horizon
    if os.environ.get("RANK", "0") == "0":
        print(f"note: the run keeps its learning-rate schedule: the cosine reaches --min_lr at step {horizon} as "
              f"saved, not at --max_iters {cfg.max_iters}; pass --lr_decay_iters to set another step", file=sys.stderr)


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


def first_batch(raw_model, batch, proc, cfg, model_args, explicit, iter_num):
    """One forward pass on the first batch before anything is written, in eval mode (no dropout draws): a batch
    that does not fit, or a model whose loss is not finite from the start, fails here."""
    x, y = batch
    raw_model.eval()
    with torch.no_grad(), proc.ctx:  # memory that cannot be allocated ends at main_boundary(), as anywhere
        _, loss = raw_model(x, y)
    if not math.isfinite(loss.item()):
        raise diverged("loss of the first batch", loss.item(), iter_num, cfg, model_args, explicit, None, proc.dtype)
    raw_model.train()


def open_run_folder(out_dir, resume_step):
    """out_dir created and locked for the life of the process (the handle holds the lock), its log settled."""
    lock = lock_out_dir(out_dir)
    settle_log(out_dir, resume_step)
    return lock


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
