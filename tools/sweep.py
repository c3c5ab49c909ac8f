"""
Results sweeps: every model, or one paper's ablation, trained by train.py with one budget and several seeds.

    python -m tools.sweep --size small --train_iters 500 --seeds 3 --update_readme      # the main table: every label
    python -m tools.sweep --ablation va_lr --update_readme                              # one paper's own ablation
    python -m tools.sweep --ablation skipmiddle,va_lr,skiplayer,attnres_blocks          # several, seed 1 of all first
    python -m tools.sweep --size small --train_iters 500 --seeds 3 --table_only         # tables and figures only

Each label is trained with each of --seeds seeds with the same data, batch, lr and steps, then evaluated on the
whole validation split. A run's key is a hash of its train.py options and the data set's meta.json: <results>/
results.json keeps every run by key, written after each run, so the same command run again goes on where it stopped
and a changed option never reuses a stale run (docs/results.md tells the outputs and the figure in full). The main
table goes to --results, --ablation NAME to <results>/ablations/NAME/. The ablations, at the small 6-layer shape:
  skipmiddle      Learning to Skip the Middle Layers of Transformers (Lawson and Aitchison), Figure 2: gated
                  skip-middle at several final mean-gate targets against dense models of 1 to 6 layers, on
                  estimated forward FLOPs per token
  va_lr           Vertical Attention, Figures 7-8: the learning rate of the vertical scores
  skiplayer       Skip-Layer Attention, Tables 1-2: skip layers n_l and skip heads n_h
  attnres_blocks  Attention Residuals (Kimi Team; open reproduction by Luo and Cai): 1 to 2L blocks
"""
import hashlib
import json
import math
import os
import re
import shlex
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

if __package__ in (None, ""):  # run as a file: the modules it imports are at the repository root
    sys.exit("run it from the repository root as `python -m tools.sweep`")

from analysis.figures import import_pyplot, save_png
from common import DTYPES, SIZES, autocast, model_from_checkpoint, paper, resolve_device
from plumbing.config import check_record, load_model_module, model_names, option
from plumbing.console import duration
from plumbing.errors import ConfigError, Interrupted, handling, main_boundary, printable
from plumbing.files import (LogRecord, held, let_go, open_split, parse_json, read_checkpoint, read_meta, read_text,
                            regular_file, write_json, written)
from plumbing.options import explicit_options, parse_model_options, parse_simple, without
from tools.bench import RUNS
from tools.tables import chosen, each, hardware_name, number, read_results, shape_of, update_readme
from eval import evaluate_split
from train import TrainConfig
from train import main as train_main  # train.py's entry point, called in-process

# ---- what is trained: the main table's labels (tools/bench.py's RUNS) and the papers' ablations

LABELS = {label for label, *_ in RUNS}  # the main table's labels, each a --model value of train.py

# The figures group the labels by their model file's PAPER (common.paper) and colour each file's labels in shades of
# one colour map, taken in the order of the model files after vanilla (black), so that a file keeps its colour in
# every figure and a new one gets its own.
PALETTE = ("Blues", "Oranges", "Greens", "Purples", "PuRd", "Reds", "YlOrBr", "BuGn", "GnBu")  # then again

# How an ablation's figure reads its x-axis: x(config, stats) -> [(axis label, series, x value), ...] from the
# run's resolved GPTConfig and its stats(); points of one axis label share a panel, of one series a line
# (vanilla, where an ablation has it, is drawn across every panel instead).
# A point whose overrides are {} is the model file's default: the main table's run of that model, reused.

GATE_GAMMA = 1e-2  # skipmiddle's controller step for its ablation (the paper's 1e-3 barely moves in 500 steps)


def skipmiddle_x(config, stats):
    """Estimated forward FLOPs per token (the paper's Figure 2), in millions."""
    with torch.device("meta"):  # the count reads only the config and the number of gates
        model = load_model_module("skipmiddle").GPT(config)
    dense = model.estimated_flops(torch.zeros(config.n_layer))[1]
    mflops = dense * stats.get("est_flops_ratio", 1.0) / 1e6
    if not config.gated:
        series = "dense, 1 to 6 layers"
    elif config.gate_gamma == 0:
        series = "gated, no sparsity control"
    elif config.gate_gamma != GATE_GAMMA:
        series = f"gated, gamma {config.gate_gamma:g} (the paper's)"
    else:
        series = f"gated, gamma {config.gate_gamma:g}, targets 1 to 0"
    return [("estimated forward FLOPs per token (millions)\n(a block is free for a token whose gate is 0 there)",
             series, mflops)]


def va_lr_x(config, stats):
    return [("va_lr, the AdamW lr of the vertical scores (model lr 1e-3)", "vertical, learned map", config.va_lr)]


def skiplayer_x(config, stats):
    """Table 1 varies n_l at half the heads, Table 2 n_h at 3/4 of the layers (here 4 of 6)."""
    n_l, n_h = config.skip_setting()
    axes = []
    if n_h == config.n_head // 2:
        axes.append((f"n_l, skip layers (n_h = {n_h} of {config.n_head} heads; Table 1)", "SLA", n_l))
    if n_l == 4:
        axes.append((f"n_h, skip heads (n_l = 4 of {config.n_layer} layers; Table 2)", "SLA", n_h))
    return axes


def attnres_x(config, stats):
    n = 2 * config.n_layer if config.attn_res == "full" else config.n_blocks
    return [(f"n_blocks ({2 * config.n_layer} = one sublayer per block = full)", "block AttnRes", n)]


# The papers' own experiments name their model files here, not in them: an ablation is a sweep's plan and figure (its
# points, x-axis and the paper's claim), read by the sweep alone, where a model file holds its model and nothing else.
ABLATIONS = {
    "skipmiddle": dict(
        paper="Learning to Skip the Middle Layers of Transformers (Lawson and Aitchison), Figure 2",
        claim="at the paper's scales, skipping does not improve the trade-off between validation loss and "
              "estimated FLOPs over dense models with fewer layers",
        points=[(f"dense-{n}", "skipmiddle", dict(gated=False, n_layer=n)) for n in range(1, 7)] +
               [(f"gated-{t}", "skipmiddle", dict(gate_target=t, gate_gamma=GATE_GAMMA))
                for t in (1.0, 0.75, 0.5, 0.25, 0.0)] +
               [("gated-nocontrol", "skipmiddle", dict(gate_gamma=0.0)),
                ("gated-0.5-paper", "skipmiddle", {})],  # gamma 1e-3, target 0.5: the main table's skipmiddle
        x=skipmiddle_x, xscale="linear", frontier="dense, 1 to 6 layers",
        stats=r"^est_flops_ratio$|^gate\d+_(zero|mean)$"),
    "va_lr": dict(
        paper="Vertical Attention, Figures 7-8",
        claim="too small a learning rate of the scores leaves the map frozen, too large makes it unstable; "
              "1e-3 to 1e-2 learn it smoothly",
        points=[("vanilla", "vanilla", {})] +
               [(f"va_lr-{lr}", "vertical", dict(va_lr=float(lr)) if lr != "1e-2" else {})
                for lr in ("1e-4", "1e-3", "1e-2", "1e-1")],  # 1e-2 is the default: the main table's vertical
        x=va_lr_x, xscale="log", stat="va_entropy", stats=r"entropy$"),
    "skiplayer": dict(
        paper="Skip-Layer Attention, Tables 1-2",
        claim="n_l of about 3/4 of the layers is best and a skip of one layer gives nothing (Table 1); about "
              "3/4 of the heads is best and too few skip heads give little (Table 2)",
        points=[("vanilla", "vanilla", {})] +
               [(f"nl{n}-nh2", "skiplayer", dict(skip_layers=n, skip_heads=2)) for n in range(1, 6)] +
               [("nl4-nh1", "skiplayer", dict(skip_layers=4, skip_heads=1)),
                ("nl4-nh3", "skiplayer", {}),  # round(3L/4), round(3H/4): the main table's skiplayer
                ("nl4-nh4", "skiplayer", dict(skip_layers=4, skip_heads=4))],
        x=skiplayer_x, xscale="linear", stats=r"^$"),
    "attnres_blocks": dict(
        paper="Attention Residuals (Kimi Team; open reproduction by Luo and Cai), block versus full",
        claim="block AttnRes (about 4 to 8 blocks) beats full AttnRes, whose many sources differ too little",
        points=[("vanilla", "vanilla", {})] +
               [(f"blocks-{n}", "attnres", dict(n_blocks=n) if n != 4 else {}) for n in (1, 2, 3, 4, 6, 8)] +
               [("full", "attnres", dict(attn_res="full"))],  # 4 blocks and full: the main table's runs
        x=attnres_x, xscale="linear", stats=r"entropy$"),
}


@dataclass
class SweepConfig:
    ablation: str = option("", "'' = the main table; else a comma-separated list of " + ", ".join(ABLATIONS) +
                           " (or all): their runs seed by seed, so that every ablation gets its first seed first")
    runs: str = option("", "comma-separated labels to train; '' = all of the sweep's (main: " +
                       ", ".join(r[0] for r in RUNS) + "); vanilla is always trained where the sweep has it")
    size: str = option("small", "model shape: a preset, or small = the model files' default (the CPU shape)",
                       choices=("small", *SIZES))
    n_layer: int = option(0, "number of layers; 0 = the --size shape's", min=0)
    block_size: int = option(256, "sequence length", min=1)
    batch_size: int = option(8, "sequences per training step", min=1)
    train_iters: int = option(500, "training steps per run", min=1)
    seeds: int = option(3, "seeds per label: --seed, --seed + 1, ...", min=1, max=1000)
    seed: int = option(TrainConfig.seed, "the first seed", min=0, max=2**32 - 1001)
    eval_points: int = option(10, "validation evaluations per run (the curves)", min=1)
    train_args: str = option("--learning_rate=1e-3 --eval_iters=10", "further train.py options, the same for every "
                             "run")
    dataset: str = option("shakespeare", "data set from prepare.py")
    data_dir: str = option("data", "folder of the prepared data sets", path=True)
    device: str = option("auto", "auto (cuda, else mps, else cpu), cpu, cuda, mps")
    dtype: str = option("auto", "auto (bfloat16 on CUDA), float32, bfloat16", choices=DTYPES)
    eval_batch_size: int = option(16, "windows per forward of the final evaluation", min=1)
    results: str = option("out/sweep", "folder of your table: results.json, RESULTS.md and curves.png; ablations "
                          "write to its ablations/NAME/ (the committed tables are results/ and results/L12/: "
                          "docs/results.md gives their commands)", path=True, out="folder")
    runs_dir: str = option("out/sweep", "folder of the runs' checkpoints and logs", path=True, out="folder")
    reuse: str = option("", "comma-separated results.json files whose runs of the same key are copied in, not "
                        "trained again (the committed runs: results/results.json); '' = none", path=True)
    max_runs: int = option(0, "stop after this many newly trained runs; 0 = all", min=0)
    table_only: bool = option(False, "train nothing: write the tables and figures from the runs the results hold")
    update_readme: bool = option(False, "also rewrite each table's copy between its markers, in the page that holds "
                                 "them (README.md or docs/results.md): the committed tables' folders have them")


def parse_args(argv):
    return parse_simple(SweepConfig, argv, __doc__)


def main(argv):
    args = parse_args(argv)
    names = list(ABLATIONS) if args.ablation == "all" else [a for a in args.ablation.split(",") if a]
    unknown = [n for n in names if n not in ABLATIONS]
    if unknown:
        raise ConfigError(f"unknown --ablation {', '.join(unknown)}; choose from {', '.join(ABLATIONS)} or all")
    device, dtype = device_and_dtype(args)
    meta = read_meta(args.data_dir, args.dataset)
    shape = model_shape(args, meta)
    check_train_args(args.train_args, shape)
    if names and shape["n_layer"] != 6:
        raise ConfigError(f"the ablations are defined at 6 layers (their points name layer counts), not {shape['n_layer']}")

    sweeps = [main_sweep(args)] if not names else [ablation_sweep(n, args) for n in names]
    wanted = chosen(args.runs, sorted({label for s in sweeps for label, *_ in s["points"]}))
    for s in sweeps:
        s["points"] = [p for p in s["points"] if p[0] in wanted or p[0] in s["always"]]
        s["plan"] = plan(s, shape, args, device.type, dtype, meta)
        for name in ("results.json", "RESULTS.md", s["figure"]):  # before any run: what each sweep writes
            regular_file(os.path.join(s["results"], name), "the sweep's", "move it away or choose another --results",
                         output=True)
    check_train_options(sweeps, shape, args)
    header = {"hardware": hardware_name(device), "dtype": dtype, "torch": torch.__version__, "size": args.size,
              "shape": shape, "dataset": args.dataset, "val_split": meta["val_tokens"], "batch_size": args.batch_size,
              "train_iters": args.train_iters,
              "seeds": [args.seed + i for i in range(args.seeds)], "train_args": args.train_args}
    return run_sweeps(sweeps, header, args, device, meta, argv)


def device_and_dtype(args):
    """Unlike common.resolve_device, cuda is taken (and auto is bfloat16 there) on a machine without CUDA, so that it
    can --table_only a GPU sweep."""
    try:
        device = resolve_device("auto") if args.device == "auto" else torch.device(args.device)
    except RuntimeError:
        raise ConfigError(f"unknown --device {args.device!r}; use auto, cpu, cuda, cuda:N or mps")
    bf16 = args.dtype == "bfloat16" or (args.dtype == "auto" and device.type == "cuda" and (
        not torch.cuda.is_available() or torch.cuda.is_bf16_supported()))
    return device, "bfloat16" if bf16 else "float32"


def model_shape(args, meta):
    return shape_of(args, meta["vocab_size"])  # its order is part of the run keys


def main_sweep(args):
    return dict(name="", results=args.results, points=RUNS, always={"vanilla"}, figure="curves.png",
                reference="vanilla", stats=r"flops|entropy$")  # the stats() the main table shows


def ablation_sweep(name, args):
    spec = ABLATIONS[name]
    return dict(spec, name=name, results=os.path.join(args.results, "ablations", name), figure="figure.png",
                always={"vanilla"} & {p[0] for p in spec["points"]}, reference=spec.get("frontier", "vanilla"))


# ---- the plan: every (label, seed) run's train.py options and key

OWNED = ("model", "dataset", "data_dir", "out_dir", "resume", "max_iters", "batch_size", "seed", "device", "dtype",
         "eval_interval", "size", "init_from")  # train.py options every run of a sweep sets itself
INSTEAD = {"model": "--runs", "out_dir": "--runs_dir", "max_iters": "--train_iters", "seed": "--seed and --seeds",
           "eval_interval": "--eval_points"}  # tools/sweep.py's option for one it owns, where the names differ


def check_train_args(train_args, shape):
    """--train_args may not set what the sweep sets per run (its seeds, shape, budget): the tables would name
    what did not run."""
    try:
        words = shlex.split(train_args)
    except ValueError as e:
        raise ConfigError(f"--train_args {train_args!r}: {e}")
    owned = explicit_options(words) & {*OWNED, *shape}
    if owned:
        raise ConfigError(f"--train_args sets {', '.join('--' + o for o in sorted(owned))}, which the sweep sets for "
                          "every run; use python -m tools.sweep's own options (--seed, --seeds, --size, --n_layer, --block_size, "
                          "--batch_size, --train_iters, ...)")


def check_train_options(sweeps, shape, args):
    """Every run's train.py options as train.py reads them, before any run (the first of each model file in the
    plan): a mistake in --train_args ends in one line naming train.py's option, and no hint names an option the
    sweep sets itself."""
    owned = {name: f"the sweep sets --{name} for every run: use python -m tools.sweep {INSTEAD.get(name, '--' + name)}"
             for name in (*OWNED, *shape) if name not in ("resume", "init_from")}
    checked = set()
    for s in sweeps:
        for label, options, _ in s["plan"][args.seed]:
            model = next(o.split("=", 1)[1] for o in options if o.startswith("--model="))
            if model in checked:
                continue
            checked.add(model)
            try:
                parse_model_options(TrainConfig, [*options, f"--out_dir={args.runs_dir}",
                                                  f"--data_dir={args.data_dir}"], "", owned=owned)
            except ConfigError as e:
                raise ConfigError(f"--train_args {args.train_args!r}, for {label}: {e}")


def train_options(name, overrides, seed, shape, args, device, dtype):
    """The train.py options of one run: everything that shapes its result (not where it is written)."""
    return [f"--model={name}", f"--dataset={args.dataset}", f"--max_iters={args.train_iters}",
            f"--batch_size={args.batch_size}", f"--seed={seed}", f"--device={device}", f"--dtype={dtype}",
            f"--eval_interval={max(1, args.train_iters // args.eval_points)}",
            *[f"--{k}={v}" for k, v in {**shape, **overrides}.items()], *shlex.split(args.train_args)]


def run_key(options, meta):
    """A run's identity: its train.py options and the data set it reads. A changed option is a new run."""
    blob = json.dumps({"options": options, "data": meta}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def plan(sweep, shape, args, device, dtype, meta):
    """{seed: [(label, options, key), ...]} in the sweep's label order."""
    return {seed: [(label, options, run_key(options, meta)) for label, name, overrides in sweep["points"]
                   for options in [train_options(name, overrides, seed, shape, args, device, dtype)]]
            for seed in (args.seed + i for i in range(args.seeds))}


def run_sweeps(sweeps, header, args, device, meta, argv):
    """Train what the sweeps' results do not hold, seed by seed and sweep by sweep within a seed (so that paired
    differences come early and every sweep gets its first seed first). After every run, rewrite that sweep's
    results.json and table; after each seed of a sweep, its figure. The last line: the wall time and the tables.
    Returns the last sweep's summary rows."""
    began = time.perf_counter()
    known = {}  # every run on record by key: --reuse files, then each sweep's own results.json
    for path in [p for p in args.reuse.split(",") if p] + [os.path.join(s["results"], "results.json") for s in sweeps]:
        known.update(saved_runs(path))
    ctx = autocast(device, header["dtype"])
    trained, stopped, stale = set(), False, {s["results"] for s in sweeps}  # stale: figures to redraw; trained: keys
    for seed in header["seeds"]:
        for s in sweeps:
            new = False
            for label, options, key in s["plan"][seed]:
                saved = saved_runs(os.path.join(s["results"], "results.json"))
                if key in saved:
                    continue
                if key in known:  # the same run in another results.json: copied under this sweep's label
                    record = {**known[key], "label": label, "reused": True}
                elif args.table_only or (args.max_runs and len(trained) == args.max_runs):
                    stopped = True
                    continue
                else:
                    done = sum(k in saved for runs in s["plan"].values() for *_, k in runs)
                    print(f"training {s['name'] or 'main'}: {label}, seed {seed} ({done + 1} of "
                          f"{sum(map(len, s['plan'].values()))})", file=sys.stderr)
                    record = train_and_evaluate(label, seed, options, key, args, device, ctx, meta, machine(header))
                    trained.add(key)
                known[key] = record
                save_run(s, record, header, argv)
                report(s, header, args, argv, trained)
                new = True
            if new:
                report(s, header, args, argv, trained, figure=True)
                stale.discard(s["results"])
    if stopped:
        print(f"stopped after {len(trained)} new runs; the same command without --max_runs or --table_only goes on "
              "from here", file=sys.stderr)
    for s in sweeps:  # every sweep's table and figure; the last one's rows
        rows = report(s, header, args, argv, trained, figure=s["results"] in stale, final=True)
    tables = ", ".join(printable(os.path.join(s["results"], "RESULTS.md")) for s in sweeps)
    print(f"done in {duration(time.perf_counter() - began)}: {len(trained)} runs trained by this command; the "
          f"table{'s' if len(sweeps) > 1 else ''}: {tables}")
    return rows


# ---- one run: train (or finish) it, then evaluate it on the whole validation split

def machine(header):
    """The machine a run is trained on, as a record and the table name it: hardware, dtype, torch."""
    return f"{header['hardware']}, {header['dtype']}, torch {header['torch']}"


def train_and_evaluate(label, seed, options, key, args, device, ctx, meta, machine):
    """Train one (label, seed) run with the shared budget (or finish it), then evaluate the whole val split."""
    out_dir = os.path.join(args.runs_dir, f"{label}-seed{seed}-{key}")
    path = os.path.join(out_dir, "ckpt.pt")
    steps = read_checkpoint(path, ("model_name", "iter_num"), mmap=True)["iter_num"] if os.path.exists(path) else 0
    t0, cpu0 = time.time(), time.process_time()
    if steps < args.train_iters:  # a run cut off earlier goes on from its last checkpoint
        try:
            # trained as --model LABEL, which the run records (its key keeps the file's name and options)
            named = [f"--model={label}" if o.startswith("--model=") and label in LABELS else o for o in options]
            train_main([*named, f"--out_dir={out_dir}", f"--data_dir={args.data_dir}",
                        *(["--resume"] if os.path.exists(path) else [])])  # a step-0 checkpoint is one too
        except Interrupted as e:
            raise Interrupted(f"{e.args[0].split(';')[0]} of {label}, seed {seed}; the runs that finished are in "
                              "results.json, and this one goes on from its checkpoint, if it saved one: run the same "
                              "command again to go on")
    seconds = time.time() - t0
    model, _, ckpt = model_from_checkpoint(out_dir, device)
    model.eval()
    T = model.config.block_size
    val = open_split(args.data_dir, args.dataset, "val", meta, model.config.vocab_size, T)
    loss, _, count = evaluate_split(model, val, T, args.eval_batch_size, device, ctx, progress=False)
    if not math.isfinite(loss[-1].item()):  # a table shows no NaN as a number: the run is refused, not recorded
        raise ConfigError(f"the run {printable(out_dir)} has a validation loss that is not finite ({loss[-1].item()}); "
                          f"delete its folder and check --train_args, or leave {label} out of --runs")
    evals, logged, log, fix = {}, {}, os.path.join(out_dir, "log.jsonl"), "delete the run's folder to train it again"
    for n, line in enumerate(read_text(log, "the run's log", fix).splitlines(), 1):  # a repeated step: the last wins
        with handling(log, fix):
            record = check_record(LogRecord, parse_json(line), f"the run's log {log} line {n}", fix)
        if "val_loss" in record:
            evals[record["iter"]] = record["val_loss"]
            logged[record["iter"]] = {k: v for k, v in record.items()  # the model file's stats() at that evaluation
                                      if k not in ("iter", "val_loss", "tokens") and number(v)}
    return {"label": label, "seed": seed, "key": key, "options": options,
            "val_loss": loss[-1].item(), "val_tokens": count, "steps": ckpt["iter_num"],
            "tokens_seen": ckpt["iter_num"] * args.batch_size * T, "train_seconds": round(seconds, 1),
            "cpu_seconds": round(time.process_time() - cpu0, 1),
            "params": sum(p.numel() for p in model.parameters()),
            "stats": model_stats(model, val, T, args.eval_batch_size, device, ctx),
            "curve": [[it * args.batch_size * T, v] for it, v in sorted(evals.items())],
            "stats_curve": [[it * args.batch_size * T, logged[it]] for it in sorted(evals)],
            "machine": machine}


@torch.no_grad()
def model_stats(model, val, T, batch_size, device, ctx):
    """The model file's stats() on the first validation windows (a batch of up to batch_size), {} without it."""
    if not hasattr(model, "stats"):
        return {}
    n = max(1, min(batch_size, len(val) // T))
    with ctx:
        return model.stats(torch.from_numpy(val[:n * T].astype(np.int64)).view(n, T).to(device))


# ---- results.json

# results.json's fields that its readers use (the header's, and a trained run's: train_and_evaluate()); the others
# (the command, the summary, a run's options and steps) are rewritten, not read

@dataclass
class SweepFile:
    runs: list = option(None, "a record per run (Run)", required=True)
    hardware: str = option("", "the machine of the latest run trained")
    torch: str = option("", "torch's version there")


@dataclass
class Run:
    label: str = option("", "the sweep's label", required=True)
    seed: int = option(0, "--seed", min=0, required=True)
    key: str = option("", "run_key(): its options and data set", required=True)
    val_loss: float = option(0.0, "over the whole validation split", required=True)
    val_tokens: int = option(1, "the split's tokens evaluated", min=1, required=True)
    train_seconds: float = option(0.0, "wall time of the training", min=0, required=True)
    params: int = option(1, "the model's", min=1, required=True)
    stats: dict = option(None, "the model file's stats(): numbers, or null", required=True)
    curve: list = option(None, "[tokens seen, validation loss] at each evaluation", required=True)
    cpu_seconds: float = option(0.0, "this process's CPU time, training and evaluation", min=0)
    stats_curve: list = option(None, "[tokens seen, the model file's stats() logged there] at each evaluation")
    machine: str = option("", "the hardware, dtype and torch that trained it")
    reused: bool = option(False, "copied from another results.json under the same key")

    def __post_init__(self):
        each(self, "stats", lambda v: v is None or number(v), "a number or null")
        each(self, "curve", lambda p: type(p) is list and len(p) == 2 and all(map(number, p)), "a pair of numbers")
        each(self, "stats_curve", lambda p: type(p) is list and len(p) == 2 and number(p[0]) and type(p[1]) is dict
             and all(map(number, p[1].values())), "a pair of tokens seen and an object of numbers")


def read_sweep(json_path):
    """A results.json ({} where there is none), checked: an object whose runs are records with a key."""
    if not os.path.exists(json_path):
        return {}
    return read_results(json_path, "the results file", "restore it from version control, or move it away to train its "
                        "runs again", SweepFile, "runs", Run)


def saved_runs(json_path):
    return {r["key"]: r for r in read_sweep(json_path).get("runs", [])}


@contextmanager
def locked(folder):
    """The results folder held by this sweep while it re-reads results.json, merges its own and writes it whole
    (held(): its file .lock, gone when the sweep lets go): of two sweeps writing into one folder at once, each keeps
    the other's runs. The other waits for it here, for a moment."""
    os.makedirs(folder, exist_ok=True)
    while (lock := held(os.path.join(folder, ".lock"), timeout=-1)) is None:  # taken as the other let go: again
        pass
    try:
        yield
    finally:
        let_go(lock)


def save_run(sweep, record, header, argv):
    """Add one run to the sweep's results.json, keeping every run that a sweep beside this one wrote meanwhile, and
    the runs of other configurations (unused). The header describes the machine of the latest run trained."""
    json_path = os.path.join(sweep["results"], "results.json")
    with locked(sweep["results"]):
        saved = read_sweep(json_path)
        head = {**header, "command": command(sweep, argv)}
        if record.get("reused") and "hardware" in saved:
            head.update({k: saved[k] for k in ("hardware", "torch")})
        runs = {**{r["key"]: r for r in saved.get("runs", [])}, record["key"]: record}
        write_json(json_path, {**saved, **head, "runs": list(runs.values())})


def command(sweep, argv):
    """The command that regenerates this sweep: argv less --max_runs and --table_only, one ablation only."""
    kept = without(argv, "--max_runs", "--table_only", "--ablation")
    return ["-m", "tools.sweep", *(["--ablation", sweep["name"]] if sweep["name"] else []), *kept]


# ---- the summary: mean ± std over seeds, and the paired difference to the reference ± its standard error

def aggregate(runs, labels, pair=None):
    """Per label: val loss mean and std over seeds, and the paired (same-seed) difference to the reference: its
    mean and standard error, marked when |mean| > 2 SE (which needs two or more pairs). pair(run) is the
    reference's loss for that run's seed, or None; by default vanilla's run of the same seed."""
    if pair is None:
        base = {r["seed"]: r["val_loss"] for r in runs if r["label"] == "vanilla"}
        pair = lambda r: base.get(r["seed"]) if r["label"] != "vanilla" else None  # noqa: E731
    rows = []
    for label in labels:
        group = [r for r in runs if r["label"] == label]
        if not group:
            continue
        values = [r["val_loss"] for r in group]
        diffs = [r["val_loss"] - ref for r in group for ref in [pair(r)] if ref is not None]
        row = {"label": label, "n": len(values), "mean": statistics.fmean(values),
               "std": statistics.stdev(values) if len(values) > 1 else None,
               "n_pairs": len(diffs), "delta": statistics.fmean(diffs) if diffs else None,
               "delta_se": statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None}
        row["marked"] = row["delta_se"] is not None and abs(row["delta"]) > 2 * row["delta_se"]
        rows.append(row)
    return rows


def point_configs(sweep, header):
    return {label: load_model_module(name).GPTConfig(**{**header["shape"], **overrides})
            for label, name, overrides in sweep["points"]}


def frontier_pair(runs, xs, series):
    """pair() for a Δ against the runs of one series (the dense models) at the same x (estimated FLOPs), of the
    same seed: their loss interpolated linearly in x, and held at the ends (a point above the largest dense
    model's FLOPs is compared with that model). The series' own runs get no pair."""
    def pair(run):
        ref = sorted((x, r["val_loss"]) for r in runs if r["seed"] == run["seed"]
                     for ax, s, x in xs[r["key"]] if s == series)
        if not ref or any(s == series for _, s, _ in xs[run["key"]]):
            return None
        return float(np.interp(xs[run["key"]][0][2], [x for x, _ in ref], [v for _, v in ref]))
    return pair


def report(sweep, header, args, argv, trained, figure=False, final=False):
    """Summary rows of the sweep's planned runs on record; writes results.json's header and summary, RESULTS.md,
    with figure its figure, with --update_readme its copy in README.md or docs/, and with final prints the table.
    While no planned run is on record, RESULTS.md (and its copy) only say so. trained: the keys of the runs this
    command trained, which the table names with their machine. Returns the rows."""
    json_path = os.path.join(sweep["results"], "results.json")
    configs = point_configs(sweep, header)
    models = {label: name for label, name, _ in sweep["points"]}  # in the sweep's label order
    with locked(sweep["results"]):  # the runs on record now, a sweep's beside this one's included (save_run())
        saved = read_sweep(json_path)
        done = {r["key"]: r for r in saved.get("runs", [])}
        planned = [key for seed in sorted(sweep["plan"]) for *_, key in sweep["plan"][seed]]
        runs = [done[key] for key in planned if key in done]
        head = {**header, **{k: saved[k] for k in ("hardware", "torch") if k in saved}, "command": command(sweep, argv)}
        xs = {r["key"]: sweep["x"](configs[r["label"]], r["stats"]) if models[r["label"]] != "vanilla" else []
              for r in runs} if "x" in sweep else {}  # vanilla is drawn as a line across, not as a point
        pair = frontier_pair(runs, xs, sweep["reference"]) if "frontier" in sweep else None
        rows = aggregate(runs, list(models), pair)
        if runs:
            write_json(json_path, {**saved, **head, "summary": rows})
        table = results_table(sweep, rows, runs, head, len(planned), trained)
        with written(os.path.join(sweep["results"], "RESULTS.md")) as f:
            f.write(table)
        if args.update_readme:
            update_readme(table, sweep["results"])
    if final:
        print(table)
    path, plt = os.path.join(sweep["results"], sweep["figure"]), import_pyplot() if figure and runs else None
    if figure and runs and plt is None:
        print("note: no matplotlib, so no figure (pip install matplotlib)", file=sys.stderr)
    elif plt and "x" in sweep:
        plot_ablation(plt, sweep, rows, runs, models, xs, configs, path)
    elif plt:
        plot_results(plt, sweep, rows, runs, models, path, val_windows(header))
    return rows


# ---- tables

def results_table(sweep, rows, runs, header, n_planned, trained):
    by_label = {}
    for r in runs:
        by_label.setdefault(r["label"], []).append(r)
    shape, steps, batch = header["shape"], header["train_iters"], header["batch_size"]
    hours = sum(r["train_seconds"] for r in runs) / 3600
    lines = []
    if sweep["name"]:
        lines += [f"{sweep['paper']}. The paper's claim: {sweep['claim']}.", ""]
    # how the table was made, a setting a row: short lines a reader scans, not one long sentence
    reference = ("the dense models of the same seed at the same estimated FLOPs (interpolated between layer counts)"
                 if "frontier" in sweep else "vanilla")
    lines += [
        "| how the table was made | |", "|---|---|",
        f"| command | `python {shlex.join(header['command'])}` |",
        f"| model | {header['size']} shape ({', '.join(f'{k} {v}' for k, v in shape.items())}) |",
        f"| data | `{header['dataset']}`, {steps} steps of {batch} x {shape['block_size']} tokens "
        f"({steps * batch * shape['block_size']:,} tokens) |",
        f"| seeds | {', '.join(map(str, header['seeds']))} |",
        f"| train.py options | `{header['train_args']}` |",
    ] + ([
        f"| runs | {len(runs)} run{'s' if len(runs) > 1 else ''}, {hours:.2f} hours of training in all{cost(runs)} |",
        f"| trained | {provenance(runs, trained)} |",
        f"| val loss | over the whole validation split of {header['val_split']:,} tokens ({runs[0]['val_tokens']:,} "
        "predicted, each from the tokens before it), mean ± std over seeds |",
        f"| Δ | the mean of the same-seed differences to {reference} ± its standard error; **bold** where "
        "\\|Δ\\| > 2 SE |",
    ] if runs else [f"| runs | {len(sweep['points'])} labels x {len(header['seeds'])} seeds |"])
    if not runs:
        return "\n".join(lines + ["", f"**In progress: 0 of {n_planned} runs**; the same command trains them."]) + "\n"
    if len(runs) < n_planned:
        lines += ["", f"**In progress: {len(runs)} of {n_planned} runs** ({seeds_done(sweep, runs)}); the same "
                      "command trains the rest, and the reading follows when every seed is in."]
    lines += ["", "| model | seeds | val loss | Δ vs " + ("reference" if sweep["name"] else "vanilla") +
              " | reading | params | extra params | stats (mean over seeds) |", "|---|---|---|---|---|---|---|---|"]
    base = by_label.get("vanilla", [{}])[0].get("params")
    for row in rows:
        group = by_label[row["label"]]
        loss = f"{row['mean']:.4f}" + (f" ± {row['std']:.4f}" if row["std"] is not None else "")
        if row["delta"] is None:
            reference = row["label"] == "vanilla" or ("frontier" in sweep and row["label"].startswith("dense-"))
            delta, reading = "", ("(reference)" if sweep["name"] else "(baseline)") if reference else "no pair"
        else:
            delta = f"{row['delta']:+.4f}" + (f" ± {row['delta_se']:.4f}" if row["delta_se"] is not None else "")
            delta = f"**{delta}**" if row["marked"] else delta
            reading = (("better" if row["delta"] < 0 else "worse") if row["marked"] else
                       "within noise" if row["delta_se"] is not None else "one seed: no SE")
        stats = [{k: v for k, v in r["stats"].items() if isinstance(v, (int, float))} for r in group]
        shown = ", ".join(f"{k} {statistics.fmean(s[k] for s in stats):.3g}" for k in stats[0]
                          if re.search(sweep["stats"], k) and all(k in s for s in stats))
        params = group[0]["params"]
        extra = f"{params - base:,}" if base is not None else ""
        lines.append(f"| {row['label']} | {row['n']} | {loss} | {delta} | {reading} | {params:,} | {extra} | {shown} |")
    return "\n".join(lines) + "\n"


def cost(runs):
    """The CPU time of the runs that record it (older runs lack it)."""
    timed = [r for r in runs if "cpu_seconds" in r]
    return (f" ({sum(r['cpu_seconds'] for r in timed) / 3600:.2f} CPU hours with their evaluation, for the "
            f"{len(timed)} that record it)") if timed else ""


def provenance(runs, trained):
    """Which runs this command trained, on this machine, and where the others come from: an earlier command (on the
    machine each records, where it does) or another results.json (--reuse)."""
    here = [r for r in runs if r["key"] in trained]
    copied = [r for r in runs if r["key"] not in trained and r.get("reused")]
    earlier = {}
    for r in runs:
        if r["key"] not in trained and not r.get("reused"):
            where = r.get("machine", "a machine it does not record")
            earlier[where] = earlier.get(where, 0) + 1
    parts = [f"{len(here)} by this command, on {here[0]['machine']}" if here else "none by this command"]
    parts += [f"{n} by an earlier command, on {where}" for where, n in earlier.items()]
    return "; ".join(parts + ([f"{len(copied)} copied from other results under the same key"] if copied else []))


def seeds_done(sweep, runs):
    have = {(r["label"], r["seed"]) for r in runs}
    full = [seed for seed in sorted(sweep["plan"]) if all((label, seed) in have for label, *_ in sweep["points"])]
    return (f"every point of seed{'s' if len(full) > 1 else ''} {', '.join(map(str, full))}" if full
            else "the first seed not yet complete")


# ---- figures

def colours(labels, models, plt):
    """A colour per label: vanilla black, each paper's labels in shades of its own colour map."""
    out, others = {}, [name for name in model_names() if name != "vanilla"]
    for model in dict.fromkeys(models.values()):
        group = [label for label in labels if models[label] == model]
        cmap = None if model == "vanilla" else PALETTE[others.index(model) % len(PALETTE)]
        for i, label in enumerate(group):
            out[label] = "black" if cmap is None else plt.get_cmap(cmap)(0.8 - 0.4 * i / max(1, len(group) - 1))
    return out


def delta_panel(ax, rows, colour, models, reference):
    """The verdict: each label's paired Δ with a bar of ± 2 SE, filled where |Δ| > 2 SE, grouped by paper with a
    gap between papers, and Δ ± SE written beside as the table gives it."""
    rows = [row for row in rows if row["delta"] is not None]
    y, yi = [], 0.0
    for i, row in enumerate(rows):
        yi -= 1.6 if i and models[row["label"]] != models[rows[i - 1]["label"]] else 1.0
        y.append(yi)
        c = colour[row["label"]]
        ax.errorbar(row["delta"], yi, xerr=2 * row["delta_se"] if row["delta_se"] is not None else None, fmt="o",
                    color=c, markerfacecolor=c if row["marked"] else "white", capsize=3, markersize=7)
        verdict = (("better" if row["delta"] < 0 else "worse") if row["marked"] else
                   "within noise" if row["delta_se"] is not None else "one seed: no SE")
        se = f" ± {row['delta_se']:.3f}" if row["delta_se"] is not None else ""
        ax.annotate(f"{row['delta']:+.3f}{se}  {verdict}", (1.01, yi), xycoords=("axes fraction", "data"),
                    va="center", fontsize=8, fontweight="bold" if row["marked"] else "normal")
    ax.axvline(0, color="black", linewidth=2, label=f"{reference} (Δ = 0)")
    ax.set_yticks(y, [f"{row['label']} (n={row['n_pairs']})" for row in rows])
    for tick, row in zip(ax.get_yticklabels(), rows):
        tick.set_color(colour[row["label"]])
    ax.set(xlabel=f"paired Δ val loss to {reference}\n(bars: ± 2 SE over seeds; written: Δ ± SE, as in the table)",
           ylim=(min(y, default=0) - 0.7, max(y, default=0) + 0.7),
           title="what the verdict rests on (filled: |Δ| > 2 SE)")
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3, axis="x")


def val_windows(header):
    """The validation windows behind every point of a run's curve: train.py's eval_iters (the last given, as
    train.py takes it) x batch_size."""
    given = re.findall(r"--eval_iters[= ](\d+)", header["train_args"])
    return int(given[-1] if given else TrainConfig.eval_iters) * header["batch_size"]


def plot_results(plt, sweep, rows, runs, models, path, windows):
    """The main table: validation curves (mean over seeds; vanilla bold black with its seeds' range) from the
    first evaluation after the start, a zoom on the last 40% of the run, and the paired differences to vanilla
    with their 2-SE bars; labels grouped and coloured by paper."""
    colour = colours([row["label"] for row in rows], models, plt)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(18, 7), gridspec_kw={"width_ratios": [3, 2]})
    zoom = ax.inset_axes([0.36, 0.36, 0.62, 0.6])
    handles, styles, top, bottom, first, late = [], ["-", "--", ":", "-."], [], [], [], []
    for i, row in enumerate(rows):
        label, model = row["label"], models[row["label"]]
        curves = [r["curve"] for r in runs if r["label"] == label]
        steps = min(len(c) for c in curves)
        tokens = np.array([p[0] for p in curves[0][:steps]]) / 1e6
        losses = np.array([[p[1] for p in c[:steps]] for c in curves])
        if i == 0 or models[rows[i - 1]["label"]] != model:  # a legend heading per paper
            handles.append(ax.plot([], [], " ", label=paper(model))[0])
        nth = sum(models[r["label"]] == model for r in rows[:i])
        vanilla = label == "vanilla"
        for a in (ax, zoom):
            line = a.plot(tokens, losses.mean(0), styles[nth % 4], color=colour[label], label=f"  {label}",
                          linewidth=3 if vanilla else 1.3, zorder=3 if vanilla else 2)[0]
            if vanilla and len(curves) > 1:
                band = a.fill_between(tokens, losses.min(0), losses.max(0), color="black", alpha=0.15,
                                      linewidth=0, label="  its seeds, min to max")
        handles += [line, band] if vanilla and len(curves) > 1 else [line]
        first.append(tokens[min(1, steps - 1)])
        top.append(losses.mean(0)[min(1, steps - 1)])  # at the first evaluation after the start
        bottom.append(losses.mean(0).min())
        late += [(t, v) for t, v in zip(tokens, losses.mean(0)) if t >= 0.6 * tokens[-1]]
    pad = 0.03 * (max(top) - min(bottom)) or 0.05  # a run of one evaluation has a flat curve: a margin all the same
    ax.set(xlabel="tokens seen (millions)", ylabel=f"validation loss (nats/token) on {windows} fixed windows",
           xlim=(0.95 * min(first), None), ylim=(min(bottom) - pad, max(top) + pad),
           title="validation loss during training, mean over seeds")
    lo, hi = min(v for _, v in late), max(v for _, v in late)
    if len({t for t, _ in late}) > 1 and hi > lo:  # a curve of a few points has nothing to zoom on
        zoom.set(xlim=(min(t for t, _ in late), max(t for t, _ in late)), ylim=(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo)))
    zoom.set_title("the last 40% of the run", fontsize=8)
    zoom.tick_params(labelsize=7)
    zoom.grid(alpha=0.3)
    ax.indicate_inset_zoom(zoom, edgecolor="grey")
    legend = ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for text in legend.get_texts():
        if not text.get_text().startswith(" "):
            text.set_fontweight("bold")
    ax.grid(alpha=0.3)
    delta_panel(bx, rows, colour, models, "vanilla")
    fig.tight_layout()
    save_png(fig, path, dpi=110, bbox_inches="tight")  # with the Δ panel's text right of its axes
    plt.close(fig)


def plot_ablation(plt, sweep, rows, runs, models, xs, configs, path):
    """An ablation: the final loss (mean ± std over seeds) against the ablation's x, one panel per x-axis, with
    the reference drawn across; its stat (if any) against the same x; the paired Δ panel."""
    by_label = {row["label"]: row for row in rows}
    axes = list(dict.fromkeys(ax for r in runs for ax, _, _ in xs[r["key"]]))
    if not axes:
        return  # only the reference so far
    panels = axes + ([sweep["stat"]] if sweep.get("stat") else [])
    fig, all_axes = plt.subplots(1, len(panels) + 1, figsize=(7 * len(panels) + 6, 6), squeeze=False,
                                 gridspec_kw={"width_ratios": [3] * len(panels) + [2]})
    series_colours = plt.get_cmap("tab10").colors
    colour = colours(list(by_label), models, plt)
    for i, panel in enumerate(panels):
        ax = all_axes[0][i]
        stat = panel == sweep.get("stat")
        points, key = {}, []  # series -> label -> [(x, run), ...]; the key's lines (achieved sparsity)
        for r in runs:
            for axis, series, x in xs[r["key"]]:
                if axis == (axes[0] if stat else panel):
                    points.setdefault(series, {}).setdefault(r["label"], []).append((x, r))
        for k, (series, labels) in enumerate(points.items()):
            marks = []  # (x mean, y mean, x std, y std, text) per label, in x order
            for label, group in labels.items():
                x = [p[0] for p in group]
                y = [p[1]["stats"].get(sweep["stat"], math.nan) if stat else p[1]["val_loss"] for p in group]
                marks.append((statistics.fmean(x), statistics.fmean(y), statistics.stdev(x) if len(x) > 1 else 0,
                              statistics.stdev(y) if len(y) > 1 else 0,
                              annotation(sweep, configs[label], [r for _, r in group], label)))
            xm, ym, xe, ye, texts = zip(*sorted(marks))
            ax.errorbar(xm, ym, xerr=xe if any(xe) else None, yerr=ye, fmt="o-", capsize=3,
                        color=series_colours[k % 10], label=series)
            for x, y, (tag, line) in zip(xm, ym, texts):
                ax.annotate(tag, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=7)
                if line:
                    key.append(line)
        if key:  # under the legend, in the empty upper right: loss falls with FLOPs
            ax.text(0.98, 0.78, "target (tag at the point)\n" + "\n".join(key), transform=ax.transAxes, fontsize=7,
                    family="monospace", va="top", ha="right", bbox=dict(facecolor="white", alpha=0.8, linewidth=0))
        if stat:  # the stat of an untrained model of the first point other than vanilla (vertical's map entropy)
            first, name, _ = next(p for p in sweep["points"] if p[1] != "vanilla")
            init = load_model_module(name).GPT(configs[first]).stats().get(sweep["stat"])
            if init is not None:
                ax.axhline(init, color="grey", linestyle=":", label=f"at initialisation ({init:.2f})")
        elif "vanilla" in by_label:
            v = by_label["vanilla"]
            ax.axhline(v["mean"], color="black", linewidth=2, label=f"vanilla: {v['mean']:.3f}"
                       + (f" ± {v['std']:.3f} (std over seeds)" if v["std"] is not None else ""))
            if v["std"] is not None:
                ax.axhspan(v["mean"] - v["std"], v["mean"] + v["std"], color="black", alpha=0.1, linewidth=0)
        ax.set_xscale(sweep["xscale"])
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set(xlabel=axes[0] if stat else panel, ylabel=f"{sweep['stat']} (final, mean ± std over seeds)" if stat
               else "final val loss, whole split (mean ± std over seeds)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    delta_panel(all_axes[0][-1], rows, colour, models,
                "the dense models at the same FLOPs" if "frontier" in sweep else "vanilla")
    fig.suptitle(f"{sweep['paper']}: {len(runs)} runs")
    fig.tight_layout()
    save_png(fig, path, dpi=110, bbox_inches="tight")  # with the Δ panel's text right of its axes
    plt.close(fig)


def annotation(sweep, config, group, label):
    """(tag beside a point, line of the panel's key or None): skipmiddle's achieved sparsity (mean over seeds) in
    the key, with a short tag at the point; else the label alone."""
    if sweep["name"] != "skipmiddle":
        return label, None
    if not config.gated:
        return f"{config.n_layer}L", None
    stats = [r["stats"] for r in group]
    middle = sum(1 for k in stats[0] if re.fullmatch(r"gate\d+_zero", k)) - 1
    zero = statistics.fmean(s.get(f"gate{middle}_zero", math.nan) for s in stats)
    ratio = statistics.fmean(s.get("est_flops_ratio", math.nan) for s in stats)
    tag = ("no control" if config.gate_gamma == 0 else f"{config.gate_target:g}"
           + (" (paper)" if config.gate_gamma != GATE_GAMMA else ""))
    return tag, f"{tag:>11}: middle gate {zero:4.0%} zero, x{ratio:.2f} FLOPs"


if __name__ == "__main__":
    main_boundary(main)
