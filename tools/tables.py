"""
The copies of generated tables in README.md and docs/ (each between its markers), and the hardware a table names.
"""
import glob
import os
import re
import shlex
import sys

import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("tools/tables.py is a library module (the generated tables of the tools); run a script, "
             "e.g. `python train.py --help`")

from plumbing.files import written

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
