"""eval.py's analyses end to end on tiny runs: depth map, logit lens over several checkpoints, few-shot multiple
choice; the lm-evaluation-harness adapter against the real package is tests/test_lm_eval.py."""
import importlib
import importlib.util
import json
import os
from contextlib import nullcontext

import numpy as np
import pytest
import torch

import train
from conftest import ROOT, model_names
from test_scripts import TINY, one_line_error

from analysis import depth_map
from analysis import scoring
evalpy = importlib.import_module("eval")
HAS_VERTICAL = os.path.exists(os.path.join(ROOT, "model_vertical.py"))
# a higher learning rate without warm-up, so that 20 steps learn which bytes English text uses
FAST = ["--max_iters=20", "--eval_interval=20", "--warmup_iters=0", "--learning_rate=1e-2"]


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    """{model name: run folder} for a tiny vanilla run and, where model_vertical.py exists, a tiny vertical one."""
    root = tmp_path_factory.mktemp("eval_runs")
    out = {}
    for name in ["vanilla"] + (["vertical"] if HAS_VERTICAL else []):
        out[name] = str(root / name)
        train.main(["--model", name, "--data_dir", data_dir, "--out_dir", out[name], *FAST, *TINY])
    return out


def needs_vertical(runs):
    if "vertical" not in runs:
        pytest.skip("model_vertical.py is not there")
    return runs["vertical"]


def test_depth_map_rows_sum_to_one(runs, script):
    out_dir = needs_vertical(runs)
    code, out, err = script("eval.py", "--out_dir", out_dir, "--depth_map", "--loss=false", "--json")
    assert code == 0, err
    m = torch.tensor(json.loads(out)["depth_map"])
    assert m.shape == (2, 2) and torch.isfinite(m).all()
    assert torch.allclose(m.sum(-1), torch.ones(2), atol=1e-5)
    assert m[0, 1] == 0  # layer 1 has one source


def test_depth_map_of_a_model_without_one(runs, script):
    one_line_error(script("eval.py", "--out_dir", runs["vanilla"], "--depth_map"), "model_vanilla.py", "depth_map()")


@pytest.mark.parametrize("name", [n for n in model_names() if n != "vanilla"])
def test_depth_map_table_of_every_model_file(name):
    """The map read after a forward (input-dependent maps need one) prints as one line per row."""
    try:
        module = importlib.import_module(f"model_{name}")
    except Exception as e:  # a model file in the making
        pytest.skip(f"model_{name}.py does not import: {e}")
    if not hasattr(module.GPT, "depth_map"):
        pytest.skip(f"model_{name}.py has no depth_map()")
    torch.manual_seed(0)
    config = module.GPTConfig(vocab_size=257, block_size=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=32,
                              ffn_hidden=64)
    model = module.GPT(config).eval()
    data = np.random.default_rng(0).integers(0, 256, 100).astype(np.uint16)
    m = depth_map.read_depth_map(model, name, data, 16, 2, "cpu", nullcontext())
    assert m.dim() == 2 and torch.isfinite(m).all() and (m >= 0).all()
    assert (m <= (2 if name == "mhc" else 1) + 1e-5).all()  # weights; mHC's post, 2 sigmoid(...), up to 2
    lines = depth_map.format_depth_map(m, config.n_layer)
    assert len(lines) == m.size(0) + 1
    printed = [[float(v) for v in line.split("|")[1].split()] for line in lines[1:]]
    assert np.allclose(printed, m.numpy(), atol=0.005)
    if name == "vertical":
        assert np.allclose(np.sum(printed, axis=1), 1, atol=0.02)


def test_logit_lens_of_two_checkpoints(runs, tmp_path, script):
    dirs = list(runs.values()) if len(runs) > 1 else [runs["vanilla"], runs["vanilla"]]
    png = tmp_path / "lens.png"
    code, out, err = script("eval.py", "--out_dir", *dirs, "--logit_lens", "--tokens=200", "--json", "--plot_path", png)
    assert code == 0, err
    results = [json.loads(line) for line in out.splitlines()]
    assert [r["out_dir"] for r in results] == dirs
    for r in results:
        assert r["tokens"] == 200 and [row["layer"] for row in r["logit_lens"]] == [1, 2]
        assert all(np.isfinite(row["loss"]) and 0 < row["p_correct"] < 1 for row in r["logit_lens"])
    if importlib.util.find_spec("matplotlib"):
        assert png.stat().st_size > 0
    else:
        assert not png.exists() and "pip install matplotlib" in err


def test_mc_normalises_every_format():
    own = {"context": "ROMEO:\nO", "choices": ["Romeo", "zq#xj"], "label": 0}
    assert scoring.normalise_mc(own) == ("ROMEO:\nO", ["Romeo", "zq#xj"], 0)
    hellaswag = {"activity_label": "Baking cookies", "ctx_a": "A woman puts dough on a tray.", "ctx_b": "she",
                 "ctx": "A woman puts dough on a tray. she", "endings": ["bakes it.", "eats [header] the tray."],
                 "label": "0"}
    assert scoring.normalise_mc(hellaswag) == ("Baking cookies: A woman puts dough on a tray. She",
                                              ["bakes it.", "eats the tray."], 0)
    arc = {"question": "Which is a gas?", "choices": {"text": ["ice", "steam", "rock"], "label": ["A", "B", "C"]},
           "answerKey": "B"}
    assert scoring.normalise_mc(arc) == ("Question: Which is a gas?\nAnswer:", ["ice", "steam", "rock"], 1)
    arc_original = {"question": {"stem": "Which is a gas?", "choices": [{"text": "ice", "label": "1"},
                                                                       {"text": "steam", "label": "2"}]},
                    "answerKey": "2"}
    assert scoring.normalise_mc(arc_original) == ("Question: Which is a gas?\nAnswer:", ["ice", "steam"], 1)
    piqa = {"goal": "Open a jar", "sol1": "twist the lid", "sol2": "eat the lid", "label": 0}
    assert scoring.normalise_mc(piqa) == ("Question: Open a jar\nAnswer:", ["twist the lid", "eat the lid"], 0)
    for bad in ({"text": "no format"}, {**own, "label": 2}, {**own, "choices": ["one"]}):
        with pytest.raises(ValueError):
            scoring.normalise_mc(bad)


def shakespeare_mc(path):
    """Questions whose right continuation is Shakespeare and whose wrong ones are as long but rare bytes."""
    speeches = [("ROMEO:\nO", "Romeo, wherefore art thou"), ("JULIET:\nO", "that I were a glove upon"),
                ("HAMLET:\nTo be, or not", "to be: that is the question"), ("LEAR:\nBlow, winds, and",
                "crack your cheeks! rage!"), ("MACBETH:\nIs this a dagger", "which I see before me"),
                ("PORTIA:\nThe quality of mercy", "is not strain'd, it droppeth")]
    junk = "zq#xj!{~^|@QXZ" * 4
    with open(path, "w") as f:
        for i, (context, right) in enumerate(speeches):
            choices = [junk[k:k + len(right)] for k in (0, 5, 9)]
            choices.insert(i % 4, right)
            f.write(json.dumps({"context": context, "choices": choices, "label": i % 4}) + "\n")


def test_mc_picks_the_likely_continuation(runs, tmp_path, script):
    shakespeare_mc(tmp_path / "mc.jsonl")  # 4 shots make the prompt longer than block_size 32: cropped
    code, out, err = script("eval.py", "--out_dir", runs["vanilla"], "--loss=false", "--mc", tmp_path / "mc.jsonl",
                         "--json")
    assert code == 0, err
    mc = json.loads(out)["mc"]
    assert mc["questions"] == 6 and mc["k_shot"] == 4 and mc["chance"] == 0.25
    assert mc["acc"] == 1.0 and mc["acc_norm"] == 1.0


def test_mc_bad_file(runs, tmp_path, script):
    (tmp_path / "bad.jsonl").write_text('{"context": "a", "choices": ["b", "c"], "label": 0}\n{"ctx": "a"}\n')
    one_line_error(script("eval.py", "--out_dir", runs["vanilla"], "--mc", tmp_path / "bad.jsonl"), "line 2")


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is not None, reason="lm_eval is installed")
def test_lm_eval_missing(runs, script):
    one_line_error(script("eval.py", "--out_dir", runs["vanilla"], "--lm_eval", "hellaswag"), "pip install lm-eval")


def test_rolling_windows_score_every_token_once():
    ids = list(range(100, 170))
    for block_size in (8, 32, 100):
        pairs = scoring.rolling_pairs(ids, 256, block_size)
        assert sum((k for _, k in pairs), []) == ids
        assert all(c and len(c) + len(k) <= block_size + 1 for c, k in pairs)


def test_skipmiddle_loss_with_skipping_on_the_console_and_in_json(tiny_data, tmp_path, script, monkeypatch):
    """docs/skipmiddle.md: eval.py reports a skip-middle run's loss with the skipped blocks really skipped. With
    every gate open it is the dense loss; with blocks 1 and 2 closed (common.close_gates) those blocks never run
    in the skipping pass, and the loss is the closed model's, not the open one's."""
    import model_skipmiddle
    from common import close_gates
    run = tmp_path / "run"
    train.main(["--model", "skipmiddle", "--data_dir", str(tiny_data), "--out_dir", str(run), "--max_iters=2",
                "--eval_interval=2", *TINY, "--n_layer=4"])
    ckpt = torch.load(run / "ckpt.pt", map_location="cpu", weights_only=False)
    model = model_skipmiddle.GPT(model_skipmiddle.GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    folders = {}
    for name, first in (("open", None), ("closed", 1)):
        if first is None:
            with torch.no_grad():
                for gate in model.gates:  # zero gate parameters: every gate exactly 1
                    gate.weight.zero_()
                    gate.bias.zero_()
        else:
            close_gates(model, first)  # blocks 1 and 2 closed for every token
        folders[name] = tmp_path / name
        folders[name].mkdir()
        torch.save({**ckpt, "model": model.state_dict()}, folders[name] / "ckpt.pt")
    calls = []  # the blocks the passes run, in order
    monkeypatch.setattr(model_skipmiddle.Block, "__call__",
                        lambda self, *a, **k: calls.append(self.attn.layer_idx) or torch.nn.Module.__call__(self, *a, **k))
    results, printed, ran = {}, {}, {}
    for name, folder in folders.items():
        code, out, err = script("eval.py", "--out_dir", folder, "--json")
        assert code == 0, err
        results[name] = json.loads(out)
        calls.clear()
        code, out, err = script("eval.py", "--out_dir", folder)
        assert code == 0, err
        ran[name] = list(calls)
        printed[name] = [float(out.split(word)[1].split()[0]) for word in ("| loss ", "loss with skipping ")]
        assert printed[name] == pytest.approx([results[name]["loss"], results[name]["loss_skip"]], abs=1e-4)
    assert results["open"]["loss_skip"] == pytest.approx(results["open"]["loss"], abs=1e-5)
    assert printed["open"][0] == printed["open"][1]
    closed = results["closed"]
    assert abs(closed["loss_skip"] - results["open"]["loss_skip"]) > 1e-3
    assert closed["loss_skip"] == pytest.approx(closed["loss"], abs=1e-4)  # a 0 gate skips what it multiplies by 0
    batches = 2  # 10 windows of 32 tokens in 300, 8 a batch: the dense pass runs every block, the skipping one 0 and 3
    stats = [0, 1, 2, 3]  # then stats(), which measures the gates with a dense forward of the first windows
    assert ran["open"] == [0, 1, 2, 3] * batches * 2 + stats
    assert ran["closed"] == [0, 1, 2, 3] * batches + [0, 3] * batches + stats
