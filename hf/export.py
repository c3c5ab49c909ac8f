"""
A run as a Hugging Face model folder: python -m hf.export --out_dir out/run --to models/run-hf

A vanilla run becomes a plain Llama or Qwen3 folder (config.json, model.safetensors: Qwen3ForCausalLM when the
model has QK-norm, else LlamaForCausalLM), which transformers loads as it loads theirs. A run of any other model
file becomes a transformers custom-code folder: config.json with model_type, architectures and auto_map,
model.safetensors with every tensor of the checkpoint, the model file as this repository ships it and
hf_model.py, the short wrapper that runs it in transformers; it loads with
AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True). Both carry the run's tokenizer, which
AutoTokenizer loads: an hf:DIR tokenizer's files, the byte tokenizer as a tokenizer.json (ids 0-255 the bytes,
256 end of text), GPT-2's made from tiktoken's files (or --tokenizer DIR where they are not at hand); and both
come back with `train.py --init_from DIR`.
"""
import os
import sys
from dataclasses import dataclass

import torch

if __package__ in (None, ""):  # run as a file: the modules it imports are at the repository root
    sys.exit("run it from the repository root as `python -m hf.export`")

from common import model_from_checkpoint
from hf import convert
from plumbing.config import option
from plumbing.errors import ConfigError, main_boundary
from plumbing.options import parse_simple


@dataclass
class ExportConfig:
    out_dir: str = option("out", "run folder holding ckpt.pt (or a path to a .pt file)", path=True)
    to: str = option("", "the folder to write; it must not exist, or be empty", path=True, out="folder",
                     required=True)
    dtype: str = option("float32", "of the saved weights", choices=("float32", "bfloat16"))
    tokenizer: str = option("", "a folder whose tokenizer files the folder gets instead of those made from the run's "
                            "tokenizer (for a gpt2 run where tiktoken's files are not at hand)", path=True)


def parse_args(argv):
    return parse_simple(ExportConfig, argv, __doc__)


def main(argv):
    args = parse_args(argv)
    if os.path.exists(args.to) and (not os.path.isdir(args.to) or os.listdir(args.to)):
        raise ConfigError(f"--to {args.to} exists and is not an empty folder; choose another --to or remove it")
    model, _, ckpt = model_from_checkpoint(args.out_dir, keys=("model_name", "model_args", "model", "meta"))
    model_args = dict(vars(model.config))  # the checkpoint's options: every field of its model file (read_checkpoint)
    source = (ckpt.get("train_config") or {}).get("init_from") or None  # the folder it started from, if any
    config = convert.export(ckpt["model_name"], model.state_dict(), model_args, args.to, ckpt["meta"] or {}, source,
                            getattr(torch, args.dtype), args.tokenizer or None)
    print(f"wrote {args.to}: {config['architectures'][0]}, {sum(p.numel() for p in model.parameters()):,} "
          f"parameters ({args.dtype})")


if __name__ == "__main__":
    main_boundary(main)
