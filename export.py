"""
A vanilla run as a Hugging Face model folder: python export.py --out_dir out/run --to models/run-hf

Writes config.json (Qwen3ForCausalLM when the model has QK-norm, else LlamaForCausalLM) and model.safetensors,
plus the tokenizer files when the run's data came from `prepare.py --tokenizer hf:DIR`; the folder loads with
transformers' AutoModelForCausalLM.from_pretrained. Only model_vanilla.py's architecture exists in transformers:
the other model files have parameters and connections it does not know.
"""
import argparse
import os
import sys

import torch

import hf
from train import ArgumentParser, ConfigError, fail, load_checkpoint


def parse_args(argv):
    p = ArgumentParser(description=__doc__.strip().splitlines()[0],
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out_dir", default="out", help="run folder holding ckpt.pt (or a path to a .pt file)")
    p.add_argument("--to", required=True, help="the folder to write; it must not exist, or be empty")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="of the saved weights")
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    if os.path.exists(args.to) and (not os.path.isdir(args.to) or os.listdir(args.to)):
        raise ConfigError(f"--to {args.to} exists and is not an empty folder; choose another --to or remove it")
    model, ckpt = load_checkpoint(args.out_dir, keys=("model_name", "model_args", "model", "meta"))
    if ckpt["model_name"] != "vanilla":
        raise ConfigError(f"{args.out_dir} holds a model_{ckpt['model_name']}.py run; only model_vanilla.py's "
                          "architecture exists in transformers, so only vanilla runs can be exported")
    model_args = dict(vars(model.config))  # the checkpoint's options, with the defaults of any it predates
    source = ckpt.get("train_config", {}).get("init_from") or None
    try:
        config = hf.export(model.state_dict(), model_args, args.to, ckpt["meta"], source,
                           dtype=getattr(torch, args.dtype))
    except hf.HFError as e:
        raise ConfigError(str(e))
    print(f"wrote {args.to}: {config['architectures'][0]}, {sum(p.numel() for p in model.parameters()):,} "
          f"parameters ({args.dtype})")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as e:
        fail(str(e))
