"""
Speed and memory of every model side by side, in one process, as ratios to vanilla measured in the same run.

    python -m tools.bench --size 50m --block_size 256 --batch_size 8        # every model and variant, CPU
    python -m tools.bench --size 300m --device cuda --compile --json results/bench_300m.json

Per model: parameters (and the extra over vanilla), training tokens/s (forward + backward + AdamW step, after
warm-up, median over repeats), peak memory of a training step, MFU on a known GPU, and sampling tokens/s
with and without the key/value cache. The speed ratio to vanilla comes from timed repeats interleaved with
vanilla's (V M V M ... M V, each model repeat against the mean of its two neighbours), so that a change in the
machine's load hits both sides alike: the table gives the median ratio and, in brackets, the smallest and the
largest; the JSON keeps every repeat's seconds. On CUDA the peak memory is torch.cuda.max_memory_allocated
less the memory held before the model was built (vanilla's). On CPU, where PyTorch keeps no such counter, it
is the bytes of parameters, gradients and AdamW state plus the tensors autograd saves for the backward pass
(the part in which the models differ). The trained results tables come from tools/sweep.py.
"""
import copy
import functools
import importlib.util
import os
import statistics
import sys
import time
from dataclasses import dataclass, make_dataclass

import numpy as np
import torch

if __package__ in (None, ""):  # run as a file: the modules it imports are at the repository root
    sys.exit("run it from the repository root as `python -m tools.bench`")

from common import (DTYPES, SIZES, autocast, check_close_gates, close_gates, model_from_checkpoint,
                    peak_flops, resolve_device, resolve_dtype, synchronize)
from generate import compile_decode_step, decode_step, generate
from plumbing.config import build_model, labelled_models, load_model_module, option
from plumbing.errors import ConfigError, main_boundary, printable
from plumbing.files import checkpoint_path, open_split, read_meta, regular_file, write_json
from plumbing.options import parse_simple
from tools.tables import chosen, command_line, spread, each, hardware_name, read_results, shape_of, update_readme

# (label, model file, config overrides): vanilla, then every other model file's default (label: its name) and each
# of the VARIANTS its file declares (label: name-variant), the comparisons of its paper
RUNS = labelled_models()


@dataclass
class BenchConfig:
    size: str = option("50m", "model shape: a preset, or small = the model files' default width and depth (the CPU "
                       "quick start's 1.5M parameters at its byte vocabulary: pass --vocab_size 257; at the default "
                       "GPT-2 vocabulary, 14.4M)", choices=("small", *SIZES))
    block_size: int = option(256, "sequence length", min=1)
    batch_size: int = option(8, "sequences per training step", min=1)
    vocab_size: int = option(50304, "vocabulary size (GPT-2's, padded to a multiple of 64)", min=1)
    n_layer: int = option(0, "number of layers; 0 = the --size shape's", min=0)
    runs: str = option("", "comma-separated labels to measure; '' = all (" + ", ".join(r[0] for r in RUNS) +
                       "); vanilla is always measured")
    warmup: int = option(2, "untimed training steps per model", min=0)
    iters: int = option(2, "training steps per timed repeat", min=1)
    repeats: int = option(5, "timed repeats per model, each between two of vanilla's: the speed ratio is their "
                          "median", min=1)
    sample_tokens: int = option(32, "tokens generated per sampling measurement", min=1)
    device: str = option("auto", "auto (cuda, else mps, else cpu), cpu, cuda, cuda:N, mps")
    dtype: str = option("auto", "auto = bfloat16 autocast on a GPU that has it, else float32", choices=DTYPES)
    compile: bool = option(False, "torch.compile the training step")
    warm_only: bool = option(False, "compile the step of each --runs model (training with --compile, the decode "
                             "step with --decode) and measure nothing: inductor keeps what it compiled in its cache "
                             "on disk, from which the same command compiles again in seconds (python -m "
                             "tools.gpu_tables warms every model at once so, then times them one after another)")
    json: str = option("", "also write the results to this JSON file", path=True, out="file")
    close_gates: int = option(-1, "models with gates: before timing generation with and without skipping, close gate K "
                              "(block K+1's) and every later one for every token (blocks K+1 to L-K skipped); -1 = as "
                              "initialised", min=-1)
    checkpoint: str = option("", "time only generation with and without skipping, on this trained run (its "
                             "out_dir), prompted with the start of its data set's val split from --data_dir", path=True)
    data_dir: str = option("data", "--checkpoint: the folder of prepared data sets", path=True)
    decode: bool = option(False, "measure generation only: prefill tokens/s, time to first token and decode "
                          "tokens/s at each --decode_batches size, with each of --decode_modes' decode steps")
    decode_batches: str = option("1,8", "--decode: comma-separated batch sizes (rows generated together)")
    decode_modes: str = option("eager,compiled", "--decode: comma-separated decode steps to time: eager, compiled "
                               "(the step compiled as sample.py --compile runs it), or both")
    prompt_tokens: int = option(64, "--decode: prompt length (random tokens)", min=1)
    decode_tokens: int = option(128, "--decode: timed decode steps after the first token", min=1)
    baseline: str = option("", "--decode: also time the eager generate() of the model_*.py files in this folder "
                           "(another checkout, e.g. from before a change), with the same weights, in the same rounds",
                           path=True)
    table_only: bool = option(False, "--decode: measure nothing: print the table of the --json file, measured before "
                              "or elsewhere (a GPU's), and with --update_readme write it into its page")
    update_readme: bool = option(False, "--decode: also rewrite the copy of the table between the markers "
                                 "<!-- JSON:start --> and <!-- JSON:end --> of the --json path, in the page of "
                                 "README.md or docs/ that holds them (docs/benchmarks.md)")


# ---- the --json file, as its readers hold it (--table_only, python -m tools.gpu_tables --summary): a header and a row
# per model; a field a file lacks is an older file's, one not declared a newer file's or one no reader uses

@dataclass
class BenchFile:
    hardware: str = option("", "the machine", required=True)
    dtype: str = option("", "the autocast dtype", required=True)
    torch: str = option("", "torch's version", required=True)
    repeats: int = option(1, "--repeats", min=1)
    results: list = option(None, "a row per model (bench_row())", required=True)


@dataclass
class DecodeFile(BenchFile):
    prompt_tokens: int = option(1, "--prompt_tokens", min=1, required=True)
    decode_tokens: int = option(1, "--decode_tokens", min=1, required=True)
    command: list = option(None, "the words of the command after python", required=True)
    baseline: str = option(None, "--baseline")

    def __post_init__(self):
        each(self, "command", lambda word: type(word) is str, "a string")


def bench_row(decode):
    """The record of a row (of --decode: its numbers of generation required). The ratios are to vanilla's in the same
    run (skip_ratio: to the same model's generation without skipping; baseline_ratio: to the --baseline checkout's):
    the median over the repeats, and the smallest and the largest."""
    return make_dataclass("DecodeRow" if decode else "BenchRow", [
        ("label", str, option("", "", required=True)),
        ("mode", str, option("eager", "", choices=("eager", "compiled", "baseline"), required=decode)),
        ("batch", int, option(1, "", min=1, required=decode)),
        *[(name, float, option(0.0, "", min=0, required=decode))
          for name in ("decode_tok_s", "prefill_tok_s", "time_to_first_token_s")],
        *[(name, float, option(None, "", min=0)) for name in ("mfu", "compile_s")],
        *[(name + end, float, option(1.0, "", min=0)) for end in ("", "_min", "_max")
          for name in ("train_speed_ratio", "peak_mem_ratio", "decode_ratio", "skip_ratio", "baseline_ratio")]])


def read_bench(path, what, fix, decode):
    """The --json file at path (of --decode where decode), every row checked."""
    return read_results(path, what, fix, DecodeFile if decode else BenchFile, "results", bench_row(decode))


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


def seconds(device, fn, *args, **kwargs):
    """(seconds, result) of fn(*args, **kwargs), timed from an idle device to the end of the work fn queued on it."""
    synchronize(device)
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    synchronize(device)
    return time.perf_counter() - t0, result


class Training:
    """One model with its AdamW optimiser and one fixed random batch: step(n) is n training steps (one by default),
    timed() the seconds of --iters of them."""

    def __init__(self, module, shape, args, device, ctx):
        torch.manual_seed(0)
        self.model = build_model(module, shape).to(device)
        self.config = self.model.config
        self.optimizer = torch.optim.AdamW(self.model.param_groups(0.1), lr=1e-4)
        self.step_model = torch.compile(self.model) if args.compile else self.model
        self.x = torch.randint(0, self.config.vocab_size, (args.batch_size, args.block_size), device=device)
        self.y = torch.randint(0, self.config.vocab_size, (args.batch_size, args.block_size), device=device)
        self.iters, self.device, self.ctx = args.iters, device, ctx

    def step(self, n=1):
        for _ in range(n):
            with self.ctx:
                _, loss = self.step_model(self.x, self.y)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if hasattr(self.model, "after_step"):
                self.model.after_step()

    def timed(self):
        return seconds(self.device, self.step, self.iters)[0]


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
    """Models whose generation can skip (an inference() hook and gates): greedy generation time of n_tokens with
    skip=True over skip=False (median of interleaved repeats), next to est_flops_ratio of the gates of the generated
    text."""
    if not hasattr(model, "inference") or not getattr(model, "gates", None):
        return {}  # a model without gates (a dense variant) has nothing to skip
    times = {True: [], False: []}
    with torch.no_grad(), ctx:
        for _ in range(repeats):
            for skip in (False, True):
                t, text = seconds(device, generate, model, prompt, n_tokens, temperature=0, skip=skip)
                times[skip].append(t)
        est_flops_ratio = model.stats(text[:, -model.config.block_size:]).get("est_flops_ratio")  # its gates
    dense, skipping = statistics.median(times[False]), statistics.median(times[True])
    return {"sample_tok_s_skip": n_tokens / skipping, "sample_tok_s_dense": n_tokens / dense,
            "skip_time_ratio": skipping / dense, "est_flops_ratio": est_flops_ratio}


def runs_of(wanted, shape):
    """(label, model file, its module, config) of each run of RUNS that wanted names, in RUNS' order."""
    for label, name, overrides in RUNS:
        if label in wanted:
            yield label, name, load_model_module(name), {**shape, **overrides}


def check_gated(wanted, shape, args):
    """--close_gates against the gates of every wanted model that has them, before anything is measured: each model
    is built on the meta device (shapes only, no memory)."""
    for _, _, module, config in runs_of(wanted, shape):
        with torch.device("meta"):
            gates = getattr(build_model(module, config), "gates", None)
        if gates:
            check_close_gates(args.close_gates, len(gates))


def checkpoint_generation(args, device, ctx):
    """--checkpoint: skip_generation() on a trained run, greedy from the first 16 tokens of its val split."""
    if not os.path.exists(checkpoint_path(args.checkpoint)):  # read_checkpoint's hint names --out_dir, not --checkpoint
        raise ConfigError(f"--checkpoint {printable(args.checkpoint)}: no checkpoint there; pass the out_dir of a "
                          "training run")
    model, _, ckpt = model_from_checkpoint(args.checkpoint, device)
    model.eval()
    # the data set's folder as train.py named it (--dataset), which meta.json's "dataset" is only for the data sets
    # prepare.py makes by name (of --files, it lists the files)
    dataset = (ckpt.get("train_config") or {}).get("dataset") or (ckpt.get("meta") or {}).get("dataset")
    if not dataset:
        raise ConfigError(f"{args.checkpoint}: its checkpoint names no data set to take a prompt from; pass the out_dir "
                          "of a run that train.py saved")
    # a window of 1 token at least, to prompt with (a shorter prompt than 16 will do): an empty split is one line
    val = open_split(args.data_dir, dataset, "val", read_meta(args.data_dir, dataset), model.config.vocab_size, 1)
    prompt = torch.from_numpy(val[:16].astype(np.int64))[None].to(device)  # (1, 16)
    if args.close_gates >= 0:
        close_gates(model, args.close_gates)
    row = {"checkpoint": args.checkpoint, "steps": ckpt["iter_num"],
           **skip_generation(model, prompt, args.sample_tokens, device, ctx)}
    if "skip_time_ratio" not in row:
        raise ConfigError(f"{args.checkpoint} holds a {ckpt['model_name']} model without gates: nothing to skip")
    print(skipping(f"{args.checkpoint} (step {row['steps']})", row))
    return [row]


def measure(label, module, shape, args, device, ctx):
    """Parameters, peak memory and sampling speed of one model; returns the row and its warm Training, timed
    later against vanilla's. On CUDA, memory held before this model was built (vanilla's) is not counted."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        held = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    run = Training(module, shape, args, device, ctx)
    model = run.model
    run.step(args.warmup)
    peak_mem = (torch.cuda.max_memory_allocated(device) - held if device.type == "cuda" else
                saved_tensor_bytes(model, run.x, run.y))
    row = {"label": label, "params": sum(p.numel() for p in model.parameters()), "peak_mem_bytes": peak_mem,
           "flops_per_token": model.flops_per_token(args.block_size)}

    model.eval()
    prompt = torch.randint(0, run.config.vocab_size, (1, 16), device=device)
    for use_cache in (True, False):
        with torch.no_grad(), ctx:
            generate(model, prompt, 4, temperature=0, use_cache=use_cache)  # warm-up
            t, _ = seconds(device, generate, model, prompt, args.sample_tokens, temperature=0, use_cache=use_cache)
        row["sample_tok_s_cache" if use_cache else "sample_tok_s_nocache"] = args.sample_tokens / t
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
    for label, _, module, config in runs_of(wanted | {"vanilla"}, shape):
        row, run = measure(label, module, config, args, device, ctx)
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
    flops = peak_flops(device, 0.0)
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
    print(f"{'model':<17}{'params':>12}{'extra':>12}{'train tok/s':>13}{'x vanilla (min-max)':>22}"
          f"{'peak MB':>10}{'x vanilla':>10}{'MFU':>7}{'sample tok/s':>14}{'no cache':>10}")
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
            print(skipping(r["label"], r))


def skipping(name, r):
    return (f"{name}: generation {r['sample_tok_s_skip']:,.1f} tok/s skipping, {r['sample_tok_s_dense']:,.1f} dense: "
            f"time ratio {r['skip_time_ratio']:.3f}, est_flops_ratio {r['est_flops_ratio']:.3f}")


# ---- --decode: generation speed, eager and compiled

def measure_decoding(wanted, shape, batches, args, device, ctx):
    """Rows per (label, mode, batch), timed in --repeats rounds, each round every case once in turn, so that a
    change in the machine's load hits all alike. decode_ratio: per round, vanilla's seconds per step (same mode
    and batch) over this case's, i.e. its decode speed as a fraction of vanilla's: median, min and max over the
    rounds; baseline_ratio the same against the --baseline checkout's eager generate(), skip_ratio (models that
    skip) against the same model's generation without skipping. batches: the batch sizes (check_decode_options)."""
    cases, compile_s = decode_cases(wanted, shape, batches, args, device, ctx)
    for case in cases.values():
        case.timed()  # warm-up: caches allocated, kernels chosen
    times = {key: [] for key in cases}
    for _ in range(args.repeats):
        for key, case in cases.items():
            times[key].append(case.timed())
    rows = []
    for (label, mode, batch), t in times.items():
        first = statistics.median(f for f, _ in t)
        step = [s for _, s in t]
        row = {"label": label, "mode": mode, "batch": batch, "time_to_first_token_s": first,
               "prefill_tok_s": batch * args.prompt_tokens / first, "decode_tok_s": batch / statistics.median(step),
               "compile_s": compile_s.get((label, batch)) if mode == "compiled" else None, "step_seconds": step}
        for name, ref in (("decode_ratio", ("vanilla", mode, batch)), ("baseline_ratio", (label, "baseline", batch)),
                          ("skip_ratio", (f"{label} (skip=False)", mode, batch))):
            if ref in times and mode != "baseline":
                ratios = [r / s for (_, r), s in zip(times[ref], step)]
                row.update({name: statistics.median(ratios), f"{name}_min": min(ratios), f"{name}_max": max(ratios)})
        rows.append(row)
    return rows


def decoding_table(rows, baseline):
    """The rows as a Markdown table: per model and batch size, eager and compiled side by side; a mode not timed
    (--decode_modes) shows '-'. Prefill and first token are the eager case's where it was timed."""
    lines = ["| model | batch | prefill tok/s | first token ms | decode tok/s eager | compiled | compiled x vanilla "
             "(min-max) | compile s |" + (" eager x baseline | compiled x baseline |" if baseline else ""),
             "|---|--:|--:|--:|--:|--:|--:|--:|" + ("--:|--:|" if baseline else "")]
    by = {(r["label"], r["mode"], r["batch"]): r for r in rows}

    for label, batch in dict.fromkeys((r["label"], r["batch"]) for r in rows if r["mode"] != "baseline"):
        e, c = by.get((label, "eager", batch)), by.get((label, "compiled", batch))
        first = e or c
        cells = [label, batch, f"{first['prefill_tok_s']:,.0f}", f"{1000 * first['time_to_first_token_s']:.1f}",
                 f"{e['decode_tok_s']:,.0f}" if e else "-", f"{c['decode_tok_s']:,.0f}" if c else "-",
                 spread(c, "decode_ratio"), f"{c['compile_s']:.1f}" if c else "-"]
        if baseline:
            cells += [spread(e, "baseline_ratio"), spread(c, "baseline_ratio")]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    notes = [f"{r['label']}, batch {r['batch']}, {r['mode']}: decode with skipping {r['skip_ratio']:.2f}x "
             f"({r['skip_ratio_min']:.2f}-{r['skip_ratio_max']:.2f}) as fast as without" for r in rows if "skip_ratio" in r]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


class Decoding:
    """Greedy generation of one model at one batch size with a given decode step (eager or compiled; None: the
    model's own generate() as it is, a --baseline's). timed() generates 1 + n tokens after the prompt and splits
    the time where the first decode step starts, once the first token is sampled: (seconds to the first token,
    the prefill and its sampling; seconds per decode step)."""

    def __init__(self, model, step, batch, args, device, ctx, **kwargs):
        self.model, self.step, self.kwargs, self.n = model, step, kwargs, args.decode_tokens
        self.device, self.ctx = device, ctx
        g = torch.Generator().manual_seed(batch)
        self.prompt = torch.randint(0, model.config.vocab_size, (batch, args.prompt_tokens), generator=g).to(device)

    def generate(self, n, on_step=None):
        """(seconds, start time) of one generate() of n tokens; on_step() is called before every decode step."""
        step, hook, calls = self.step, None, []
        if step is not None and on_step is not None:
            step = lambda *a: (on_step(), self.step(*a))[1]  # noqa: E731

        def count(module, args):  # a baseline's generate(): every forward pass embeds its tokens once, and every
            calls.append(1)       # one after the prefill's is a decode step, whichever method it goes through
            if len(calls) > 1:
                on_step()
        if self.step is None and on_step is not None:
            hook = self.model.tok_emb.register_forward_pre_hook(count)
        synchronize(self.device)
        t0 = time.perf_counter()
        with torch.no_grad(), self.ctx:
            if self.step is None and hasattr(self.model, "generate"):  # a checkout whose model files generate
                self.model.generate(self.prompt, n, temperature=0, **self.kwargs)
            else:
                generate(self.model, self.prompt, n, temperature=0, step=step, **self.kwargs)
        synchronize(self.device)
        if hook is not None:
            hook.remove()
        return time.perf_counter() - t0, t0

    def timed(self):
        first = []

        def on_step():
            if not first:  # once: a synchronisation per step would hold the GPU back
                synchronize(self.device)
                first.append(time.perf_counter())
        total, t0 = self.generate(1 + self.n, on_step)
        return first[0] - t0, (t0 + total - first[0]) / self.n


def load_baseline(folder, name, model, config_args):
    """The same model (same weights) built from folder/model_<name>.py, another checkout's copy of the file."""
    path = os.path.join(folder, f"model_{name}.py")
    regular_file(path, f"--baseline's model_{name}.py", "pass the root of another checkout")
    spec = importlib.util.spec_from_file_location(f"baseline_model_{name}", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # generate.py finds its KVCache there
    spec.loader.exec_module(module)
    base = module.GPT(module.GPTConfig(**config_args)).to(model.lm_head.weight.device).eval()
    base.load_state_dict(model.state_dict())
    return base


def decode_cases(wanted, shape, batches, args, device, ctx, vanilla=True):
    """{(label, mode, batch): Decoding} for vanilla (unless vanilla=False) and every wanted run, in each of
    --decode_modes (mode 'eager', 'compiled'; and 'baseline' with --baseline); generation that can skip, with skipping,
    is labelled as the run and without as '<label> (skip=False)'. Also returns the compile seconds of each compiled
    case: its first generate(), which traces and compiles the step (a new batch size may compile again)."""
    cases, compile_s = {}, {}
    for label, name, module, config in runs_of((wanted | {"vanilla"}) if vanilla else wanted, shape):
        torch.manual_seed(0)
        model = build_model(module, config).to(device).eval()
        variants = {label: {}}
        if hasattr(module.GPT, "inference") and getattr(model, "gates", None):
            variants = {label: dict(skip=True), f"{label} (skip=False)": dict(skip=False)}
            if args.close_gates >= 0:
                close_gates(model, args.close_gates)
        modes = args.decode_modes.split(",")
        eager = functools.partial(decode_step, model)
        compiled = compile_decode_step(model, device) if "compiled" in modes else None
        base = load_baseline(args.baseline, name, model, config) if args.baseline else None
        for variant, kwargs in variants.items():
            for batch in batches:
                if "eager" in modes:
                    cases[variant, "eager", batch] = Decoding(model, eager, batch, args, device, ctx, **kwargs)
                if compiled is not None:
                    cases[variant, "compiled", batch] = case = Decoding(model, compiled, batch, args, device, ctx,
                                                                        **kwargs)
                    compile_s[variant, batch] = case.generate(2)[0]
                if base is not None:
                    cases[variant, "baseline", batch] = Decoding(base, None, batch, args, device, ctx, **kwargs)
        print(f"  built and compiled {label}", file=sys.stderr)
    return cases, compile_s


def warm_caches(wanted, shape, batches, args, device, ctx):
    """--warm_only: the compiled steps of exactly the wanted runs, each run as the measuring command runs it (the
    training step with its warm-up steps, or the decode step's first generations), and nothing timed."""
    if args.decode:
        decode_cases(wanted, shape, batches, args, device, ctx, vanilla=False)
    else:
        for label, _, module, config in runs_of(wanted, shape):
            Training(module, config, args, device, ctx).step(max(args.warmup, 1))  # then freed, before the next
            print(f"  compiled {label}", file=sys.stderr)
    return []


def parse_args(argv):
    return parse_simple(BenchConfig, argv, __doc__)


def main(argv):
    args = parse_args(argv)
    if args.table_only:  # the table of a file measured before or elsewhere
        if not (args.decode and args.json):
            raise ConfigError("--table_only prints the --decode table of a --json file: give --decode and --json")
        fix = "give a file that `python -m tools.bench --decode --json` wrote"
        saved = read_bench(args.json, "the --json file", fix, decode=True)
        text = publish_decoding(saved, args.json) if args.update_readme else decoding_table(saved["results"],
                                                                                             saved.get("baseline"))
        print(text, end="")
        return saved["results"]
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    ctx = autocast(device, dtype)
    wanted = chosen(args.runs, [r[0] for r in RUNS])
    batches = check_decode_options(args) if args.decode else None
    decode_compiled = args.decode and "compiled" in args.decode_modes.split(",")
    if args.warm_only and (not (args.compile or decode_compiled) or args.json or args.update_readme or args.checkpoint):
        raise ConfigError("--warm_only compiles and measures nothing: give it --compile (training) or --decode (with "
                          "compiled among --decode_modes), without --json, --update_readme or --checkpoint")
    if args.checkpoint:
        return checkpoint_generation(args, device, ctx)
    if args.update_readme and not (args.decode and args.json):
        raise ConfigError("--update_readme writes the --decode table into the page that holds its markers: give "
                          "--decode, and --json (its path names the markers)")
    shape = shape_of(args, args.vocab_size)
    if args.close_gates >= 0:  # the options, all of them, before an hour of measuring
        check_gated(wanted, shape, args)
    hardware = hardware_name(device)
    if args.json:  # the folder, before an hour of measuring: a path that cannot be written fails now
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    if args.warm_only:
        return warm_caches(wanted, shape, batches, args, device, ctx)
    head = {"size": args.size, "shape": shape, "hardware": hardware, "dtype": dtype, "torch": torch.__version__,
            "repeats": args.repeats}
    if args.decode:
        print(f"{args.size} shape, generation after {args.prompt_tokens} prompt tokens, {hardware}, {dtype}, "
              f"torch {torch.__version__}")
        rows = measure_decoding(wanted, shape, batches, args, device, ctx)
        print(decoding_table(rows, args.baseline), end="")
        head.update(prompt_tokens=args.prompt_tokens, decode_tokens=args.decode_tokens, close_gates=args.close_gates,
                    baseline=args.baseline, command=["-m", "tools.bench", *argv])
    else:
        print(f"{args.size} shape, batch {args.batch_size} x {args.block_size} tokens, {hardware}, "
              f"{dtype}{', compiled' if args.compile else ''}, torch {torch.__version__}")
        rows = measure_all(wanted, shape, args, device, ctx)
        print_measurements(rows)
        head.update(batch_size=args.batch_size, compile=args.compile, warmup=args.warmup, iters=args.iters)
    if args.json:
        write_json(args.json, {**head, "results": rows})
    if args.update_readme:
        publish_decoding({**head, "results": rows}, args.json)
    return rows


def publish_decoding(saved, path):
    """Write the --decode table of saved (a --json file's content) with its note into the page that holds path's
    markers; returns the text."""
    text = (f"`{command_line(saved['command'])}` on {saved['hardware']}, {saved['dtype']}, torch {saved['torch']}; "
            f"greedy, {saved['prompt_tokens']} prompt tokens, {saved['decode_tokens']} timed steps, median of "
            f"{saved['repeats']} rounds.\n\n" + decoding_table(saved["results"], saved.get("baseline")))
    update_readme(text, path)
    return text


def check_decode_options(args):
    """--decode's options together: batch sizes, the modes, a window that no step restarts. Returns the batch sizes."""
    try:
        batches = [int(b) for b in args.decode_batches.split(",")]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        raise ConfigError(f"--decode_batches {args.decode_batches!r}: give batch sizes of 1 or more, e.g. 1,8")
    modes = args.decode_modes.split(",")
    if not set(modes) <= {"eager", "compiled"} or len(set(modes)) != len(modes):
        raise ConfigError(f"--decode_modes {args.decode_modes!r}: give eager, compiled or eager,compiled")
    if args.prompt_tokens + args.decode_tokens + 1 > args.block_size:
        raise ConfigError(f"--prompt_tokens + --decode_tokens + 1 = {args.prompt_tokens + args.decode_tokens + 1} "
                          f"exceeds --block_size {args.block_size}: the timed steps would restart the window")
    return batches


if __name__ == "__main__":
    main_boundary(main)
