"""Every declared option of every script and model file, fed nan, inf, -1, 0, a huge value and a wrong type:
the run either succeeds, or ends in exactly one `error:` line that names the option, with a non-zero exit, no
traceback, and no file created or changed (by checksum). The options are read from the dataclasses the scripts
and model files declare them in, so a new option is covered the day it is added."""
import dataclasses
import os

import numpy as np
import pytest

from tools import bench
import eval as evalpy
from hf import export
import prepare
import sample
from tools import sweep
import train
from plumbing.config import load_model_module, model_names
from conftest import run_script, write_data_set
from test_errors import checksums

PROBES = {int: ["nan", "inf", "-1", "0", str(10**30), "abc"], float: ["nan", "inf", "-1", "0", "1e300", "abc"],
          bool: ["nan", "inf", "-1", "0", str(10**30), "abc"], str: ["nan", "inf", "-1", "0", "1e300", "x" * 300],
          tuple: ["nan", "inf", "-1", "0", "1e300", "abc"]}
TINY = ["--n_layer=1", "--n_head=2", "--n_kv_head=1", "--n_embd=16", "--ffn_hidden=32", "--block_size=8",
        "--batch_size=2", "--eval_iters=1", "--max_iters=1", "--eval_interval=1", "--log_interval=1", "--device=cpu"]


def cases():
    """(script, the option, its type, arguments every probe of it starts from)."""
    out = []
    for f in dataclasses.fields(train.TrainConfig):
        out.append(("train.py", f.name, f.type, ["--data_dir={data}", "--out_dir=run", *TINY]))
    for name in model_names():
        fields = dataclasses.fields(load_model_module(name).GPTConfig)
        shared = {f.name for f in dataclasses.fields(load_model_module("vanilla").GPTConfig)}
        for f in fields:
            if name == "vanilla" or f.name not in shared:  # the shared fields once, through vanilla
                out.append(("train.py", f.name, f.type, [f"--model={name}", "--data_dir={data}", "--out_dir=run",
                                                         *TINY, "--n_layer=2"]))  # attnres: 4 blocks need 2
    for f in dataclasses.fields(sample.SampleConfig):
        out.append(("sample.py", f.name, f.type, ["--out_dir={run}", "--num_samples=1", "--max_new_tokens=2",
                                                  "--device=cpu"]))
    for f in dataclasses.fields(evalpy.EvalConfig):
        out.append(("eval.py", f.name, f.type, ["--out_dir={run}", "--tokens=20", "--device=cpu"]))
    for f in dataclasses.fields(bench.BenchConfig):
        out.append(("tools/bench.py", f.name, f.type, ["--size=small", "--runs=vanilla", "--block_size=8", "--batch_size=1",
                                                 "--warmup=0", "--iters=1", "--repeats=1", "--sample_tokens=1",
                                                 "--vocab_size=64", "--device=cpu"]))
    for f in dataclasses.fields(sweep.SweepConfig):
        out.append(("tools/sweep.py", f.name, f.type, ["--table_only", "--data_dir={data}", "--results=res", "--reuse=",
                                                 "--runs_dir=runs", "--runs=vanilla", "--n_layer=1", "--block_size=8",
                                                 "--batch_size=1", "--train_iters=1", "--eval_points=1", "--seeds=1",
                                                 "--train_args=--eval_iters=1", "--device=cpu"]))
    for f in dataclasses.fields(export.ExportConfig):
        out.append(("hf/export.py", f.name, f.type, ["--out_dir={run}", "--to=exported"]))
    for f in dataclasses.fields(prepare.PrepareConfig):
        out.append(("prepare.py", f.name, f.type, ["--files={text}", "--num_proc=1", "--out_dir=data"]))
    return out


CASES = cases()
# where lm-eval is installed, each probe of --lm_eval indexes its 15,000 task files (about 7 s): the slow tier's
SLOW = {("eval.py", "lm_eval")}


@pytest.fixture(scope="module")
def world(data_dir, tmp_path_factory):
    """A small data set, a one-step run to sample and evaluate, and a text file to prepare."""
    root = tmp_path_factory.mktemp("options")
    write_data_set(root / "data" / "shakespeare",
                   np.fromfile(os.path.join(data_dir, "shakespeare", "train.bin"), np.uint16))
    train.main(["--data_dir", str(root / "data"), "--out_dir", str(root / "run"), *TINY])
    (root / "text.txt").write_text("To be, or not to be, that is the question.\n" * 20)
    return root


@pytest.mark.parametrize("script,name,kind,base", [
    pytest.param(*c, marks=pytest.mark.slow) if c[:2] in SLOW else c for c in CASES],
    ids=[f"{c[0][:-3]}-{c[1]}" + (f"-{c[3][0][8:]}" if c[3][0].startswith("--model=") else "") for c in CASES])
def test_every_option_takes_any_value_safely(script, name, kind, base, world, tmp_path, monkeypatch, capsys):
    places = {"data": world / "data", "run": world / "run", "text": world / "text.txt"}
    base = [a.format(**places) for a in base]
    outcomes = []
    for i, value in enumerate(PROBES[kind]):
        cwd = tmp_path / str(i)  # relative paths (out_dir=run, json=nan, ...) land here
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        before = checksums(world, cwd)
        code, _, err = run_script(script, [*base, f"--{name}={value}"], capsys)
        lines = [l for l in err.splitlines() if l.startswith("error: ")]
        assert "Traceback" not in err, (value, err[-3000:])
        if code in (0, None):
            assert not lines, (value, err)
            outcomes.append("ok")
            continue
        assert len(lines) == 1 and f"--{name}" in lines[0], (value, err[-2000:])
        assert checksums(world, cwd) == before, (value, lines[0])
        outcomes.append("refused")
    assert "refused" in outcomes or kind is str, outcomes  # every typed option refuses something


EXACT = [  # (script, arguments, what the one line must say): no prefix of an option is taken for it
    ("train.py", ["--max_iter", "10"], "--max_iter 10 (did you mean --max_iters?); see train.py --help"),
    ("train.py", ["--n_layers", "4"], "did you mean --n_layer?"),
    ("train.py", ["--model", "vanilla", "--va_lr", "0.1"], "--va_lr is an option of model_vertical.py"),
    ("train.py", ["--model", "vertical", "--skip_heads", "2"], "--skip_heads is an option of model_skiplayer.py"),
    ("train.py", ["{preset}"], "(did you mean --n_layer?) (--va_lr is an option of model_vertical.py"),
    ("sample.py", ["--out_dri", "x"], "did you mean --out_dir?"),
    ("tools/kernels.py", ["--n_lay", "2"], "(did you mean --n_layer?); see python -m tools.kernels --help"),
]


@pytest.mark.parametrize("script,args,says", EXACT, ids=[f"{s}{' '.join(a)}" for s, a, _ in EXACT])
def test_options_are_exact_and_a_wrong_one_names_the_right_one(script, args, says, tmp_path, capsys):
    preset = tmp_path / "preset.py"
    preset.write_text("n_layers = 4\nva_lr = 0.1\n")  # as on the command line, with the default model (vanilla)
    code, out, err = run_script(script, [str(preset) if a == "{preset}" else a for a in args], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1 and err.startswith("error:") and says in err, err
