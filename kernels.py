"""
Eager kernels per training step and per decode step, for every model file: what a laptop, a CPU or Apple MPS pays
for, where torch.compile does not fuse them (every launch counts there).

    python kernels.py                                   # every model file at GPT-2 small's shape, as in the README
    python kernels.py --json results/kernels.json --update_readme   # the README's table
    python kernels.py --model_file path/to/model.py     # nanoGPT's (training step) or gpt-fast's (decode step)
    python kernels.py --device cuda --json results/h200/kernels.json --update_readme   # the launches on a GPU

On the CPU a kernel is one ATen operator call seen by a TorchDispatchMode that computes a tensor: views (an
operator whose result aliases its input: view, transpose, expand, split, detach, _unsafe_view, ...) and operators
that return no tensor are left out, and the training step runs in float32. On CUDA a kernel is one launch on the
GPU as torch.profiler records it (an operator may launch none, one or several), and the training step runs under
bf16 autocast, as train.py runs it there. The training step is one forward with targets and its backward; the
decode step is generate.py's decode_step at the middle of the context, after a prefill. The counts depend on the
shapes only through which operators run, not on their sizes, so a small batch gives the same count as a large one.
"""
import argparse
import collections
import importlib.util
import json
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common import (ArgumentParser, ConfigError, autocast, build_model, check_output, hardware_name,
                    load_model_module, main_boundary, model_names, resolve_device, update_readme)
from generate import cache_for, decode_step, inference

SHAPE = dict(n_layer=12, n_head=12, n_kv_head=12, n_embd=768, ffn_hidden=3072, vocab_size=50304)  # GPT-2 small


class KernelCount(TorchDispatchMode):
    """Counts the ATen operators run under it, by name, leaving out views."""

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


def training_step(model, batch_size, block_size, vocab_size, device=torch.device("cpu")):
    idx = torch.randint(0, vocab_size, (batch_size, block_size), device=device)
    model.train()

    def step():
        with autocast(device, "float32" if device.type == "cpu" else "bfloat16"):
            loss = model(idx, idx)[1]
        loss.backward()
    step()  # once before counting: lazily made state (rotary tables on first use, grads' buffers)
    model.zero_grad(set_to_none=True)
    return count(step, device)


def decode(model, block_size, vocab_size, device=torch.device("cpu"), batch_size=1):
    model.eval()
    forward, cache_class = inference(model)
    cache = cache_for(model, cache_class, batch_size, device)
    prompt = torch.randint(0, vocab_size, (batch_size, block_size // 2), device=device)
    with torch.no_grad():
        forward(prompt, cache=cache, input_pos=torch.arange(block_size // 2, device=device))
    token, pos = prompt[:, -1:], torch.tensor([block_size // 2], device=device)
    decode_step(model, token, pos, cache)  # once before counting
    return count(lambda: decode_step(model, token, pos + 1, cache), device)


def external(path, args, device):
    """Another repository's model file at the same shape: the training step of nanoGPT's GPT(GPTConfig), or one
    decode step of gpt-fast's Transformer(ModelArgs) after a prefill to the middle of the context."""
    spec = importlib.util.spec_from_file_location("external_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    if hasattr(module, "Transformer"):  # gpt-fast
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
    config = module.GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                              vocab_size=args.vocab_size, block_size=args.block_size, bias=False, dropout=0.0)
    model = module.GPT(config).to(device)
    return "forward + backward", training_step(model, args.batch_size, args.block_size, args.vocab_size, device)


def main(argv=None):
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in SHAPE.items():
        parser.add_argument(f"--{name}", type=int, default=default, help=f"(default: {default})")
    parser.add_argument("--batch_size", type=int, default=4, help="(default: 4)")
    parser.add_argument("--block_size", type=int, default=256, help="(default: 256)")
    parser.add_argument("--model_file", default="", help="count nanoGPT's model.py (GPT, GPTConfig: a "
                        "training step) or gpt-fast's (Transformer, ModelArgs: a decode step) instead of this "
                        "repository's model files (default: none)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu: ATen operators, float32; "
                        "cuda: the GPU's kernel launches, bf16 autocast (default: cpu)")
    parser.add_argument("--json", default="", help="also write the counts here (default: none)")
    parser.add_argument("--top", type=int, default=6, help="operators listed per row (default: 6)")
    parser.add_argument("--update_readme", action="store_true", help="also write the table into README.md between "
                        "the markers of the --json file (default: off)")
    args = parser.parse_args(argv)
    if args.update_readme and not args.json:
        raise ConfigError("--update_readme writes the table of a --json file; give --json too")
    if args.json:
        check_output("--json", args.json, "file")  # before the counting, which takes minutes at full size
    device = resolve_device(args.device)
    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.model_file:
        what, ops = external(args.model_file, args, device)
        print(f"{args.model_file}: {sum(ops.values())} kernels per {what}; {dict(ops.most_common(8))}")
        return
    rows = {}
    for name in model_names():
        module = load_model_module(name)
        model = build_model(module, {**{k: getattr(args, k) for k in SHAPE}, "block_size": args.block_size},
                            "the shape options: choose a shape every model file takes, such as the default").to(device)
        train = training_step(model, args.batch_size, args.block_size, args.vocab_size, device)
        step = decode(model, args.block_size, args.vocab_size, device)
        rows[name] = {"train": sum(train.values()), "decode": sum(step.values()),
                      "train_ops": dict(train.most_common()), "decode_ops": dict(step.most_common())}
        del model
    base = rows["vanilla"]["train"]
    what = ("ATen operators, float32, CPU" if device.type == "cpu" else
            f"kernel launches, bf16 autocast, {hardware_name(device)}")
    lines = [f"Eager kernels per training step (forward + backward; {what}) and per decode step, "
             f"{args.n_layer} x {args.n_embd}, vocab {args.vocab_size}, batch {args.batch_size} x {args.block_size}, "
             f"torch {torch.__version__}:", "",
             "| model | fwd+bwd | x vanilla | decode step | most frequent (fwd+bwd) |", "|---|--:|--:|--:|---|"]
    for name, r in rows.items():  # a GPU kernel's name can run to hundreds of characters: its first 40 here
        top = ", ".join(f"{n[:40]} {c}" for n, c in list(r["train_ops"].items())[:args.top])
        lines.append(f"| {name} | {r['train']} | {r['train'] / base:.2f} | {r['decode']} | {top} |")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": {**{k: getattr(args, k) for k in SHAPE}, "batch_size": args.batch_size,
                                 "block_size": args.block_size, "torch": torch.__version__,
                                 "device": hardware_name(device)}, "models": rows}, f,
                      indent=1)
        if args.update_readme:
            update_readme("\n".join(lines) + "\n", args.json)


if __name__ == "__main__":
    main_boundary(main)
