"""
Plumbing a learner may skip: the readers and writers of the scripts' files. A file is opened only once it is a regular
file (opening a FIFO can wait forever), read whole and bounded (JSON strict), its fields held to their declarations
below (plumbing/config.py), and written whole or not at all; the rest is the boundary's. Last, train.py's run folder:
its lock, the checks before a run writes, and its append-only log.
"""
import contextlib
import dataclasses
import difflib
import glob
import importlib.util
import json
import os
import pathlib
import stat
import sys
import types

import filelock
import numpy as np
import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/files.py is a library module (every file's readers and writers); run `python train.py --help`")

from plumbing.config import check_record, load_model_module, model_of, option
from plumbing.errors import ConfigError, arg, handling, naming, note, printable, script_command

FILE_BYTES = 256 << 20  # the most bytes a script reads whole: a file of text, JSON or a preset (the rest is mapped)


def regular_file(path, what, fix, output=False):
    """path, once it is a regular file (or, for a file a script writes, nothing yet); else ConfigError with fix."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:  # nothing there yet (or a link to nothing), which writing makes
        mode = stat.S_IFREG if output else 0
    if not stat.S_ISREG(mode):
        kind = ("does not exist" if not mode else "is a folder, not a file" if stat.S_ISDIR(mode) else
                "is not a regular file (a FIFO, a socket or a device)")
        raise ConfigError(f"{what} {printable(path)} {kind}{', where a file is written' if output else ''}; {fix}")
    return path


@contextlib.contextmanager
def written(path, mode="w"):
    """A file whose content (text: UTF-8) replaces path, whole or not at all: a temporary file beside it (x: made
    anew, so what is in the way is neither opened nor removed), renamed at the end; a write that fails names path."""
    tmp = f"{path}.tmp-{os.getpid()}"
    f = open(tmp, mode.replace("w", "x"), encoding=None if "b" in mode else "utf-8")
    try:
        with naming(path), f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)


def read_text(path, what, fix, limit=FILE_BYTES):
    """The UTF-8 text of the regular file at path, of at most limit bytes; else ConfigError naming what and fix."""
    if os.path.getsize(regular_file(path, what, fix)) > limit:
        raise ConfigError(f"{what} {printable(path)} holds {os.path.getsize(path):,} bytes, more than the {limit:,} "
                          f"such a file may; {fix}")
    data = pathlib.Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(f"{what} {printable(path)} is not UTF-8 text (line {line}); {fix}")


def _not_json(name):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text):
    """json.loads, strict: no NaN or Infinity; a value nested deeper than its parser recurses is a ValueError too."""
    try:
        return json.loads(text, parse_constant=_not_json)
    except RecursionError:
        raise ValueError("nested too deep") from None


@dataclasses.dataclass
class AnyFields:
    """An object of fields, whatever they are: another program's file (a Hugging Face config.json)."""


def read_json(path, what, fix, record=AnyFields):
    """The JSON object of the file at path, held to record: a dataclass of the fields it declares."""
    text = read_text(path, what, fix)
    with handling(path, fix):
        value = parse_json(text)
    return check_record(record, value, path, fix)


def to_json(value, **kwargs):
    """Strict JSON, which every tool reads: a number that is not finite is written as null."""
    return json.dumps(json.loads(json.dumps(value), parse_constant=lambda name: None), allow_nan=False, **kwargs)


def write_json(path, value):
    with written(path) as f:
        f.write(to_json(value, indent=1))


# ---- data sets: data/<name>/{train,val}.bin and meta.json (prepare.py)

REDO = "run prepare.py again to remake the data set"
# the data sets prepare.py makes by name: the offline one, and those it streams from the hub (repo, config)
WEB_DATASETS = {
    "fineweb-edu": ("HuggingFaceFW/fineweb-edu", "sample-10BT"),  # the Vertical Attention paper (and Open AttnRes)
    "fineweb": ("HuggingFaceFW/fineweb", "sample-10BT"),  # the skip-middle paper
    "openwebtext": ("Skylion007/openwebtext", None),  # the SLA paper
}
DATASETS = ("shakespeare", *WEB_DATASETS)


@dataclasses.dataclass
class Meta:
    """meta.json of a prepared data set, as prepare.py writes it."""
    tokenizer: str = option(None, "byte, gpt2 or hf:DIR", required=True)
    vocab_size: int = option(None, "token ids are below it", min=1, required=True)
    dtype: str = option(None, "of the .bin files", choices=("uint16", "uint32"), required=True)
    eot_token: int = option(None, "the id between documents", min=0)
    train_tokens: int = option(None, "tokens in train.bin", min=0)
    val_tokens: int = option(None, "tokens in val.bin", min=0)
    dataset: str = option(None, "the data set's name")

    def __post_init__(self):
        if self.eot_token is not None and self.eot_token >= self.vocab_size:
            raise ValueError(f"its field eot_token {self.eot_token} is not below vocab_size {self.vocab_size}")


def prepare_hint(data_dir, dataset, options=""):
    """What to run for a data set that is not prepared: the command that makes it or puts it back, or a near name."""
    out = "" if os.path.normpath(data_dir) == "data" else f" {arg('out_dir', data_dir)}"
    if dataset in DATASETS:
        return f"run `python prepare.py --dataset {dataset}{options}{out}` first"
    if os.path.basename(dataset) != dataset or dataset in ("", ".", ".."):
        return (f"--dataset names one folder inside --data_dir, without / or .. (prepare.py makes "
                f"{', '.join(DATASETS)}, or one of your own with --files and --name)")
    left = sorted(glob.glob(os.path.join(glob.escape(data_dir), f".{glob.escape(dataset)}.old-*")))
    if left and os.path.isfile(os.path.join(left[-1], "meta.json")):  # prepare.py stopped between its two renames
        return (f"the data set sits in {printable(left[-1])}, where a prepare.py run that was stopped while replacing "
                f"it left it; rename that folder back to {printable(os.path.join(data_dir, dataset))}")
    prepared = [d for d in (os.listdir(data_dir) if os.path.isdir(data_dir) else ()) if d != dataset and all(
        os.path.isfile(os.path.join(data_dir, d, f)) for f in ("meta.json", "train.bin", "val.bin"))]
    close = difflib.get_close_matches(dataset, [*prepared, *DATASETS], 1, 0.6)
    if close and close[0] in prepared:
        return f"did you mean --dataset {close[0]}? ({printable(data_dir)} holds it)"
    if close:
        return f"did you mean --dataset {close[0]}? run `python prepare.py --dataset {close[0]}{out}` first"
    return (f"prepare.py knows no data set of that name ({', '.join(DATASETS)}); to make {printable(dataset)} from "
            f"text files of your own, run `python prepare.py --files FILE ... {arg('name', dataset)}{out}`")


def read_meta(data_dir, dataset, tokenizer=""):
    """meta.json of a prepared data set, checked, of tokenizer where one is asked for (a preset's); ConfigError names
    the fix: the prepare command, with the tokenizer."""
    folder, options = os.path.join(data_dir, dataset), f" --tokenizer {tokenizer}" if tokenizer else ""
    if not all(os.path.exists(os.path.join(folder, f)) for f in ("meta.json", "train.bin")):
        raise ConfigError(f"no prepared data in {printable(folder)} (--data_dir {printable(data_dir)}, --dataset "
                          f"{printable(dataset)}); " + prepare_hint(data_dir, dataset, options))
    meta = read_json(os.path.join(folder, "meta.json"), "the data set's meta.json", REDO, Meta)
    if tokenizer and meta["tokenizer"] != tokenizer:
        raise ConfigError(f"{printable(folder)} was prepared with the {meta['tokenizer']} tokenizer and this run asks "
                          f"for {tokenizer}; " + (prepare_hint(data_dir, dataset, options) if dataset in DATASETS else
                                                 f"prepare it again with{options}") + ", or pass --tokenizer ''")
    return meta


def open_split(data_dir, dataset, split, meta, vocab_size, block_size=0):
    """split.bin, memory-mapped once it is whole, holds a window of block_size + 1 tokens, and ids < vocab_size."""
    path = os.path.join(data_dir, dataset, f"{split}.bin")
    size, dtype = os.path.getsize(regular_file(path, f"the {split} split", REDO)), np.dtype(meta["dtype"])
    n = size // dtype.itemsize
    if size % dtype.itemsize or meta.get(f"{split}_tokens", n) != n:  # a wrong dtype in meta.json shows here too
        raise ConfigError(f"{printable(path)} holds {size} bytes, not the {meta.get(f'{split}_tokens', '?')} "
                          f"{meta['dtype']} tokens meta.json says: it is cut short or meta.json is wrong; {REDO}")
    if n < block_size + 2:  # a window reads T + 1 tokens, drawn from at least 1 offset
        fix = (f"lower --block_size to {n - 2} or less, or prepare more data" if n >= 3 else
               "prepare more text (prepare.py --val_fraction sets the validation split's share)")
        raise ConfigError(f"the {split} split of {printable(dataset)} holds {n} tokens, too few for --block_size "
                          f"{block_size}; {fix}")
    data = np.memmap(path, dtype=dtype, mode="r")
    stretch = max(1, min(n, 1 << 24) // 64)  # all of a small split, else 64 stretches spread over it
    top = max(int(data[i:i + stretch].max()) for i in range(0, n, max(stretch, n // 64)))
    if top >= vocab_size:
        raise ConfigError(f"{printable(path)} holds token id {top} but the model's vocab_size is {vocab_size} "
                          f"(meta.json: {meta['vocab_size']}); {REDO}")
    return data


@dataclasses.dataclass
class LogRecord:
    """The fields of a record of a run's log.jsonl (train.py's Log) that the scripts read."""
    iter: int = option(None, "the step", min=0, required=True)
    tokens: int = option(None, "tokens seen", min=0)
    loss: float = option(None, "the training loss")
    val_loss: float = option(None, "the validation loss")


# ---- train.py's checkpoint: out_dir/ckpt.pt

@dataclasses.dataclass
class Checkpoint:
    """The fields of ckpt.pt the scripts read: meta, train_config and run are held to Meta, TrainedOn and RunShape,
    the weights' names and shapes, the optimiser and random states by torch as they load."""
    model_name: str = option(None, "model_<model_name>.py", required=True)
    label: str = option(None, "the --model it was trained with: model_name, or a label of the tables, model_name-variant")
    model_args: dict = option(None, "every field of its GPTConfig", required=True)
    model: dict = option(None, "the state_dict", required=True)
    iter_num: int = option(None, "the step", min=0)
    tokens_seen: int = option(None, "tokens trained on", min=0)
    best_val_loss: float = option(None, "the best validation loss")


@dataclasses.dataclass
class TrainedOn:
    """The options of train_config that scripts other than train.py read."""
    data_dir: str = option(None, "", path=True)
    dataset: str = option(None, "")
    init_from: str = option(None, "", path=True)


@dataclasses.dataclass
class RunShape:
    """The fields of a checkpoint's run (train.py's Log.run) that a resumed run and the curves read: its batch."""
    gradient_accumulation_steps: int = option(None, "micro-steps per optimiser step", min=1, required=True)
    tokens_per_step: int = option(None, "tokens per optimiser step", min=1)


def perhaps(folder):
    """" (perhaps --out_dir FOLDER, which holds ckpt.pt)" where it does, else "": a hint that works when followed."""
    there = os.path.isfile(os.path.join(folder, "ckpt.pt"))
    return f" (perhaps {arg('out_dir', folder)}, which holds ckpt.pt)" if there else ""


def checkpoint_path(out_dir):
    """The checkpoint file of --out_dir: a run folder's ckpt.pt, or a .pt file itself."""
    if os.path.isfile(out_dir) and not out_dir.endswith(".pt"):
        raise ConfigError(f"--out_dir {printable(out_dir)} is a file, not a run folder or a .pt checkpoint; pass the "
                          f"run folder that holds ckpt.pt{perhaps(os.path.dirname(out_dir) or '.')}")
    return out_dir if out_dir.endswith(".pt") else os.path.join(out_dir, "ckpt.pt")


def missing_run_hint(path):
    """What to do where there is no checkpoint at path: a run beside it or in out/, or train one where that makes
    sense."""
    folder = os.path.dirname(path) or "."
    if os.path.basename(path) != "ckpt.pt":
        return f"pass an existing .pt file or a run folder{perhaps(folder)}"
    runs = sorted({f for d in (folder, "out") for f in [d, *glob.glob(os.path.join(glob.escape(d), "*"))]
                   if os.path.isfile(os.path.join(f, "ckpt.pt"))})
    if runs:
        shown = ", ".join(map(printable, runs[:4])) + (f" and {len(runs) - 4} more" if len(runs) > 4 else "")
        return f"the runs here are {shown}: pass one, e.g. `{script_command()} {arg('out_dir', runs[0])}`"
    if os.path.isdir(folder) and os.listdir(folder):
        what = "a prepared data set" if os.path.isfile(os.path.join(folder, "meta.json")) else "files of other kinds"
        return f"{printable(folder)} holds {what}, not a run: pass the --out_dir of a run that train.py wrote"
    return f"train one with `python train.py {arg('out_dir', folder)}`"


def read_checkpoint(path, keys=(), mmap=False):
    """The dict train.py saved at path, read with weights_only (it runs no code), with keys, held to Checkpoint."""
    fix = "restore it from a copy, or train again"
    regular_file(path, "the checkpoint", missing_run_hint(path) if not os.path.lexists(path) else  # (any other
                 "pass a run folder that holds train.py's ckpt.pt")  # OSError, a link that loops: the boundary's)
    with handling(path, f"the file is truncated, empty or not a checkpoint; {fix}"):
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    if not isinstance(ckpt, dict) or "model_name" not in ckpt:
        bare = isinstance(ckpt, dict) and ckpt and all(torch.is_tensor(v) for v in ckpt.values())
        raise ConfigError(f"{printable(path)} is not a checkpoint of train.py: it has no model_name"
                          f"{' (it is a bare state_dict)' if bare else ''}; pass a run folder that train.py wrote")
    check_record(Checkpoint, ckpt, path, fix)
    for name, record in (("meta", Meta), ("train_config", TrainedOn), ("run", RunShape)):
        if ckpt.get(name) is not None:
            check_record(record, ckpt[name], f"{path}'s {name}", fix)
    fields = [f.name for f in dataclasses.fields(load_model_module(ckpt["model_name"]).GPTConfig)]
    missing = [k for k in keys if k not in ckpt] + [f"model_args' {n}" for n in fields if n not in ckpt["model_args"]]
    if missing:  # (for a field model_args lack, GPTConfig would take its default: another model than was trained)
        raise ConfigError(f"{printable(path)} lacks {', '.join(missing)}: it was saved by another version of train.py "
                          f"or model_{ckpt['model_name']}.py; use that version, or train again")
    for name, weight in ckpt["model"].items():  # which load_state_dict would cast to its parameter's dtype, unasked
        if torch.is_tensor(weight) and not weight.is_floating_point():
            raise ConfigError(f"{printable(path)}: its weight {name} is {weight.dtype}, not floating point; {fix}")
    return ckpt


def save_checkpoint(path, ckpt):
    """Whole or not at all (written()): a crash or a full disk mid-write never leaves half a ckpt.pt."""
    with written(path, "wb") as f:
        torch.save(ckpt, f)


# ---- train.py's run folder: the checks before a run writes, where a later failure would lose data or waste the
# run (its lock, a checkpoint that fits a --resume), and its append-only log

RUN_FILES = ("ckpt.pt", "log.jsonl", "log.superseded.jsonl")  # what a run writes in its folder
LOCK = ".lock"  # held by the run in the folder, and gone when it ends
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
    if ckpt["model_name"] != model_of(cfg.model)[0].__name__[6:]:  # the model file; its options are checked below
        raise ConfigError(f"{printable(path)} was trained with --model {ckpt.get('label', ckpt['model_name'])}, not "
                          f"{cfg.model}; drop --model (a resumed run is the checkpoint's model) or choose another "
                          "--out_dir")
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


def held(path, timeout=0):
    """A filelock on path, or None where another process holds it."""
    lock = filelock.FileLock(path)
    with contextlib.suppress(filelock.Timeout):
        if lock.acquire(timeout=timeout) and os.path.exists(path):  # (gone: its holder removed it as it let go)
            return lock
        lock.release()


def let_go(lock):  # its file removed first: a process that then takes the lock on that file has none (held())
    with contextlib.suppress(OSError):  # (where the system keeps an open file, filelock removes it as it lets go)
        os.remove(lock.lock_file)
    lock.release()


@contextlib.contextmanager
def run_folder(out_dir):
    """out_dir made and locked (held) till the run ends: a second run in it is refused however the two are timed."""
    made = [p for p in [out_dir, *pathlib.Path(os.path.normpath(out_dir)).parents] if not os.path.exists(p)]
    os.makedirs(out_dir, exist_ok=True)  # an OSError here is the boundary's, naming --out_dir
    if (lock := held(os.path.join(out_dir, LOCK))) is None:
        raise ConfigError(f"another run is writing to {printable(out_dir)}; wait for it to end or choose another "
                          "--out_dir")
    try:
        yield
    finally:
        let_go(lock)
        for folder in made:  # deepest first: a run that wrote nothing leaves no folder it made (one with a file stays)
            with contextlib.suppress(OSError):
                os.rmdir(folder)


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
