"""The contract every model_*.py meets, run on every model file and each of its VARIANTS."""
import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from common import model_from_checkpoint
from hf.convert import split_fused
from plumbing.errors import ConfigError
from plumbing.files import open_split
from plumbing.files import read_meta
import train
from conftest import ROOT, model_cases, model_names
from generate import generate

TINY = dict(vocab_size=257, block_size=64, n_layer=4, n_head=4, n_kv_head=2, n_embd=64, ffn_hidden=128)
CASES = model_cases()
IDS = [f"{name}-{variant}" for name, variant, _ in CASES]


def build(name, overrides, seed=0, **extra):
    module = importlib.import_module(f"model_{name}")
    torch.manual_seed(seed)
    return module.GPT(module.GPTConfig(**{**TINY, **overrides, **extra}))


def text_windows(data_dir, n, T, seed, split="train"):
    """n windows of real text through train.py's own data path (Data.batch)."""
    meta = read_meta(data_dir, "shakespeare")
    data = train.Data({s: open_split(data_dir, "shakespeare", s, meta, 257, T) for s in ("train", "val")})
    offsets = torch.randint(len(data.splits[split]) - T - 1, (n,), generator=torch.Generator().manual_seed(seed))
    return data.batch(split, offsets, T, torch.device("cpu"))


@pytest.mark.parametrize("name,variant,overrides", CASES, ids=IDS)
def test_shapes(name, variant, overrides):
    model = build(name, overrides)
    idx = torch.randint(0, TINY["vocab_size"], (2, 16))
    logits, loss = model(idx)
    assert logits.shape == (2, 16, TINY["vocab_size"]) and loss is None
    logits, loss, hidden = model(idx, targets=idx, return_hidden=True)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert len(hidden) == TINY["n_layer"] and all(h.shape == (2, 16, TINY["n_embd"]) for h in hidden)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name,variant,overrides", CASES, ids=IDS)
def test_causality(name, variant, overrides, mode):
    model = build(name, overrides)
    model.train(mode == "train")
    idx = torch.randint(0, TINY["vocab_size"], (2, 32))
    changed = idx.clone()
    changed[:, 20:] = torch.randint(0, TINY["vocab_size"], (2, 12))
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :20], b[:, :20], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, 20:], b[:, 20:])  # the later positions do see the change


@pytest.mark.parametrize("name,variant,overrides", CASES, ids=IDS)
def test_loss_falls_on_text(name, variant, overrides, data_dir):
    model = build(name, overrides)
    x_val, y_val = text_windows(data_dir, 16, 64, seed=1, split="val")
    with torch.no_grad():
        model.eval()
        before = model(x_val, y_val)[1].item()
    model.train()
    opt = torch.optim.AdamW(model.param_groups(0.0), lr=3e-3)
    for step in range(30):
        x, y = text_windows(data_dir, 8, 64, seed=100 + step)
        loss = model(x, y)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        if hasattr(model, "after_step"):
            model.after_step()
    with torch.no_grad():
        model.eval()
        after = model(x_val, y_val)[1].item()
    assert after < before - 1.0, (before, after)


@pytest.mark.parametrize("name,variant,overrides", CASES, ids=IDS)
def test_generate_with_cache_equals_recomputation(name, variant, overrides):
    model = build(name, overrides).eval()
    prompt = torch.randint(0, TINY["vocab_size"], (2, 7))
    with_cache = generate(model, prompt, 40, temperature=0, use_cache=True)
    without = generate(model, prompt, 40, temperature=0, use_cache=False)
    assert with_cache.shape == (2, 47)
    assert torch.equal(with_cache, without)
    # past the context length generation goes on (the cache restarts from the recent tokens)
    long = generate(model, prompt, TINY["block_size"] + 5, temperature=0.7, top_k=20, top_p=0.9)
    assert long.shape == (2, 7 + TINY["block_size"] + 5)


@pytest.mark.parametrize("name,variant,overrides", CASES, ids=IDS)
def test_checkpoint_round_trip(name, variant, overrides, tmp_path):
    model = build(name, overrides)
    with torch.no_grad():  # move every parameter off its init so that a missed key would show
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    path = str(tmp_path / "ckpt.pt")
    args = dict(vars(model.config))  # every field of its GPTConfig, as train.py saves them
    train.save_checkpoint(path, {"model_name": name, "model_args": args, "model": model.state_dict()})
    loaded, _, _ = model_from_checkpoint(path)
    idx = torch.randint(0, TINY["vocab_size"], (2, 24))
    assert torch.equal(model.eval()(idx)[0], loaded.eval()(idx)[0])
    assert all("module." not in k and "_orig_mod" not in k for k in torch.load(path)["model"])
    # a checkpoint of an older layout (q, k and v as separate matmuls, as Llama has them) is refused by
    # load_state_dict's own check, as one error naming the file
    train.save_checkpoint(path, {"model_name": name, "model_args": args,
                                 "model": split_fused(model.state_dict(), model.config)})
    with pytest.raises(ConfigError, match="ckpt.pt .*Missing key"):
        model_from_checkpoint(path)


# ---- through train.py: resume and DDP (default config of each model) -------------------------------------

def train_args(name, data_dir, out_dir, **opts):
    base = dict(model=name, data_dir=data_dir, out_dir=out_dir, device="cpu", batch_size=4, block_size=32,
                n_layer=4, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64, eval_iters=2, log_interval=1,
                warmup_iters=2, learning_rate=3e-3)
    return [f"--{k}={v}" for k, v in {**base, **opts}.items()]


def losses(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return {r["iter"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


@pytest.mark.parametrize("name", model_names())
def test_resumed_run_equals_uninterrupted(name, data_dir, tmp_path):
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    # the interrupted run stops at step 4 but keeps the uninterrupted run's lr schedule
    train.main(train_args(name, data_dir, full, max_iters=8, eval_interval=4, lr_decay_iters=8))
    train.main(train_args(name, data_dir, part, max_iters=4, eval_interval=4, lr_decay_iters=8))
    train.main(train_args(name, data_dir, part, max_iters=8, eval_interval=4, lr_decay_iters=8, resume=True))
    a, b = losses(full), losses(part)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    assert [a[i] for i in range(5, 9)] == [b[i] for i in range(5, 9)], (a, b)
    sa, sb = torch.load(os.path.join(full, "ckpt.pt"))["model"], torch.load(os.path.join(part, "ckpt.pt"))["model"]
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.versions
@pytest.mark.parametrize("name", [n if n == "vanilla" else pytest.param(n, marks=pytest.mark.slow)  # torchrun, 6 s each
                                  for n in model_names()])
def test_ddp_two_processes_equals_accumulation(name, data_dir, tmp_path):
    """Version-sensitive: CI runs it under each torch version of tests/test_versions.py. Real torchrun, two
    processes on gloo (torch 2.5's has no ReduceOp.AVG: train.py sums the step loss and divides), equal to one
    process accumulating the same two micro-batches: the logged losses and the parameters."""
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    opts = dict(max_iters=4, eval_interval=4, gradient_accumulation_steps=2)
    train.main(train_args(name, data_dir, one, **opts))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "train.py"), *train_args(name, data_dir, two, **opts)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = losses(one), losses(two)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    np.testing.assert_allclose([a[i] for i in a], [b[i] for i in a], rtol=1e-4)
    sa, sb = torch.load(os.path.join(one, "ckpt.pt"))["model"], torch.load(os.path.join(two, "ckpt.pt"))["model"]
    for k in sa:  # parameters and method state (buffers) end the same
        torch.testing.assert_close(sa[k], sb[k], rtol=1e-3, atol=1e-5)
