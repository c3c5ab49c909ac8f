"""
Plumbing a learner may skip: every file a script reads goes through these readers, so that a bad one ends in one
line naming it, and every file a script writes is checked like one it reads (output_file) and written whole or not
at all, by a writer that opens nothing that can block (written). Every reader is bounded: a file read whole holds at
most FILE_BYTES, a JSON value nests at most JSON_DEPTH deep, and JSON is strict (no NaN or Infinity). meta.json of a
prepared data set and its token splits are checked here, the splits by every reader alike (open_split).
"""
import contextlib
import difflib
import glob
import json
import math
import os
import shlex
import stat
import sys

import numpy as np
import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/files.py is a library module (the readers and writers of every file the scripts use); run a "
             "script, e.g. `python train.py --help`")

from plumbing.errors import ConfigError
from plumbing.schemas import META, checked


def regular_file(path, what, fix, output=False):
    """path, after checking that it is a regular file (or a link to one), or, for a file a script writes (output),
    nothing yet: ConfigError, naming what it is and the fix, for one that is missing (to read), a folder, or a FIFO, a
    socket or a device, refused before it is opened (reading a FIFO waits for a writer, writing one for a reader, that
    may never come)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if output:  # nothing there yet (or a link to nothing, which writing makes)
            return path
        raise ConfigError(f"{what} {path} does not exist; {fix}")
    except OSError as e:
        raise ConfigError(f"cannot {'write' if output else 'read'} {what} {path} ({e.strerror}); {fix}")
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{what} {path} is a folder, {'where a file is written' if output else 'not a file'}; {fix}")
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{what} {path} is not a regular file (a FIFO, a socket or a device), "
                          f"{'where a file is written' if output else 'which is not read'}; {fix}")
    return path


def output_file(path, what, fix):
    """path, after checking that a script can write a file there (regular_file of an output)."""
    return regular_file(path, what, fix, output=True)


@contextlib.contextmanager
def written(path, mode="w"):
    """A file object whose content replaces path, whole or not at all, when the block ends without an error: it is a
    temporary file beside path, created anew (O_EXCL: whatever is in the way, a FIFO included, is not opened, so that
    nothing waits), then renamed over path. Every writer of a whole file writes through here."""
    tmp = f"{path}.tmp-{os.getpid()}"
    if os.path.isfile(tmp) and not os.path.islink(tmp):
        os.remove(tmp)  # left by a killed process of the same id
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        raise ConfigError(f"cannot write {path}: {tmp} is in the way (not a regular file); move it away")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)


# the most bytes a script reads whole: a file of text, JSON or a preset (the token splits and the weights are mapped)
FILE_BYTES = 256 << 20


def read_bytes(path, what, fix, limit=FILE_BYTES):
    """The bytes of the regular file at path (regular_file()); ConfigError (naming what it is and the fix) if it
    cannot be read, or holds more than limit bytes."""
    regular_file(path, what, fix)
    try:
        if os.path.getsize(path) > limit:
            raise ConfigError(f"{what} {path} holds {os.path.getsize(path):,} bytes, more than the {limit:,} such a "
                              f"file may; {fix}")
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path} ({e.strerror}); {fix}")


def read_text(path, what, fix, limit=FILE_BYTES):
    """The UTF-8 text of the file at path (read_bytes' checks, and not UTF-8)."""
    data = read_bytes(path, what, fix, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(f"{what} {path} is not UTF-8 text (line {line}); {fix}")


def _not_json(name):
    raise ValueError(f"{name} is not a JSON number")


JSON_DEPTH = 64  # the deepest nesting of a JSON value the scripts read (theirs is 5 deep at most)


def parse_json(text):
    """json.loads, refusing NaN and Infinity (Python's json takes them; JSON has no such numbers) and a value nested
    more than JSON_DEPTH deep (the parser recurses into it: deep enough, a RecursionError); ValueError says which."""
    try:
        value = json.loads(text, parse_constant=_not_json)
    except RecursionError:
        raise ValueError(f"nested more than {JSON_DEPTH} deep")
    level, items = 0, [value]
    while items:  # breadth first, a level at a time: no recursion
        level, items = level + 1, [v for item in items
                                   for v in (item.values() if isinstance(item, dict) else
                                             item if isinstance(item, list) else ())]
        if level > JSON_DEPTH:
            raise ValueError(f"nested more than {JSON_DEPTH} deep")
    return value


def read_json(path, what, fix):
    """The JSON value in the file at path; ConfigError for every way it can be wrong, naming where."""
    text = read_text(path, what, fix)
    try:
        return parse_json(text)
    except (ValueError, MemoryError) as e:
        reason = " ".join(str(e).split())[:120] or "too large to read"
        raise ConfigError(f"{what} {path} is not readable JSON ({reason}); {fix}")


def read_object(path, what, fix):
    """The JSON object in the file at path (read_json()); ConfigError if the file holds another value."""
    value = read_json(path, what, fix)
    if not isinstance(value, dict):
        raise ConfigError(f"{what} {path} is not a JSON object; {fix}")
    return value


def json_safe(value):
    """value with every float that is not finite replaced by None, in dicts, lists and tuples too."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def has_nonfinite(value):
    """Whether value holds a float that is not finite (which to_json() writes as null)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return any(has_nonfinite(v) for v in items)


def to_json(value, **kwargs):
    """Strict JSON, which every tool reads: a value that is not finite becomes null (json_safe())."""
    return json.dumps(json_safe(value), allow_nan=False, **kwargs)


REDO = "run prepare.py again to remake the data set"

# the data sets prepare.py makes by name (its --dataset, and what a hint names): the offline one, and those streamed
# from the Hugging Face hub, as name -> (hub repo, config); all are parquet shards
WEB_DATASETS = {
    "fineweb-edu": ("HuggingFaceFW/fineweb-edu", "sample-10BT"),  # the Vertical Attention paper (and Open AttnRes)
    "fineweb": ("HuggingFaceFW/fineweb", "sample-10BT"),  # the skip-middle paper
    "openwebtext": ("Skylion007/openwebtext", None),  # the SLA paper
}
DATASETS = ("shakespeare", *WEB_DATASETS)


def prepare_hint(data_dir, dataset):
    """What to run for a data set that is not prepared: the command that makes it where prepare.py knows its name,
    else the nearest name (a typo) prepare.py knows or data_dir holds, else how to make one of your own files."""
    out = "" if os.path.normpath(data_dir) == "data" else f" --out_dir {shlex.quote(data_dir)}"
    if dataset in DATASETS:
        return f"run `python prepare.py --dataset {dataset}{out}` first"
    if os.path.basename(dataset) != dataset or dataset in ("", ".", ".."):
        return (f"--dataset names one folder inside --data_dir, without / or .. (prepare.py makes "
                f"{', '.join(DATASETS)}, or one of your own with --files and --name)")
    left = sorted(glob.glob(os.path.join(glob.escape(data_dir), f".{glob.escape(dataset)}.old-*")))
    if left and os.path.isfile(os.path.join(left[-1], "meta.json")):  # prepare.py stopped between its two renames
        folder = os.path.join(data_dir, dataset)
        return (f"the data set sits in {left[-1]}, where a prepare.py run that was stopped while replacing it left it; "
                f"put it back with `mv {shlex.quote(left[-1])} {shlex.quote(folder)}`")
    prepared = [d for d in (os.listdir(data_dir) if os.path.isdir(data_dir) else ()) if d != dataset and all(
        os.path.isfile(os.path.join(data_dir, d, f)) for f in ("meta.json", "train.bin", "val.bin"))]
    close = difflib.get_close_matches(dataset, [*prepared, *DATASETS], 1, 0.6)
    if close and close[0] in prepared:
        return f"did you mean --dataset {close[0]}? ({data_dir} holds it)"
    if close:
        return f"did you mean --dataset {close[0]}? run `python prepare.py --dataset {close[0]}{out}` first"
    return (f"prepare.py knows no data set of that name ({', '.join(DATASETS)}); to make {dataset} from text files of "
            f"your own, run `python prepare.py --files FILE ... --name {shlex.quote(dataset)}{out}`")


def read_meta(data_dir, dataset):
    """meta.json of a prepared data set, checked; ConfigError names the fix."""
    folder = os.path.join(data_dir, dataset)
    meta_path = os.path.join(folder, "meta.json")
    if not (os.path.exists(meta_path) and os.path.exists(os.path.join(folder, "train.bin"))):
        raise ConfigError(f"no prepared data in {folder} (--data_dir {data_dir}, --dataset {dataset}); "
                          + prepare_hint(data_dir, dataset))
    return checked(read_json(meta_path, "the data set's meta.json", REDO), META, meta_path, REDO)


def split_tokens(data_dir, dataset, split, meta):
    """The number of tokens in split.bin, after checking that the file is whole and matches meta.json."""
    path = os.path.join(data_dir, dataset, f"{split}.bin")
    if not os.path.exists(path):
        raise ConfigError(f"no {path}; {REDO}")
    regular_file(path, f"the {split} split", REDO)  # not a folder, a FIFO, a socket or a device
    size, itemsize = os.path.getsize(path), np.dtype(meta["dtype"]).itemsize
    if size % itemsize:
        raise ConfigError(f"{path} holds {size} bytes, not a whole number of {meta['dtype']} tokens: it is cut "
                          f"short or meta.json names the wrong dtype; {REDO}")
    n = size // itemsize
    if meta.get(f"{split}_tokens", n) != n:  # a wrong dtype in meta.json shows here too
        raise ConfigError(f"{path} holds {n} {meta['dtype']} tokens but meta.json says {meta[f'{split}_tokens']}; "
                          f"{REDO}")
    return n


def open_split(data_dir, dataset, split, meta, vocab_size):
    """split.bin as a read-only memmap of meta's dtype, once split_tokens() has found it a whole regular file that
    matches meta.json (opening a FIFO would wait for a writer), holding only ids below vocab_size, the model's (read
    whole where it is small, else 64 stretches spread over it). Every reader of a split opens it here, so that each
    refuses what train.py refuses."""
    split_tokens(data_dir, dataset, split, meta)
    path = os.path.join(data_dir, dataset, f"{split}.bin")
    data = np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r") if os.path.getsize(path) else np.zeros(0, np.uint16)
    stretch = max(1, min(len(data), 1 << 24) // 64)  # all of a small split, else 64 evenly spread stretches
    top = max((int(data[i:i + stretch].max()) for i in range(0, len(data), max(stretch, len(data) // 64))), default=0)
    if top >= vocab_size:
        raise ConfigError(f"{path} holds token id {top} but the model's vocab_size is {vocab_size} (meta.json: "
                          f"{meta['vocab_size']}); {REDO}")
    return data


def write_json(path, value, schema):
    """value as strict JSON at path, whole or not at all (written()): checked against schema first (a writer never
    replaces a file with one its readers refuse)."""
    checked(value, schema, path, "nothing was written; this is a bug of the script that wrote it")
    with written(path) as f:
        f.write(to_json(value, indent=1))


def save_checkpoint(path, ckpt):
    """Whole or not at all (written()): a crash or a full disk mid-write never leaves a half-written ckpt.pt."""
    try:
        with written(path, "wb") as f:
            torch.save(ckpt, f)
    except (OSError, RuntimeError) as e:
        raise ConfigError(f"cannot write the checkpoint {path} ({' '.join(str(e).split())[:100]}); free some space "
                          "or choose another --out_dir; the previous checkpoint is kept")
