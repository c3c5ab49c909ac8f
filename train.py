"""
The one trainer for every model file.

    python train.py --model vanilla                          # one process (CPU, one GPU)
    python train.py config/fineweb_edu_50m.py --model vertical --max_iters=100   # a paper's recipe, then overrides
    torchrun --standalone --nproc_per_node=8 train.py --model vertical
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=HOST --master_port=29500 train.py ...

`--model NAME` loads model_NAME.py; every field of that file's GPTConfig is an option too (`--n_layer 12`,
`--va_lr 0.01`). `python train.py --model NAME --help` lists them all with their defaults.
As in nanoGPT, --gradient_accumulation_steps is the total per optimiser step; each of N processes does 1/N
(not given: one micro-step per process). `--resume` continues the checkpoint's model: a model option that
differs from the checkpoint's is refused, not ignored. Every mistake in the input ends in one `error:` line
before anything in out_dir or the data is touched.
"""
import argparse
import dataclasses
import glob
import importlib
import importlib.util
import json
import math
import os
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch

import hf

# size presets from seed 000 Table 2 (the paper's names; the counts change with the vocabulary)
SIZES = {
    "50m": dict(n_embd=192, ffn_hidden=768, n_head=3, n_layer=6, n_kv_head=1),
    "100m": dict(n_embd=384, ffn_hidden=1536, n_head=6, n_layer=8, n_kv_head=3),
    "300m": dict(n_embd=768, ffn_hidden=3072, n_head=12, n_layer=12, n_kv_head=4),
}

# dense bf16 peak FLOP/s by GPU name, for MFU; the first name found in the device's name wins
PEAK_FLOPS = [
    ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("H20", 148e12), ("B200", 2250e12),
    ("A100", 312e12), ("A10G", 70e12), ("A10", 125e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12),
    ("RTX 4090", 165e12), ("RTX 3090", 71e12), ("A6000", 155e12), ("V100", 125e12), ("T4", 65e12),
]

TRAIN_DEFAULTS = dict(
    # I/O
    model="vanilla",          # loads model_<model>.py
    out_dir="out",            # checkpoint, log file
    resume=False,             # continue the run saved in out_dir
    size="",                  # seed 000's shapes, 50m, 100m or 300m, with the model file's SIZE_DEFAULTS ("": none)
    dataset="shakespeare",    # data/<dataset>/{train,val}.bin from prepare.py
    init_from="",             # a Hugging Face Llama or Qwen3 folder: its architecture and weights (hf.py; "": none)
    data_dir="data",
    # optimisation
    max_iters=1000,
    batch_size=16,            # sequences per micro-step per process
    gradient_accumulation_steps=None,  # micro-steps per optimiser step, summed over processes; None = 1 each
    learning_rate=1e-3,
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.95,
    adam_eps=1e-8,
    grad_clip=1.0,            # 0 = off
    decay_lr=True,            # linear warm-up + cosine decay; False = constant lr (seed 000's recipe)
    warmup_iters=100,
    lr_decay_iters=0,         # 0 = max_iters
    min_lr=1e-4,
    warmup_start=0.0,         # warm-up starts at this fraction of the lr
    # evaluation and logging
    eval_interval=250,
    eval_iters=20,            # validation budget: eval_iters * batch_size windows of block_size tokens
    log_interval=10,
    wandb_log=False,
    wandb_project="layer-connections",
    wandb_run_name="",
    # system
    seed=1337,
    device="auto",            # auto, cpu, cuda, cuda:1, mps
    dtype="auto",             # auto (bfloat16 on CUDA where supported, else float32), float32, bfloat16
    compile=False,
    peak_flops=0.0,           # device peak FLOP/s for MFU; 0 = look the GPU up in a table
)


class ConfigError(Exception):
    """A mistake in the user's input, reported as one line."""


def fail(message):
    if os.environ.get("RANK", "0") == "0":  # under torchrun every process fails alike: one line is enough
        print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


# ----------------------------------------------------------------------------------------------------------
# options: train options + the model file's GPTConfig fields, from defaults < preset files < command line

class ArgumentParser(argparse.ArgumentParser):
    """argparse with its errors as one line (the usage block hides the message)."""

    def error(self, message):
        fail(f"{message}; see {os.path.basename(sys.argv[0])} --help")


def str2bool(s):
    if isinstance(s, bool):
        return s
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def load_model_module(name):
    here = os.path.dirname(os.path.abspath(__file__))
    if not os.path.exists(os.path.join(here, f"model_{name}.py")):
        known = sorted(os.path.basename(p)[6:-3] for p in glob.glob(os.path.join(here, "model_*.py")))
        raise ConfigError(f"unknown model {name!r}; choose one of: {', '.join(known)}")
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(f"model_{name}")


def read_config_file(path):
    values = {}
    try:
        source = open(path).read()
    except OSError:
        raise ConfigError(f"cannot read config file {path}")
    try:
        exec(compile(source, path, "exec"), {}, values)
    except SyntaxError as e:
        raise ConfigError(f"config file {path} line {e.lineno}: {e.msg}; fix the file (it holds python assignments)")
    except Exception as e:
        raise ConfigError(f"config file {path} fails: {type(e).__name__}: {e}; fix the file")
    return {k: v for k, v in values.items() if not k.startswith("_")}


def parse_args(argv):
    """Returns (train options, model config, model module). Raises ConfigError on bad input."""
    files = [a for a in argv if not a.startswith("-") and a.endswith(".py")]
    rest = [a for a in argv if a not in files]
    from_files = {}
    for f in files:
        from_files.update(read_config_file(f))
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--model", default=from_files.get("model", TRAIN_DEFAULTS["model"]))
    module = load_model_module(pre.parse_known_args(rest)[0].model)
    fields = {f.name: f for f in dataclasses.fields(module.GPTConfig)}
    model_defaults = {name: f.default for name, f in fields.items()}

    defaults = {**TRAIN_DEFAULTS, **model_defaults}
    unknown = set(from_files) - set(defaults)
    if unknown:
        raise ConfigError(f"{', '.join(files)} sets unknown option(s) {', '.join(sorted(unknown))}")
    defaults.update(from_files)

    parser = ArgumentParser(
        description="Train a model_<name>.py on data from prepare.py (preset files: config/*.py).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("config_files", nargs="*", help="preset files (python assignments), applied in order")
    for name, default in defaults.items():
        kind = type(model_defaults.get(name, TRAIN_DEFAULTS.get(name)))
        kind = int if kind is type(None) else kind  # gradient_accumulation_steps: None means "one per process"
        group = "model" if name in fields else "train"
        if kind is bool:
            parser.add_argument(f"--{name}", type=str2bool, nargs="?", const=True, default=default,
                                help=f"({group})")
        else:
            note = " the total over all processes; None = one micro-step per process" \
                if name == "gradient_accumulation_steps" else ""
            parser.add_argument(f"--{name}", type=kind, default=default, help=f"({group}){note}")
    args = vars(parser.parse_args(argv))
    args.pop("config_files")
    # a size preset fills the shape fields that neither a preset file nor the command line set, and so do the
    # model file's own settings for that size from its paper (its SIZE_DEFAULTS, e.g. skiplayer's (n_l, n_h))
    explicit = set(from_files) | {a.split("=")[0][2:] for a in rest if a.startswith("--")}
    if args["size"]:
        if args["size"] not in SIZES:
            raise ConfigError(f"unknown --size {args['size']!r}; choose one of: {', '.join(SIZES)}")
        sized = {**SIZES[args["size"]], **getattr(module, "SIZE_DEFAULTS", {}).get(args["size"], {})}
        args.update({k: v for k, v in sized.items() if k not in explicit})
        explicit |= set(sized)
    train_opts = {k: v for k, v in args.items() if k not in fields}
    model_args = {k: v for k, v in args.items() if k in fields}
    train_opts["explicit"] = sorted(explicit)
    return train_opts, model_args, module


def resolve_device(name):
    """The torch.device of a --device option (auto: CUDA where there is a GPU, else CPU), or ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
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
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {name} is not supported; use auto, cpu, cuda, cuda:N or mps")
    return device


def check_options(o, model_args):
    """Every option on its own, before any data, checkpoint, folder or process group is touched."""
    for name in ("batch_size", "eval_iters", "eval_interval", "log_interval"):
        if o[name] < 1:
            raise ConfigError(f"--{name} must be 1 or more, not {o[name]}")
    for name in ("max_iters", "warmup_iters", "lr_decay_iters", "min_lr", "weight_decay", "adam_eps", "grad_clip",
                 "peak_flops"):
        if o[name] < 0:
            raise ConfigError(f"--{name} must be 0 or more, not {o[name]}")
    if not o["learning_rate"] > 0:
        raise ConfigError(f"--learning_rate must be above 0, not {o['learning_rate']}")
    for name in ("beta1", "beta2"):
        if not 0 <= o[name] < 1:
            raise ConfigError(f"--{name} must be at least 0 and below 1, not {o[name]}")
    if not 0 <= o["warmup_start"] <= 1:
        raise ConfigError(f"--warmup_start must be between 0 and 1, not {o['warmup_start']}")
    check_model_args(model_args)
    # under torchrun the world size is known before the process group starts
    world = int(os.environ["WORLD_SIZE"]) if "RANK" in os.environ else 1
    accum = o["gradient_accumulation_steps"]
    if accum is not None and accum < 1:
        raise ConfigError(f"--gradient_accumulation_steps must be 1 or more, not {accum}")
    if accum is not None and accum % world:
        raise ConfigError(f"--gradient_accumulation_steps {accum} is not a multiple of the {world} processes; make "
                          "it one, or leave it out (one micro-step per process)")
    device = resolve_device(o["device"])
    if device.type == "cuda" and world > 1 and int(os.environ["LOCAL_RANK"]) >= torch.cuda.device_count():
        raise ConfigError(f"torchrun starts more processes per node than the {torch.cuda.device_count()} GPU(s) "
                          "here; lower --nproc_per_node")
    if o["dtype"] == "float16":
        raise ConfigError("--dtype float16 needs loss scaling, which train.py does not do; use bfloat16 or float32")
    if o["dtype"] not in ("auto", "float32", "bfloat16"):
        raise ConfigError(f"--dtype {o['dtype']} is not supported; use auto, float32 or bfloat16")
    if o["dtype"] == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("--dtype bfloat16: this GPU has no bfloat16; use float32")
    if os.path.exists(o["out_dir"]) and not os.path.isdir(o["out_dir"]):
        raise ConfigError(f"--out_dir {o['out_dir']} is a file, not a folder; choose another --out_dir")
    if o["wandb_log"] and importlib.util.find_spec("wandb") is None:
        raise ConfigError("--wandb_log needs the wandb package; `pip install wandb` or drop the option")


# ----------------------------------------------------------------------------------------------------------
# data: windows drawn by a generator seeded from (seed, step), so that ranks never share a window and a
# resumed run draws exactly the windows the uninterrupted run would have drawn

def read_meta(data_dir, dataset):
    """meta.json of a prepared data set, checked; ConfigError names the fix."""
    folder = os.path.join(data_dir, dataset)
    meta_path = os.path.join(folder, "meta.json")
    if not (os.path.exists(meta_path) and os.path.exists(os.path.join(folder, "train.bin"))):
        raise ConfigError(f"no prepared data in {folder}; run `python prepare.py --dataset {dataset}` first")
    redo = "run prepare.py again to remake the data set"
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{meta_path} is not readable JSON ({e}); {redo}")
    if not isinstance(meta, dict):
        raise ConfigError(f"{meta_path} is not a JSON object; {redo}")
    missing = [k for k in ("tokenizer", "vocab_size", "dtype") if k not in meta]
    if missing:
        raise ConfigError(f"{meta_path} lacks {', '.join(missing)}; {redo}")
    if meta["dtype"] not in ("uint16", "uint32"):
        raise ConfigError(f"{meta_path} names dtype {meta['dtype']!r}; prepare.py writes uint16 or uint32; {redo}")
    if not isinstance(meta["vocab_size"], int) or meta["vocab_size"] < 1:
        raise ConfigError(f"{meta_path} names vocab_size {meta['vocab_size']!r}; {redo}")
    return meta


def split_tokens(data_dir, dataset, split, meta):
    """The number of tokens in split.bin, after checking that the file is whole and matches meta.json."""
    path = os.path.join(data_dir, dataset, f"{split}.bin")
    redo = "run prepare.py again to remake the data set"
    if not os.path.isfile(path):
        raise ConfigError(f"no {path}; {redo}")
    size, itemsize = os.path.getsize(path), np.dtype(meta["dtype"]).itemsize
    if size % itemsize:
        raise ConfigError(f"{path} holds {size} bytes, not a whole number of {meta['dtype']} tokens: it is cut "
                          f"short or meta.json names the wrong dtype; {redo}")
    n = size // itemsize
    if meta.get(f"{split}_tokens", n) != n:  # a wrong dtype in meta.json shows here too
        raise ConfigError(f"{path} holds {n} {meta['dtype']} tokens but meta.json says {meta[f'{split}_tokens']}; "
                          f"{redo}")
    return n


def largest_id(data, sample=1 << 24):
    """The largest token id in data: all of it up to `sample` tokens, else 64 evenly spread stretches."""
    if len(data) <= sample:
        return int(data.max())
    n = sample // 64
    return max(int(data[i:i + n].max()) for i in np.linspace(0, len(data) - n, 64).astype(np.int64))


def check_data(o, meta, model_args):
    """Both splits are whole, long enough for block_size, and hold only ids the model can embed."""
    T, vocab = model_args["block_size"], model_args["vocab_size"]
    for split in ("train", "val"):
        n = split_tokens(o["data_dir"], o["dataset"], split, meta)
        if n < T + 2:  # a window reads T + 1 tokens, drawn from at least 1 offset
            raise ConfigError(f"the {split} split of {o['dataset']} holds {n} tokens, too few for --block_size {T}; "
                              f"lower --block_size to {max(1, n - 2)} or less, or prepare more data")
        top = largest_id(open_split(o["data_dir"], o["dataset"], split, meta))
        if top >= vocab:
            raise ConfigError(f"{os.path.join(o['data_dir'], o['dataset'], split + '.bin')} holds token id {top} but "
                              f"the model's vocab_size is {vocab} (meta.json: {meta['vocab_size']}); run prepare.py "
                              "again to remake the data set")


def open_split(data_dir, dataset, split, meta):
    # a fresh memmap per call: numpy's memmap otherwise holds pages and leaks memory over long runs
    return np.memmap(os.path.join(data_dir, dataset, f"{split}.bin"), dtype=np.dtype(meta["dtype"]), mode="r")


def windows(data, offsets, T):
    x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in offsets.tolist()])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in offsets.tolist()])
    return x, y


def train_offsets(n_tokens, T, seed, step, n_windows):
    """The offsets of every window of one optimiser step, over all processes and micro-steps."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(n_tokens - T - 1, (n_windows,), generator=g)


@torch.no_grad()
def evaluate(model, val, T, n_windows, batch_size, rank, world, device, ctx):
    """Mean loss on a fixed set of validation windows (the same every call), shared out across ranks."""
    offsets = torch.randint(len(val) - T - 1, (n_windows,), generator=torch.Generator().manual_seed(0))
    mine = offsets[rank::world]
    model.eval()
    total = torch.zeros(2, device=device)  # loss summed over windows, number of windows
    for i in range(0, len(mine), batch_size):
        x, y = windows(val, mine[i:i + batch_size], T)
        with ctx:
            _, loss = model(x.to(device), y.to(device))
        total += torch.stack([loss.float() * len(x), torch.tensor(float(len(x)), device=device)])
    if world > 1:
        torch.distributed.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()


# ----------------------------------------------------------------------------------------------------------
# checkpoints

def unwrap(model):
    model = model.module if hasattr(model, "module") else model
    return getattr(model, "_orig_mod", model)


def save_checkpoint(path, ckpt):
    tmp = path + ".tmp"
    torch.save(ckpt, tmp)
    os.replace(tmp, path)  # atomic: a crash mid-write never leaves a half-written ckpt.pt


def read_checkpoint(path, keys=("model_name", "model_args", "model")):
    """The dict train.py saved at path, holding at least `keys`; ConfigError for a missing, truncated, empty or
    foreign file (a bare state_dict), so that train --resume, sample.py and eval.py all say it in one line."""
    if not os.path.isfile(path):
        raise ConfigError(f"no checkpoint at {path}; train one with `python train.py --out_dir "
                          f"{os.path.dirname(path) or '.'}`")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch.load's errors differ by damage: zip reader, unpickler, EOF
        reason = " ".join(str(e).split())[:120] or type(e).__name__
        raise ConfigError(f"cannot read the checkpoint {path} ({reason}): the file is truncated, empty or not a "
                          "checkpoint; restore it from a copy or train again")
    if not isinstance(ckpt, dict) or "model_name" not in ckpt:
        bare = isinstance(ckpt, dict) and ckpt and all(torch.is_tensor(v) for v in ckpt.values())
        raise ConfigError(f"{path} is not a checkpoint of train.py: it has no model_name"
                          f"{' (it is a bare state_dict)' if bare else ''}; train.py saves the model name, both "
                          "configs and the weights together")
    missing = [k for k in keys if k not in ckpt]
    if missing:
        raise ConfigError(f"{path} lacks {', '.join(missing)}: it was not saved by this version of train.py")
    return ckpt


RESUME_KEYS = ("model_name", "model_args", "model", "optimizer", "iter_num", "best_val_loss", "rng", "meta")


def check_resume(o, model_args, ckpt, meta, path):
    """--resume continues the saved model on data of the same tokenizer. A model option that differs from the
    checkpoint's would be ignored, so it is refused: changing the model needs a new run."""
    if ckpt["model_name"] != o["model"]:
        raise ConfigError(f"{path} was trained with --model {ckpt['model_name']}, not {o['model']}; "
                          f"pass --model {ckpt['model_name']} or choose another --out_dir")
    saved = ckpt["model_args"]
    differ = [f"--{k} {v} (saved: {saved.get(k)})" for k, v in model_args.items()
              if k in o["explicit"] and v != saved.get(k)]
    if differ:
        raise ConfigError(f"--resume continues the model saved in {path}, and these options would change it: "
                          f"{', '.join(differ)}; drop them, or start a new run in another --out_dir")
    trained = ckpt["meta"]
    if (trained["tokenizer"], trained["vocab_size"]) != (meta["tokenizer"], meta["vocab_size"]):
        raise ConfigError(f"{path} was trained on data of the {trained['tokenizer']} tokenizer (vocab "
                          f"{trained['vocab_size']}) but {os.path.join(o['data_dir'], o['dataset'])} uses "
                          f"{meta['tokenizer']} (vocab {meta['vocab_size']}); pass the --dataset it was trained on "
                          f"({ckpt.get('train_config', {}).get('dataset', '?')}) or one prepared with "
                          f"--tokenizer {trained['tokenizer']}")


def prepare_out_dir(out_dir, resume_iter, master):
    """Run only after every check has passed: the folder, without the ckpt.pt.tmp of a run killed while saving,
    and log.jsonl, empty for a new run; a resumed run keeps the records up to its checkpoint's step, less the
    evaluation there (the resumed run evaluates that step again), so that no step is logged twice."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create --out_dir {out_dir} ({e.strerror}); choose another --out_dir")
    if not master:
        return
    if os.path.exists(os.path.join(out_dir, "ckpt.pt.tmp")):
        os.remove(os.path.join(out_dir, "ckpt.pt.tmp"))
    log_path, keep = os.path.join(out_dir, "log.jsonl"), []
    if resume_iter is not None and os.path.exists(log_path):
        with open(log_path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                    step = record["iter"]
                except (ValueError, TypeError, KeyError):
                    continue  # a line cut short by a crash
                if step < resume_iter or (step == resume_iter and "val_loss" not in record):
                    keep.append(line.rstrip("\n") + "\n")
    with open(log_path + ".tmp", "w") as f:
        f.writelines(keep)
    os.replace(log_path + ".tmp", log_path)


def rng_states(device, world):
    """Every rank's random number generator states, gathered on every rank: dropout masks differ by rank, and
    a resumed run gives each rank its own state back."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    states = [state]
    if world > 1:
        states = [None] * world
        torch.distributed.all_gather_object(states, state)
    return {k: [s[k] for s in states] for k in state}


def load_checkpoint(out_dir, device="cpu", keys=("model_name", "model_args", "model")):
    """(model, checkpoint dict) from out_dir/ckpt.pt (or a .pt path), or ConfigError with the fix."""
    path = out_dir if out_dir.endswith(".pt") else os.path.join(out_dir, "ckpt.pt")
    ckpt = read_checkpoint(path, keys)
    module = load_model_module(ckpt["model_name"])
    model = build_model(module, ckpt["model_args"], path)
    load_state(model, ckpt["model"], ckpt["model_name"], path)
    return model.to(device), ckpt


def check_model_args(model_args):
    """The fields every model file shares: positive sizes, and heads that split n_embd evenly."""
    for name in ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "n_kv_head", "ffn_hidden"):
        if model_args[name] < 1:
            raise ConfigError(f"--{name} must be 1 or more, not {model_args[name]}")
    n_embd, n_head, n_kv_head = model_args["n_embd"], model_args["n_head"], model_args["n_kv_head"]
    head_dim = model_args["head_dim"]  # 0: n_embd // n_head
    if head_dim < 0 or head_dim % 2:
        raise ConfigError(f"--head_dim must be even, or 0 for n_embd // n_head, not {head_dim}")
    if (not head_dim and (n_embd % n_head or (n_embd // n_head) % 2)) or n_head % n_kv_head:
        raise ConfigError(f"n_embd {n_embd}, n_head {n_head}, n_kv_head {n_kv_head} do not fit: n_head must divide "
                          "n_embd into an even head size (or set --head_dim), and n_kv_head must divide n_head")
    if not 0 <= model_args["dropout"] < 1:
        raise ConfigError(f"--dropout must be at least 0 and below 1, not {model_args['dropout']}")


def build_model(module, model_args, path):
    known = {f.name for f in dataclasses.fields(module.GPTConfig)}
    extra = set(model_args) - known
    if extra:
        raise ConfigError(f"{path} has config fields {', '.join(sorted(extra))} that {module.__name__}.py "
                          "does not know; it was saved by another version of that file")
    check_model_args({f.name: f.default for f in dataclasses.fields(module.GPTConfig)} | model_args)
    try:
        return module.GPT(module.GPTConfig(**model_args))
    except (ValueError, AssertionError, ZeroDivisionError) as e:
        raise ConfigError(f"{module.__name__}.py rejects this configuration: {e}")


def load_state(model, state, model_name, path):
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[1].strip() if "\n" in str(e) else str(e)
        raise ConfigError(f"{path} does not fit model_{model_name}.py ({first[:200]}); "
                          "it was saved by another version of that file")


# ----------------------------------------------------------------------------------------------------------

def lr_factor(it, o):
    if not o["decay_lr"]:
        return 1.0
    decay_iters = o["lr_decay_iters"] or o["max_iters"]
    if it < o["warmup_iters"]:
        return o["warmup_start"] + (1 - o["warmup_start"]) * it / o["warmup_iters"]
    if it >= decay_iters:
        return o["min_lr"] / o["learning_rate"]
    progress = (it - o["warmup_iters"]) / max(1, decay_iters - o["warmup_iters"])
    floor = o["min_lr"] / o["learning_rate"]
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1 - floor)


def peak_flops(device, o):
    if o["peak_flops"] > 0:
        return o["peak_flops"]
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, flops in PEAK_FLOPS:
            if key in name:
                return flops
    return 0.0  # unknown: MFU is not reported


def setup_device(o):
    """(device, rank, local_rank, world) for one process or a torchrun process group."""
    ddp = "RANK" in os.environ
    if o["device"] == "auto":
        o["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    if not ddp:
        return torch.device(o["device"]), 0, 0, 1
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if o["device"].startswith("cuda"):
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl", device_id=device)
    else:
        device = torch.device(o["device"])
        torch.distributed.init_process_group("gloo")
    return device, rank, local_rank, world


def main(argv):
    o, model_args, module = parse_args(argv)
    check_options(o, model_args)
    meta = read_meta(o["data_dir"], o["dataset"])
    ckpt_path = os.path.join(o["out_dir"], "ckpt.pt")
    ckpt = None
    if o["resume"]:
        if not os.path.exists(ckpt_path):
            raise ConfigError(f"--resume found no checkpoint at {ckpt_path}; drop --resume to start a new run")
        ckpt = read_checkpoint(ckpt_path, RESUME_KEYS)
        check_resume(o, model_args, ckpt, meta, ckpt_path)
        model_args = ckpt["model_args"]  # the architecture is the checkpoint's
    elif os.path.exists(ckpt_path):
        raise ConfigError(f"{o['out_dir']} already holds a checkpoint; pass --resume to continue it "
                          "or choose another --out_dir")
    else:
        if o["init_from"]:  # the architecture from the folder's config.json; the folder is checked here
            try:
                model_args = hf.init_args(o["init_from"], module, model_args, o["explicit"], meta)
            except hf.HFError as e:
                raise ConfigError(str(e))
        elif "vocab_size" not in o["explicit"]:
            model_args["vocab_size"] = meta["vocab_size"]
        if model_args["vocab_size"] < meta["vocab_size"]:
            raise ConfigError(f"--vocab_size {model_args['vocab_size']} is smaller than the data's "
                              f"{meta['vocab_size']}; drop the option")
    check_data(o, meta, model_args)
    # every check has passed: from here on the run may write to out_dir
    prepare_out_dir(o["out_dir"], ckpt["iter_num"] if ckpt else None, os.environ.get("RANK", "0") == "0")

    device, rank, _, world = setup_device(o)
    master = rank == 0
    o["gradient_accumulation_steps"] = o["gradient_accumulation_steps"] or world  # not given: one per process
    accum = o["gradient_accumulation_steps"] // world
    if o["dtype"] == "auto":
        o["dtype"] = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    ptdtype = torch.float32 if o["dtype"] == "float32" else torch.bfloat16
    ctx = nullcontext() if ptdtype == torch.float32 else torch.autocast(device.type, dtype=ptdtype)
    torch.manual_seed(o["seed"] + rank)

    model = build_model(module, model_args, ckpt_path).to(device)
    if o["init_from"] and ckpt is None:  # the pretrained weights of the shared components (hf.py)
        try:
            hf.load_weights(model, o["init_from"])
        except hf.HFError as e:
            raise ConfigError(str(e))
    raw_model = model
    groups = raw_model.param_groups(o["weight_decay"])
    for g in groups:
        g.setdefault("lr", o["learning_rate"])
        g["base_lr"] = g["lr"]  # the schedule scales every group's own lr by the same factor
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(groups, lr=o["learning_rate"], betas=(o["beta1"], o["beta2"]),
                                  eps=o["adam_eps"], fused=fused)
    iter_num, best_val = 0, float("inf")
    if ckpt is not None:
        load_state(raw_model, ckpt["model"], o["model"], ckpt_path)
        try:
            optimizer.load_state_dict(ckpt["optimizer"])
        except (ValueError, KeyError) as e:
            raise ConfigError(f"the optimiser state in {ckpt_path} does not fit model_{o['model']}.py ({e}); "
                              "it was saved by another version of that file")
        for g, fresh in zip(optimizer.param_groups, groups):
            g["base_lr"] = fresh["base_lr"]  # a resumed run follows this run's --learning_rate options
        iter_num, best_val = ckpt["iter_num"], ckpt["best_val_loss"]
        # each rank its own state (dropout masks differ by rank); a run saved with another number of
        # processes cannot be continued exactly, and takes the states it has in turn
        rng = ckpt["rng"]
        torch.set_rng_state(rng["torch"][rank % len(rng["torch"])])
        if device.type == "cuda" and "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"][rank % len(rng["cuda"])], device)
    if o["compile"]:
        model = torch.compile(model)
    eval_model = model  # evaluation bypasses DDP: ranks may hold different numbers of validation windows
    if world > 1:
        device_ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)

    T, B = model_args["block_size"], o["batch_size"]
    n_params = sum(p.numel() for p in raw_model.parameters())
    peak = peak_flops(device, o)
    log_path = os.path.join(o["out_dir"], "log.jsonl")
    wandb = None
    if master:
        print(f"model_{o['model']}.py: {n_params:,} parameters | {world} process(es) x {accum} micro-steps x "
              f"{B} x {T} tokens | {device} {o['dtype']}")
        if o["wandb_log"]:
            import wandb
            wandb.init(project=o["wandb_project"], name=o["wandb_run_name"] or None, config={**o, **model_args})

    def log(record):
        if master:
            with open(log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
            if wandb is not None:
                wandb.log(record, step=record["iter"])

    from tqdm import tqdm
    bar = tqdm(total=o["max_iters"], initial=iter_num, disable=not master, dynamic_ncols=True)
    train_time, tokens_since = 0.0, 0  # tokens/s counts training steps only, not evaluation
    try:
        while True:
            if iter_num % o["eval_interval"] == 0 or iter_num >= o["max_iters"]:
                val = open_split(o["data_dir"], o["dataset"], "val", meta)
                val_loss = evaluate(eval_model, val, T, o["eval_iters"] * B, B, rank, world, device, ctx)
                if not math.isfinite(val_loss):
                    raise ConfigError(f"validation loss is {val_loss} at step {iter_num}; the last good checkpoint "
                                      "is kept; lower --learning_rate or use --dtype float32")
                stats = raw_model.stats() if hasattr(raw_model, "stats") else {}
                record = {"iter": iter_num, "val_loss": val_loss, **stats}
                log(record)
                best_val = min(best_val, val_loss)
                rng = rng_states(device, world)  # every rank takes part
                if master:
                    bar.write(" | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in record.items()))
                    save_checkpoint(ckpt_path, {
                        "model_name": o["model"], "model_args": model_args, "train_config": o,
                        "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                        "iter_num": iter_num, "best_val_loss": best_val, "meta": meta,
                        "rng": rng,
                    })
            if iter_num >= o["max_iters"]:
                break

            t0 = time.time()
            factor = lr_factor(iter_num, o)
            for g in optimizer.param_groups:
                g["lr"] = g["base_lr"] * factor
            train = open_split(o["data_dir"], o["dataset"], "train", meta)
            offsets = train_offsets(len(train), T, o["seed"], iter_num, world * accum * B)
            step_loss = torch.zeros((), device=device)
            for micro in range(accum):
                x, y = windows(train, offsets[(rank * accum + micro) * B:(rank * accum + micro + 1) * B], T)
                # gradients are all-reduced only on the last micro-step
                sync = world == 1 or micro == accum - 1
                with (nullcontext() if sync else model.no_sync()), ctx:
                    _, loss = model(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
                    loss = loss / accum
                loss.backward()
                step_loss += loss.detach()
            if world > 1:
                torch.distributed.all_reduce(step_loss, op=torch.distributed.ReduceOp.AVG)
            if o["grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if hasattr(raw_model, "after_step"):
                raw_model.after_step()
            iter_num += 1
            if device.type == "cuda":
                torch.cuda.synchronize()
            train_time += time.time() - t0
            tokens_since += world * accum * B * T
            bar.update(1)
            if iter_num % o["log_interval"] == 0:
                tok_s = tokens_since / train_time
                record = {"iter": iter_num, "loss": step_loss.item(), "lr": o["learning_rate"] * factor,
                          "tok_per_s": tok_s}
                # checked here, where the loss is read anyway (no extra GPU sync per step); a NaN between two
                # logs is caught by the validation loss before any checkpoint is written
                if not math.isfinite(record["loss"]):
                    raise ConfigError(f"the training loss is {record['loss']} at step {iter_num}; the last good "
                                      f"checkpoint in {o['out_dir']} is kept; lower --learning_rate "
                                      "or use --dtype float32")
                if peak:
                    record["mfu"] = raw_model.flops_per_token(T) * tok_s / (peak * world)
                log(record)
                bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{tok_s:,.0f}",
                                **({"mfu": f"{100 * record['mfu']:.1f}%"} if peak else {}))
                train_time, tokens_since = 0.0, 0
    finally:
        bar.close()  # before any error line, so that it does not share the bar's line
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as e:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        fail(str(e))
