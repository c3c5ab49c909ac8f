"""
Speed and memory of every model side by side, in one process, as ratios to vanilla measured in the same run;
with --train_iters, a sweep that trains every model with one budget and several seeds.

    python bench.py --size 50m --block_size 256 --batch_size 8        # every model and variant, CPU
    python bench.py --size 300m --device cuda --compile --json out/bench_300m.json
    python bench.py --size small --train_iters 500 --seeds 3 --update_readme   # the results table and curves

Per model: parameters (and the extra over vanilla), training tokens/s (forward + backward + AdamW step, after
warm-up, median over repeats), peak memory of a training step, MFU on a known GPU, and sampling tokens/s
with and without the key/value cache. The speed ratio to vanilla comes from timed repeats interleaved with
vanilla's (V M V M ... M V, each model repeat against the mean of its two neighbours), so that a change in the
machine's load hits both sides alike: the table gives the median ratio and, in brackets, the smallest and the
largest; the JSON keeps every repeat's seconds. On CUDA the peak memory is torch.cuda.max_memory_allocated
less the memory held before the model was built (vanilla's). On CPU, where PyTorch keeps no such counter, it
is the bytes of parameters, gradients and AdamW state plus the tensors autograd saves for the backward pass
(the part in which the models differ).

With --train_iters N every label is trained by train.py with one budget (same data, batch, lr and steps) and
each of --seeds seeds (the seed sets the initialisation and the order of the training windows), then
evaluated on the whole validation split. <results>/results.json keeps every run, keyed by all of its train.py
options and the data set, and is written after each run: the same command run again skips the runs it holds,
so a sweep can be finished over several sittings, and a changed option never reuses a stale run. From it come
<results>/RESULTS.md (val loss mean ± std over seeds, the paired difference to vanilla ± its standard error),
<results>/curves.png (validation loss against tokens seen) and, with --update_readme, README.md's copy of the
table between its `<!-- <results>:start -->` markers.
"""
import copy
import hashlib
import inspect
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch

import train
from eval import evaluate_split, import_pyplot
from train import SIZES, ArgumentParser, ConfigError, fail, load_model_module, peak_flops, str2bool

# (label, model file, config overrides): each method's default and the variants its paper compares
RUNS = [
    ("vanilla", "vanilla", {}),
    ("vertical", "vertical", {}),
    ("vertical-unet", "vertical", dict(va_map="unet")),
    ("vertical-inet", "vertical", dict(va_map="inet")),
    ("skiplayer", "skiplayer", {}),
    ("skiplayer-ala", "skiplayer", dict(ala_every=2)),
    ("attnres", "attnres", {}),
    ("attnres-full", "attnres", dict(attn_res="full")),
    ("aila", "aila", {}),
    ("aila-arch1", "aila", dict(aila_arch=1)),
    ("aila-residual", "aila", dict(aila_merge="residual")),
    ("skipmiddle", "skipmiddle", {}),
    ("skipmiddle-dense", "skipmiddle", dict(gated=False)),
]


def parse_args(argv):
    p = ArgumentParser(description=__doc__.strip().splitlines()[0],
                       formatter_class=__import__("argparse").ArgumentDefaultsHelpFormatter)
    p.add_argument("--size", default="50m", choices=["small", *SIZES],
                   help="model shape: a preset, or small = the model files' default (the CPU quick start)")
    p.add_argument("--block_size", type=int, default=256, help="sequence length")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--vocab_size", type=int, default=50304, help="GPT-2's vocabulary, padded to a multiple of 64")
    p.add_argument("--runs", default="", help="comma-separated labels to measure; '' = all (" +
                   ", ".join(r[0] for r in RUNS) + "); vanilla is always measured")
    p.add_argument("--warmup", type=int, default=2, help="untimed training steps per model")
    p.add_argument("--iters", type=int, default=2, help="training steps per timed repeat")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed repeats per model, each between two of vanilla's: the speed ratio is their median")
    p.add_argument("--sample_tokens", type=int, default=32, help="tokens generated per sampling measurement")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA where supported), float32, bfloat16")
    p.add_argument("--compile", type=str2bool, nargs="?", const=True, default=False)
    p.add_argument("--json", default="", help="also write the results to this JSON file")
    p.add_argument("--close_gates", type=int, default=-1,
                   help="skipmiddle: before timing generation with and without skipping, close gate K and every later "
                        "one for every token (blocks K to L-1-K skipped); -1 = the gates as initialised")
    p.add_argument("--checkpoint", default="",
                   help="time only generation with and without skipping, on this trained run (its out_dir), prompted "
                        "with the start of its data set's val split from --data_dir")
    p.add_argument("--train_iters", type=int, default=0, help="train every label this many steps (a sweep); 0 = no")
    p.add_argument("--seeds", type=int, default=3, help="sweep: seeds per label, --seed, --seed + 1, ...")
    p.add_argument("--seed", type=int, default=train.TRAIN_DEFAULTS["seed"], help="sweep: the first seed")
    p.add_argument("--n_layer", type=int, default=0, help="sweep or speed: number of layers; 0 = the --size shape's")
    p.add_argument("--eval_points", type=int, default=10, help="sweep: validation evaluations per run (the curves)")
    p.add_argument("--max_runs", type=int, default=0, help="sweep: stop after this many new runs; 0 = all")
    p.add_argument("--table_only", type=str2bool, nargs="?", const=True, default=False,
                   help="sweep: train nothing; write the table and curves from the runs results.json holds")
    p.add_argument("--results", default="results", help="sweep: folder of results.json, RESULTS.md, curves.png")
    p.add_argument("--runs_dir", default="out/bench", help="sweep: folder of the runs' checkpoints and logs")
    p.add_argument("--eval_batch_size", type=int, default=16, help="sweep: windows per eval forward")
    p.add_argument("--dataset", default="shakespeare", help="sweep: data set from prepare.py")
    p.add_argument("--data_dir", default="data")
    p.add_argument("--update_readme", type=str2bool, nargs="?", const=True, default=False,
                   help="sweep: rewrite README.md's copy of the table")
    p.add_argument("--train_args", default="--learning_rate=1e-3 --eval_iters=10",
                   help="sweep: further train.py options, the same for every run")
    return p.parse_args(argv)


def saved_tensor_bytes(model, x, y):
    """Bytes autograd keeps for the backward pass of one training forward (each storage counted once)."""
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = model(x, y)
    loss.backward()
    model.zero_grad(set_to_none=True)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return sum(seen.values()) + 4 * params  # + parameters, gradients, AdamW's two moments


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


class Training:
    """One model with its AdamW optimiser and one fixed random batch: step() is a training step, timed() the
    seconds of --iters of them."""

    def __init__(self, module, shape, args, device, ctx):
        self.config = module.GPTConfig(**shape)
        torch.manual_seed(0)
        self.model = module.GPT(self.config).to(device)
        self.optimizer = torch.optim.AdamW(self.model.param_groups(0.1), lr=1e-4)
        self.step_model = torch.compile(self.model) if args.compile else self.model
        self.x = torch.randint(0, self.config.vocab_size, (args.batch_size, args.block_size), device=device)
        self.y = torch.randint(0, self.config.vocab_size, (args.batch_size, args.block_size), device=device)
        self.iters, self.device, self.ctx = args.iters, device, ctx

    def step(self):
        with self.ctx:
            _, loss = self.step_model(self.x, self.y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if hasattr(self.model, "after_step"):
            self.model.after_step()

    def timed(self):
        sync(self.device)
        t0 = time.perf_counter()
        for _ in range(self.iters):
            self.step()
        sync(self.device)
        return time.perf_counter() - t0


def interleaved(vanilla, run, repeats):
    """Timed repeats in alternation, vanilla first and last: V M V M ... M V. Each model repeat is compared with
    the mean of the vanilla repeats just before and after it, so that a change in the machine's load (other
    jobs, clocks, caches) hits both sides of a ratio alike. Returns (vanilla seconds, model seconds, speed
    ratios model / vanilla)."""
    t_vanilla, t_model = [vanilla.timed()], []
    for _ in range(repeats):
        t_model.append(run.timed())
        t_vanilla.append(vanilla.timed())
    ratios = [(a + b) / 2 / t for a, b, t in zip(t_vanilla, t_vanilla[1:], t_model)]  # tok/s ratio = time ratio
    return t_vanilla, t_model, ratios


def skip_generation(model, prompt, n_tokens, device, ctx, repeats=3):
    """Models whose generate() can skip (skipmiddle): greedy generation time of n_tokens with skip=True over
    skip=False (median of interleaved repeats), next to est_flops_ratio of the gates of those forwards."""
    if "skip" not in inspect.signature(model.generate).parameters or not getattr(model, "gates", None):
        return {}  # a model without gates (skipmiddle-dense) has nothing to skip
    times = {True: [], False: []}
    with torch.no_grad(), ctx:
        model.stats()  # drop the gate statistics of earlier forwards
        for _ in range(repeats):
            for skip in (False, True):
                sync(device)
                t0 = time.perf_counter()
                model.generate(prompt, n_tokens, temperature=0, skip=skip)
                sync(device)
                times[skip].append(time.perf_counter() - t0)
    dense, skipping = statistics.median(times[False]), statistics.median(times[True])
    return {"sample_tok_s_skip": n_tokens / skipping, "sample_tok_s_dense": n_tokens / dense,
            "skip_time_ratio": skipping / dense, "est_flops_ratio": model.stats().get("est_flops_ratio")}


def close_gates(model, first):
    """Every token's gate 0 from gate `first` on: a bias of 2 there puts the soft mask S (eq. 1) at 2 >= 1 for it
    and every later gate (S only grows), so g = 1 - clamp(S, 0, 1) = 0 (eq. 2) in blocks first to L-1-first."""
    if not 0 <= first < len(model.gates):
        raise ConfigError(f"--close_gates must be between 0 and {len(model.gates) - 1} for {len(model.gates)} gates")
    with torch.no_grad():
        for gate in model.gates:
            gate.weight.zero_()
            gate.bias.zero_()
        model.gates[first].bias.fill_(2.0)


def checkpoint_generation(args, device, ctx):
    """--checkpoint: skip_generation() on a trained run, greedy from the first 16 tokens of its val split."""
    model, ckpt = train.load_checkpoint(args.checkpoint, device)
    model.eval()
    meta = ckpt["meta"]
    val = np.memmap(os.path.join(args.data_dir, meta["dataset"], "val.bin"), dtype=np.dtype(meta["dtype"]), mode="r")
    prompt = torch.from_numpy(val[:16].astype(np.int64))[None].to(device)  # (1, 16)
    if args.close_gates >= 0:
        close_gates(model, args.close_gates)
    row = {"checkpoint": args.checkpoint, "steps": ckpt["iter_num"],
           **skip_generation(model, prompt, args.sample_tokens, device, ctx)}
    if "skip_time_ratio" not in row:
        raise ConfigError(f"{args.checkpoint} holds a {ckpt['model_name']} model without gates: nothing to skip")
    print(f"{args.checkpoint} (step {row['steps']}): generation {row['sample_tok_s_skip']:,.1f} tok/s skipping, "
          f"{row['sample_tok_s_dense']:,.1f} dense: time ratio {row['skip_time_ratio']:.3f}, "
          f"est_flops_ratio {row['est_flops_ratio']:.3f}")
    return [row]


def measure(label, module, shape, args, device, ctx):
    """Parameters, peak memory and sampling speed of one model; returns the row and its warm Training, timed
    later against vanilla's. On CUDA, memory held before this model was built (vanilla's) is not counted."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        held = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    run = Training(module, shape, args, device, ctx)
    model, T = run.model, args.block_size
    for _ in range(args.warmup):
        run.step()
    if device.type == "cuda":
        peak_mem = torch.cuda.max_memory_allocated(device) - held
    else:
        peak_mem = saved_tensor_bytes(model, run.x, run.y)
    row = {"label": label, "params": sum(p.numel() for p in model.parameters()), "peak_mem_bytes": peak_mem,
           "flops_per_token": model.flops_per_token(T)}

    model.eval()
    prompt = torch.randint(0, run.config.vocab_size, (1, 16), device=device)
    for use_cache in (True, False):
        with torch.no_grad(), ctx:
            model.generate(prompt, 4, temperature=0, use_cache=use_cache)  # warm-up
            sync(device)
            t0 = time.perf_counter()
            model.generate(prompt, args.sample_tokens, temperature=0, use_cache=use_cache)
            sync(device)
        row["sample_tok_s_cache" if use_cache else "sample_tok_s_nocache"] = args.sample_tokens / (time.perf_counter() - t0)
    skipper = model
    if args.close_gates >= 0 and getattr(model, "gates", None):
        skipper = copy.deepcopy(model)  # the timed training keeps the gates as initialised
        close_gates(skipper, args.close_gates)
    row.update(skip_generation(skipper, prompt, args.sample_tokens, device, ctx))
    model.train()
    return row, run


def measure_all(wanted, shape, args, device, ctx):
    """Rows for vanilla and every wanted run. Training speed: each model's timed repeats interleaved with
    vanilla's (see interleaved()); train_speed_ratio is the median of the per-pair ratios, with their min and
    max; vanilla's train_tok_s is the median of all its repeats."""
    rows, vanilla = [], None
    for label, name, overrides in RUNS:
        if label != "vanilla" and label not in wanted:
            continue
        try:
            module = load_model_module(name)
        except ConfigError:
            continue  # that model file is not in this checkout
        row, run = measure(label, module, {**shape, **overrides}, args, device, ctx)
        if vanilla is None:
            vanilla, row["train_seconds"] = run, []
        else:
            if args.warmup:
                vanilla.step()  # building and warming this model may have evicted vanilla's caches
            t_vanilla, row["train_seconds"], row["train_speed_ratios"] = interleaved(vanilla, run, args.repeats)
            rows[0]["train_seconds"] += t_vanilla
        del run
        rows.append(row)
        print(f"  measured {label}", file=sys.stderr)
    base = rows[0]
    if not base["train_seconds"]:  # vanilla alone
        base["train_seconds"] = [vanilla.timed() for _ in range(args.repeats)]
    flops = peak_flops(device, {"peak_flops": 0.0})
    for r in rows:
        r["train_tok_s"] = args.batch_size * args.block_size * args.iters / statistics.median(r["train_seconds"])
        r["mfu"] = r["flops_per_token"] * r["train_tok_s"] / flops if flops else None
        ratios = r.get("train_speed_ratios", [1.0])
        r["train_speed_ratio"] = statistics.median(ratios)
        r["train_speed_ratio_min"], r["train_speed_ratio_max"] = min(ratios), max(ratios)
        r["extra_params"] = r["params"] - base["params"]
        r["peak_mem_ratio"] = r["peak_mem_bytes"] / base["peak_mem_bytes"]
        r["cache_speedup"] = r["sample_tok_s_cache"] / r["sample_tok_s_nocache"]
    return rows


def print_measurements(rows):
    header = (f"{'model':<17}{'params':>12}{'extra':>12}{'train tok/s':>13}{'x vanilla (min-max)':>22}"
              f"{'peak MB':>10}{'x vanilla':>10}{'MFU':>7}{'sample tok/s':>14}{'no cache':>10}")
    print(header)
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        speed = f"{r['train_speed_ratio']:.3f}"
        if "train_speed_ratios" in r:
            speed += f" ({r['train_speed_ratio_min']:.2f}-{r['train_speed_ratio_max']:.2f})"
        print(f"{r['label']:<17}{r['params']:>12,}{r['extra_params']:>12,}{r['train_tok_s']:>13,.0f}{speed:>22}"
              f"{r['peak_mem_bytes'] / 2**20:>10.1f}{r['peak_mem_ratio']:>10.3f}"
              f"{mfu:>7}{r['sample_tok_s_cache']:>14,.1f}{r['sample_tok_s_nocache']:>10,.1f}")
    for r in rows:
        if "skip_time_ratio" in r:  # greedy generation, B=1, with the cache
            print(f"{r['label']}: generation {r['sample_tok_s_skip']:,.1f} tok/s skipping, {r['sample_tok_s_dense']:,.1f} "
                  f"dense: time ratio {r['skip_time_ratio']:.3f}, est_flops_ratio {r['est_flops_ratio']:.3f}")


def main(argv):
    args = parse_args(argv)
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    use_bf16 = args.dtype == "bfloat16" or (args.dtype == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported())
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()
    wanted = set(args.runs.split(",")) if args.runs else {r[0] for r in RUNS}
    unknown = wanted - {r[0] for r in RUNS}
    if unknown:
        raise ConfigError(f"unknown --runs {', '.join(sorted(unknown))}; choose from {', '.join(r[0] for r in RUNS)}")
    if min(args.iters, args.repeats) < 1 or args.warmup < 0:
        raise ConfigError("--iters and --repeats must be at least 1, --warmup at least 0")
    if args.checkpoint:
        return checkpoint_generation(args, device, ctx)
    if args.train_iters:  # train on real data: the vocabulary is the data set's
        args.vocab_size = train.read_meta(args.data_dir, args.dataset)["vocab_size"]
    shape = dict(SIZES.get(args.size, {}), block_size=args.block_size, vocab_size=args.vocab_size)
    if args.size == "small":  # the model files' own defaults: write them out, for the record
        defaults = load_model_module("vanilla").GPTConfig()
        shape = {k: getattr(defaults, k) for k in ("n_embd", "ffn_hidden", "n_head", "n_layer", "n_kv_head")} | shape
    if args.n_layer:
        shape["n_layer"] = args.n_layer
    hardware = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} "
                   f"thread{'s' if torch.get_num_threads() > 1 else ''})")
    print(f"{args.size} shape, batch {args.batch_size} x {args.block_size} tokens, {hardware}, "
          f"{'bfloat16' if use_bf16 else 'float32'}{', compiled' if args.compile else ''}, torch {torch.__version__}")
    if args.train_iters:
        return sweep(wanted | {"vanilla"}, shape, args, device, ctx, hardware, "bfloat16" if use_bf16 else "float32", argv)
    rows = measure_all(wanted, shape, args, device, ctx)
    print_measurements(rows)
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"size": args.size, "shape": shape, "batch_size": args.batch_size, "hardware": hardware,
                       "dtype": "bfloat16" if use_bf16 else "float32", "compile": args.compile,
                       "torch": torch.__version__, "warmup": args.warmup, "iters": args.iters, "repeats": args.repeats,
                       "results": rows}, f, indent=1)
    return rows


# ----------------------------------------------------------------------------------------------------------
# --train_iters: a sweep that trains every (label, seed) with one budget, resumable run by run

def train_options(name, overrides, seed, shape, args, device, dtype):
    """The train.py options of one run: everything that shapes its result (not where it is written)."""
    return [f"--model={name}", f"--dataset={args.dataset}", f"--max_iters={args.train_iters}",
            f"--batch_size={args.batch_size}", f"--seed={seed}", f"--device={device.type}", f"--dtype={dtype}",
            f"--eval_interval={max(1, args.train_iters // args.eval_points)}",
            *[f"--{k}={v}" for k, v in {**shape, **overrides}.items()], *args.train_args.split()]


def run_key(options, meta):
    """A run's identity: its train.py options and the data set it reads. A changed option is a new run."""
    blob = json.dumps({"options": options, "data": meta}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def train_and_evaluate(label, seed, options, key, args, device, ctx, meta):
    """Train one (label, seed) run with the shared budget (or finish it), then evaluate the whole val split."""
    out_dir = os.path.join(args.runs_dir, f"{label}-seed{seed}-{key}")
    path = os.path.join(out_dir, "ckpt.pt")
    steps = torch.load(path, map_location="cpu", weights_only=False)["iter_num"] if os.path.exists(path) else 0
    t0 = time.time()
    if steps < args.train_iters:  # a run cut off earlier goes on from its last checkpoint
        train.main([*options, f"--out_dir={out_dir}", f"--data_dir={args.data_dir}", *(["--resume"] if steps else [])])
    seconds = time.time() - t0
    model, ckpt = train.load_checkpoint(out_dir, device)
    model.eval()
    T = model.config.block_size
    val = np.memmap(os.path.join(args.data_dir, args.dataset, "val.bin"), dtype=np.dtype(meta["dtype"]), mode="r")
    loss, _, count = evaluate_split(model, val, T, args.eval_batch_size, device, ctx, progress=False)
    evals = {}  # the validation curve from the run's log; where a resumed log repeats a step, the last wins
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        for record in map(json.loads, f):
            if "val_loss" in record:
                evals[record["iter"]] = record["val_loss"]
    return {"label": label, "seed": seed, "key": key, "options": options,
            "val_loss": loss[-1].item(), "val_tokens": count, "steps": ckpt["iter_num"],
            "tokens_seen": ckpt["iter_num"] * args.batch_size * T, "train_seconds": round(seconds, 1),
            "params": sum(p.numel() for p in model.parameters()),
            "stats": model.stats() if hasattr(model, "stats") else {},
            "curve": [[it * args.batch_size * T, v] for it, v in sorted(evals.items())]}


def aggregate(runs, labels):
    """Per label: val loss mean and std over seeds, and the paired (same-seed) difference to vanilla: its mean
    and standard error, marked when |mean| > 2 SE (which needs two or more pairs)."""
    by_label = {}
    for r in runs:
        by_label.setdefault(r["label"], {})[r["seed"]] = r["val_loss"]
    base = by_label.get("vanilla", {})
    rows = []
    for label in labels:
        losses = by_label.get(label)
        if not losses:
            continue
        values = list(losses.values())
        diffs = [loss - base[seed] for seed, loss in losses.items() if seed in base] if label != "vanilla" else []
        row = {"label": label, "n": len(values), "mean": statistics.fmean(values),
               "std": statistics.stdev(values) if len(values) > 1 else None,
               "n_pairs": len(diffs), "delta": statistics.fmean(diffs) if diffs else None,
               "delta_se": statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None}
        row["marked"] = row["delta_se"] is not None and abs(row["delta"]) > 2 * row["delta_se"]
        rows.append(row)
    return rows


def sweep(labels, shape, args, device, ctx, hardware, dtype, argv):
    """Train every (label, seed) of the plan that <results>/results.json does not hold yet; then the table
    (RESULTS.md, and README.md with --update_readme) and the curves (curves.png) over the plan's runs."""
    meta = train.read_meta(args.data_dir, args.dataset)
    os.makedirs(args.results, exist_ok=True)
    json_path = os.path.join(args.results, "results.json")
    done = saved_runs(json_path)  # runs of other configurations stay in the file, unused
    command = ["bench.py", *without_options(argv, "--max_runs", "--table_only")]  # the command that regenerates
    header = {"command": command, "hardware": hardware, "dtype": dtype, "torch": torch.__version__,
              "size": args.size, "shape": shape, "dataset": args.dataset, "batch_size": args.batch_size,
              "train_iters": args.train_iters, "seeds": [args.seed + i for i in range(args.seeds)]}
    plan, new = [], 0
    for seed in header["seeds"]:  # seed by seed, so that paired differences to vanilla come early
        for label, name, overrides in RUNS:
            if label in labels:
                options = train_options(name, overrides, seed, shape, args, device, dtype)
                plan.append((label, seed, options, run_key(options, meta)))
    for label, seed, options, key in plan:
        if key in done:
            continue
        if args.table_only or (args.max_runs and new == args.max_runs):
            print(f"stopped after {new} new runs; the same command without --max_runs or --table_only goes on from here",
                  file=sys.stderr)
            break
        print(f"training {label}, seed {seed} ({len(done.keys() & {p[3] for p in plan}) + 1} of {len(plan)})",
              file=sys.stderr)
        record = train_and_evaluate(label, seed, options, key, args, device, ctx, meta)
        done = {**saved_runs(json_path), key: record}  # with what a sweep beside this one has written meanwhile
        new += 1
        write_json(json_path, {**header, "runs": list(done.values())})  # after every run: nothing is lost
    done = {**saved_runs(json_path), **done}
    runs = [done[key] for *_, key in plan if key in done]
    if not runs:
        return []
    rows = aggregate(runs, [label for label, *_ in RUNS if label in labels])
    write_json(json_path, {**header, "summary": rows, "runs": list(done.values())})
    table = results_table(rows, runs, header, args)
    with open(os.path.join(args.results, "RESULTS.md"), "w") as f:
        f.write(table)
    if args.update_readme:
        update_readme(table, args.results)
    print(table)
    plot_curves(rows, runs, os.path.join(args.results, "curves.png"))
    return rows


def saved_runs(json_path):
    """The runs results.json holds, by key."""
    runs = json.load(open(json_path)).get("runs", []) if os.path.exists(json_path) else []
    return {r["key"]: r for r in runs}


def without_options(argv, *names):
    """argv less the named options, in either form (--name=value or --name value)."""
    kept, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
        elif a.split("=")[0] in names:
            skip = "=" not in a and i + 1 < len(argv) and not argv[i + 1].startswith("--")
        else:
            kept.append(a)
    return kept


def write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)  # atomic: an interrupted sweep never leaves a broken results.json


def results_table(rows, runs, header, args):
    by_label = {}
    for r in runs:
        by_label.setdefault(r["label"], []).append(r)
    base = by_label.get("vanilla", [{}])[0].get("params")
    hours = sum(r["train_seconds"] for r in runs) / 3600
    lines = [
        f"`python {shlex.join(header['command'])}` on {header['hardware']}, {header['dtype']}, torch "
        f"{header['torch']}: {args.size} shape ({', '.join(f'{k} {v}' for k, v in header['shape'].items())}), "
        f"data set `{args.dataset}`, {args.train_iters} steps of {args.batch_size} x {header['shape']['block_size']} "
        f"tokens ({args.train_iters * args.batch_size * header['shape']['block_size']:,} tokens), seeds "
        f"{', '.join(map(str, header['seeds']))}, train.py options `{args.train_args}`; {len(runs)} runs, "
        f"{hours:.2f} hours of training in all. Validation loss over the whole validation split "
        f"({runs[0]['val_tokens']:,} tokens) as mean ± std over seeds; Δ = the mean of the same-seed differences "
        "to vanilla ± its standard error, **bold** where |Δ| > 2 SE.",
        "",
        "| model | seeds | val loss | Δ vs vanilla | reading | params | extra params | stats (mean over seeds) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        group = by_label[row["label"]]
        loss = f"{row['mean']:.4f}" + (f" ± {row['std']:.4f}" if row["std"] is not None else "")
        if row["delta"] is None:
            delta, reading = "", "(baseline)" if row["label"] == "vanilla" else "no vanilla pair"
        else:
            delta = f"{row['delta']:+.4f}" + (f" ± {row['delta_se']:.4f}" if row["delta_se"] is not None else "")
            delta = f"**{delta}**" if row["marked"] else delta
            reading = (("better" if row["delta"] < 0 else "worse") if row["marked"] else
                       "within noise" if row["delta_se"] is not None else "one seed: no SE")
        stats = [{k: v for k, v in r["stats"].items() if isinstance(v, (int, float))} for r in group]
        shown = ", ".join(f"{k} {statistics.fmean(s[k] for s in stats):.3g}" for k in stats[0]
                          if ("flops" in k or k.endswith("entropy")) and all(k in s for s in stats))
        params = group[0]["params"]
        extra = f"{params - base:,}" if base is not None else ""
        lines.append(f"| {row['label']} | {row['n']} | {loss} | {delta} | {reading} | {params:,} | {extra} | {shown} |")
    return "\n".join(lines) + "\n"


def update_readme(table, results):
    """Replace README.md's copy of the table between its markers for this results folder."""
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")
    text = open(readme).read()
    tag = os.path.normpath(results)
    marked = re.compile(rf"(<!-- {re.escape(tag)}:start -->\n).*?(<!-- {re.escape(tag)}:end -->)", re.S)
    if not marked.search(text):
        print(f"note: README.md has no <!-- {tag}:start --> marker; its table is left alone", file=sys.stderr)
        return
    with open(readme, "w") as f:
        f.write(marked.sub(lambda m: m.group(1) + table + m.group(2), text))


def plot_curves(rows, runs, path):
    """Validation loss against tokens seen (mean over seeds, min-max band) and each model's final loss."""
    plt = import_pyplot()
    if plt is None:
        print("note: no matplotlib, so no curves.png (pip install matplotlib)", file=sys.stderr)
        return
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    colours = plt.get_cmap("tab20").colors
    tail = []  # the y range: from the best loss to where the slowest curve stands at a fifth of the run
    for i, row in enumerate(rows):
        curves = [r["curve"] for r in runs if r["label"] == row["label"]]
        steps = min(len(c) for c in curves)
        tokens = np.array([p[0] for p in curves[0][:steps]])
        losses = np.array([[p[1] for p in c[:steps]] for c in curves])
        style = "--" if i % 2 else "-"
        ax.plot(tokens, losses.mean(0), style, color=colours[i % 20], label=row["label"])
        ax.fill_between(tokens, losses.min(0), losses.max(0), color=colours[i % 20], alpha=0.2, linewidth=0)
        tail += [losses.min(), losses.mean(0)[min(steps - 1, max(1, steps // 5))]]
    ax.set(xlabel="tokens seen", ylabel="validation loss (nats/token)", ylim=(min(tail) - 0.02, max(tail)),
           title="validation loss during training (mean over seeds, band: min to max)")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    y = np.arange(len(rows))[::-1]
    for i, row in enumerate(rows):
        bx.errorbar(row["mean"], y[i], xerr=row["std"] or 0, fmt="o", color=colours[i % 20], capsize=3)
    bx.set_yticks(y, [f"{row['label']} (n={row['n']})" for row in rows])
    bx.set(xlabel="final validation loss, whole split (mean ± std over seeds)", title="final loss")
    if rows and rows[0]["label"] == "vanilla":
        bx.axvline(rows[0]["mean"], color="grey", linestyle=":", linewidth=1)
    bx.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)



if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as e:
        fail(str(e))
