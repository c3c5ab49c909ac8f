"""
Speed and memory of every model side by side, in one process, as ratios to vanilla measured in the same run.

    python bench.py --size 50m --block_size 256 --batch_size 8        # every model and variant, CPU
    python bench.py --size 300m --device cuda --compile --json out/bench_300m.json
    python bench.py --size small --train_iters 600 --update_readme     # + train each: the results table

Per model: parameters (and the extra over vanilla), training tokens/s (forward + backward + AdamW step, after
warm-up, median over repeats), peak memory of a training step, MFU on a known GPU, and sampling tokens/s
with and without the key/value cache. On CUDA the peak memory is torch.cuda.max_memory_allocated. On CPU,
where PyTorch keeps no such counter, it is the bytes of parameters, gradients and AdamW state plus the
tensors autograd saves for the backward pass (the part in which the models differ).

With --train_iters N every run is also trained by train.py with one budget (same data, seed, batch, lr and
steps) into <results>/<label>/ and evaluated on the whole validation split; <results>/RESULTS.md and
results.json get the table; --update_readme rewrites README.md's copy of it (between its results markers).
A run whose checkpoint already holds N steps is evaluated again, not retrained.
"""
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
from eval import evaluate_split
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
    p.add_argument("--iters", type=int, default=3, help="training steps per timed repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sample_tokens", type=int, default=32, help="tokens generated per sampling measurement")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA where supported), float32, bfloat16")
    p.add_argument("--compile", type=str2bool, nargs="?", const=True, default=False)
    p.add_argument("--json", default="", help="also write the results to this JSON file")
    p.add_argument("--train_iters", type=int, default=0, help="also train every run this many steps; 0 = no")
    p.add_argument("--results", default="results", help="with --train_iters: folder of the runs and the table")
    p.add_argument("--eval_batch_size", type=int, default=16, help="with --train_iters: windows per eval forward")
    p.add_argument("--dataset", default="shakespeare", help="with --train_iters: data set from prepare.py")
    p.add_argument("--data_dir", default="data")
    p.add_argument("--update_readme", type=str2bool, nargs="?", const=True, default=False,
                   help="with --train_iters: rewrite README.md's results table from this run")
    p.add_argument("--train_args", default="--learning_rate=1e-3 --eval_interval=200",
                   help="with --train_iters: further train.py options, the same for every run")
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


def skip_generation(model, prompt, n_tokens, device, ctx, repeats=3):
    """Models whose generate() can skip (skipmiddle): greedy generation time of n_tokens with skip=True over
    skip=False (median of interleaved repeats), next to est_flops_ratio of the gates of those forwards."""
    if "skip" not in inspect.signature(model.generate).parameters or not hasattr(model, "stats"):
        return {}
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


def measure(label, module, shape, args, device, ctx):
    config = module.GPTConfig(**shape)
    torch.manual_seed(0)
    model = module.GPT(config).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.param_groups(0.1), lr=1e-4)
    step_model = torch.compile(model) if args.compile else model
    B, T = args.batch_size, args.block_size
    x = torch.randint(0, config.vocab_size, (B, T), device=device)
    y = torch.randint(0, config.vocab_size, (B, T), device=device)

    def train_step():
        with ctx:
            _, loss = step_model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if hasattr(model, "after_step"):
            model.after_step()

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.warmup):
        train_step()
    times = []
    for _ in range(args.repeats):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(args.iters):
            train_step()
        sync(device)
        times.append(time.perf_counter() - t0)
    tok_s = B * T * args.iters / statistics.median(times)
    if device.type == "cuda":
        peak_mem = torch.cuda.max_memory_allocated(device)
    else:
        peak_mem = saved_tensor_bytes(model, x, y)
    flops = peak_flops(device, {"peak_flops": 0.0})
    row = {"label": label, "params": n_params, "train_tok_s": tok_s, "peak_mem_bytes": peak_mem,
           "flops_per_token": model.flops_per_token(T),
           "mfu": model.flops_per_token(T) * tok_s / flops if flops else None}

    model.eval()
    prompt = torch.randint(0, config.vocab_size, (1, 16), device=device)
    for use_cache in (True, False):
        with torch.no_grad(), ctx:
            model.generate(prompt, 4, temperature=0, use_cache=use_cache)  # warm-up
            sync(device)
            t0 = time.perf_counter()
            model.generate(prompt, args.sample_tokens, temperature=0, use_cache=use_cache)
            sync(device)
        row["sample_tok_s_cache" if use_cache else "sample_tok_s_nocache"] = args.sample_tokens / (time.perf_counter() - t0)
    row.update(skip_generation(model, prompt, args.sample_tokens, device, ctx))
    del model, optimizer, step_model
    return row


def main(argv):
    args = parse_args(argv)
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    use_bf16 = args.dtype == "bfloat16" or (args.dtype == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported())
    ctx = torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()
    wanted = set(args.runs.split(",")) if args.runs else {r[0] for r in RUNS}
    unknown = wanted - {r[0] for r in RUNS}
    if unknown:
        raise ConfigError(f"unknown --runs {', '.join(sorted(unknown))}; choose from {', '.join(r[0] for r in RUNS)}")
    if args.train_iters:  # train on real data: the vocabulary is the data set's
        args.vocab_size = train.read_meta(args.data_dir, args.dataset)["vocab_size"]
    shape = dict(SIZES.get(args.size, {}), block_size=args.block_size, vocab_size=args.vocab_size)
    if args.size == "small":  # the model files' own defaults: write them out, for the record
        defaults = load_model_module("vanilla").GPTConfig()
        shape = {k: getattr(defaults, k) for k in ("n_embd", "ffn_hidden", "n_head", "n_layer", "n_kv_head")} | shape
    hardware = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)")
    print(f"{args.size} shape, batch {args.batch_size} x {args.block_size} tokens, {hardware}, "
          f"{'bfloat16' if use_bf16 else 'float32'}{', compiled' if args.compile else ''}, torch {torch.__version__}")
    rows = []
    for label, name, overrides in RUNS:
        if label != "vanilla" and label not in wanted:
            continue
        try:
            module = load_model_module(name)
        except ConfigError:
            continue  # that model file is not in this checkout
        rows.append(measure(label, module, {**shape, **overrides}, args, device, ctx))
        print(f"  measured {label}", file=sys.stderr)
    base = rows[0]
    for r in rows:
        r["extra_params"] = r["params"] - base["params"]
        r["train_speed_ratio"] = r["train_tok_s"] / base["train_tok_s"]
        r["peak_mem_ratio"] = r["peak_mem_bytes"] / base["peak_mem_bytes"]
        r["cache_speedup"] = r["sample_tok_s_cache"] / r["sample_tok_s_nocache"]

    header = (f"{'model':<17}{'params':>12}{'extra':>12}{'train tok/s':>13}{'x vanilla':>10}{'peak MB':>10}"
              f"{'x vanilla':>10}{'MFU':>7}{'sample tok/s':>14}{'no cache':>10}")
    print(header)
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"{r['label']:<17}{r['params']:>12,}{r['extra_params']:>12,}{r['train_tok_s']:>13,.0f}"
              f"{r['train_speed_ratio']:>10.3f}{r['peak_mem_bytes'] / 2**20:>10.1f}{r['peak_mem_ratio']:>10.3f}"
              f"{mfu:>7}{r['sample_tok_s_cache']:>14,.1f}{r['sample_tok_s_nocache']:>10,.1f}")
    for r in rows:
        if "skip_time_ratio" in r:  # greedy generation, B=1, with the cache
            print(f"{r['label']}: generation {r['sample_tok_s_skip']:,.1f} tok/s skipping, {r['sample_tok_s_dense']:,.1f} "
                  f"dense: time ratio {r['skip_time_ratio']:.3f}, est_flops_ratio {r['est_flops_ratio']:.3f}")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"size": args.size, "shape": shape, "batch_size": args.batch_size, "hardware": hardware,
                       "dtype": "bfloat16" if use_bf16 else "float32", "compile": args.compile,
                       "torch": torch.__version__, "results": rows}, f, indent=1)
    if args.train_iters:
        runs = {label: (name, overrides) for label, name, overrides in RUNS}
        for r in rows:
            r.update(train_and_evaluate(r["label"], *runs[r["label"]], shape, args, device, ctx))
        write_results(rows, args, shape, hardware, "bfloat16" if use_bf16 else "float32", argv)
    return rows


def train_and_evaluate(label, name, overrides, shape, args, device, ctx):
    """Train one run with the shared budget (or finish it), then its loss over the whole validation split."""
    out_dir = os.path.join(args.results, label)
    path = os.path.join(out_dir, "ckpt.pt")
    steps = torch.load(path, map_location="cpu", weights_only=False)["iter_num"] if os.path.exists(path) else 0
    if steps < args.train_iters:
        train.main([f"--model={name}", f"--out_dir={out_dir}", f"--dataset={args.dataset}",
                    f"--data_dir={args.data_dir}", f"--max_iters={args.train_iters}", f"--batch_size={args.batch_size}",
                    f"--device={device}", *[f"--{k}={v}" for k, v in {**shape, **overrides}.items()],
                    *args.train_args.split(), *(["--resume"] if steps else [])])
    model, ckpt = train.load_checkpoint(out_dir, device)
    model.eval()
    meta = ckpt["meta"]
    val = np.memmap(os.path.join(args.data_dir, args.dataset, "val.bin"), dtype=np.dtype(meta["dtype"]), mode="r")
    loss, _, count = evaluate_split(model, val, shape["block_size"], args.eval_batch_size, device, ctx, progress=False)
    stats = model.stats() if hasattr(model, "stats") else {}
    return {"val_loss": loss[-1].item(), "val_ppl": math.exp(loss[-1].item()), "val_tokens": count,
            "steps": ckpt["iter_num"], "tokens_seen": ckpt["iter_num"] * args.batch_size * shape["block_size"],
            "stats": stats}


def write_results(rows, args, shape, hardware, dtype, argv):
    """results/RESULTS.md + results.json, and the same table in README.md between its results markers."""
    os.makedirs(args.results, exist_ok=True)
    shape_text = ", ".join(f"{k} {v}" for k, v in {**SIZES.get(args.size, {}), **shape}.items())
    lines = [
        f"`python bench.py {shlex.join(argv)}` on {hardware}, {dtype}, torch {torch.__version__}: "
        f"{args.size} shape ({shape_text}), data set `{args.dataset}`, {rows[0]['steps']} steps of "
        f"{args.batch_size} x {args.block_size} tokens ({rows[0]['tokens_seen']:,} tokens seen), seed "
        f"{train.TRAIN_DEFAULTS['seed']}, train.py options `{args.train_args}`; validation loss over the whole "
        f"validation split ({rows[0]['val_tokens']:,} tokens). Speed and memory: ratios to vanilla at the same shape, "
        "measured in the same process.",
        "",
        "| model | val loss | val ppl | params | extra params | train tok/s (x vanilla) | peak memory (x vanilla) | stats |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        stats = ", ".join(f"{k} {v:.3g}" for k, v in r["stats"].items()
                          if isinstance(v, (int, float)) and ("flops" in k or k.endswith("entropy")))
        lines.append(f"| {r['label']} | {r['val_loss']:.4f} | {r['val_ppl']:.3f} | {r['params']:,} | "
                     f"{r['extra_params']:,} | {r['train_speed_ratio']:.3f} | {r['peak_mem_ratio']:.3f} | {stats} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.results, "RESULTS.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.results, "results.json"), "w") as f:
        json.dump({"command": ["bench.py", *argv], "hardware": hardware, "dtype": dtype, "shape": shape,
                   "dataset": args.dataset, "results": rows}, f, indent=1)
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")
    text = open(readme).read()
    marked = re.compile(r"(<!-- results:start -->\n).*?(<!-- results:end -->)", re.S)
    if args.update_readme and marked.search(text):
        with open(readme, "w") as f:
            f.write(marked.sub(lambda m: m.group(1) + table + m.group(2), text))
    print(table)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as e:
        fail(str(e))
