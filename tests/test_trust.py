"""What a user is handed is read, never run, and what a script replaces it replaces whole: a checkpoint holding a
pickled callable is refused by every script that reads checkpoints (one reader, torch.load(weights_only=True)); a
data set is swapped in by one rename, also when prepare.py is killed mid-way, and a corpus too small to train on
replaces nothing; a resumed run keeps its learning-rate schedule. (A preset with a function call: test_files.py.)"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import train
from conftest import ROOT, run_script
from test_errors import TINY, assert_one_error_line, checksums, write_data_set

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("trust") / "data"
    write_data_set(out / "shakespeare", np.fromfile(os.path.join(data_dir, "shakespeare", "train.bin"), np.uint16))
    return out


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    """A run of 2 steps, saved at 0 and 2."""
    out = tmp_path_factory.mktemp("trust_run") / "run"
    train.main(["--data_dir", str(data), "--out_dir", str(out), "--max_iters=2", "--eval_interval=2", *TINY])
    return out


class Payload:
    """Unpickled, it would call os.system: a command that leaves a file behind."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# (script, arguments after the run folder's): every script that reads a checkpoint
READERS = [
    ("sample.py", ["--num_samples=1", "--max_new_tokens=2"]),
    ("eval.py", []),
    ("export.py", ["--to", "{tmp}/exported"]),
    ("train.py", ["--resume", "--max_iters=4", "--data_dir", "{data}", *TINY]),
    ("bench.py", ["--close_gates=0", "--sample_tokens=2"]),  # --checkpoint: the option reads the run's ckpt.pt
]


@pytest.mark.parametrize("script,args", READERS, ids=[r[0] for r in READERS])
def test_a_checkpoint_with_a_pickled_callable_runs_nothing(script, args, run, data, tmp_path, capsys):
    hostile = tmp_path / "run"
    shutil.copytree(run, hostile)
    ckpt = torch.load(run / "ckpt.pt", weights_only=True)
    marker = tmp_path / "ran"
    ckpt["meta"]["note"] = Payload(marker)  # where a careless loader would find it: beside the tokenizer's name
    torch.save(ckpt, hostile / "ckpt.pt")
    before = checksums(tmp_path)
    option = "--checkpoint" if script == "bench.py" else "--out_dir"
    args = [a.format(tmp=tmp_path, data=data) for a in args]
    code, out, err = run_script(script, [option, hostile, *args], capsys)
    assert_one_error_line(code, err, f"the checkpoint {hostile / 'ckpt.pt'} holds posix.system")
    assert "could run code" in err and not marker.exists()
    assert checksums(tmp_path) == before
