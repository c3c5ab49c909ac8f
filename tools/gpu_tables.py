"""
Every GPU table of docs/benchmarks.md in one command, each a JSON under results/<gpu>/ (results/h100/ on an H100):

    python -m tools.gpu_tables                          # every part, in the order below
    python -m tools.gpu_tables --parts compiled,decode  # some of them
    python -m tools.gpu_tables --dry_run                # print the commands only

The parts, each one run of tools/bench.py or tools/kernels.py at the Vertical Attention paper's 300m shape, bf16 autocast,
every model file with its default settings (--runs):
    compiled     training, torch.compile, 1024 tokens: tokens/s, MFU and peak memory, as ratios to vanilla
    decode       greedy generation with the compiled decode step (sample.py --compile), batch 1; eager too with
                 --decode_eager true
    kernels      the GPU's kernel launches per eager training step and per decode step (tools/kernels.py --device cuda)
    eager        training without torch.compile, 1024 tokens
    compiled4096 training, torch.compile, 4096 tokens
    kernels_compiled  the Triton kernels inductor generates per training step and per decode step
Each part runs in its own processes, so that one that fails leaves the others' tables; the command exits non-zero
if any failed. Compiling is most of the time, so it runs in two phases (docs/benchmarks.md tells them in full): first,
in two pools of processes side by side sized by GPU memory, every step a timed part will compile (tools/bench.py
--warm_only fills inductor's cache on disk) and the counts, a label a process, which tools/kernels.py --merge then
joins; then the timed parts, one after another, alone on the machine, compiling from that cache in seconds.
"""
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import torch

if __package__ in (None, ""):  # run as a file: the modules it imports are at the repository root
    sys.exit("run it from the repository root as `python -m tools.gpu_tables`")

from plumbing.config import model_names, option
from plumbing.errors import ConfigError, RunError, main_boundary, printable
from plumbing.files import regular_file
from plumbing.options import check_output, parse_simple, without
from tools.bench import read_bench
from tools.tables import hardware_name, spread, update_readme

PARTS = ("compiled", "decode", "kernels", "eager", "compiled4096", "kernels_compiled")
COUNTING = ("kernels_compiled", "kernels")  # the parts that time nothing: the first phase counts them, a label a job
COMPILING = ("compiled4096", "compiled", "decode")  # the timed parts that compile, slowest first
HEAVY = ("compiled4096", "compiled")  # the first phase's pools, by the GPU memory a job holds, slowest first
LIGHT = ("kernels_compiled", "decode", "kernels")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


@dataclass
class TablesConfig:
    parts: str = option(",".join(PARTS), "comma-separated parts to run, in this order: " + ", ".join(PARTS))
    runs: str = option(",".join(name for name in model_names() if name != "vanilla"), "python -m tools.bench's "
                       "--runs: the labels measured beside vanilla; default: every model file at its defaults")
    out: str = option("", "folder of the JSON files (written, or with --summary read); '' = results/<gpu>, the GPU's "
                      "model in lower case (h100, h200)", path=True)
    repeats: int = option(3, "timed repeats per model (python -m tools.bench --repeats)", min=1)
    iters: int = option(5, "training steps per timed repeat (python -m tools.bench --iters)", min=1)
    jobs: int = option(4, "processes compiling training steps at once before the timed parts (each holds a training "
                       "step of the 300m shape on the GPU, about 16 GB); 1 = no such phase: each part runs in turn and "
                       "compiles or counts its models itself", min=1)
    light_jobs: int = option(4, "processes at once beside those, for the first phase's jobs that hold little GPU "
                             "memory: the decode steps' compiles (batch 1) and the kernel counts, a label each (none "
                             "with --jobs 1)", min=1)
    decode_eager: bool = option(False, "the decode part also times eager decoding (python -m tools.bench --decode_modes "
                                "eager,compiled); the summary reads only the compiled step")
    update_readme: bool = option(True, "also rewrite the tables' copies in docs/ (between each JSON's markers)")
    dry_run: bool = option(False, "print the commands and run nothing (also where there is no GPU)")
    summary: bool = option(False, "run nothing: only rewrite the summary table of the JSON files in --out (no GPU "
                           "needed)")


def gpu_folder(name):
    """results/<model>: the first word of the GPU's name that looks like a model number (H100, A100, L40S, ...)."""
    words = re.findall(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return os.path.join("results", words[0].lower() if words else re.sub(r"\W+", "_", name).strip("_").lower())


def commands(args, out):
    train = ["--size", "300m", "--device", "cuda", "--runs", args.runs, "--repeats", str(args.repeats),
             "--iters", str(args.iters), "--warmup", "2", "--sample_tokens", "8"]
    readme = ["--update_readme"] if args.update_readme else []
    runs = ",".join(labels(args))
    every = {
        "compiled": ["-m", "tools.bench", *train, "--compile", "--block_size", "1024", "--batch_size", "16",
                     "--json", f"{out}/bench_300m_1024.json"],
        "decode": ["-m", "tools.bench", "--size", "300m", "--device", "cuda", "--decode", "--runs", args.runs,
                   "--decode_batches", "1", "--decode_modes", "eager,compiled" if args.decode_eager else "compiled",
                   "--repeats", str(args.repeats), "--json", f"{out}/decode.json", *readme],
        "kernels": ["-m", "tools.kernels", "--device", "cuda", "--runs", runs, "--json", f"{out}/kernels.json", *readme],
        "eager": ["-m", "tools.bench", *train, "--block_size", "1024", "--batch_size", "16",
                  "--json", f"{out}/bench_300m_1024_eager.json"],
        "compiled4096": ["-m", "tools.bench", *train, "--compile", "--block_size", "4096", "--batch_size", "4",
                         "--json", f"{out}/bench_300m_4096.json"],
        "kernels_compiled": ["-m", "tools.kernels", "--device", "cuda", "--compiled", "--size", "small", "--runs", runs,
                             "--json", f"{out}/kernels_compiled.json", *readme],
    }
    wanted = args.parts.split(",")
    unknown = set(wanted) - set(PARTS)
    if unknown:
        raise ConfigError(f"unknown --parts {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    return {part: every[part] for part in PARTS if part in wanted}


def labels(args):  # vanilla, the ratios' base, first
    return list(dict.fromkeys(["vanilla", *args.runs.split(",")]))


def warm_commands(todo, args):
    """[(name, argv)]: for each timed part that compiles, its own command with --warm_only, a model each, so that
    inductor's cache holds exactly what the part will compile."""
    return [(f"{part} {label}", [*without(todo[part], "--runs", "--json", "--update_readme"), "--runs", label,
                                 "--warm_only"])
            for part in COMPILING if part in todo for label in labels(args)]


def parts_folder(argv):
    """logs/<the part's JSON file less .json>/ beside it: where a counting part's labels are counted to, a file each."""
    path = argv[argv.index("--json") + 1]
    return os.path.join(os.path.dirname(path), "logs", os.path.splitext(os.path.basename(path))[0])


def count_commands(part, argv, args):
    """[(name, argv)] of a counting part's command split by label, each alone into parts_folder()/<label>.json."""
    folder = parts_folder(argv)
    return [(f"{part} {label}", [*without(argv, "--runs", "--json", "--update_readme"), "--runs", label,
                                 "--with_vanilla", "false", "--json", os.path.join(folder, f"{label}.json")])
            for label in labels(args)]


def first_jobs(todo, args):
    """The first phase: (heavy, light, merges), each a list of (name, argv): the compiles of training steps, --jobs at
    a time; beside them, --light_jobs at a time, the decode steps' compiles and the counts; then each count's merge,
    one after another (two processes rewriting one page at once could lose a table)."""
    jobs = {part: [job for job in warm_commands(todo, args) if job[0].split()[0] == part] for part in COMPILING}
    jobs.update({part: count_commands(part, todo[part], args) for part in COUNTING if part in todo})
    return ([job for part in HEAVY for job in jobs.get(part, [])],
            [job for part in LIGHT for job in jobs.get(part, [])],
            [(part, [*todo[part], "--merge", parts_folder(todo[part])]) for part in COUNTING if part in todo])


def run_logged(name, argv, logs):
    """(name, argv, exit code, seconds, log file) of a script run in its own process, its output in logs/<name>.log."""
    log = regular_file(os.path.join(logs, name.replace(" ", "_") + ".log"), "the log", "move it away", output=True)
    t0 = time.perf_counter()
    with open(log, "wb") as f:  # a regular file or none (regular_file): opening it waits for nothing
        code = subprocess.run([sys.executable, *argv], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    return name, argv, code, time.perf_counter() - t0, log


def report(name, argv, code, seconds, log, output=False):  # with all its output, or the end of a failed one's
    print(f"# {name}: {shlex.join(['python', *argv])}\n"
          f"# {name}: {'done' if code == 0 else f'failed (exit {code})'} in {seconds:.0f} s; its output: {log}",
          flush=True)
    if output or code:
        text = open(log, encoding="utf-8", errors="replace").read()  # (what the script printed, as it was)
        print(text if output else text[-3000:], end="", flush=True)


def first_phase(todo, args, out):
    """Runs first_jobs(); returns the counting parts that failed (a count or the merge). A failed compile is only
    reported, since its timed part will compile (and fail) on its own."""
    logs = os.path.join(out, "logs")
    os.makedirs(logs, exist_ok=True)
    heavy, light, merges = first_jobs(todo, args)
    failed = []
    with ThreadPoolExecutor(args.jobs) as heavy_pool, ThreadPoolExecutor(args.light_jobs) as light_pool:
        futures = ([heavy_pool.submit(run_logged, name, argv, logs) for name, argv in heavy] +
                   [light_pool.submit(run_logged, name, argv, logs) for name, argv in light])
        for future in as_completed(futures):
            name, argv, code, seconds, log = future.result()
            report(name, argv, code, seconds, log)
            part = name.split()[0]
            if code and part in COUNTING and part not in failed:
                failed.append(part)
    for part, argv in merges:
        if part in failed:
            print(f"# {part}: not merged, since a count failed (above)", flush=True)
            continue
        done = run_logged(part, argv, logs)
        report(*done, output=True)  # the table
        if done[2]:
            failed.append(part)
    return failed


def summary(out):
    """One table of every model's ratios to vanilla in the JSON files of out."""
    def read(name):
        path = os.path.join(out, name)
        if not os.path.exists(path):
            return None
        fix = f"run its part again (python -m tools.gpu_tables --parts ...), or move the file out of {printable(out)}"
        return read_bench(path, "the results file", fix, decode=name == "decode.json")

    compiled, eager, long, decode = (read(n) for n in ("bench_300m_1024.json", "bench_300m_1024_eager.json",
                                                       "bench_300m_4096.json", "decode.json"))
    first = next((t for t in (compiled, decode, eager, long) if t), None)
    if first is None:
        raise ConfigError(f"--summary: no JSON file of python -m tools.bench in {out}; run the parts first")
    rows = {}
    for key, table in (("compiled", compiled), ("eager", eager), ("long", long), ("decode", decode)):
        for r in (table or {}).get("results", []):  # of decode.json, the compiled step's rows at batch 1
            if key != "decode" or (r["mode"] == "compiled" and r["batch"] == 1 and "decode_ratio" in r):
                rows.setdefault(r["label"], {})[key] = r

    def ratio(r, key, field):  # one number where the repeats agree
        return spread(r.get(key), field, same=False)
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
    if not args.dry_run and args.out:  # where the parts write: before anything runs
        check_output("--out", args.out, "folder")
    if not args.dry_run and not torch.cuda.is_available():
        raise ConfigError("no CUDA GPU here: these are the GPU tables; --dry_run prints the commands")
    out = args.out or gpu_folder(hardware_name(torch.device("cuda")) if torch.cuda.is_available() else "gpu")
    todo = commands(args, out)
    timed = {part: argv_ for part, argv_ in todo.items() if args.jobs == 1 or part not in COUNTING}
    if args.dry_run:
        heavy, light, merges = first_jobs(todo, args) if args.jobs > 1 else ([], [], [])
        for title, jobs in ((f"first, at most {args.jobs} at a time (training steps compiling, about 16 GB of GPU "
                             "memory each)", heavy),
                            (f"beside them, at most {args.light_jobs} at a time (decode steps compiling, kernel "
                             "counts: little GPU memory)", light),
                            ("then each count's merge (writing its table), one after another", merges),
                            ("then, one after another", timed.items())):
            if jobs:
                print(f"# {title}:\n" + "\n".join(shlex.join(["python", *argv_]) for _, argv_ in jobs))
        return todo
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()
    failed = first_phase(todo, args, out) if args.jobs > 1 else []
    if args.jobs > 1:
        print(f"# compiled and counted, {args.jobs} + {args.light_jobs} at a time: {time.perf_counter() - start:.0f} s",
              flush=True)
    for part, argv_ in timed.items():
        print(f"# {part}: {shlex.join(['python', *argv_])}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.run([sys.executable, *argv_], cwd=ROOT).returncode
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
