"""eval.py's analyses end to end on tiny runs: depth map, logit lens over two checkpoints, multiple choice."""
import json
import os
import subprocess
import sys

import pytest
import torch

import eval as evaluate
from conftest import ROOT

TINY = ["--n_layer=3", "--n_head=2", "--n_kv_head=1", "--n_embd=32", "--ffn_hidden=64", "--block_size=64",
        "--batch_size=8", "--eval_iters=2", "--device=cpu", "--eval_interval=100"]


def run(script, *args):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("analyses")
    out = {}
    for name in ("vanilla", "vertical"):
        out[name] = str(base / name)
        run("train.py", "--model", name, "--data_dir", data_dir, "--out_dir", out[name], "--max_iters=60", *TINY)
    return out


def test_depth_map_rows_sum_to_one(runs):
    result = json.loads(run("eval.py", "--out_dir", runs["vertical"], "--loss=false", "--depth_map", "--json",
                            "--plot=false"))
    m = torch.tensor(result["depth_map"])
    assert m.shape == (3, 3) and torch.allclose(m.sum(-1), torch.ones(3), atol=1e-5)
    assert torch.equal(m.triu(1), torch.zeros(3, 3))  # a layer reads no later source
    table = run("eval.py", "--out_dir", runs["vertical"], "--loss=false", "--depth_map", "--plot=false")
    assert f"{m[1, 0].item():.2f}" in table


def test_logit_lens_of_two_checkpoints(runs, tmp_path):
    out = run("eval.py", "--out_dir", runs["vanilla"], runs["vertical"], "--logit_lens", "--tokens=500", "--json",
              f"--plot_path={tmp_path / 'lens.png'}")
    results = [json.loads(line) for line in out.strip().splitlines()]
    assert [r["model"] for r in results] == ["vanilla", "vertical"]
    for r in results:
        assert len(r["logit_lens"]) == 3 and r["tokens"] == 500
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "lens.png").stat().st_size > 0


def test_multiple_choice_picks_the_likely_continuation(runs, tmp_path):
    # a trained model knows that a speaker's name is followed by a colon and a new line, not by noise
    speakers = ["ROMEO", "JULIET", "HAMLET", "OTHELLO", "MACBETH", "PORTIA"]
    items = [{"context": f"{s}", "choices": ["zq#xj!k%", ":\nI"], "label": 1} for s in speakers]
    items += [{"context": f"{s}:\nWhat", "choices": [" is", "#%q&z~"], "label": 0} for s in speakers]
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(json.dumps(i) for i in items))
    result = json.loads(run("eval.py", "--out_dir", runs["vanilla"], "--loss=false", f"--mc={path}", "--k_shot=2",
                            "--json"))
    assert result["mc"]["questions"] == 12 and result["mc"]["acc"] == 1.0 and result["mc"]["chance"] == 0.5


def test_mc_formats_are_normalised():
    assert evaluate.normalise_mc({"context": "a", "choices": ["b", "c"], "label": 1}) == ("a", ["b", "c"], 1)
    hs = evaluate.normalise_mc({"ctx": "He runs", "endings": ["fast.", "slow."], "label": "0"})
    assert hs[1:] == (["fast.", "slow."], 0) and "He runs" in hs[0]
    arc = evaluate.normalise_mc({"question": "Sky?", "choices": {"text": ["blue", "red"], "label": ["A", "B"]},
                                 "answerKey": "B"})
    assert arc == ("Question: Sky?\nAnswer:", ["blue", "red"], 1)
    piqa = evaluate.normalise_mc({"goal": "Open a jar", "sol1": "twist", "sol2": "lick", "label": 0})
    assert piqa[1:] == (["twist", "lick"], 0)
    with pytest.raises(ValueError):
        evaluate.normalise_mc({"context": "a", "choices": ["b", "c"], "label": 2})


def test_lm_eval_missing_is_one_line(runs):
    try:
        import lm_eval  # noqa: F401
        pytest.skip("lm_eval is installed: the adapter path applies instead")
    except ImportError:
        pass
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--out_dir", runs["vanilla"],
                           "--lm_eval=hellaswag"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0 and "pip install lm-eval" in proc.stderr
