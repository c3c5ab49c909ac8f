"""
Every GPU table of docs/benchmarks.md in one command, each a JSON under results/<gpu>/ (results/h100/ on an H100):

    python gpu_tables.py                          # every part, in the order below
    python gpu_tables.py --parts compiled,decode  # some of them
    python gpu_tables.py --dry_run                # print the commands only

The parts, each one run of bench.py or kernels.py at the Vertical Attention paper's 300m shape, bf16 autocast,
every model file with its default settings (--runs):
    compiled     training, torch.compile, 1024 tokens: tokens/s, MFU and peak memory, as ratios to vanilla
    decode       greedy generation, eager and with the compiled decode step (sample.py --compile), batch 1
    kernels      the GPU's kernel launches per eager training step and per decode step (kernels.py --device cuda)
    eager        training without torch.compile, 1024 tokens
    compiled4096 training, torch.compile, 4096 tokens
    kernels_compiled  the Triton kernels inductor generates per training step and per decode step
Each part runs in its own process, so that one that fails leaves the others' tables; the time of each is printed,
and the command exits non-zero if any failed.

Most of the time is compiling: on one H100 each model's training step compiles for 30 to 80 s, so the six models'
steps at two lengths and their decode steps would take over 10 minutes in a row. So the command runs in two
phases. First, --jobs processes at once compile every step that a timed part will compile (bench.py --warm_only:
measuring nothing), and run the parts that only count (kernels, kernels_compiled); inductor keeps each compiled
step in its cache on disk. Then the timed parts run one after another, alone on the machine, and their models
compile from that cache in seconds.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import torch

from common import ConfigError, RunError, hardware_name, main_boundary, option, parse_simple, update_readme

PARTS = ("compiled", "decode", "kernels", "eager", "compiled4096", "kernels_compiled")
COUNTING = ("kernels_compiled", "kernels")  # the parts that time nothing: they run beside the compiling, slowest first
COMPILING = ("compiled4096", "compiled", "decode")  # the timed parts that compile, slowest first
HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class TablesConfig:
    parts: str = option(",".join(PARTS), "comma-separated parts to run, in this order: " + ", ".join(PARTS))
    runs: str = option("vertical,skiplayer,attnres,aila,skipmiddle", "bench.py's --runs: the labels measured beside "
                       "vanilla")
    out: str = option("", "folder of the JSON files; '' = results/<gpu>, the GPU's model in lower case (h100, h200)",
                      path=True, out="folder")
    repeats: int = option(3, "timed repeats per model (bench.py --repeats)", min=1)
    iters: int = option(5, "training steps per timed repeat (bench.py --iters)", min=1)
    jobs: int = option(4, "processes compiling at once before the timed parts (each holds a training step of the 300m "
                       "shape on the GPU, about 16 GB); 1 = no such phase: each timed part compiles its models itself",
                       min=1)
    update_readme: bool = option(True, "also rewrite the tables' copies in docs/ (between each JSON's markers)")
    dry_run: bool = option(False, "print the commands and run nothing (also where there is no GPU)")
    summary: bool = option(False, "run nothing: only rewrite the summary table of the JSON files in --out (no GPU "
                           "needed)")


def gpu_folder(name):
    """results/<model>: the first word of the GPU's name that looks like a model number (H100, A100, L40S, ...)."""
    words = re.findall(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return os.path.join("results", words[0].lower() if words else re.sub(r"\W+", "_", name).strip("_").lower())


def commands(args, out):
    """{part: argv} of every part asked for."""
    train = ["--size", "300m", "--device", "cuda", "--runs", args.runs, "--repeats", str(args.repeats),
             "--iters", str(args.iters), "--warmup", "2", "--sample_tokens", "8"]
    readme = ["--update_readme"] if args.update_readme else []
    runs = "vanilla," + args.runs
    every = {
        "compiled": ["bench.py", *train, "--compile", "--block_size", "1024", "--batch_size", "16",
                     "--json", f"{out}/bench_300m_1024.json"],
        "decode": ["bench.py", "--size", "300m", "--device", "cuda", "--decode", "--runs", args.runs,
                   "--decode_batches", "1", "--repeats", str(args.repeats), "--json", f"{out}/decode.json", *readme],
        "kernels": ["kernels.py", "--device", "cuda", "--runs", runs, "--json", f"{out}/kernels.json", *readme],
        "eager": ["bench.py", *train, "--block_size", "1024", "--batch_size", "16",
                  "--json", f"{out}/bench_300m_1024_eager.json"],
        "compiled4096": ["bench.py", *train, "--compile", "--block_size", "4096", "--batch_size", "4",
                         "--json", f"{out}/bench_300m_4096.json"],
        "kernels_compiled": ["kernels.py", "--device", "cuda", "--compiled", "--size", "small", "--runs", runs,
                             "--json", f"{out}/kernels_compiled.json", *readme],
    }
    wanted = args.parts.split(",")
    unknown = set(wanted) - set(PARTS)
    if unknown:
        raise ConfigError(f"unknown --parts {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    return {part: every[part] for part in PARTS if part in wanted}


def without(argv, *names):
    """argv less the options named, each with its value (a flag, --update_readme, has none)."""
    out, skip = [], False
    for i, word in enumerate(argv):
        if skip:
            skip = False
        elif word in names:
            skip = word != "--update_readme"
        else:
            out.append(word)
    return out


def warm_commands(todo, args):
    """[(name, argv)]: for each timed part that compiles, one bench.py --warm_only per model, the part's own command
    otherwise (its shapes, dtype and steps), so that inductor's cache holds exactly what the part will compile."""
    return [(f"{part} {label}", [*without(todo[part], "--runs", "--json", "--update_readme"), "--runs", label,
                                 "--warm_only"])
            for part in COMPILING if part in todo for label in ["vanilla", *args.runs.split(",")]]


def run_quietly(commands, logs):
    """[(name, argv, exit code, seconds, log file)] of scripts run one after another, each in its own process, its
    output written as it comes to logs/<name>.log (what a run stopped halfway leaves)."""
    done = []
    for name, argv in commands:
        log, t0 = os.path.join(logs, name.replace(" ", "_") + ".log"), time.perf_counter()
        with open(log, "w") as f:
            code = subprocess.run([sys.executable, *argv], cwd=HERE, stdout=f, stderr=subprocess.STDOUT).returncode
        done.append((name, argv, code, time.perf_counter() - t0, log))
    return done


def first_jobs(todo, args):
    """The first phase's jobs, each a list of (name, argv) run one after another: the counting parts together,
    then each warm command alone."""
    counting = [(part, todo[part]) for part in COUNTING if part in todo]
    return ([counting] if counting else []) + [[job] for job in warm_commands(todo, args)]


def first_phase(todo, args, out):
    """Every compile of the timed parts, --jobs at a time, and beside them the parts that only count (one after
    the other: each rewrites its table in docs/). Each job's output goes to out/logs/. Returns the counting parts
    that failed; a failed compile is only reported, since its timed part will compile (and fail) on its own."""
    logs = os.path.join(out, "logs")
    os.makedirs(logs, exist_ok=True)
    failed = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for future in as_completed([pool.submit(run_quietly, job, logs) for job in first_jobs(todo, args)]):
            for name, argv, code, seconds, log in future.result():
                print(f"# {name}: {shlex.join(['python', *argv])}\n"
                      f"# {name}: {'done' if code == 0 else f'failed (exit {code})'} in {seconds:.0f} s; its output: "
                      f"{log}", flush=True)
                if name in COUNTING or code:
                    output = open(log).read()
                    print(output if name in COUNTING else output[-3000:], end="", flush=True)
                if code and name in COUNTING:
                    failed.append(name)
    return failed


def summary(out):
    """One table of every model's ratios to vanilla in the JSON files of out: compiled training speed, MFU and peak
    memory at 1024 tokens, compiled decoding at batch 1, eager training, compiled training at 4096 tokens."""
    def read(name):
        path = os.path.join(out, name)
        return json.load(open(path)) if os.path.exists(path) else None

    compiled, eager, long, decode = (read(n) for n in ("bench_300m_1024.json", "bench_300m_1024_eager.json",
                                                       "bench_300m_4096.json", "decode.json"))
    first = next((t for t in (compiled, decode, eager, long) if t), None)
    if first is None:
        raise ConfigError(f"--summary: no bench.py JSON file in {out}; run the parts first")
    rows = {}
    for key, table in (("compiled", compiled), ("eager", eager), ("long", long)):
        for r in (table or {}).get("results", []):
            rows.setdefault(r["label"], {})[key] = r
    for r in (decode or {}).get("results", []):
        if r["mode"] == "compiled" and r["batch"] == 1 and "decode_ratio" in r:
            rows.setdefault(r["label"], {})["decode"] = r

    def ratio(r, key, field):
        x = r.get(key)
        if x is None or field not in x:
            return "-"
        lo, hi = x.get(f"{field}_min"), x.get(f"{field}_max")
        return f"{x[field]:.2f}" + (f" ({lo:.2f}-{hi:.2f})" if lo is not None and lo != hi else "")
    lines = [f"{first['hardware']}, {first['dtype']}, torch {first['torch']}, the 300m shape; ratios to vanilla "
             "(median, in brackets the smallest and largest of the interleaved repeats):", "",
             "| model | compiled tok/s (1024) | MFU | MFU x vanilla | peak memory | compiled decode (B 1) | eager "
             "tok/s (1024) | compiled tok/s (4096) |", "|---|--:|--:|--:|--:|--:|--:|--:|"]
    base = rows.get("vanilla", {}).get("compiled", {})
    for label, r in rows.items():
        c = r.get("compiled", {})
        mfu = f"{100 * c['mfu']:.1f}%" if c.get("mfu") else "-"
        mfu_ratio = f"{c['mfu'] / base['mfu']:.2f}" if c.get("mfu") and base.get("mfu") else "-"
        mem = f"{c['peak_mem_ratio']:.2f}" if "peak_mem_ratio" in c else "-"
        lines.append(f"| {label} | {ratio(r, 'compiled', 'train_speed_ratio')} | {mfu} | {mfu_ratio} | {mem} | "
                     f"{ratio(r, 'decode', 'decode_ratio')} | {ratio(r, 'eager', 'train_speed_ratio')} | "
                     f"{ratio(r, 'long', 'train_speed_ratio')} |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    return parse_simple(TablesConfig, argv, __doc__)


def main(argv):
    args = parse_args(argv)
    if args.summary:
        if not args.out:
            raise ConfigError("--summary reads the JSON files of one GPU: give --out, e.g. results/h100")
        table = summary(args.out)
        print(table, end="")
        if args.update_readme:
            update_readme(table, args.out)
        return table
    if not args.dry_run and not torch.cuda.is_available():
        raise ConfigError("no CUDA GPU here: these are the GPU tables; --dry_run prints the commands")
    out = args.out or gpu_folder(hardware_name(torch.device("cuda")) if torch.cuda.is_available() else "gpu")
    todo = commands(args, out)
    timed = [part for part in todo if args.jobs == 1 or part not in COUNTING]
    if args.dry_run:
        if args.jobs > 1:
            print(f"# first, {args.jobs} at a time:")
            for _, argv_ in (job for jobs in first_jobs(todo, args) for job in jobs):
                print(shlex.join(["python", *argv_]))
            print("# then, one after another:")
        for part in timed:
            print(shlex.join(["python", *todo[part]]))
        return todo
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()
    failed = first_phase(todo, args, out) if args.jobs > 1 else []
    if args.jobs > 1:
        print(f"# compiled and counted, {args.jobs} at a time: {time.perf_counter() - start:.0f} s", flush=True)
    for part in timed:
        argv_ = todo[part]
        print(f"# {part}: {shlex.join(['python', *argv_])}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.run([sys.executable, *argv_], cwd=HERE).returncode
        print(f"# {part}: {'done' if code == 0 else f'failed (exit {code})'} in {time.perf_counter() - t0:.0f} s",
              flush=True)
        if code:
            failed.append(part)
    print(f"# all parts: {time.perf_counter() - start:.0f} s; JSON files in {out}")
    table = summary(out)
    print(table, end="")
    if args.update_readme:
        update_readme(table, out)
    if failed:
        raise RunError(f"{', '.join(failed)} failed (the others' tables are written); its own message is above")
    return todo


if __name__ == "__main__":
    main_boundary(main)
