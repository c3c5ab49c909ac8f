"""Prints the README's quick start as shell lines, for .ci/run: every `python ...` command of the sh blocks under
"## Quick start" in the README's order, but the test command, which .ci/run runs itself. A train.py command gets
--max_iters: STEPS for a new run, twice that for a --resume, so that it trains on; the comparison's sweep gets
--train_iters STEPS (its runs otherwise train the Results' 500 steps)."""
import re
import sys

STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 50
text = open(sys.argv[1] if len(sys.argv) > 1 else "README.md", encoding="utf-8").read()
section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
for block in re.findall(r"```sh\n(.*?)```", section, re.S):
    for line in block.splitlines():
        command = line.split("  #")[0].strip()
        if not command.startswith("python ") or command.startswith("python -m pytest"):
            continue
        if command.startswith("python train.py"):
            command += f" --max_iters {2 * STEPS if '--resume' in command else STEPS}"
        if command.startswith("python -m tools.sweep"):
            command += f" --train_iters {STEPS}"
        print(command)
