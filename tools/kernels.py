"""
Kernels per training step and per decode step, for every model file: eager, what a laptop, a CPU or Apple MPS pays
for (every launch counts there), and compiled, what torch.compile makes of the same step (train.py's default on a
GPU), where each generated kernel is about one pass over memory.

    python -m tools.kernels                                   # eager, every model file at GPT-2 small's shape
    python -m tools.kernels --json results/kernels.json --update_readme   # the eager table of docs/benchmarks.md
    python -m tools.kernels --compiled --size small --runs all --json results/kernels_compiled.json --update_readme
    python -m tools.kernels --model_file path/to/model.py     # nanoGPT's (training step) or gpt-fast's (decode step)
    python -m tools.kernels --device cuda --json results/h100/kernels.json --update_readme   # the launches on a GPU
    python -m tools.kernels --runs vanilla --with_vanilla false --json parts/vanilla.json    # a table in parts, a label
    python -m tools.kernels --runs vertical --with_vanilla false --json parts/vertical.json  # each, side by side, ...
    python -m tools.kernels --runs vertical --json kernels.json --merge parts                # ... joined into one file

Eager, a kernel is on the CPU one ATen operator call that computes a tensor (views and operators that return no
tensor left out; the training step in float32), on CUDA one launch on the GPU as torch.profiler records it (the
training step under bf16 autocast, as train.py runs it there). Compiled (--compiled), a kernel is one that inductor
generates while it compiles the step with fullgraph=True and its caches off (docs/benchmarks.md says what that count
measures). The training step is one forward with targets and its backward; the decode step is generate.py's
decode_step at the middle of the context, after a prefill. Compiled counts can change with the shape, so a table
names its shape. Each label's row is counted from a fresh model (seed 0) with nothing compiled before it, so that a
table may be counted in parts, a label each (--with_vanilla false), in processes side by side (tools/gpu_tables.py
does), and joined with --merge into the file that one run of the same command would have written.
"""
import collections
import importlib.util
import os
import shlex
import sys
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

if __package__ in (None, ""):  # run as a file: the modules it imports are at the repository root
    sys.exit("run it from the repository root as `python -m tools.kernels`")

from common import autocast, resolve_device
from generate import cache_for, compile_decode_step, decode_step, inference
from plumbing.config import build_model, check_record, load_model_module, model_names, option
from plumbing.errors import ConfigError, arg, main_boundary, printable
from plumbing.files import write_json
from plumbing.options import explicit_options, parse_simple, without
from tools.bench import RUNS
from tools.tables import chosen, command_line, each, hardware_name, read_results, update_readme

# --size: the shape options' values when not given; gpt2 is GPT-2 small's, small the model files' own defaults
SHAPES = {
    "gpt2": dict(n_layer=12, n_head=12, n_kv_head=12, n_embd=768, ffn_hidden=3072, vocab_size=50304, batch_size=4,
                 block_size=256),
    "small": dict(n_layer=6, n_head=4, n_kv_head=2, n_embd=128, ffn_hidden=512, vocab_size=256, batch_size=2,
                  block_size=64),
}
MODEL_SHAPE = ("n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden", "vocab_size")


@dataclass
class KernelsConfig:
    size: str = option("gpt2", "the shape: gpt2 = GPT-2 small's (12 x 768, vocab 50304, batch 4 x 256), small = the "
                       "model files' defaults (6 x 128, vocab 256, batch 2 x 64); the shape options given override it",
                       choices=tuple(SHAPES))
    n_layer: int = option(12, "number of layers (--size gpt2's)", min=1)
    n_head: int = option(12, "query heads (--size gpt2's)", min=1)
    n_kv_head: int = option(12, "key/value heads (--size gpt2's)", min=1)
    n_embd: int = option(768, "model width (--size gpt2's)", min=1)
    ffn_hidden: int = option(3072, "SwiGLU hidden size (--size gpt2's)", min=1)
    vocab_size: int = option(50304, "vocabulary size (--size gpt2's)", min=1)
    batch_size: int = option(4, "sequences in the training step (--size gpt2's)", min=1)
    block_size: int = option(256, "context length: the training step's tokens per sequence; the decode step runs at "
                             "its middle, after a prefill of half of it (--size gpt2's)", min=2)
    runs: str = option("", "comma-separated labels to count: model files, or variants as python -m tools.bench names them "
                       "(vertical-unet, attnres-full, ...); '' = every model file, all = every model file and "
                       "variant; vanilla, the ratios' base, is counted too unless --with_vanilla false")
    with_vanilla: bool = option(True, "also count vanilla, the ratios' base; false = exactly the --runs labels: a part "
                                "of a table, which --merge joins (a file without vanilla makes no table)")
    compiled: bool = option(False, "count the kernels inductor generates for the compiled steps instead of the eager "
                            "operators")
    model_file: str = option("", "count nanoGPT's model.py (GPT, GPTConfig: a training step) or gpt-fast's "
                             "(Transformer, ModelArgs: a decode step) instead of this repository's model files",
                             path=True)
    device: str = option("cpu", "cpu: ATen operators (float32); cuda: the GPU's kernel launches (bf16 autocast)",
                         choices=("cpu", "cuda"))
    json: str = option("", "also write the counts here", path=True, out="file")
    update_readme: bool = option(False, "also write the table between the markers of the --json file, in the page "
                                 "of README.md or docs/ that holds them")
    table_only: bool = option(False, "count nothing: print the table of the --json file, counted before or elsewhere "
                              "(a GPU's), and with --update_readme write it into its page")
    merge: str = option("", "count nothing: join the files <this folder>/<label>.json, one per label of this "
                        "command, each counted with its options and --runs <label> --with_vanilla false, into the "
                        "--json file that this command less --merge would have written", path=True)


# ---- the --json file, as its readers hold it (--table_only, --merge): what was counted, and the counts by label

@dataclass
class KernelsFile:
    shape: dict = option(None, "what the counts were counted at and with (KernelsShape)", required=True)
    models: dict = option(None, "the counts by label (Counts)", required=True)


@dataclass
class KernelsShape:
    n_layer: int = option(1, "--n_layer", min=1, required=True)
    n_embd: int = option(1, "--n_embd", min=1, required=True)
    vocab_size: int = option(1, "--vocab_size", min=1, required=True)
    batch_size: int = option(1, "--batch_size", min=1, required=True)
    block_size: int = option(1, "--block_size", min=1, required=True)
    device: str = option("", "the machine", required=True)
    torch: str = option("", "torch's version", required=True)
    compiled: bool = option(False, "--compiled")
    dtype: str = option("float32", "the dtype of the training step")
    command: str = option(None, "the command that counts them")


@dataclass
class Counts:
    train: int = option(1, "kernels per training step (a step makes one at least: vanilla's divides the ratios)",
                        min=1, required=True)
    decode: int = option(1, "kernels per decode step", min=1, required=True)
    train_ops: dict = option(None, "the training step's kernels by name")
    decode_ops: dict = option(None, "the decode step's kernels by name")

    def __post_init__(self):
        for name in ("train_ops", "decode_ops"):
            each(self, name, lambda n: type(n) is int and n >= 0, "a count of 0 or more")


def read_counts(path, what, fix):
    """The --json file at path, checked whole: its shape and every label's counts."""
    saved = read_results(path, what, fix, KernelsFile, "models", Counts)
    check_record(KernelsShape, saved["shape"], f"{path}'s shape", fix)
    return saved


class KernelCount(TorchDispatchMode):

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        returns = func._schema.returns
        # _unsafe_view is a view too (nn.Linear's reshape after a matmul), which the schema does not mark as one;
        # an operator that returns no tensor (promote_types) computes nothing
        view = func.overloadpacket.__name__ == "_unsafe_view" or any(
            r.alias_info is not None and not r.alias_info.is_write for r in returns)
        if not view and any("Tensor" in str(r.type) for r in returns):
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count(fn, device=torch.device("cpu")):
    """{name: calls} of the kernels fn() runs: ATen operators on the CPU, the GPU's launches on CUDA."""
    if device.type == "cuda":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
            fn()
            torch.cuda.synchronize()
        return collections.Counter({e.key: e.count for e in profiler.key_averages()
                                    if e.device_type == torch.autograd.DeviceType.CUDA})
    with KernelCount() as counter:
        fn()
    return counter.ops


def generated(fn):
    """{"generated": n}: the kernels inductor generates while fn() compiles (and runs) a step, with every cache off
    (a cached graph generates nothing) and dynamo's state reset first (nothing compiled before is reused)."""
    import torch._inductor.config
    import torch._inductor.metrics as metrics
    torch._dynamo.reset()
    off = ({"force_disable_caches": True} if hasattr(torch._inductor.config, "force_disable_caches") else
           {"fx_graph_cache": False})  # an older torch: its one cache that skips code generation
    with torch._inductor.config.patch(**off):
        metrics.reset()
        fn()
        n = metrics.generated_kernel_count
    torch._dynamo.reset()
    return collections.Counter({"generated": n})


def training_step(model, batch_size, block_size, vocab_size, device=torch.device("cpu"), compiled=False):
    idx = torch.randint(0, vocab_size, (batch_size, block_size), device=device)
    model.train()
    forward = torch.compile(model, fullgraph=True) if compiled else model

    def step():
        with autocast(device, "float32" if device.type == "cpu" else "bfloat16"):
            loss = forward(idx, idx)[1]
        loss.backward()
        model.zero_grad(set_to_none=True)
    if compiled:
        return generated(step)
    step()  # once before counting: lazily made state (rotary tables on first use, grads' buffers)
    return count(step, device)


def decode(model, block_size, vocab_size, device=torch.device("cpu"), batch_size=1, compiled=False):
    model.eval()
    forward, cache_class = inference(model)
    cache = cache_for(model, cache_class, batch_size, device)
    prompt = torch.randint(0, vocab_size, (batch_size, block_size // 2), device=device)
    with torch.no_grad():
        forward(prompt, cache=cache, input_pos=torch.arange(block_size // 2, device=device))
    token, pos = prompt[:, -1:], torch.tensor([block_size // 2], device=device)
    if compiled:  # the step sample.py --compile runs: one graph, a CUDA graph on CUDA
        return generated(lambda: compile_decode_step(model, device)(token, pos, cache))
    decode_step(model, token, pos, cache)  # once before counting
    return count(lambda: decode_step(model, token, pos + 1, cache), device)


def external(path, args, device):
    """Another repository's model file at the same shape: the training step of nanoGPT's GPT(GPTConfig), or one
    decode step of gpt-fast's Transformer(ModelArgs) after a prefill to the middle of the context."""
    if not path.endswith(".py") or not os.path.isfile(path):
        raise ConfigError(f"--model_file {path} is {'not a file' if not os.path.isfile(path) else 'no .py file'}: "
                          "give the path of nanoGPT's or gpt-fast's model.py")
    spec = importlib.util.spec_from_file_location("external_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the file's own code: whatever it raises, the user's fix is in that file
        raise ConfigError(f"--model_file {path} does not import ({type(e).__name__}: {e}); give nanoGPT's or "
                          "gpt-fast's model.py")
    if hasattr(module, "Transformer") and hasattr(module, "ModelArgs"):  # gpt-fast
        model = module.Transformer(module.ModelArgs(
            n_layer=args.n_layer, n_head=args.n_head, n_local_heads=args.n_kv_head, dim=args.n_embd,
            intermediate_size=args.ffn_hidden, vocab_size=args.vocab_size, block_size=args.block_size)).to(device)
        with device:
            model.eval().setup_caches(1, args.block_size)
        half = args.block_size // 2
        with torch.no_grad():
            model(torch.randint(0, args.vocab_size, (1, half), device=device), torch.arange(half, device=device))
            token = torch.randint(0, args.vocab_size, (1, 1), device=device)
            model(token, torch.tensor([half], device=device))  # once before counting, as decode() does
            return "decode step", count(lambda: model(token, torch.tensor([half + 1], device=device)), device)
    if not (hasattr(module, "GPT") and hasattr(module, "GPTConfig")):
        raise ConfigError(f"--model_file {path} defines neither GPT and GPTConfig (nanoGPT) nor Transformer and "
                          "ModelArgs (gpt-fast); give one of those model.py files")
    config = module.GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                              vocab_size=args.vocab_size, block_size=args.block_size, bias=False, dropout=0.0)
    model = module.GPT(config).to(device)
    return "forward + backward", training_step(model, args.batch_size, args.block_size, args.vocab_size, device)


def parse_args(argv):
    args = parse_simple(KernelsConfig, argv, __doc__)
    given = explicit_options(argv)
    for name, value in SHAPES[args.size].items():  # the --size shape, where an option was not given
        if name not in given:
            setattr(args, name, value)
    if (args.update_readme or args.table_only or args.merge) and not args.json:
        what = "--table_only reads" if args.table_only else "--merge writes" if args.merge else "--update_readme writes"
        raise ConfigError(f"{what} the table of a --json file; give --json too")
    if args.table_only and args.merge:
        raise ConfigError("--table_only prints a file's table and --merge joins parts into one: give one of them")
    if args.model_file and (args.compiled or args.merge):
        raise ConfigError(f"{'--compiled counts' if args.compiled else '--merge joins'} this repository's model files; "
                          f"drop --model_file or {'--compiled' if args.compiled else '--merge'}")
    labels = [r[0] for r in RUNS]
    wanted = (set(model_names()) if not args.runs else set(labels) if args.runs == "all" else
              chosen(args.runs, labels) | ({"vanilla"} if args.with_vanilla else set()))
    if args.update_readme and "vanilla" not in wanted:
        raise ConfigError("--update_readme writes a table of ratios to vanilla, which --with_vanilla false leaves out "
                          "here: drop --update_readme (--merge joins the parts into a table)")
    args.labels = [r for r in RUNS if r[0] in wanted]
    return args


def header(args, device, version, argv):  # the --json file's "shape"; argv: the options of its command
    return {**{k: getattr(args, k) for k in MODEL_SHAPE}, "batch_size": args.batch_size, "block_size": args.block_size,
            "torch": version, "device": device, "dtype": "float32" if args.device == "cpu" else "bf16 autocast",
            "compiled": args.compiled, "command": shlex.join(["python", "-m", "tools.kernels", *argv])}


def merged(args, argv):
    """--merge: the --json file's content from the parts in the --merge folder, a label's row from each, in the
    order of a run; its command is this one less --merge, which counts the same rows in one process. A part that is
    missing, or was counted with other options or on another machine or torch than the first part, is refused."""
    command = without(argv, "--merge")
    alone = without(command, "--runs", "--with_vanilla", "--json", "--update_readme")  # a part's command, less these
    rows, head = {}, None
    for label, _, _ in args.labels:
        path = os.path.join(args.merge, f"{label}.json")
        fix = (f"count it: `{shlex.join(['python', '-m', 'tools.kernels', *alone, '--runs', label])} "
               f"--with_vanilla false {arg('json', path)}`")
        part = read_counts(path, "--merge part", fix)
        shape, models = part["shape"], part["models"]
        if label not in models:
            raise ConfigError(f"--merge part {printable(path)} holds no counts of {label}; {fix}")
        head = head or header(args, shape["device"], shape["torch"], command)
        wrong = [k for k in head if k != "command" and shape.get(k) != head[k]]  # a part's command is its own
        if wrong:
            raise ConfigError(f"--merge part {printable(path)} has {wrong[0]} {shape.get(wrong[0])!r} where this command "
                              f"(and its first part's device and torch) has {head[wrong[0]]!r}; {fix}")
        rows[label] = models[label]
    return {"shape": head, "models": rows}


def main(argv):
    args = parse_args(argv)
    if args.table_only:
        fix = "give a file that `python -m tools.kernels --json` wrote"
        return publish(read_counts(args.json, "the --json file", fix), args)
    if args.merge:
        saved = merged(args, argv)
    else:
        device = resolve_device(args.device)
        torch.manual_seed(0)
        if args.model_file:
            what, ops = external(args.model_file, args, device)
            print(f"{args.model_file}: {sum(ops.values())} kernels per {what}; {dict(ops.most_common(8))}")
            return
        if args.json:  # the folder, before minutes of counting
            os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        saved = counted(args, argv, device)
    if args.json:
        write_json(args.json, saved)
    if "vanilla" not in saved["models"]:  # a part (--with_vanilla false): no base for the ratios, so no table
        for label, r in saved["models"].items():
            print(f"{label}: {r['train']} kernels per training step, {r['decode']} per decode step")
        return []
    return publish(saved, args)


def counted(args, argv, device):
    rows = {}
    for label, name, overrides in args.labels:
        torch.manual_seed(0)  # each row's random model and tokens, whichever rows are counted before it
        module = load_model_module(name)
        shape = {**{k: getattr(args, k) for k in MODEL_SHAPE}, "block_size": args.block_size, **overrides}
        model = build_model(module, shape, "the shape options: choose a shape every model file takes, such as the "
                            "default").to(device)
        train = training_step(model, args.batch_size, args.block_size, args.vocab_size, device, args.compiled)
        step = decode(model, args.block_size, args.vocab_size, device, compiled=args.compiled)
        rows[label] = {"train": sum(train.values()), "decode": sum(step.values()),
                       "train_ops": dict(train.most_common()), "decode_ops": dict(step.most_common())}
        if args.compiled:
            print(f"{label}: {rows[label]['train']} generated kernels per training step, {rows[label]['decode']} per "
                  "decode step", file=sys.stderr)  # progress: each model compiles for a minute or more on a CPU
        del model
    return {"shape": header(args, hardware_name(device), torch.__version__, argv), "models": rows}


def publish(saved, args):
    """Print the table of saved (the --json file's content); with --update_readme write it between its markers."""
    shape, rows = saved["shape"], saved["models"]
    if "vanilla" not in rows:
        raise ConfigError(f"{args.json} holds no vanilla row, the ratios' base (a part counted with --with_vanilla "
                          "false); join it with the other parts by --merge")
    command = shape.get("command", "")  # older files hold none
    base = rows["vanilla"]["train"]
    cpu = shape["device"].startswith("CPU")  # hardware_name()'s words for a CPU
    dtype = shape.get("dtype", "float32" if cpu else "bf16 autocast")  # files written before the field was
    kind = "kernels inductor generates" if shape.get("compiled") else "ATen operators" if cpu else "kernel launches"
    what = f"{kind}, {dtype}, {shape['device']}"
    size = (f"{shape['n_layer']} x {shape['n_embd']}, vocab {shape['vocab_size']}, batch {shape['batch_size']} x "
            f"{shape['block_size']}, torch {shape['torch']}" + (f"; `{command_line(command)}`" if command else ""))
    if shape.get("compiled"):
        parts, names = ["train", "decode"], {"train": "fwd+bwd", "decode": "decode step"}  # (count, x vanilla's)
        lines = [f"Compiled kernels per training step (forward + backward) and per decode step ({what}), {size}:", "",
                 "| model |" + "".join(f" {names[p]} | x vanilla |" for p in parts), "|---|" + "--:|--:|" * len(parts)]
        lines += [f"| {label} |" + "".join(f" {r[p]} | {r[p] / rows['vanilla'][p]:.2f} |" for p in parts)
                  for label, r in rows.items()]
    else:
        lines = [f"Eager kernels per training step (forward + backward; {what}) and per decode step, {size}:", "",
                 "| model | fwd+bwd | x vanilla | decode step | most frequent (fwd+bwd) |", "|---|--:|--:|--:|---|"]
        for label, r in rows.items():  # a GPU kernel's name can run to hundreds of characters: its first 40 here
            top = ", ".join(f"{n[:40]} {c}" for n, c in list(r.get("train_ops", {}).items())[:6])
            lines.append(f"| {label} | {r['train']} | {r['train'] / base:.2f} | {r['decode']} | {top} |")
    print("\n".join(lines))
    if args.update_readme:
        update_readme("\n".join(lines) + "\n", args.json)
    return lines


if __name__ == "__main__":
    main_boundary(main)
