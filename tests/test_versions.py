"""The torch versions CI tests, and the code paths that have differed between them.

.ci/run runs the default tier under three torch versions, each in a fresh virtual environment, and the slow tier
once, under the newest:
  FLOOR       the oldest that requirements.txt allows (its torch>=FLOOR; .ci/run installs torch==FLOOR)
  CPU_BUILD   the CPU build that the README's CPU install line gives here (.ci/run's CPU_TORCH)
  the newest  whatever an unpinned `pip install -r requirements.txt` resolves to (2.14.1 in November 2026),
              a CUDA build, run on the CPU; .ci/run prints which version it was
The paths that have broken on one of them, and the tests of each (VERSION_SENSITIVE), marked `versions`, which run
under all three (.ci/run: `python -m pytest -q -m "slow and versions"` after the default tier):
  DDP on gloo      torch 2.5's gloo has no ReduceOp.AVG: train.py all-reduces the step loss as a sum, then divides
  compiled decode  each decode step compiles to one graph, skipmiddle's skipping step to one per part and k (an
                   earlier form of it, a torch.cond whose branch wrote the cache, failed on 2.11 and lost the write
                   on 2.5)
  torch.load       checkpoints are read with weights_only=True (DESIGN.md), whose unpickler differs by version
"""
import ast
import os
import re
import subprocess
import sys

import pytest
import torch

from plumbing.files import read_checkpoint
import train
from conftest import ROOT

FLOOR = "2.5.1"
CPU_BUILD = "2.13.0"
VERSION_SENSITIVE = {  # path: the tests that cover it, as file::function
    "DDP on gloo": ["tests/test_contract.py::test_ddp_two_processes_equals_accumulation"],
    "compiled decode": ["tests/test_decode.py::test_compiled_step_is_one_graph_and_equals_recomputation",
                        "tests/test_decode.py::test_compiled_skipping_step_equals_the_eager_one_greedy_and_sampled"],
    "torch.load": ["tests/test_versions.py::test_a_checkpoint_loads_with_weights_only"],
}
NOTE = "tests/test_versions.py"  # what each of those tests' docstrings names: the versions are listed here


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def release(version):
    """(major, minor, patch) of a torch version string: 2.13.0+cpu -> (2, 13, 0)."""
    return tuple(int(n) for n in re.match(r"(\d+)\.(\d+)\.(\d+)", version).groups())


def test_requirements_floor_is_the_tested_floor():
    """requirements.txt's torch floor is an exact release (.ci/run installs torch==FLOOR from it) and the one
    listed here, so that the oldest version users may install is one that the suite passed on."""
    floors = re.findall(r"^torch\s*>=\s*([\w.]+)\s*(?:#.*)?$", read("requirements.txt"), re.M)
    assert floors == [FLOOR], f"requirements.txt's torch line should read torch>={FLOOR}, found {floors}"


def test_ci_tests_the_versions_listed_here():
    """.ci/run installs the CPU build listed here, the floor that it reads from requirements.txt, and the newest."""
    ci = read(".ci/run")
    assert f"CPU_TORCH={CPU_BUILD}\n" in ci, f".ci/run should set CPU_TORCH={CPU_BUILD}"
    for part in ('"torch==$floor -r requirements.txt"', '"torch==$CPU_TORCH" "-r requirements.txt"',
                 '"-r requirements.txt"\n'):
        assert part in ci, f".ci/run no longer installs {part}"


def test_the_install_page_names_the_tested_range():
    """The install page, which the README links, says which versions CI tests: the floor and the CPU build by
    number."""
    assert "(docs/install.md)" in read("README.md")
    text = read(os.path.join("docs", "install.md"))
    for version in (FLOOR, CPU_BUILD):
        assert f"torch {version}" in text or f"torch=={version}" in text, \
            f"docs/install.md does not name torch {version}"


def test_this_torch_is_in_the_supported_range():
    """A run under a torch older than the floor is outside what requirements.txt allows: say so, not fail
    somewhere deep in a test."""
    assert release(torch.__version__) >= release(FLOOR), (
        f"torch {torch.__version__} is older than requirements.txt's floor {FLOOR}: "
        f"pip install 'torch>={FLOOR}'")


def marked_versions(function):
    """Whether a test function's decorators include pytest.mark.versions."""
    return any(isinstance(d, ast.Attribute) and d.attr == "versions" for d in function.decorator_list)


@pytest.mark.parametrize("path", sorted(VERSION_SENSITIVE))
def test_each_version_sensitive_path_has_a_test_that_says_so(path):
    """The tests of each path exist, are marked `versions` (which CI runs under every version) and their docstrings
    name this file, where the versions they cover are."""
    for test in VERSION_SENSITIVE[path]:
        file, name = test.split("::")
        functions = {f.name: f for f in ast.parse(read(file)).body if isinstance(f, ast.FunctionDef)}
        assert name in functions, f"{file} has no {name}, which VERSION_SENSITIVE names for {path}"
        assert marked_versions(functions[name]), f"{test} should be marked @pytest.mark.versions: CI selects it so"
        doc = ast.get_docstring(functions[name]) or ""
        assert NOTE in " ".join(doc.split()), f"{test}'s docstring should name {NOTE} (the versions it runs under)"


def test_every_test_marked_versions_is_listed_here():
    """A test marked `versions` covers a path listed in VERSION_SENSITIVE: the list says why it runs three times."""
    listed = {test for tests in VERSION_SENSITIVE.values() for test in tests}
    for file in sorted(os.listdir(os.path.join(ROOT, "tests"))):
        if file.startswith("test_") and file.endswith(".py"):
            for f in ast.parse(read(f"tests/{file}")).body:
                if isinstance(f, ast.FunctionDef) and marked_versions(f):
                    assert f"tests/{file}::{f.name}" in listed, f"tests/{file}::{f.name} is marked versions, not listed"


def test_ci_runs_the_version_sensitive_tests_under_the_floor_and_the_cpu_build():
    """.ci/run runs `-m "slow and versions"` (the slow ones; the others are in the default tier) in each environment
    that does not run the whole slow tier."""
    ci = read(".ci/run")
    assert '-m "slow and versions"' in ci and "-m slow" in ci


@pytest.mark.versions
def test_a_checkpoint_loads_with_weights_only(data_dir, tmp_path):
    """Version-sensitive: CI runs it under each torch version of tests/test_versions.py. A checkpoint that train.py
    writes holds tensors and plain containers only, so torch.load with weights_only=True reads it (also memory-mapped,
    as eval.py reads one), and sample.py samples from it."""
    out = tmp_path / "run"
    train.main(["--data_dir", data_dir, "--out_dir", str(out), "--max_iters=2", "--eval_interval=2", "--n_layer=2",
                "--n_head=2", "--n_kv_head=1", "--n_embd=32", "--ffn_hidden=64", "--block_size=32", "--batch_size=4",
                "--eval_iters=2", "--device=cpu"])
    path = str(out / "ckpt.pt")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    assert ckpt["model_name"] == "vanilla" and ckpt["iter_num"] == 2
    mapped = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    assert all(torch.equal(ckpt["model"][k], mapped["model"][k]) for k in ckpt["model"])
    assert read_checkpoint(path)["model_args"] == ckpt["model_args"]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), "--out_dir", str(out), "--num_samples=1",
                           "--max_new_tokens=8", "--device=cpu"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-2000:]
