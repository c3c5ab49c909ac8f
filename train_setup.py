"""
What train.py does before its first step and when a run stops, so that train.py itself tells the steps: the
process it is (one, or one of torchrun's), the checks that refuse a bad run before anything is written (out_dir,
--resume against its checkpoint, the data splits, a first forward pass), the model and optimiser with their saved
state, and the one-line messages of a run that stops (a loss that is not finite, Ctrl-C, a lost process).
Library code for train.py: run `python train.py --help`.
"""
import dataclasses
import math
import os
import shlex
import signal
import sys
from dataclasses import dataclass

import torch

import hf
from common import (ConfigError, Interrupted, OutOfMemory, PeerLost, RunError, allocation_failure, autocast,
                    build_model, load_weights, open_split, read_checkpoint, resolve_device, resolve_dtype, split_tokens)


@dataclass
class Process:
    """This process: one, or one of torchrun's world; accum is its own share of the micro-steps."""
    world: int
    rank: int
    accum: int
    device: torch.device
    dtype: str

    def __post_init__(self):
        self.ctx = autocast(self.device, self.dtype)  # made once: a step enters it again and again


def this_process(cfg):
    """The Process this is: one, or one of torchrun's."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    accum = cfg.gradient_accumulation_steps or world  # not given: one micro-step per process
    if accum % world:
        raise ConfigError(f"--gradient_accumulation_steps {accum} is not a multiple of the {world} processes; make "
                          "it one, or leave it out (one micro-step per process)")
    device = resolve_device(cfg.device)
    if device.type == "cuda" and world > 1:  # one GPU per process
        device = resolve_device(f"cuda:{local_rank}")
    return Process(world, rank, accum // world, device, resolve_dtype(cfg.dtype, device))


def keep_global_batch(proc, cfg, ckpt):
    """A resumed run takes the micro-steps per optimiser step it was saved with, whatever the number of processes
    now, so that it reads the windows the uninterrupted run would have (unless --gradient_accumulation_steps says
    otherwise)."""
    saved = (ckpt.get("run") or {}).get("gradient_accumulation_steps") if ckpt else None
    if cfg.gradient_accumulation_steps or not isinstance(saved, int) or saved == proc.world * proc.accum:
        return
    if saved % proc.world:
        raise ConfigError(f"the run was saved with {saved} micro-steps per optimiser step, which {proc.world} "
                          f"processes cannot share; resume it on a number of processes that divides {saved}, or pass "
                          "--gradient_accumulation_steps (a new global batch)")
    proc.accum = saved // proc.world
    if proc.rank == 0:
        print(f"note: resumed on {proc.world} process(es), the run keeps its global batch: {saved} micro-steps per "
              f"optimiser step, {proc.accum} per process", file=sys.stderr)


def read_run(cfg, model_args, module, explicit, meta):
    """The checkpoint to continue (None for a new run) and the model options, after checking out_dir."""
    path, log = os.path.join(cfg.out_dir, "ckpt.pt"), os.path.join(cfg.out_dir, "log.jsonl")
    if os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise ConfigError(f"--out_dir {cfg.out_dir} is a file, not a folder; choose another --out_dir")
    if os.path.exists(log) and not os.path.isfile(log):
        raise ConfigError(f"{log} is not a file; move it away")
    if not cfg.resume:
        if os.path.exists(path):
            raise ConfigError(f"{cfg.out_dir} already holds a checkpoint; pass --resume to continue it "
                              "or choose another --out_dir")
        if cfg.init_from:  # the architecture from the folder's config.json; the folder is checked here
            try:
                model_args = hf.init_args(cfg.init_from, module, dict(model_args), explicit, meta)
            except hf.HFError as e:
                raise ConfigError(str(e))
        elif "vocab_size" not in explicit:
            model_args = {**model_args, "vocab_size": meta["vocab_size"]}
        if model_args["vocab_size"] < meta["vocab_size"]:
            raise ConfigError(f"--vocab_size {model_args['vocab_size']} is smaller than the data's "
                              f"{meta['vocab_size']}; drop the option")
        return None, model_args
    if not os.path.exists(path):
        raise ConfigError(f"--resume found no checkpoint at {path}; drop --resume to start a new run")
    ckpt = read_checkpoint(path, ("model_name", "model_args", "model", "optimizer", "iter_num", "best_val_loss",
                                  "rng", "meta"))
    if ckpt["iter_num"] > cfg.max_iters:
        raise ConfigError(f"the run in {cfg.out_dir} is at step {ckpt['iter_num']}, past --max_iters {cfg.max_iters}: "
                          f"nothing to train; pass --max_iters above {ckpt['iter_num']} to go on")
    check_resume(cfg, model_args, explicit, ckpt, meta, path)
    keep_schedule(cfg, explicit, ckpt)
    return ckpt, ckpt["model_args"]  # the architecture is the checkpoint's


def keep_schedule(cfg, explicit, ckpt):
    """A resumed run whose cosine has begun keeps its horizon, the step where it reaches min_lr (saved in the
    checkpoint's train_config): with the default --lr_decay_iters 0 the horizon would follow a new --max_iters, and
    the learning rate, already decayed, would jump at the resumed step. cfg.lr_decay_iters is set to the saved
    horizon, which the next checkpoint saves again; --lr_decay_iters given on the command line sets another. A run
    saved within its warm-up, whose learning rates did not depend on the horizon, takes the new one: it then
    equals the uninterrupted run of the new --max_iters."""
    saved = ckpt.get("train_config") or {}
    horizon = saved.get("lr_decay_iters") or saved.get("max_iters")
    if (not cfg.decay_lr or not saved.get("decay_lr", True) or "lr_decay_iters" in explicit
            or type(horizon) is not int or horizon == (cfg.lr_decay_iters or cfg.max_iters)
            or ckpt["iter_num"] <= cfg.warmup_iters):
        return
    cfg.lr_decay_iters = horizon
    if os.environ.get("RANK", "0") == "0":
        print(f"note: the run keeps its learning-rate schedule: the cosine reaches --min_lr at step {horizon} as "
              f"saved, not at --max_iters {cfg.max_iters}; pass --lr_decay_iters to set another step", file=sys.stderr)


def check_resume(cfg, model_args, explicit, ckpt, meta, path):
    """--resume continues the saved model on data of the same tokenizer. A model option that differs from the
    checkpoint's would be ignored, so it is refused: changing the model needs a new run."""
    if ckpt["model_name"] != cfg.model:
        raise ConfigError(f"{path} was trained with --model {ckpt['model_name']}, not {cfg.model}; "
                          f"pass --model {ckpt['model_name']} or choose another --out_dir")
    saved = ckpt["model_args"]
    differ = [f"--{k} {v} (saved: {saved.get(k)})" for k, v in model_args.items()
              if k in explicit and v != saved.get(k)]
    if differ:
        raise ConfigError(f"--resume continues the model saved in {path}, and these options would change it: "
                          f"{', '.join(differ)}; drop them, or start a new run in another --out_dir")
    trained = ckpt["meta"]
    if (trained["tokenizer"], trained["vocab_size"]) != (meta["tokenizer"], meta["vocab_size"]):
        was = ckpt.get("train_config", {})
        where = f" --data_dir {shlex.quote(was['data_dir'])}" if was.get("data_dir", cfg.data_dir) != cfg.data_dir else ""
        raise ConfigError(f"{path} was trained on data of the {trained['tokenizer']} tokenizer (vocab "
                          f"{trained['vocab_size']}) but {os.path.join(cfg.data_dir, cfg.dataset)} uses "
                          f"{meta['tokenizer']} (vocab {meta['vocab_size']}); pass the --dataset it was trained on "
                          f"(--dataset {shlex.quote(was.get('dataset', '?'))}{where}) or one prepared with "
                          f"--tokenizer {trained['tokenizer']}")


def check_splits(data_dir, dataset, meta, block_size, vocab_size):
    """Both splits are whole, long enough for block_size, and hold only ids a model of vocab_size can embed."""
    for split in ("train", "val"):
        n = split_tokens(data_dir, dataset, split, meta)
        if n < block_size + 2:  # a window reads T + 1 tokens, drawn from at least 1 offset
            fix = (f"lower --block_size to {n - 2} or less, or prepare more data" if n >= 3 else
                   "prepare more text (prepare.py --val_fraction sets the validation split's share)")
            raise ConfigError(f"the {split} split of {dataset} holds {n} tokens, too few for --block_size "
                              f"{block_size}; {fix}")
        data = open_split(data_dir, dataset, split, meta)
        stretch = max(1, min(len(data), 1 << 24) // 64)  # all of a small split, else 64 evenly spread stretches
        top = max(int(data[i:i + stretch].max()) for i in range(0, len(data), max(stretch, len(data) // 64)))
        if top >= vocab_size:
            raise ConfigError(f"{os.path.join(data_dir, dataset, split + '.bin')} holds token id {top} but the "
                              f"model's vocab_size is {vocab_size} (meta.json: {meta['vocab_size']}); run prepare.py "
                              "again to remake the data set")


def make_model(module, model_args, cfg, ckpt, device):
    """The model of model_args on device; a new run with --init_from takes the pretrained weights of the
    components every model file shares with vanilla (hf.py), the method's own parameters keep their init."""
    model = build_model(module, model_args, f"the options of model_{cfg.model}.py").to(device)
    if cfg.init_from and ckpt is None:
        try:
            hf.load_folder(model, cfg.init_from)
        except hf.HFError as e:
            raise ConfigError(str(e))
    return model


def make_optimizer(raw_model, cfg, device):
    """AdamW over the model's own parameter groups (a group may bring its own lr: vertical's scores)."""
    groups = raw_model.param_groups(cfg.weight_decay)
    for g in groups:
        g.setdefault("lr", cfg.learning_rate)
        g["base_lr"] = g["lr"]  # the schedule scales every group's own lr by the same factor
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                             fused=device.type == "cuda")


def restore(model, optimizer, ckpt, cfg, rank, device):
    """A resumed run's weights, optimiser state and this rank's random state (a run saved with another number of
    processes cannot be continued exactly, and takes the states it has in turn)."""
    path = os.path.join(cfg.out_dir, "ckpt.pt")
    load_weights(model, ckpt["model"], cfg.model, path)
    base_lrs = [g["base_lr"] for g in optimizer.param_groups]
    try:
        optimizer.load_state_dict(ckpt["optimizer"])
    except (ValueError, KeyError) as e:
        raise ConfigError(f"the optimiser state in {path} does not fit model_{cfg.model}.py ({e}); "
                          "it was saved by another version of that file")
    for g, base in zip(optimizer.param_groups, base_lrs):
        g["base_lr"] = base  # a resumed run follows this run's learning-rate options
    rng = ckpt["rng"]
    torch.set_rng_state(rng["torch"][rank % len(rng["torch"])])
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"][rank % len(rng["cuda"])], device)


def check_first_batch(raw_model, cfg, model_args, explicit, batch, iter_num, proc):
    """One forward pass on the first batch before anything is written, in eval mode (no dropout draws): a batch
    that does not fit, or a model whose loss is not finite from the start, fails here."""
    x, y = batch
    raw_model.eval()
    with torch.no_grad(), proc.ctx:  # memory that cannot be allocated ends at main_boundary(), as anywhere
        _, loss = raw_model(x, y)
    if not math.isfinite(loss.item()):
        raise RunError(divergence_message("loss of the first batch", loss.item(), iter_num, cfg, model_args, explicit,
                                          None, proc.dtype))
    raw_model.train()


def divergence_message(what, value, step, cfg, model_args, explicit, saved_step, dtype):
    """The one line of a non-finite loss: what to check (the options this run set; float32, where the run computed in
    another dtype), and what is kept."""
    values = {**dataclasses.asdict(cfg), **model_args}
    changed = [f"--{k} {values[k]}" for k in sorted(explicit) if k in values and k not in
               ("out_dir", "data_dir", "dataset", "max_iters", "resume", "device", "eval_interval", "log_interval")]
    kept = (f"the checkpoint of step {saved_step} in {cfg.out_dir} is kept" if saved_step is not None
            else "no checkpoint was written")
    return (f"the {what} is {value} at step {step}: training diverged; check the options of this run "
            f"({', '.join(changed) or 'the defaults'}: a learning rate, weight decay or model setting out of range)"
            f"{'' if dtype == 'float32' else ' or use --dtype float32'}; {kept}")


def catch_stop_signals():
    """(stop requests, the previous handlers): Ctrl-C and SIGTERM append to the list, which the training loop
    reads between two steps, and the run stops there (a KeyboardInterrupt raised wherever the signal lands can be
    swallowed by a library's cleanup code, and training would go on); a second signal interrupts at once."""
    stop = []

    def handler(signum, frame):
        if stop:
            raise KeyboardInterrupt
        stop.append(signum)
    return stop, {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}


def lost_peer(error):
    """Whether a collective failed because another process of the run is gone."""
    return isinstance(error, torch.distributed.DistError) or any(
        s in str(error) for s in ("Connection closed by peer", "Connection reset by peer", "remote worker",
                                  "NCCL communicator was aborted", "Broken pipe"))


def stopped(error, iter_num, saved_step, cfg, proc):
    """The one-line error of a run stopped by Ctrl-C or SIGTERM, by memory that cannot be allocated (main_boundary()
    adds what to lower), or by another process of the run that is gone (gloo: connection closed; NCCL: aborted); any
    other error as it is."""
    kept, again = ((f"the checkpoint of step {saved_step} is kept", "continue with --resume") if saved_step is not None
                   else ("no checkpoint was written", "run the same command again"))
    if isinstance(error, KeyboardInterrupt):
        return Interrupted(f"interrupted at step {iter_num}; {kept} in {cfg.out_dir}; {again}")
    size = allocation_failure(error)
    if size is not None:
        return OutOfMemory(f"out of memory at step {iter_num}: an allocation{size} failed; {kept} in {cfg.out_dir}")
    if proc.world == 1 or not lost_peer(error):
        return error
    return PeerLost(f"another process of this run stopped at step {iter_num}; {kept} in {cfg.out_dir}; {again} "
                    "once every process can run")


if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("train_setup.py is a library module of train.py; run `python train.py --help`")
