"""
The one trainer for every model file.

    python train.py --model vanilla                          # one process (CPU, one GPU)
    python train.py config/fineweb_edu_50m.py --model vertical --max_iters=100   # a paper's recipe, then overrides
    torchrun --standalone --nproc_per_node=8 train.py --model vertical
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=HOST --master_port=29500 train.py ...

`--model NAME` loads model_NAME.py, and every field of its GPTConfig is an option too (`--model NAME --help` lists
them); leading arguments are preset files (config/*.py). As in nanoGPT, --gradient_accumulation_steps is the total
per optimiser step, shared by the processes. A run is a transaction: out_dir is locked first, every check passes (a
forward pass too) before anything is written there, and log.jsonl is append-only. Every decision of a run is a line
of this file, read top to bottom; the checks and one-line errors are in plumbing/.
"""
import dataclasses
import importlib.util
import math
import os
import signal
import time
from contextlib import nullcontext

import numpy as np
import torch

from common import DTYPES, SIZES, autocast, peak_flops, resolve_device, resolve_dtype, synchronize
from hf import convert
from plumbing.config import build_model, check_model_args, model_names, option
from plumbing.console import Console, bar_note, duration
from plumbing.errors import (ConfigError, arg, catch_stop_signals, diverged, handling, main_boundary, naming, note,
                             printable, stopped)
from plumbing.files import (LOCK, check_run, note_changes, open_split, read_checkpoint, read_meta, read_resume,
                            run_folder, save_checkpoint, settle_log, to_json)
from plumbing.options import parse_model_options


@dataclasses.dataclass
class TrainConfig:
    # I/O
    model: str = option("vanilla", "the architecture: loads model_<model>.py; a label of the tables, <model>-<variant>, "
                        "is that file with its variant's options (mhc-hc: model_mhc.py, --hc_kind hc); one of: "
                        + ", ".join(model_names()) + " (python -m tools.sweep --help lists the labels)")
    out_dir: str = option("out", "the run's folder: ckpt.pt, log.jsonl", path="out")  # made where the run starts
    resume: bool = option(False, "continue the run saved in out_dir")
    size: str = option("", "a shape of the Vertical Attention paper's Table 2; '' = the model file's own",
                       choices=("", *SIZES))
    dataset: str = option("shakespeare", "data/<dataset>/{train,val}.bin from prepare.py")
    tokenizer: str = option("", "the tokenizer the data set must be prepared with (a preset's); '' = any")
    init_from: str = option("", "a Hugging Face Llama or Qwen3 folder: its architecture and the weights of the shared "
                            "components (hf/convert.py); '' = none; ignored with --resume", path=True)
    data_dir: str = option("data", "the folder of prepared data sets", path=True)
    # optimisation
    max_iters: int = option(1000, "optimiser steps in all", min=0)
    batch_size: int = option(16, "sequences per micro-step per process", min=1)
    gradient_accumulation_steps: int = option(None, "micro-steps per optimiser step in all; None: 1 per process", min=1)
    learning_rate: float = option(1e-3, "peak AdamW learning rate", above=0)
    weight_decay: float = option(0.1, "AdamW weight decay of matrices and embeddings", min=0)
    beta1: float = option(0.9, "AdamW beta1", min=0, below=1)
    beta2: float = option(0.95, "AdamW beta2", min=0, below=1)
    adam_eps: float = option(1e-8, "AdamW epsilon", above=0)
    grad_clip: float = option(1.0, "clip the gradient norm to this; 0 = off", min=0)
    decay_lr: bool = option(True, "linear warm-up then cosine decay to min_lr; false = constant learning rate")
    warmup_iters: int = option(100, "steps of linear warm-up", min=0)
    lr_decay_iters: int = option(0, "the cosine reaches min_lr at this step; 0 = max_iters", min=0)
    min_lr: float = option(1e-4, "the learning rate at the end of the decay", min=0)
    warmup_start: float = option(0.0, "warm-up starts at this fraction of the learning rate", min=0, max=1)
    # evaluation and logging
    eval_interval: int = option(250, "steps between validation losses and checkpoints", min=1)
    eval_iters: int = option(20, "validation batches: eval_iters * batch_size windows of block_size tokens", min=1)
    log_interval: int = option(10, "steps between training-loss records", min=1)
    wandb_log: bool = option(False, "also log to Weights & Biases (pip install wandb)")
    wandb_project: str = option("layer-connections", "wandb project")
    wandb_run_name: str = option("", "wandb run name; '' = wandb's own")
    # system
    seed: int = option(1337, "initialisation, dropout and the order of the training windows", min=0, max=2**32 - 1)
    device: str = option("auto", "auto (cuda, else mps, else cpu), cpu, cuda, cuda:N, mps")
    dtype: str = option("auto", "auto = bfloat16 autocast on a GPU that has it, else float32", choices=DTYPES)
    compile: bool = option(None, "torch.compile the model; not given: on CUDA where Triton is installed (eager took "
                           "1.8x), off on CPU and MPS")
    peak_flops: float = option(0.0, "the device's peak FLOP/s for MFU; 0 = look the GPU up in a table", min=0)

    def __post_init__(self):  # the rules across fields; each field's own are checked first (plumbing/config.py)
        if self.decay_lr and self.min_lr > self.learning_rate:
            raise ValueError(f"--min_lr {self.min_lr} is above --learning_rate {self.learning_rate}; the decay "
                             "ends at min_lr, so it must be at most the learning rate")


def parse_args(argv):
    """(TrainConfig, model options as a dict, model module, names set explicitly): defaults < presets < argv."""
    cfg, model_args, module, explicit = parse_model_options(TrainConfig, argv, __doc__)
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    if cfg.resume and "model" not in explicit and os.path.isfile(path):  # a resumed run is the checkpoint's model
        saved = read_checkpoint(path, mmap=True)
        label = saved.get("label", saved["model_name"])  # (a checkpoint of an older train.py has no label)
        cfg, model_args, module, explicit = parse_model_options(TrainConfig, [*argv, f"--model={label}"], __doc__)
    if cfg.size:  # the shape of Table 2, with the model file's own settings for it, where no option set them
        sized = {**SIZES[cfg.size], **getattr(module, "SIZE_DEFAULTS", {}).get(cfg.size, {})}
        model_args = {**model_args, **{k: v for k, v in sized.items() if k not in explicit}}
        explicit = explicit | set(sized)  # a resumed run's check treats them as given
        check_model_args(module, model_args, f"--size {cfg.size}")
    return cfg, model_args, module, explicit


# ---- the data: random windows of block_size + 1 tokens from data/<dataset>/{train,val}.bin

@dataclasses.dataclass
class Data:
    """The prepared data set's two splits, memory-mapped once per run, and the batches read from them."""
    splits: dict  # {"train": memmap, "val": memmap}, checked (plumbing/files.py's open_split)

    def batch(self, split, offsets, T, device):
        """(x, y) on device, each (len(offsets), T): the windows of T + 1 tokens that start at offsets, as inputs and
        next-token targets. On CUDA the batch is pinned first, so that its copy to the GPU does not block."""
        data = self.splits[split]
        x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in offsets.tolist()])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in offsets.tolist()])
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)

    def train_batches(self, cfg, proc, T, step):
        """This process's training batches from optimiser step `step` on, one per micro-step, in order."""
        while True:
            n_windows = proc.world * proc.accum * cfg.batch_size  # every window of this optimiser step
            offsets = train_offsets(len(self.splits["train"]), T, cfg.seed, step, n_windows)
            for micro in range(proc.accum):
                first = (proc.rank * proc.accum + micro) * cfg.batch_size
                yield self.batch("train", offsets[first:first + cfg.batch_size], T, proc.device)
            step += 1


def train_offsets(n_tokens, T, seed, step, n_windows):
    """The offsets of every window of one optimiser step, over all processes and micro-steps: drawn from (seed,
    step), so that ranks never share a window and a resumed run draws what the uninterrupted run would have."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(n_tokens - T - 1, (n_windows,), generator=g)


# ---- the optimiser and the learning-rate schedule

def make_optimizer(raw_model, cfg, device):
    """AdamW over the model's own parameter groups (a group may bring its own lr: vertical's scores); fused on CUDA."""
    groups = raw_model.param_groups(cfg.weight_decay)
    for g in groups:
        g.setdefault("lr", cfg.learning_rate)
        g["base_lr"] = g["lr"]  # the schedule scales every group's own lr by the same factor
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                             fused=device.type == "cuda")


def lr_factor(it, cfg):
    """The learning rate of step it as a fraction of the peak: linear warm-up, then a cosine down to min_lr."""
    if not cfg.decay_lr:
        return 1.0
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if it < cfg.warmup_iters:
        return cfg.warmup_start + (1 - cfg.warmup_start) * it / cfg.warmup_iters
    floor = cfg.min_lr / cfg.learning_rate
    if it >= decay_iters:
        return floor
    progress = (it - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1 - floor)


# ---- the processes: one, or one per GPU under torchrun, each with its own share of the micro-steps; DDP

@dataclasses.dataclass
class Process:
    """This process: one, or one of torchrun's world; accum is its own share of the micro-steps."""
    world: int
    rank: int
    accum: int
    device: torch.device
    dtype: str
    ctx: object  # autocast to dtype, made once: a step enters it again and again


def this_process(cfg):
    """The Process this is: one, or one of torchrun's (which sets WORLD_SIZE, RANK and LOCAL_RANK)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    accum = cfg.gradient_accumulation_steps or world  # not given: one micro-step per process
    if accum % world:
        raise ConfigError(f"--gradient_accumulation_steps {accum} is not a multiple of the {world} processes; make "
                          "it one, or leave it out (one micro-step per process)")
    device = resolve_device(cfg.device)
    if device.type == "cuda" and world > 1:  # one GPU per process
        device = resolve_device(f"cuda:{local_rank}")
    if cfg.compile and device.type == "cuda" and importlib.util.find_spec("triton") is None:  # (said before the run)
        raise ConfigError("--compile on CUDA needs Triton, which this torch does not have (its Windows builds do not); "
                          "pass --compile false")
    dtype = resolve_dtype(cfg.dtype, device)
    return Process(world, rank, accum // world, device, dtype, autocast(device, dtype))


def wrap(raw_model, cfg, proc):
    """(the model to train: compiled where asked, under DDP; the model to evaluate: not under DDP, whose ranks may
    hold different numbers of validation windows)."""
    triton = importlib.util.find_spec("triton") is not None  # inductor's GPU kernels (torch's Windows builds lack it)
    compiled = cfg.compile if cfg.compile is not None else proc.device.type == "cuda" and triton
    model = torch.compile(raw_model) if compiled else raw_model
    if proc.world == 1:
        return model, model
    ids = [proc.device.index] if proc.device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids), model


# ---- one optimiser step, and evaluation

def optimizer_step(model, raw_model, optimizer, cfg, iter_num, proc, batches, batch):
    """Step iter_num: accum micro-steps from `batch` (gradients all-reduced on the last; the next batch read while the
    device computes, nanoGPT's order). Returns the mean loss, a tensor (reading it syncs the GPU), and the next one."""
    for g in optimizer.param_groups:
        g["lr"] = g["base_lr"] * lr_factor(iter_num, cfg)
    step_loss = torch.zeros((), device=proc.device)
    for micro in range(proc.accum):
        x, y = batch
        sync = proc.world == 1 or micro == proc.accum - 1
        with (nullcontext() if sync else model.no_sync()), proc.ctx:
            _, loss = model(x, y)
            loss = loss / proc.accum
        batch = next(batches)  # on a GPU, while it computes the forward
        loss.backward()
        step_loss += loss.detach()
    if proc.world > 1:  # a sum, then divided: torch 2.5's gloo has no ReduceOp.AVG
        torch.distributed.all_reduce(step_loss)
        step_loss /= proc.world
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if hasattr(raw_model, "after_step"):
        raw_model.after_step()  # collective under DDP (skipmiddle's controller all-reduces its statistics)
    return step_loss, batch


@torch.no_grad()
def evaluate(model, raw_model, data, cfg, T, proc):
    """(mean loss on the fixed validation windows, shared out across ranks; the model file's stats() on this rank's
    first validation batch, e.g. a map's entropy or gate sparsity, or {}); collective under DDP."""
    g = torch.Generator().manual_seed(0)  # the same windows at every evaluation
    mine = torch.randint(len(data.splits["val"]) - T - 1, (cfg.eval_iters * cfg.batch_size,), generator=g)
    mine, B = mine[proc.rank::proc.world], cfg.batch_size
    model.eval()
    total, stats = torch.zeros(2, device=proc.device), {}  # loss summed over windows, number of windows
    for i in range(0, len(mine), B):
        x, y = data.batch("val", mine[i:i + B], T, proc.device)
        with proc.ctx:
            _, loss = model(x, y)
            if i == 0 and hasattr(raw_model, "stats"):
                stats = raw_model.stats(x)
        total += torch.stack([loss.float() * len(x), torch.tensor(float(len(x)), device=proc.device)])
    if proc.world > 1:
        torch.distributed.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item(), stats


# ---- the log: log.jsonl (append-only), the progress bar, wandb

class Log:
    """log.jsonl and the console (plumbing/console.py); tokens/s and MFU over the training time since the last
    record (the clock waits for the device only where it starts and stops), and the tokens seen."""

    def __init__(self, cfg, model_args, raw_model, proc, start, tokens_seen):
        T = model_args["block_size"]
        self.master, self.path, self.device = proc.rank == 0, os.path.join(cfg.out_dir, "log.jsonl"), proc.device
        self.tokens_per_step = proc.world * proc.accum * cfg.batch_size * T
        self.run = {"world": proc.world, "gradient_accumulation_steps": proc.world * proc.accum,
                    "device": str(proc.device), "dtype": proc.dtype, "tokens_per_step": self.tokens_per_step}
        self.flops, self.peak = raw_model.flops_per_token(T), peak_flops(proc.device, cfg.peak_flops) * proc.world
        self.seconds, self.tokens, self.t0, self.tokens_seen = 0.0, 0, None, tokens_seen
        header = (f"model_{type(raw_model).__module__[6:]}.py"
                  f"{f' ({cfg.model})' if cfg.model != type(raw_model).__module__[6:] else ''}: "
                  f"{sum(p.numel() for p in raw_model.parameters()):,} parameters | "
                  f"{f'resumes at step {start:,} | ' if cfg.resume else ''}"
                  f"{proc.world} process(es) x {proc.accum} micro-steps x {cfg.batch_size} x {T} tokens | "
                  f"{proc.device} {proc.dtype}")
        self.console = Console(cfg.max_iters, start, self.master, header, cfg.eval_interval,
                               {**dataclasses.asdict(cfg), **model_args} if cfg.wandb_log else None,
                               cfg.wandb_project, cfg.wandb_run_name)

    def start_clock(self):
        if self.t0 is None:
            synchronize(self.device)
            self.t0 = time.perf_counter()

    def stop_clock(self):
        if self.t0 is not None:
            synchronize(self.device)
            self.seconds, self.t0 = self.seconds + time.perf_counter() - self.t0, None

    def step_done(self):
        self.tokens += self.tokens_per_step
        self.tokens_seen += self.tokens_per_step
        self.console.bar.update(1)

    def train_record(self, step, loss, lr):
        self.stop_clock()
        tok_s = self.tokens / self.seconds
        self.seconds, self.tokens = 0.0, 0
        self.start_clock()
        return {"iter": step, "loss": loss, "lr": lr, "tok_per_s": tok_s,
                **({"mfu": self.flops * tok_s / self.peak} if self.peak else {}), "tokens": self.tokens_seen}

    def write(self, record, show=False):
        if self.master:
            with naming(self.path), open(self.path, "a", encoding="utf-8") as f:
                f.write(to_json(record) + "\n")
            self.console.record(record, line=show)


# ---- what a resumed run keeps (checked in plumbing/files.py first)

def resumed(cfg, proc, explicit, ckpt, T):
    """(cfg, micro-steps per process, tokens seen) of a run that continues the saved one; notes say what it keeps."""
    saved, run, step = ckpt.get("train_config") or {}, ckpt.get("run") or {}, ckpt["iter_num"]
    # the schedule's horizon once its cosine has begun: with --lr_decay_iters 0 it would follow a new --max_iters,
    # and the decayed learning rate would jump (a run saved in its warm-up takes the new one: it did not decay yet)
    horizon = saved.get("lr_decay_iters") or saved.get("max_iters")  # (train_config holds to TrainConfig's rules)
    if (cfg.decay_lr and saved.get("decay_lr", True) and "lr_decay_iters" not in explicit and horizon
            and horizon != (cfg.lr_decay_iters or cfg.max_iters) and step > cfg.warmup_iters):
        cfg = dataclasses.replace(cfg, lr_decay_iters=horizon)  # which the next checkpoint saves again
        note(f"the run keeps its learning-rate schedule: the cosine reaches --min_lr at step {horizon} as saved, not "
             f"at --max_iters {cfg.max_iters}; pass --lr_decay_iters to set another step")
    cfg = dataclasses.replace(cfg, model=ckpt.get("label", cfg.model))  # its label: --model mhc resumes mhc-hc
    note_changes(cfg, ckpt, lr_factor)  # what the options change of the saved run: its data, schedule, ...
    # the global batch it was saved with, shared by this run's processes, so that it reads the windows the
    # uninterrupted run would have (--gradient_accumulation_steps sets a new one)
    accum, steps = proc.accum, run.get("gradient_accumulation_steps")
    if not cfg.gradient_accumulation_steps and steps and steps != proc.world * accum:
        if steps % proc.world:
            raise ConfigError(f"the run was saved with {steps} micro-steps per optimiser step, which {proc.world} "
                              f"processes cannot share; resume it on a number of processes that divides {steps}, or "
                              "pass --gradient_accumulation_steps (a new global batch)")
        accum = steps // proc.world
        note(f"resumed on {proc.world} process(es), the run keeps its global batch: {steps} micro-steps per "
             f"optimiser step, {accum} per process")
    # the token count goes on from the saved one (an older checkpoint's: its steps at its tokens per step)
    per_step, was = proc.world * accum * cfg.batch_size * T, run.get("tokens_per_step")
    tokens = ckpt.get("tokens_seen", step * (was or per_step))
    if was and was != per_step:
        note(f"the run resumes with {per_step:,} tokens per optimiser step where it saved {was:,}; its token count "
             f"goes on from the saved {tokens:,} at step {step:,}")
    return cfg, accum, tokens


def next_steps(cfg, step, val_loss, seconds):
    """One line: the run's wall time, its checkpoint and loss, and the commands that sample, evaluate, go on."""
    out = arg("out_dir", cfg.out_dir)
    return (f"done in {duration(seconds)}: {printable(os.path.join(cfg.out_dir, 'ckpt.pt'))} holds step {step} "
            f"(best val loss {val_loss:.4f}); sample from it: `python sample.py {out}`; evaluate it: `python eval.py "
            f"{out}`; to train on, run the same command with --resume and a larger --max_iters")


# ---- the checkpoint, and resume

def rng_states(device, world):
    """Every rank's random number generator states, gathered on every rank (a collective under DDP): dropout
    masks differ by rank, and a resumed run gives each rank its own state back."""
    state = {"torch": torch.get_rng_state(), **({"cuda": torch.cuda.get_rng_state(device)} if device.type == "cuda"
                                                else {})}
    states = [state] * world
    if world > 1:
        torch.distributed.all_gather_object(states, state)
    return {k: [s[k] for s in states] for k in state}


def save(raw_model, optimizer, cfg, model_args, meta, log, iter_num, best_val, proc):
    """The checkpoint of step iter_num, with the random states of every rank: rank 0 writes it, whole or not at all."""
    rng = rng_states(proc.device, proc.world)  # collective under DDP
    if proc.rank == 0:
        save_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"), {
            "model_name": type(raw_model).__module__[6:], "label": cfg.model, "model_args": model_args,
            "train_config": dataclasses.asdict(cfg),
            "run": log.run, "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
            "iter_num": iter_num, "tokens_seen": log.tokens_seen, "best_val_loss": best_val,
            "meta": meta, "rng": rng})


def restore(raw_model, optimizer, ckpt, cfg, proc):
    """A resumed run's weights, optimiser state and this rank's random state (a run saved with another number of
    processes cannot be continued exactly, and takes the states it has in turn), checked by torch as they load."""
    fix = "its weights, optimiser state or random states do not fit this run; restore it from a copy, or train anew"
    with handling(os.path.join(cfg.out_dir, "ckpt.pt"), fix):
        raw_model.load_state_dict(ckpt["model"])
        base_lrs = [g["base_lr"] for g in optimizer.param_groups]
        optimizer.load_state_dict(ckpt["optimizer"])
        states = [(p, optimizer.state[p]) for p in raw_model.parameters() if optimizer.state[p]]
        if not all(s["exp_avg"].shape == s["exp_avg_sq"].shape == p.shape and s["step"] >= 0 for p, s in states):
            raise ValueError("the optimiser's state does not fit its parameters")  # torch finds it only at a step
        rng = ckpt["rng"]
        torch.set_rng_state(rng["torch"][proc.rank % len(rng["torch"])])
        if proc.device.type == "cuda" and "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"][proc.rank % len(rng["cuda"])], proc.device)
    for g, base in zip(optimizer.param_groups, base_lrs):
        g["base_lr"] = base  # a resumed run follows this run's learning-rate options


def stop_now(stop, iter_num, cfg, proc):
    """Whether the run stops before step iter_num: Ctrl-C or SIGTERM came since the last step. Under DDP the ranks
    agree, at each logged step (an all-reduce where they synchronise anyway), so that they save and stop together."""
    if proc.world == 1:
        return bool(stop)
    if iter_num % cfg.log_interval:
        return False
    asked = torch.tensor(float(bool(stop)), device=proc.device)
    torch.distributed.all_reduce(asked)  # a sum: any rank's request
    return asked.item() > 0


# ---- the run: every check and decision, then the loop, which Ctrl-C and SIGTERM stop between two steps, saved

def main(argv):
    cfg, model_args, module, explicit = parse_args(argv)
    proc = this_process(cfg)
    # the run folder, taken (by rank 0, for every process) before the checks and held to the end: a second run in
    # it, new or resumed, is refused
    with run_folder(cfg.out_dir) if proc.rank == 0 else nullcontext():
        run(*prepare(cfg, model_args, module, explicit, proc))
    if proc.world > 1:
        torch.distributed.destroy_process_group()


def prepare(cfg, model_args, module, explicit, proc):
    """Every check, before anything in out_dir is written, and what the run trains: (cfg, model_args, explicit,
    proc, data, the model, its optimiser, meta, the step it starts at); a resumed run's state is restored."""
    meta = read_meta(cfg.data_dir, cfg.dataset, cfg.tokenizer)  # of the tokenizer a preset asks for
    check_run(cfg)
    if cfg.resume:  # the run saved in out_dir, checked against this command's options and data; its architecture
        ckpt = read_resume(cfg, model_args, explicit, meta)
        model_args = dataclasses.asdict(check_model_args(module, ckpt["model_args"], f"{cfg.out_dir}'s model_args"))
        cfg, proc.accum, tokens_seen = resumed(cfg, proc, explicit, ckpt, model_args["block_size"])
    else:
        ckpt, tokens_seen = None, 0
        if cfg.init_from:  # its config.json sets the architecture, its tokenizer the vocabulary (hf/convert.py)
            model_args = convert.init_args(cfg.init_from, module, dict(model_args), explicit, meta)
        elif "vocab_size" not in explicit:  # every token id of the data set, as its meta.json says
            model_args = {**model_args, "vocab_size": meta["vocab_size"]}
        if cfg.size and meta["tokenizer"] == "byte":  # Table 2's counts hold the paper's embedding, not 257 rows
            note(f"--size {cfg.size} on byte-level data: the shape is the paper's, its parameter count is not (the "
                 "paper's count holds a vocabulary of 32,000 or more)")
    T = model_args["block_size"]
    data = Data({s: open_split(cfg.data_dir, cfg.dataset, s, meta, model_args["vocab_size"], T)
                 for s in ("train", "val")})
    if proc.world > 1:  # nccl on CUDA where torch has it (its Windows builds do not), else gloo; it writes nothing
        if proc.device.type == "cuda":
            torch.cuda.set_device(proc.device)
        nccl = proc.device.type == "cuda" and torch.distributed.is_nccl_available()
        torch.distributed.init_process_group("nccl" if nccl else "gloo")
    torch.manual_seed(cfg.seed + proc.rank)
    raw_model = build_model(module, model_args).to(proc.device)
    if cfg.init_from and ckpt is None:  # the pretrained weights of the components every model file shares with
        convert.load_folder(raw_model, cfg.init_from)  # vanilla (hf/convert.py); the method's own keep their init
    optimizer = make_optimizer(raw_model, cfg, proc.device)
    if ckpt is not None:
        restore(raw_model, optimizer, ckpt, cfg, proc)
    step, best_val = (ckpt["iter_num"], ckpt["best_val_loss"]) if ckpt else (0, float("inf"))
    return cfg, model_args, explicit, proc, data, raw_model, optimizer, meta, step, best_val, tokens_seen


def run(cfg, model_args, explicit, proc, data, raw_model, optimizer, meta, iter_num, best_val, tokens_seen):
    T, saved_step = model_args["block_size"], iter_num if cfg.resume else None
    batches = data.train_batches(cfg, proc, T, iter_num)  # this process's batches, one per micro-step
    batch = next(batches)
    model, eval_model = wrap(raw_model, cfg, proc)
    raw_model.eval()  # one forward pass before anything is written, with no dropout drawn: a batch that does not fit,
    with torch.no_grad(), proc.ctx:  # a compile that cannot work, or a loss not finite from the start, fails here
        first_loss = eval_model(*batch)[1].item()
    raw_model.train()
    if not math.isfinite(first_loss):
        raise diverged("loss of the first batch", first_loss, iter_num, cfg, model_args, explicit, saved_step,
                       proc.dtype)

    # ---- the run: from here on it may write to out_dir
    if cfg.decay_lr and 0 < cfg.max_iters <= cfg.warmup_iters:  # a short run: its schedule never reaches the cosine
        note(f"--max_iters {cfg.max_iters} ends within the warm-up of {cfg.warmup_iters} steps: the learning rate "
             f"rises to {cfg.learning_rate * lr_factor(cfg.max_iters - 1, cfg):.3g} and never decays; lower "
             "--warmup_iters for a run that does")
    if proc.rank == 0 and set(os.listdir(cfg.out_dir)) - {LOCK}:  # an earlier run's files: its log up to the step
        settle_log(cfg.out_dir, saved_step)
    stop, handlers = catch_stop_signals(bar_note)  # from here Ctrl-C and SIGTERM stop the run after a step, saved
    log = Log(cfg, model_args, raw_model, proc, iter_num, tokens_seen)
    try:
        while True:
            if stop_now(stop, iter_num, cfg, proc):  # Ctrl-C or SIGTERM since the last step: keep it, then stop
                if iter_num != saved_step:
                    save(raw_model, optimizer, cfg, model_args, meta, log, iter_num, best_val, proc)
                    saved_step = iter_num
                raise KeyboardInterrupt
            # ---- evaluate and checkpoint once in a while (a resumed run has both for its first step already)
            if (iter_num % cfg.eval_interval == 0 or iter_num >= cfg.max_iters) and iter_num != saved_step:
                log.stop_clock()  # evaluation is not training time
                val_loss, stats = evaluate(eval_model, raw_model, data, cfg, T, proc)
                if not math.isfinite(val_loss):
                    raise diverged("validation loss", val_loss, iter_num, cfg, model_args, explicit, saved_step,
                                   proc.dtype)
                best_val = min(best_val, val_loss)
                log.write({"iter": iter_num, "val_loss": val_loss, "tokens": log.tokens_seen, **stats}, show=True)
                save(raw_model, optimizer, cfg, model_args, meta, log, iter_num, best_val, proc)
                saved_step = iter_num
            if iter_num >= cfg.max_iters:
                break

            # ---- one optimiser step
            log.start_clock()
            step_loss, batch = optimizer_step(model, raw_model, optimizer, cfg, iter_num, proc, batches, batch)
            iter_num += 1
            log.step_done()

            # ---- log: the loss is read (and the GPU synchronised) only here, not every step
            if iter_num % cfg.log_interval == 0:
                loss = step_loss.item()
                if not math.isfinite(loss):
                    raise diverged("training loss", loss, iter_num, cfg, model_args, explicit, saved_step, proc.dtype)
                log.write(log.train_record(iter_num, loss, cfg.learning_rate * lr_factor(iter_num - 1, cfg)))
        if proc.world > 1:  # every rank leaves together: none tears its connections down while a peer still talks
            torch.distributed.barrier()
    except (KeyboardInterrupt, RuntimeError, OSError) as e:
        raise stopped(e, iter_num, saved_step, cfg, proc)
    finally:
        log.console.bar.close()  # the bar first: the lines below are not drawn into it
        for s, handler in handlers.items():
            signal.signal(s, handler)
    if proc.rank == 0:  # the run's last line: where it is, and what to run next
        print(next_steps(cfg, saved_step, best_val, time.perf_counter() - log.console.began))


if __name__ == "__main__":  # memory that cannot be allocated, anywhere in a run, ends in one line naming these
    main_boundary(main, memory_fix="lower --batch_size (a larger --gradient_accumulation_steps keeps the batch; "
                  "--resume takes both), or the model's size in a new run (--n_embd, --n_layer, --block_size)")
