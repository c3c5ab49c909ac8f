"""
Plumbing a learner may skip: what train.py checks before it writes anything, only where a failure found later would
lose data or waste the run: the run folder, taken (locked) before the checks and held to the run's end; a checkpoint
there only with --resume; --resume against its checkpoint (train.py's own options, the model, the data's tokenizer);
then the run's append-only log. Each check returns what it read or raises a one-line error; what the run does with
it is decided in train.py.
"""
import contextlib
import dataclasses
import glob
import importlib.util
import os
import sys
import types

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/checks.py is a library module (train.py's checks before a run); run a script, "
             "e.g. `python train.py --help`")

from plumbing.config import check_record
from plumbing.errors import ConfigError, arg, note, printable
from plumbing.files import output_file, parse_json, read_checkpoint, written

# the files a run writes in its folder (through a temporary file beside each: plumbing/files.py's written())
RUN_FILES = ("ckpt.pt", "log.jsonl", "log.superseded.jsonl")


def check_run(cfg):
    """--wandb_log has wandb; each file the run writes in out_dir is a regular file or not there yet; a checkpoint
    there only with --resume, and one there for --resume."""
    if cfg.wandb_log and importlib.util.find_spec("wandb") is None:
        raise ConfigError("--wandb_log needs the wandb package; `pip install wandb` or drop the option")
    for name in RUN_FILES:  # a folder, a FIFO, a socket or a device there is refused before anything is opened
        output_file(os.path.join(cfg.out_dir, name), "the run's file", "move it away")
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    if not cfg.resume and os.path.exists(path):
        raise ConfigError(f"{printable(cfg.out_dir)} already holds a checkpoint; pass --resume to continue it or "
                          "choose another --out_dir")
    if cfg.resume and not os.path.exists(path):
        raise ConfigError(f"--resume found no checkpoint at {printable(path)}; drop --resume to start a new run")


def read_resume(cfg, model_args, explicit, meta):
    """The checkpoint in out_dir that --resume continues, checked: its train_config by train.py's own options
    (type(cfg)), a step below --max_iters, the same model file, no model option of the command line that would
    change its model, and data of its tokenizer."""
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    fix = "restore it from a copy, or train again"
    ckpt = read_checkpoint(path, ("model_args", "optimizer", "iter_num", "best_val_loss", "rng", "meta"))
    check_record(type(cfg), ckpt.get("train_config") or {}, f"{path}'s train_config", fix)
    if ckpt["iter_num"] > cfg.max_iters:
        raise ConfigError(f"the run in {printable(cfg.out_dir)} is at step {ckpt['iter_num']}, past --max_iters "
                          f"{cfg.max_iters}: nothing to train; pass --max_iters above {ckpt['iter_num']} to go on")
    if ckpt["model_name"] != cfg.model:
        raise ConfigError(f"{printable(path)} was trained with --model {ckpt['model_name']}, not {cfg.model}; drop "
                          "--model (a resumed run is the checkpoint's model) or choose another --out_dir")
    saved = ckpt["model_args"]
    differ = [f"--{k} {v} (saved: {saved.get(k)})" for k, v in model_args.items() if k in explicit and v != saved.get(k)]
    if differ:
        raise ConfigError(f"--resume continues the model saved in {printable(path)}, and these options would change "
                          f"it: {', '.join(differ)}; drop them, or start a new run in another --out_dir")
    trained, was = ckpt["meta"], ckpt.get("train_config") or {}
    if (trained["tokenizer"], trained["vocab_size"]) != (meta["tokenizer"], meta["vocab_size"]):
        where = f" {arg('data_dir', was['data_dir'])}" if was.get("data_dir", cfg.data_dir) != cfg.data_dir else ""
        raise ConfigError(f"{printable(path)} was trained on data of the {trained['tokenizer']} tokenizer (vocab "
                          f"{trained['vocab_size']}) but {printable(os.path.join(cfg.data_dir, cfg.dataset))} uses "
                          f"{meta['tokenizer']} (vocab {meta['vocab_size']}); pass the --dataset it was trained on "
                          f"({arg('dataset', was.get('dataset', '?'))}{where}) or one prepared with --tokenizer "
                          f"{trained['tokenizer']}")
    return ckpt


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
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConfigError(f"--out_dir {printable(out_dir)} is a file, not a folder; choose another --out_dir")
    made = [p for p in [out_dir, *parents(out_dir)] if not os.path.exists(p)]  # deepest first
    os.makedirs(out_dir, exist_ok=True)  # an OSError here is the boundary's, naming --out_dir
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            same = os.path.samestat(os.fstat(fd), os.stat(out_dir))  # not a folder that a run removed meanwhile
        except OSError:
            same = False
        if not same:
            made = []  # the other run's now
            raise ConfigError(f"another run is writing to {printable(out_dir)}; wait for it to end or choose another "
                              "--out_dir")
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
        with open(os.path.join(out_dir, "log.superseded.jsonl"), "ab") as f:  # a regular file (check_run)
            f.writelines(move)
    with written(log_path, "wb") as f:
        f.writelines(keep)
