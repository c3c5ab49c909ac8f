"""
Text from a checkpoint: python sample.py --out_dir out --start "ROMEO:" --num_samples 3

The model file, its config and the tokenizer all come from the checkpoint. Generation uses the key/value
cache; past the context length it keeps going on the most recent tokens. Each new token's text is printed as it
comes.
"""
import sys
import time
from dataclasses import dataclass

import torch

from common import (DTYPES, autocast, describe_run, get_tokenizer, model_from_checkpoint, resolve_device,
                    resolve_dtype)
from generate import compile_decode_step, generate
from plumbing.config import option
from plumbing.errors import ConfigError, main_boundary
from plumbing.files import read_text
from plumbing.options import explicit_options, parse_simple


@dataclass
class SampleConfig:
    out_dir: str = option("out", "the run folder holding ckpt.pt (or a path to a .pt file)", path=True)
    start: str = option("\n", "the prompt, or FILE:path to read it from a file; a prompt of whitespace only is "
                        "not printed")
    num_samples: int = option(3, "samples to draw", min=1)
    max_new_tokens: int = option(500, "tokens generated per sample", min=0)
    temperature: float = option(0.8, "softmax temperature; 0 = greedy", min=0)
    top_k: int = option(200, "sample among the k most likely tokens; 0 = off", min=0)
    top_p: float = option(1.0, "nucleus sampling: the smallest set of tokens holding this probability; 1 = off "
                          "(the Vertical Attention paper samples with 0.9)", min=0, max=1)
    seed: int = option(1337, "random seed of the sampling", min=0, max=2**32 - 1)
    device: str = option("auto", "auto (cuda, else mps, else cpu), cpu, cuda, cuda:N, mps")
    dtype: str = option("auto", "auto = bfloat16 autocast on a GPU that has it, else float32", choices=DTYPES)
    use_cache: bool = option(True, "the key/value cache; false = recompute the whole context per token")
    compile: bool = option(False, "torch.compile the decode step (one graph per token: inductor; on CUDA a CUDA "
                           "graph); the compile time is reported once")
    skip: bool = option(True, "models that can skip (skipmiddle): tokens whose gate is 0 skip their blocks for real; "
                        "false = compute every block")


def read_prompt(start):
    if start.startswith("FILE:"):  # a regular file of UTF-8 text (plumbing/files.py checks it)
        return read_text(start[5:], "the prompt file", "pass a text file with --start FILE:path")
    try:
        start.encode("utf-8")  # bytes that are not UTF-8 reach Python's argv as unpaired surrogates
    except UnicodeEncodeError:
        raise ConfigError("--start is not valid UTF-8 text; pass UTF-8, or a file with --start FILE:path")
    return start


class Printer:
    """Prints a sample as its tokens come, flushed: after every token the whole sequence is decoded again and what
    it adds is printed. A trailing U+FFFD (the decoder's replacement character) is held back until the end: it may
    be a character whose bytes are still coming (the byte tokenizer emits UTF-8 a byte at a time). hide: the text
    at the start left unprinted (a prompt of whitespace only)."""

    def __init__(self, decode, ids, hide=""):
        self.decode, self.ids, self.hide, self.shown = decode, list(ids), hide, 0
        self.show()

    def __call__(self, token):  # generate()'s on_token: the new token (1, 1)
        self.ids.append(token[0, 0].item())
        self.show()

    def show(self, final=False):
        text = self.decode(self.ids)[len(self.hide):]
        text = text if final else text.rstrip("\ufffd")
        print(text[self.shown:], end="\n" if final else "", flush=True)
        self.shown = max(self.shown, len(text))


def parse_args(argv):
    return parse_simple(SampleConfig, argv, __doc__)


def main(argv):
    cfg = parse_args(argv)
    device = resolve_device(cfg.device)
    ctx = autocast(device, resolve_dtype(cfg.dtype, device))
    model, module, ckpt = model_from_checkpoint(cfg.out_dir, device, keys=("model_name", "model_args", "model", "meta"))
    model.eval()
    encode, decode, _, _ = get_tokenizer(ckpt["meta"]["tokenizer"])
    prompt = read_prompt(cfg.start)
    ids = encode(prompt)
    block_size = model.config.block_size
    if not ids:
        raise ConfigError("the prompt is empty; pass some text with --start (or --start FILE:path)")
    if len(ids) > block_size:  # generation reads the most recent block_size tokens, as it does past the context
        print(f"note: the prompt is {len(ids)} tokens and the model's context {block_size}: it continues from the "
              f"last {block_size}", file=sys.stderr)
    skips = hasattr(module.GPT, "inference")  # generation options of the model file's own (skipmiddle: skip)
    if not skips and "skip" in explicit_options(argv):
        print(f"note: --skip is ignored: model_{ckpt['model_name']}.py has no skipping", file=sys.stderr)
    print(f"# {cfg.out_dir}: model_{ckpt['model_name']}.py, {describe_run(ckpt)}", file=sys.stderr)
    x = torch.tensor(ids, dtype=torch.long, device=device)[None]
    skip = {"skip": cfg.skip} if skips else {}
    if cfg.compile and not cfg.use_cache:
        print("note: --compile compiles the cached decode step; with --use_cache false nothing is compiled",
              file=sys.stderr)
    step = None
    if cfg.compile and cfg.use_cache and cfg.max_new_tokens > 1:
        t0 = time.perf_counter()
        step = compile_decode_step(model, device)
        with ctx:
            generate(model, x, 2, temperature=0, step=step, **skip)  # a prefill and one decode step: it compiles
        print(f"# decode step compiled in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    hide = prompt if not prompt.strip() and decode(ids).startswith(prompt) else ""  # a whitespace prompt: unprinted
    torch.manual_seed(cfg.seed)
    for _ in range(cfg.num_samples):
        printer = Printer(decode, ids, hide)  # each token's text printed as it comes
        with ctx:
            generate(model, x, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k or None,
                     top_p=cfg.top_p, use_cache=cfg.use_cache, step=step, on_token=printer, **skip)
        printer.show(final=True)  # what was held back, and the end of the line
        print("---------------")


if __name__ == "__main__":
    main_boundary(main)
