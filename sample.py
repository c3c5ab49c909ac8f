"""
Text from a checkpoint: python sample.py --out_dir out --start "ROMEO:" --num_samples 3

The model file, its config and the tokenizer all come from the checkpoint. Generation uses the key/value
cache; past the context length it keeps going on the most recent tokens.
"""
import argparse
import inspect
import sys
from contextlib import nullcontext

import torch

from prepare import get_tokenizer
from train import ArgumentParser, ConfigError, fail, load_checkpoint, resolve_device, str2bool


def parse_args(argv):
    p = ArgumentParser(description=__doc__.strip().splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out_dir", default="out", help="run folder holding ckpt.pt (or a path to a .pt file)")
    p.add_argument("--start", default="\n", help="prompt text, or FILE:path to read it from a file")
    p.add_argument("--num_samples", type=int, default=3)
    p.add_argument("--max_new_tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top_k", type=int, default=200, help="0 = off")
    p.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling; 1.0 = off (seed 000 used 0.9)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="auto = bfloat16 on CUDA where supported, else float32")
    p.add_argument("--use_cache", type=str2bool, nargs="?", const=True, default=True,
                   help="key/value cache (false: recompute the whole context per token)")
    p.add_argument("--compile", type=str2bool, nargs="?", const=True, default=False)
    p.add_argument("--skip", type=str2bool, nargs="?", const=True, default=True,
                   help="skipmiddle: tokens whose gate is 0 skip their blocks for real (false: compute every "
                        "block); other models ignore it")
    args = p.parse_args(argv)
    for name, low in (("num_samples", 1), ("max_new_tokens", 0), ("temperature", 0), ("top_k", 0)):
        if getattr(args, name) < low:
            raise ConfigError(f"--{name} must be {low} or more, not {getattr(args, name)}")
    if not 0 <= args.top_p <= 1:
        raise ConfigError(f"--top_p must be between 0 and 1 (1 = off), not {args.top_p}")
    return args


def read_prompt(start):
    if start.startswith("FILE:"):
        try:
            with open(start[5:], encoding="utf-8") as f:
                return f.read()
        except OSError:
            raise ConfigError(f"cannot read the prompt file {start[5:]}")
        except UnicodeDecodeError:
            raise ConfigError(f"the prompt file {start[5:]} is not UTF-8 text; convert it (e.g. iconv -t utf-8)")
    try:
        start.encode("utf-8")  # bytes that are not UTF-8 reach Python's argv as unpaired surrogates
    except UnicodeEncodeError:
        raise ConfigError("--start is not valid UTF-8 text; pass UTF-8, or a file with --start FILE:path")
    return start


def main(argv):
    args = parse_args(argv)
    device = str(resolve_device(args.device))
    use_bf16 = args.dtype == "bfloat16" or (args.dtype == "auto" and device.startswith("cuda")
                                            and torch.cuda.is_bf16_supported())
    ctx = torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if use_bf16 else nullcontext()
    model, ckpt = load_checkpoint(args.out_dir, device, keys=("model_name", "model_args", "model", "meta"))
    model.eval()
    if args.compile:
        model = torch.compile(model)
    encode, decode, _, _ = get_tokenizer(ckpt["meta"]["tokenizer"])
    ids = encode(read_prompt(args.start))
    block_size = ckpt["model_args"]["block_size"]
    if not ids:
        raise ConfigError("the prompt is empty; pass some text with --start (or --start FILE:path)")
    if len(ids) > block_size:
        raise ConfigError(f"the prompt is {len(ids)} tokens but the model's context is {block_size}; "
                          "shorten --start")
    skip = {"skip": args.skip} if "skip" in inspect.signature(model.generate).parameters else {}
    if not skip and "--skip" in " ".join(argv):
        print(f"note: --skip is ignored: model_{ckpt['model_name']}.py has no skipping", file=sys.stderr)
    torch.manual_seed(args.seed)
    x = torch.tensor(ids, dtype=torch.long, device=device)[None]
    for _ in range(args.num_samples):
        with torch.no_grad(), ctx:
            y = model.generate(x, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k or None,
                               top_p=args.top_p, use_cache=args.use_cache, **skip)
        print(decode(y[0].tolist()))
        print("---------------")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as e:
        fail(str(e))
