"""
What every script shares:
    sizes        the shapes of the Vertical Attention paper's Table 2 (--size)
    device       --device and --dtype resolved, bf16 autocast, waiting for the GPU, its peak FLOP/s for MFU
    tokenizers   byte, gpt2 and hf:DIR, by the name a data set's meta.json gives (prepare.py, sample.py, eval.py)
    labels       the name the tables and figures group a model file's labels by, its PAPER (the labels, every
                 model file and the variants its paper compares, are plumbing.config's labelled_models())
    checkpoints  a model rebuilt from train.py's ckpt.pt: the model file and options it names, and its weights
    skip-middle  its middle blocks skipped by every token (tools.bench --close_gates, eval.py --wiring)
The model files (--model NAME), the readers of every file and what a bad option, data set or checkpoint ends in
(one line naming the fix) are in plumbing/, which a learner may skip: every file is checked there where it is read,
so that the code here can be plain.
"""
import importlib
import os
import sys
from contextlib import nullcontext

import torch

from plumbing.errors import ConfigError, handling, note
from plumbing.files import checkpoint_path, read_checkpoint, read_json
from plumbing.config import build_model, load_model_module

# ----------------------------------------------------------------------------------------------------------
# sizes

# size presets from the Vertical Attention paper's Table 2 (its names; the counts change with the vocabulary)
SIZES = {
    "50m": dict(n_embd=192, ffn_hidden=768, n_head=3, n_layer=6, n_kv_head=1),
    "100m": dict(n_embd=384, ffn_hidden=1536, n_head=6, n_layer=8, n_kv_head=3),
    "300m": dict(n_embd=768, ffn_hidden=3072, n_head=12, n_layer=12, n_kv_head=4),
}


# ----------------------------------------------------------------------------------------------------------
# device and precision

# dense bf16 peak FLOP/s by GPU name, for MFU; the first name found in the device's name wins
PEAK_FLOPS = [
    ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("H20", 148e12), ("B200", 2250e12),
    ("A100", 312e12), ("A10G", 70e12), ("A10", 125e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12),
    ("RTX 4090", 165e12), ("RTX 3090", 71e12), ("A6000", 155e12), ("V100", 125e12), ("T4", 65e12),
]


def resolve_device(name):
    """The torch.device of a --device option (auto: the first this machine has of cuda, mps and cpu, said in a note),
    or ConfigError."""
    # MPS from torch 2.7 on: before it, attention with fewer key/value heads than query heads (every model file's
    # default) aborts the process on MPS where no gradient is taken, in every evaluation
    mps = torch.backends.mps.is_available() and torch.__version__ >= "2.7"
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
        note(f"--device auto: {name}" + (" (MPS needs torch 2.7 or later)" if torch.backends.mps.is_available()
                                          and not mps else ""))
        return torch.device(name)
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown --device {name!r}; use auto, cpu, cuda, cuda:N or mps")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = " (this torch is a CPU build)" if torch.version.cuda is None else ""
            raise ConfigError(f"--device {name}: no CUDA GPU is available here{build}; use --device cpu or auto")
        if (device.index or 0) >= count:
            raise ConfigError(f"--device {name}: there are {count} GPU(s) here, cuda:0 to cuda:{count - 1}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("--device mps: MPS is not available here; use --device cpu or auto")
    elif device.type == "mps" and not mps:
        raise ConfigError(f"--device mps needs torch 2.7 or later (its attention without gradients aborts on MPS in "
                          f"torch {torch.__version__}); `pip install -U torch`, or use --device cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {name} is not supported; use auto, cpu, cuda, cuda:N or mps")
    return device


DTYPES = ("auto", "float32", "bfloat16")  # float16 would need loss scaling, which train.py does not do


def resolve_dtype(name, device):
    """'float32' or 'bfloat16' for a --dtype option (auto: bfloat16 on a CUDA GPU that has it)."""
    if name == "auto":
        return "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if name == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("--dtype bfloat16: this GPU has no bfloat16; use float32")
    return name


def synchronize(device):
    """Wait for the work queued on device (CUDA, MPS); a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def autocast(device, dtype):
    """The mixed-precision context of a resolved dtype: bf16 autocast, or nothing for float32."""
    return nullcontext() if dtype == "float32" else torch.autocast(device.type, dtype=torch.bfloat16)


def peak_flops(device, given):
    if given > 0:
        return given
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((flops for key, flops in PEAK_FLOPS if key in name), 0.0)
    return 0.0  # unknown: MFU is not reported


# ----------------------------------------------------------------------------------------------------------
# tokenizers: the name a data set's meta.json gives (prepare.py --tokenizer), so that every script re-creates it

def encode_bytes(text):
    """UTF-8 bytes as ids 0..255: no vocabulary file, works anywhere."""
    return list(text.encode("utf-8"))


def decode_bytes(ids):
    # ids >= 256 (the end-of-text token) are not bytes; a model may also emit broken UTF-8
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def need(module, what):
    """Import an optional dependency, or end with the one line that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{what} needs the {module} package: pip install {module}")


def get_tokenizer(name):
    """Return (encode, decode, vocab_size, eot) for the tokenizer `name` ("byte", "gpt2" or "hf:DIR")."""
    if name == "byte":
        return encode_bytes, decode_bytes, 257, 256
    if name == "gpt2":
        tiktoken = need("tiktoken", "the gpt2 tokenizer")
        try:
            enc = tiktoken.get_encoding("gpt2")  # downloads its BPE files on first use, then reads its cache
        except Exception:
            raise ConfigError("could not download the gpt2 tokenizer files (no internet?); use --tokenizer byte "
                              "or set TIKTOKEN_CACHE_DIR to a folder holding them")
        # encode_ordinary: an "<|endoftext|>" inside a web page is text, not our document separator
        return enc.encode_ordinary, enc.decode, enc.n_vocab, enc.eot_token
    if name.startswith("hf:"):  # the tokenizer.json of a Hugging Face model folder
        return hf_tokenizer(name[3:])
    raise ConfigError(f"unknown tokenizer {name!r}: byte, gpt2 or hf:DIR; a checkpoint or meta.json that names "
                      "another was not written by this repository")


EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")  # document separators, by convention


def hf_tokenizer(folder):
    """(encode, decode, vocab_size, eot) of folder/tokenizer.json (the `tokenizers` package). The end-of-text id
    is the first of EOT_NAMES the vocabulary has, else tokenizer_config.json's eos_token."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise ConfigError(f"{folder} has no tokenizer.json; --tokenizer hf:DIR reads a Hugging Face tokenizer.json")
    Tokenizer = need("tokenizers", "--tokenizer hf:DIR").Tokenizer
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:
        raise ConfigError(f"cannot read {path} ({' '.join(str(e).split())[:150]})")
    tok.encode_special_tokens = True  # a "<|endoftext|>" inside a document is text, not our separator
    vocab = tok.get_vocab(with_added_tokens=True)
    eot = next((vocab[n] for n in EOT_NAMES if n in vocab), None)
    config = os.path.join(folder, "tokenizer_config.json")
    if eot is None and os.path.isfile(config):
        eos = read_json(config, "the tokenizer's config", "save the tokenizer again").get("eos_token")
        eot = vocab.get(eos.get("content") if isinstance(eos, dict) else eos)
    if eot is None:
        raise ConfigError(f"{path} has no end-of-text token ({', '.join(EOT_NAMES)}, or tokenizer_config.json's "
                          "eos_token); add one to the tokenizer")
    vocab_size = max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)

    def encode(text):
        return tok.encode(text, add_special_tokens=False).ids

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=False)

    return encode, decode, vocab_size, eot


# ----------------------------------------------------------------------------------------------------------
# labels: what each model file declares, so that a new model_<name>.py is in every table and figure unasked; the
# labels themselves, vanilla first then every model file and each of its VARIANTS, are plumbing.config's
# labelled_models(), which train.py's --model reads too

def paper(name):
    """The name the tables and figures group model_<name>.py's labels by: its PAPER, else the file's name."""
    module = load_model_module(name)
    return getattr(module, "PAPER", name)


# ----------------------------------------------------------------------------------------------------------
# checkpoints: out_dir/ckpt.pt, written by train.py

def model_from_checkpoint(out_dir, device="cpu", keys=()):
    """(model, module, checkpoint dict) of a run folder's ckpt.pt (or a .pt file): the model file it names, built
    with its options (checked by its GPTConfig), and its weights (checked by load_state_dict)."""
    path = checkpoint_path(out_dir)
    ckpt = read_checkpoint(path, keys)
    module = load_model_module(ckpt["model_name"])
    model = build_model(module, ckpt["model_args"], f"the model_args of {path}")
    with handling(path, f"it does not fit model_{ckpt['model_name']}.py: it was saved by another version of that "
                  "file; restore it from a copy, or train again"):
        model.load_state_dict(ckpt["model"])
    return model.to(device), module, ckpt


def describe_run(ckpt):
    """'step N, T tokens seen' of a checkpoint, for the scripts that read one."""
    step = ckpt.get("iter_num")
    if step is None:
        return "step unknown"
    tokens = ckpt.get("tokens_seen")
    return f"step {step:,}" + (f", {tokens:,} tokens seen" if tokens is not None else "")


# ----------------------------------------------------------------------------------------------------------
# skip-middle with its middle blocks skipped by every token

def close_gates(model, first):
    """Every token's gate 0 from gate `first` on: a bias of 2 there puts the soft mask S (eq. 1) at 2 >= 1 for it
    and every later gate (S only grows), so g = 1 - clamp(S, 0, 1) = 0 (eq. 2) in blocks first+1 to L-first (counted
    from 1)."""
    check_close_gates(first, len(model.gates))
    with torch.no_grad():
        for gate in model.gates:
            gate.weight.zero_()
            gate.bias.zero_()
        model.gates[first].bias.fill_(2.0)


def check_close_gates(first, gates):
    if not 0 <= first < gates:
        raise ConfigError(f"--close_gates must be between 0 and {gates - 1} for {gates} gates")


if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("common.py is a library module: what the scripts share about sizes, devices, tokenizers and checkpoints; "
             "run a script, e.g. `python train.py --help`")
