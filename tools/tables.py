"""
The copies of generated tables in README.md and docs/ (each between its markers), the hardware a table names, and
the reader of the tools' results files (each tool declares its file's fields with option(), beside its options).
"""
import glob
import math
import os
import re
import shlex
import sys

import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("tools/tables.py is a library module (the generated tables of the tools); run a script, "
             "e.g. `python train.py --help`")

from common import SIZES
from plumbing.config import check_record, load_model_module
from plumbing.errors import ConfigError, printable
from plumbing.files import read_json, written

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


def marked_pages():
    """The markdown files that may hold a generated table's copy: README.md, docs/*.md and results/*.md. The README
    keeps the tables a newcomer reads; the rest live in the page about them."""
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + \
        sorted(glob.glob(os.path.join(ROOT, "results", "*.md")))


def update_readme(table, results):
    """Replace the copy of a generated table between its markers for `results` (a results folder or file),
    <!-- results:start --> and <!-- results:end -->, in whichever page holds them (marked_pages): a table moved
    from the README to a page of docs/ is still rewritten where it now is. Returns the pages written."""
    tag = os.path.normpath(results)
    marked = re.compile(rf"(<!-- {re.escape(tag)}:start -->\n).*?(<!-- {re.escape(tag)}:end -->)", re.S)
    pages = []
    for page in marked_pages():
        text = open(page, encoding="utf-8").read()
        if marked.search(text):
            with written(page) as f:
                f.write(marked.sub(lambda m: m.group(1) + table + m.group(2), text))
            pages.append(page)
    if not pages:
        print(f"note: no page (README.md, docs/*.md, results/*.md) has a <!-- {tag}:start --> marker; the table is "
              "left alone", file=sys.stderr)
    return pages


def hardware_name(device):
    """The GPU's name, or the CPU and its threads; "CUDA" for a CUDA device on a machine without one (sweep.py
    rewrites a GPU sweep's tables anywhere)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device) if torch.cuda.is_available() else "CUDA"
    import platform
    threads = torch.get_num_threads()
    return f"CPU ({platform.processor() or platform.machine()}, {threads} thread{'s' if threads > 1 else ''})"


def shape_of(args, vocab_size):
    """The model options of a tool's runs from its --size (small: the model files' own defaults, written out for the
    record), --block_size and --n_layer."""
    shape = dict(SIZES.get(args.size, {}), block_size=args.block_size, vocab_size=vocab_size)
    if args.size == "small":
        defaults = load_model_module("vanilla").GPTConfig()
        shape = {k: getattr(defaults, k) for k in ("n_embd", "ffn_hidden", "n_head", "n_layer", "n_kv_head")} | shape
    return shape | ({"n_layer": args.n_layer} if args.n_layer else {})


def chosen(runs, labels):
    """The set of labels a --runs option names ('' = all of labels); ConfigError naming those not among labels."""
    wanted = set(runs.split(",")) if runs else set(labels)
    if wanted - set(labels):
        raise ConfigError(f"unknown --runs {', '.join(sorted(wanted - set(labels)))}; choose from {', '.join(labels)}")
    return wanted


def spread(r, name, same=True):
    """A ratio of the row r ('-' where it has none): the median, and its smallest and largest where the row has them
    (same=False: only where they differ)."""
    lo, hi = (r or {}).get(f"{name}_min"), (r or {}).get(f"{name}_max")
    if not r or name not in r:
        return "-"
    return f"{r[name]:.2f}" + (f" ({lo:.2f}-{hi:.2f})" if None not in (lo, hi) and (same or lo != hi) else "")


def read_results(path, what, fix, record, field, item):
    """A tool's results file: the JSON object at path held to record (plumbing/config.py's check_record), and each
    item of its field `field` (a list, or an object of items by name) to the record item; ConfigError naming the file,
    the field and fix."""
    saved = read_json(path, what, fix, record)
    items = saved.get(field)
    if items is None:  # a required field, or null: the validator takes null where a field's default is None
        raise ConfigError(f"{printable(path)}: its field {field} is {'null' if field in saved else 'missing'}; {fix}")
    for key, value in items.items() if isinstance(items, dict) else enumerate(items):
        check_record(item, value, f"{path}'s {field}[{key}]", fix)
    return saved


def each(record, name, test, what):
    """A rule of a results record's __post_init__: its field name (a list or an object) is not null where it is
    required, and every item (a list's, or an object's values) passes test; else ValueError naming the field."""
    value = getattr(record, name)
    if value is None and record.__dataclass_fields__[name].metadata.get("required"):
        raise ValueError(f"its field {name} is null")
    if value is not None and not all(map(test, value.values() if isinstance(value, dict) else value)):
        raise ValueError(f"its field {name} holds an item that is not {what}")


def number(value):
    """A JSON number (a bool is not one; parse_json lets no NaN or infinity in)."""
    return type(value) in (int, float) and math.isfinite(value)

# the tools that were top-level files before they moved into folders, as the modules they are now
MOVED = {"bench.py": "tools.bench", "kernels.py": "tools.kernels", "gpu_tables.py": "tools.gpu_tables",
         "sweep.py": "tools.sweep", "export.py": "hf.export"}


def command_line(command):
    """The `python ...` line of a recorded command: the words after python (a list), or the whole line. A tool that
    a file records by its old top-level name (bench.py) is shown as the module it is now (-m tools.bench), which
    takes the same options."""
    words = shlex.split(command)[1:] if isinstance(command, str) else list(command)
    if words and words[0] in MOVED:
        words = ["-m", MOVED[words[0]], *words[1:]]
    return shlex.join(["python", *words])
