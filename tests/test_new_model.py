"""A model file no script names is found by every one of them (docs/contract.md, "A new model file"): a throwaway copy
of model_vanilla.py, with a PAPER, one of VARIANTS and a depth_map(), trains with train.py, samples with sample.py,
is evaluated, drawn and wired by eval.py, is a label of the sweep, the bench and gpu_tables, and exports to a Hugging
Face folder, with no script edited. The copy has a name of its own (two runs of this test never share it), lives
only for the test's duration, and is removed whatever happens, so that no other test finds it."""
import contextlib
import glob
import importlib
import json
import os
import re
import subprocess
import sys
import uuid

import pytest

from conftest import ROOT, TINY, run_script

from analysis import wiring
from hf import export

evalpy = importlib.import_module("eval")

PAPER = "A paper of mine"
ADDED = f'''

PAPER = {PAPER!r}
VARIANTS = {{"wide": dict(ffn_hidden=96)}}


def depth_map(self, idx=None):
    """The chain as a map: row l reads column l (column 0 the embedding)."""
    return torch.eye(self.config.n_layer, self.config.n_layer + 1)


GPT.depth_map = depth_map
'''

# what the tools list, printed by a process of their own: their lists are made when they are imported, and this one
# imported them before the model file was there
TOOLS = """
import contextlib, io, json
from tools import bench, gpu_tables, sweep
text = io.StringIO()
with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
    sweep.parse_args(["--help"])
print(json.dumps({"bench": [label for label, *_ in bench.RUNS], "sweep_help": text.getvalue(),
                  "gpu_tables": gpu_tables.TablesConfig.__dataclass_fields__["runs"].default}))
"""


@pytest.fixture
def new_model():
    """The name of a model file made for this test from model_vanilla.py, removed with what Python cached of it."""
    name = f"mine{uuid.uuid4().hex[:8]}"
    path = os.path.join(ROOT, f"model_{name}.py")
    with open(path, "x", encoding="utf-8") as f:
        f.write(open(os.path.join(ROOT, "model_vanilla.py"), encoding="utf-8").read() + ADDED)
    try:
        yield name
    finally:
        os.remove(path)
        sys.modules.pop(f"model_{name}", None)
        for cached in glob.glob(os.path.join(ROOT, "__pycache__", f"model_{name}.*")):
            with contextlib.suppress(OSError):
                os.remove(cached)


def test_a_new_model_file_is_found_by_every_script(new_model, tiny_data, tmp_path, capsys, monkeypatch):
    name, run = new_model, tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": ROOT}
    tools = subprocess.Popen([sys.executable, "-c", TOOLS], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    # train.py's --model choices are made when it is imported: a process of its own, as a learner runs it
    trained = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--model", name, "--data_dir",
                              str(tiny_data), "--out_dir", str(run), "--max_iters=2", "--eval_interval=2", *TINY],
                             env=env, capture_output=True, text=True, timeout=300)
    out, err = tools.communicate(timeout=300)
    assert trained.returncode == 0, trained.stderr
    assert tools.returncode == 0, err
    listed = json.loads(out)
    labels = [name, f"{name}-wide"]
    assert all(label in listed["bench"] for label in labels) and listed["bench"][0] == "vanilla"
    assert name in listed["gpu_tables"].split(",")
    sweep_help = re.sub(r"-\s+", "-", " ".join(listed["sweep_help"].split()))  # argparse wraps at hyphens
    assert all(label in re.findall(r"[\w-]+", sweep_help) for label in labels), sweep_help

    code, text, err = run_script("sample.py", ["--out_dir", run, "--start", "To be", "--num_samples=1",
                                               "--max_new_tokens=4", "--device=cpu"], capsys)
    assert code in (0, None) and "To be" in text, err

    code, text, err = run_script("eval.py", ["--out_dir", run, "--depth_map", "--device=cpu"], capsys)
    assert code in (0, None), err
    assert name in text and "depth map" in text and "loss" in text
    assert os.path.getsize(run / "depth_map.png") > 0

    code, text, err = run_script("eval.py", ["--wiring", run, "--plot", "false"], capsys)
    assert code in (0, None) and f"{name}, step 2" in text, err
    # the figure at initialisation draws every label of the tables; here only this file's, to be quick
    from plumbing.config import labelled_models
    mine = [r for r in labelled_models() if r[1] == name]
    assert [label for label, *_ in mine] == labels
    monkeypatch.setattr(wiring, "labelled_models", lambda: mine)
    panels = wiring.wiring_panels(evalpy.parse_args(["--wiring"]))
    assert [caption for caption, *_ in panels] == [f"{PAPER}: {label}" for label in labels]

    export.main(["--out_dir", str(run), "--to", str(tmp_path / "hf")])
    assert json.load(open(tmp_path / "hf" / "config.json"))["model_name"] == name
    assert (tmp_path / "hf" / f"model_{name}.py").read_text(encoding="utf-8").endswith(ADDED)
