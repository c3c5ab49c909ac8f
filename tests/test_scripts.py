"""The scripts end to end on the offline data set, and every bad input ending in one clear line."""
import json
import os
import subprocess
import sys

import pytest
import torch

import train
from conftest import ROOT

TINY = ["--n_layer=2", "--n_head=2", "--n_kv_head=1", "--n_embd=32", "--ffn_hidden=64", "--block_size=32",
        "--batch_size=4", "--eval_iters=2", "--device=cpu"]


def one_line_error(proc, *words):
    code, _, err = proc
    lines = [l for l in err.splitlines() if l.startswith("error: ")]  # (a training run's progress bar aside)
    assert code != 0 and len(lines) == 1 and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def run_dir(data_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("run") / "vanilla")
    train.main(["--data_dir", data_dir, "--out_dir", out, "--max_iters=20", "--eval_interval=10", *TINY])
    return out


def test_train_writes_checkpoint_and_log(run_dir):
    ckpt = torch.load(os.path.join(run_dir, "ckpt.pt"), weights_only=False)
    assert ckpt["model_name"] == "vanilla" and ckpt["iter_num"] == 20
    assert ckpt["meta"]["tokenizer"] == "byte" and ckpt["model_args"]["vocab_size"] == ckpt["meta"]["vocab_size"]
    records = [json.loads(l) for l in open(os.path.join(run_dir, "log.jsonl"))]
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(vals) == 3 and vals[-1] < vals[0]


def test_sample_generates_text(run_dir, script):
    code, out, err = script("sample.py", "--out_dir", run_dir, "--start", "ROMEO:", "--num_samples=2",
                         "--max_new_tokens=50", "--top_p=0.9", "--temperature=0.7")
    assert code == 0, err
    samples = out.split("---------------")
    assert len(samples) == 3 and all(s.strip().startswith("ROMEO:") for s in samples[:2])


def test_sample_prompt_from_file(run_dir, tmp_path, script):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("JULIET:\n")
    code, out, err = script("sample.py", "--out_dir", run_dir, f"--start=FILE:{prompt}", "--num_samples=1",
                         "--max_new_tokens=5", "--temperature=0")
    assert code == 0 and out.startswith("JULIET:\n"), err


def test_sample_prompt_longer_than_the_context_continues_from_its_end(run_dir, script):
    """block_size is 32: a 50-token prompt is read from its last 32 tokens, as generation does past the context."""
    long = "ROMEO: But soft, what light through yonder window breaks"  # 56 bytes: 56 tokens
    code, out, err = script("sample.py", "--out_dir", run_dir, "--start", long, "--num_samples=1",
                         "--max_new_tokens=8", "--temperature=0")
    assert code == 0 and out.startswith(long) and "continues from the last 32" in err, err
    _, cut, _ = script("sample.py", "--out_dir", run_dir, "--start", long[-32:], "--num_samples=1",
                    "--max_new_tokens=8", "--temperature=0")
    assert out[len(long):] == cut[32:]  # the same continuation: the model saw the same 32 tokens


@pytest.mark.slow  # compiles in a new process
def test_sample_compile_compiles_the_decode_step(run_dir, script):
    """--compile: the same greedy text as eager (past the context of 32 tokens, where the window restarts), and
    the compile time reported once; dynamo compiles exactly one graph (TORCH_LOGS prints each graph it compiles)
    for the 2 x 39 decode steps."""
    greedy = ["--out_dir", run_dir, "--start", "ROMEO:", "--num_samples=2", "--max_new_tokens=40", "--temperature=0"]
    code, eager, err = script("sample.py", *greedy)
    assert code == 0, err
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), *greedy, "--compile"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TORCH_LOGS": "graph_code", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == eager
    assert proc.stderr.count("# decode step compiled in") == 1
    assert proc.stderr.count("===== __compiled_fn") == 1, proc.stderr


def test_eval_whole_split_and_logit_lens(run_dir, data_dir, script):
    code, out, err = script("eval.py", "--out_dir", run_dir, "--logit_lens", "--json")
    assert code == 0, err
    result = json.loads(out)
    meta = json.load(open(os.path.join(data_dir, "shakespeare", "meta.json")))
    assert result["tokens"] == meta["val_tokens"] - 1  # every token but the first is predicted once
    assert abs(result["perplexity"] - torch.tensor(result["loss"]).exp().item()) < 1e-3
    lens = result["logit_lens"]
    assert [r["layer"] for r in lens] == [1, 2]
    assert abs(lens[-1]["loss"] - result["loss"]) < 1e-4  # vanilla's head reads the last layer
    assert all(0 < r["p_correct"] < 1 for r in lens)
    code, out, _ = script("eval.py", "--out_dir", run_dir, "--tokens=100", "--json")
    assert code == 0 and json.loads(out)["tokens"] == 100


# ---- bad input: one line naming the fix, non-zero exit, nothing saved lost ---------------------------------

def test_unknown_model(script):
    one_line_error(script("train.py", "--model", "nope"), "unknown --model", "vanilla")


def test_unknown_option_and_wrong_type(script):
    one_line_error(script("train.py", "--no_such_option=1"), "unrecognized", "--no_such_option")
    one_line_error(script("train.py", "--max_iters", "ten"), "--max_iters", "invalid int")
    one_line_error(script("sample.py", "--num_samples", "x"), "--num_samples")


def test_model_options_follow_the_model(data_dir, script):
    code, out, _ = script("train.py", "--model", "vanilla", "--help")
    assert code == 0 and "--n_layer" in out and "--max_iters" in out and "(default: 1000)" in out
    code, out, _ = script("train.py", "--model", "vertical", "--data_dir", data_dir, "--help")  # the data's vocabulary
    assert code == 0 and "--va_lr" in out and "--vocab_size" in out
    vocab = " ".join(out.split("--vocab_size INT")[1].split("--block_size")[0].split())
    assert "(default: 257)" in vocab, vocab


def test_missing_data(tmp_path, script):
    one_line_error(script("train.py", "--data_dir", tmp_path, "--out_dir", tmp_path / "o"), "prepare.py")


def test_existing_run_is_not_overwritten(run_dir, data_dir, script):
    before = os.path.getmtime(os.path.join(run_dir, "ckpt.pt"))
    one_line_error(script("train.py", "--data_dir", data_dir, "--out_dir", run_dir, *TINY), "--resume")
    assert os.path.getmtime(os.path.join(run_dir, "ckpt.pt")) == before


def test_resume_with_another_model(run_dir, data_dir, script):
    one_line_error(script("train.py", "--model", "vertical", "--resume", "--data_dir", data_dir, "--out_dir", run_dir),
                   "--model vanilla")


def test_checkpoint_that_does_not_fit_its_model_file(run_dir, tmp_path, script):
    ckpt = torch.load(os.path.join(run_dir, "ckpt.pt"), weights_only=False)
    ckpt["model_args"]["n_layer"] = 3  # as if model_vanilla.py had built a different network
    torch.save(ckpt, tmp_path / "ckpt.pt")
    one_line_error(script("sample.py", "--out_dir", tmp_path), "does not fit model_vanilla.py")
    one_line_error(script("eval.py", "--out_dir", tmp_path), "does not fit model_vanilla.py")
    one_line_error(script("sample.py", "--out_dir", tmp_path / "nothing"), "ckpt.pt does not exist", "train one with")


def test_empty_prompt(run_dir, script):
    """(A prompt longer than the context is read from its end: test_sample_prompt_longer_than_the_context_...)"""
    one_line_error(script("sample.py", "--out_dir", run_dir, "--start="), "empty")


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(data_dir, tmp_path, script):
    out = tmp_path / "nan"
    args = ["--data_dir", data_dir, "--out_dir", out, "--eval_interval=2", "--decay_lr=false", *TINY]
    assert script("train.py", *args, "--max_iters=2")[0] == 0
    good = torch.load(out / "ckpt.pt", weights_only=False)
    line = one_line_error(script("train.py", *args, "--max_iters=40", "--resume", "--learning_rate=1e30",
                              "--grad_clip=0"), "loss", "checkpoint")
    kept = torch.load(out / "ckpt.pt", weights_only=False)
    assert kept["iter_num"] == good["iter_num"] == 2, line
    assert all(torch.equal(good["model"][k], kept["model"][k]) for k in good["model"])


# ---- DDP: resume with dropout, the README's torchrun command ---------------------------------------------------

def torchrun(*args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "train.py"), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow  # three torchrun runs of two processes
def test_ddp_resume_with_dropout_equals_uninterrupted(data_dir, tmp_path):
    """Two processes (gloo), dropout on, and no --gradient_accumulation_steps (one micro-step per process, as in
    the README's command): stopped at step 2 and resumed, the run equals the uninterrupted one, because every rank
    gets its own random state back; the resumed log holds every step once, and a stale ckpt.pt.tmp is gone."""
    full, part = tmp_path / "full", tmp_path / "part"
    opts = ["--data_dir", data_dir, *TINY, "--dropout=0.2", "--log_interval=1", "--eval_interval=2",
            "--warmup_iters=1", "--lr_decay_iters=4"]
    torchrun(*opts, "--out_dir", full, "--max_iters=4")
    torchrun(*opts, "--out_dir", part, "--max_iters=2")
    (part / "ckpt.pt.tmp").write_bytes(b"left by a run killed while saving")
    torchrun(*opts, "--out_dir", part, "--max_iters=4", "--resume")
    a, b = ([json.loads(l) for l in open(d / "log.jsonl")] for d in (full, part))
    assert [(r["iter"], "val_loss" in r) for r in b] == [(r["iter"], "val_loss" in r) for r in a]
    assert [r.get("loss", r.get("val_loss")) for r in b] == [r.get("loss", r.get("val_loss")) for r in a], (a, b)
    sa, sb = (torch.load(d / "ckpt.pt", weights_only=False) for d in (full, part))
    assert sa["run"]["gradient_accumulation_steps"] == 2 and len(sa["rng"]["torch"]) == 2
    assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])
    assert not (part / "ckpt.pt.tmp").exists()
