"""The learning-rate schedule against values worked out by hand: a linear warm-up from --warmup_start, a cosine from
the peak down to --min_lr at --lr_decay_iters (or --max_iters), then the floor; as train.py computes it
(lr_factor), logs it and sets it in the optimiser."""
import json
import math

import pytest
import torch

import train

# --learning_rate 1e-3, --min_lr 1e-4 (the floor: a factor of 0.1), --warmup_iters 10, --max_iters 110: the cosine
# runs over the 100 steps from 10 to 110, at step 10 + 100 x a factor of 0.1 + 0.45 (1 + cos(pi x)). At the midpoint
# a cosine and a line agree (0.55); the quarters tell them apart: 0.868198 and 0.231802, where a line gives 0.775
# and 0.325
BY_HAND = {0: 0.0, 1: 0.1, 5: 0.5, 9: 0.9, 10: 1.0, 35: 0.1 + 0.45 * (1 + math.cos(math.pi / 4)), 60: 0.55,
           85: 0.1 + 0.45 * (1 + math.cos(3 * math.pi / 4)), 110: 0.1, 500: 0.1}


def config(*args):
    return train.parse_args(["--learning_rate=1e-3", "--min_lr=1e-4", "--warmup_iters=10", "--max_iters=110",
                             *args])[0]


def test_warm_up_cosine_and_floor_by_hand():
    cfg = config()
    assert {it: pytest.approx(train.lr_factor(it, cfg), abs=1e-12) for it in BY_HAND} == BY_HAND
    assert 0.868198 < BY_HAND[35] < 0.868199 and 0.231801 < BY_HAND[85] < 0.231803  # the cosine's quarters


def test_the_options_that_shape_it():
    """--warmup_start: the warm-up starts there; --lr_decay_iters: the cosine ends there, before --max_iters;
    --decay_lr false: the peak throughout; --warmup_iters 0: the cosine from step 0."""
    assert [train.lr_factor(it, config("--warmup_start=0.2")) for it in (0, 5, 10)] == pytest.approx([0.2, 0.6, 1.0])
    short = config("--lr_decay_iters=60")  # the cosine over steps 10 to 60
    assert [train.lr_factor(it, short) for it in (35, 60, 100)] == pytest.approx([0.55, 0.1, 0.1])
    assert {train.lr_factor(it, config("--decay_lr=false")) for it in (0, 10, 60, 500)} == {1.0}
    no_warmup = config("--warmup_iters=0", "--max_iters=100")
    assert [train.lr_factor(it, no_warmup) for it in (0, 50, 100)] == pytest.approx([1.0, 0.55, 0.1])


def test_a_run_logs_and_steps_with_the_scheduled_learning_rate(data_dir, tmp_path):
    """A real 12-step run with a warm-up of 4 and the cosine over steps 4 to 12: each record's lr is that of the step
    just taken, and the optimiser's groups (in the checkpoint) hold the last step's, scaled from each group's own."""
    out = tmp_path / "run"
    train.main(["--data_dir", data_dir, "--out_dir", str(out), "--max_iters=12", "--warmup_iters=4",
                "--learning_rate=1e-3", "--min_lr=1e-4", "--log_interval=1", "--eval_interval=12", "--n_layer=1",
                "--n_head=2", "--n_kv_head=1", "--n_embd=16", "--ffn_hidden=32", "--block_size=16", "--batch_size=2",
                "--eval_iters=1", "--device=cpu"])
    # step s (0-indexed) of 12: s / 4 in the warm-up, then 0.1 + 0.45 (1 + cos(pi (s - 4) / 8))
    by_hand = [0.0, 0.25, 0.5, 0.75] + [0.1 + 0.45 * (1 + math.cos(math.pi * k / 8)) for k in range(8)]
    logged = [r["lr"] for r in map(json.loads, open(out / "log.jsonl")) if "lr" in r]
    assert logged == pytest.approx([1e-3 * f for f in by_hand], rel=1e-9)
    groups = torch.load(out / "ckpt.pt", weights_only=True)["optimizer"]["param_groups"]
    assert [g["lr"] for g in groups] == pytest.approx([g["base_lr"] * by_hand[-1] for g in groups], rel=1e-9)
