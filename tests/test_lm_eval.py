"""eval.py's lm-evaluation-harness adapter against the real package (pip install -r requirements-eval.txt), on the
tasks in tests/lm_eval_tasks: multiple choice over the questions eval.py --mc reads too, and loglikelihood_rolling
over documents whose loss eval.py computes too. The tasks read local files: nothing is downloaded."""
import importlib
import importlib.util
import json
import math
import os
from contextlib import nullcontext

import numpy as np
import pytest
import torch

import train
from conftest import ROOT, run_script
from test_errors import assert_one_error_line
from test_scripts import TINY

pytestmark = [pytest.mark.extras, pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None,
    reason="lm-evaluation-harness is not installed: pip install -r requirements-eval.txt")]
from analysis import scoring
from common import model_from_checkpoint
from common import get_tokenizer
evalpy = importlib.import_module("eval")
TASKS = os.path.join(ROOT, "tests", "lm_eval_tasks")
# no Hugging Face hub, and a proxy that refuses whatever else would go out
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}


@pytest.fixture(scope="module")
def run_dir(data_dir, tmp_path_factory):
    """A tiny vanilla model trained for 100 steps on Shakespeare's bytes (validation loss about 2.6 per byte)."""
    out, threads = str(tmp_path_factory.mktemp("lm_eval") / "run"), torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small runs faster on one thread than on several fighting over it
    try:
        train.main(["--data_dir", data_dir, "--out_dir", out, *TINY, "--batch_size=16", "--max_iters=100",
                    "--eval_interval=100", "--warmup_iters=0", "--learning_rate=1e-2"])
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture
def adapter(run_dir, monkeypatch):
    for k, v in OFFLINE.items():
        monkeypatch.setenv(k, v)
    model, _, ckpt = model_from_checkpoint(run_dir)
    model.eval()
    encode, _, _, eot = get_tokenizer(ckpt["meta"]["tokenizer"])
    T, threads = ckpt["model_args"]["block_size"], torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield scoring.make_lm_eval_adapter(model, encode, eot, T, 4, "cpu", nullcontext()), model, encode, eot, T
    finally:
        torch.set_num_threads(threads)


def test_simple_evaluate_agrees_with_eval_py(run_dir, monkeypatch, capsys):
    """eval.py --lm_eval on both task files (lm_eval.simple_evaluate with a TaskManager over their folder) and
    eval.py's own scorers on the same items, in one run:
    - multiple choice, 0-shot, against --mc on the same jsonl: the same acc and acc_norm. A third of the
      questions have a one-character wrong choice, where normalising by the length of the choice (lm-eval) and
      by the length of the continuation with its leading space part ways;
    - loglikelihood_rolling against eval.py's loss over [end-of-text] + each document (their lengths are
      multiples of the context, so that eval.py's consecutive windows are lm-eval's rolling windows):
      bits_per_byte is that loss over every document, in bits (the tokenizer's tokens are bytes)."""
    for k, v in OFFLINE.items():
        monkeypatch.setenv(k, v)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small runs faster on one thread than on several fighting over it
    try:
        evalpy.main(["--out_dir", run_dir, "--loss=false", "--k_shot=0", "--device=cpu", "--json",
                     "--mc", os.path.join(TASKS, "shakespeare_mc.jsonl"), "--lm_eval",
                     ",".join(os.path.join(TASKS, f) for f in ("shakespeare_mc.yaml", "shakespeare_rolling.yaml"))])
        result = json.loads(capsys.readouterr().out)  # stdout holds the JSON line only
        mc, harness = result["mc"], result["lm_eval"]["shakespeare_mc"]
        assert mc["questions"] == harness["sample_len"] == 30
        assert harness["acc,none"] == pytest.approx(mc["acc"], abs=1e-12)
        assert harness["acc_norm,none"] == pytest.approx(mc["acc_norm"], abs=1e-12)
        assert 0 < mc["acc_norm"] < 1 and mc["acc_norm"] != mc["acc"]

        model, _, ckpt = model_from_checkpoint(run_dir)
        encode, _, _, eot = get_tokenizer(ckpt["meta"]["tokenizer"])
        T, nll, n = ckpt["model_args"]["block_size"], 0.0, 0
        with open(os.path.join(TASKS, "shakespeare_text.jsonl"), encoding="utf-8") as f:
            docs = [json.loads(line)["text"] for line in f]
        for doc in docs:
            ids = encode(doc)
            assert len(ids) % T == 0 and len(ids) > T
            loss, _, count = evalpy.evaluate_split(model.eval(), np.array([eot] + ids), T, 4, "cpu", nullcontext(),
                                                   progress=False)
            nll, n = nll + loss[-1].item() * count, n + count
    finally:
        torch.set_num_threads(threads)
    rolling = result["lm_eval"]["shakespeare_rolling"]
    assert rolling["sample_len"] == len(docs) == 3 and n == sum(len(d.encode()) for d in docs)
    assert rolling["bits_per_byte,none"] * math.log(2) == pytest.approx(nll / n, rel=1e-6)
    assert rolling["byte_perplexity,none"] == pytest.approx(math.exp(nll / n), rel=1e-6)


def test_rolling_windows_are_lm_evals():
    """Every (context, continuation) window of the adapter is lm-eval's own, for any length and context."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    for n in (1, 2, 31, 32, 33, 64, 100):
        ids = list(range(100, 100 + n))
        for block_size in (1, 8, 32, 100):
            theirs = [make_disjoint_window(w) for w in get_rolling_token_windows(ids, 256, block_size, 1)]
            assert scoring.rolling_pairs(ids, 256, block_size) == [(list(c), list(k)) for c, k in theirs]


def test_loglikelihood_is_a_forward_pass(adapter):
    from lm_eval.api.instance import Instance
    lm, model, encode, eot, _ = adapter

    def token_logprobs(ids):
        ids = torch.tensor(ids)
        with torch.no_grad():
            logp = torch.log_softmax(model(ids[None, :-1])[0][0].float(), -1)
        return logp.gather(-1, ids[1:, None])[:, 0]

    def request(*args):
        return Instance(request_type="loglikelihood", doc={}, arguments=args, idx=0)

    (lp, _), (empty, _) = lm.loglikelihood([request("ROMEO:\n", "O Romeo"), request("", "O Romeo")])
    # the context's trailing newline moves to the continuation: 8 bytes scored; no context: after end-of-text
    assert lp == pytest.approx(token_logprobs(encode("ROMEO:\nO Romeo"))[-8:].sum().item(), abs=1e-4)
    assert empty == pytest.approx(token_logprobs([eot] + encode("O Romeo")).sum().item(), abs=1e-4)
    with pytest.raises(NotImplementedError):
        lm.generate_until([])


def test_a_task_file_that_is_not_there(run_dir, capsys):
    code, _, err = run_script("eval.py", ["--out_dir", run_dir, "--lm_eval", os.path.join(TASKS, "nothing.yaml")],
                              capsys)
    assert_one_error_line(code, err, "no task file")


@pytest.mark.parametrize("text,fragment", [
    ("task: x\n  output_type: [multiple_choice\n", "is not readable YAML line"),  # the parser's error, one line
    ("- a list\n- not a task\n", "holds no task"),
    (b"task: caf\xe9\n", "is not UTF-8 text"),
])
def test_a_bad_task_file_is_one_line_before_any_work(text, fragment, run_dir, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    code, out, err = run_script("eval.py", ["--out_dir", run_dir, "--lm_eval", str(path)], capsys)
    assert_one_error_line(code, err, fragment)
    assert "bad.yaml" in err and out == ""  # before the checkpoint's loss was evaluated


@pytest.mark.parametrize("data", ["missing", "empty file", "empty folder", "missing path"])
def test_a_task_whose_data_set_is_missing_or_empty_is_one_line(data, run_dir, tmp_path, capsys):
    """A task reading a local data set (data_files, or a dataset_path on disk) that is not there, or empty: one line
    naming the task file and the data path, before any work (lm-evaluation-harness would end in a traceback)."""
    where = tmp_path / ("docs.jsonl" if "file" in data or data == "missing" else "docs")
    if data == "empty file":
        where.write_text("")
    elif data == "empty folder":
        where.mkdir()
    key = "dataset_path" if "path" in data or "folder" in data else "dataset_kwargs"
    source = (f"dataset_path: {where}\n" if key == "dataset_path" else
              f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {where}\n")
    task = tmp_path / "local.yaml"
    task.write_text(f"task: local\n{source}test_split: test\noutput_type: multiple_choice\n")
    code, out, err = run_script("eval.py", ["--out_dir", run_dir, "--lm_eval", str(task)], capsys)
    assert_one_error_line(code, err, f"{task} reads its data set from {where}")
    assert out == ""
