"""
A vanilla run as a Hugging Face model folder: python export.py --out_dir out/run --to models/run-hf

Writes config.json (Qwen3ForCausalLM when the model has QK-norm, else LlamaForCausalLM) and model.safetensors,
plus the tokenizer files when the run's data came from `prepare.py --tokenizer hf:DIR`; the folder loads with
transformers' AutoModelForCausalLM.from_pretrained. Only model_vanilla.py's architecture exists in transformers:
the other model files have parameters and connections it does not know.
"""
import os
from dataclasses import dataclass

import torch

import hf
from common import ConfigError, load_checkpoint, main_boundary, option, parse_simple


@dataclass
class ExportConfig:
    out_dir: str = option("out", "run folder holding ckpt.pt (or a path to a .pt file)", path=True)
    to: str = option("", "the folder to write; it must not exist, or be empty", path=True)
    dtype: str = option("float32", "of the saved weights", choices=("float32", "bfloat16"))

    def __post_init__(self):
        if not self.to:
            raise ValueError("--to is needed: the folder to write the Hugging Face model into")


def parse_args(argv):
    return parse_simple(ExportConfig, argv, __doc__)


def main(argv):
    args = parse_args(argv)
    if os.path.exists(args.to) and (not os.path.isdir(args.to) or os.listdir(args.to)):
        raise ConfigError(f"--to {args.to} exists and is not an empty folder; choose another --to or remove it")
    model, _, ckpt = load_checkpoint(args.out_dir, keys=("model_name", "model_args", "model", "meta"))
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
    main_boundary(main)
