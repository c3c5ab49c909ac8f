import contextlib
import glob
import importlib
import json
import os
import runpy
import shlex
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def tracked(pattern):
    """The repository's own files that match pattern (a glob from its root, ** across folders), as glob.glob gives
    them (full paths, sorted): those git tracks, so that a learner's notes, scripts or model_*.py beside them are
    not tested as the repository's. In a copy that is no git checkout, every file that matches."""
    found = sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True))
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        return found
    ours = {os.path.normpath(p) for p in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if p}
    return [p for p in found if os.path.normpath(os.path.relpath(p, ROOT)) in ours]


def model_names():
    """The repository's model files (tracked: a learner's own model_mine.py is theirs), by name."""
    return sorted(os.path.basename(p)[6:-3] for p in tracked("model_*.py"))


def labels():
    """The tables' labels of the repository's model files (plumbing.config.labelled_models, which lists a
    learner's own model file too)."""
    from plumbing.config import labelled_models
    return [(label, name, o) for label, name, o in labelled_models() if name in model_names()]


def model_cases():
    """(model name, variant name, config overrides) for every model file and each of its VARIANTS and TESTED."""
    cases = []
    for name in model_names():
        module = importlib.import_module(f"model_{name}")
        cases.append((name, "default", {}))
        variants = {**getattr(module, "VARIANTS", {}), **getattr(module, "TESTED", {})}
        cases += [(name, v, overrides) for v, overrides in variants.items()]
    return cases


SUB = "subprocess"


@pytest.fixture(scope="session", autouse=True)
def a_folder_of_its_own(tmp_path_factory):
    """The suite runs from an empty folder of its own, never from the repository, where a learner keeps their runs
    (out/), data (data/) and results: what a script reads or writes by default (out/, data/, the runs a hint lists)
    is then the suite's own, and a test that needs a working folder makes it under tmp_path."""
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("work"))
    yield
    os.chdir(here)


@pytest.fixture
def one_thread():
    """Tiny models run many small ops: one thread is much faster than two contending for shared cores (a test
    module takes it with pytestmark = pytest.mark.usefixtures("one_thread"))."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_script(script, args, capsys, mode="", cwd=None):
    """(exit code, stdout, stderr) of `python script args` (train.py), or of `python -m tools.bench args` for a script
    in a folder (tools/bench.py), from cwd (default: the suite's own folder): its real __main__ block run here, or
    with mode SUB in a subprocess."""
    module = script[:-3].replace("/", ".") if "/" in script else None
    if mode == SUB:
        args = [a if isinstance(a, bytes) else str(a) for a in args]
        command = ["-m", module] if module else [os.path.join(ROOT, script)]
        proc = subprocess.run([sys.executable, *command, *args], cwd=cwd, capture_output=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": ROOT})
        return proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")
    capsys.readouterr()
    argv, sys.argv, here = sys.argv, [script, *map(str, args)], os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        with warnings.catch_warnings():  # runpy's note that the module is imported already (by a test): it runs anew
            warnings.simplefilter("ignore", RuntimeWarning)
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=False)
            else:
                runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = argv
        os.chdir(here)
    captured = capsys.readouterr()
    if isinstance(code, str):  # sys.exit(message): Python prints it and exits with 1
        return 1, captured.out, captured.err + code + "\n"
    return code, captured.out, captured.err


@contextlib.contextmanager
def alarm(seconds=60):
    """Fail, instead of holding up the suite, where the block waits (a script that opened a FIFO)."""
    def waited(*_):
        raise AssertionError("the script waited on a FIFO: it opened it")
    previous = signal.signal(signal.SIGALRM, waited)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def script(capsys):
    """script(name, *args): (exit code, stdout, stderr) of a script's real entry point run in this process
    (run_script), for the tests whose subject is what the script does; a process of its own costs about 2 s of
    imports, and stays for what only a process shows (signals, torchrun, a terminal, a memory limit)."""
    return lambda name, *args: run_script(name, args, capsys)


def run_printed(command, cwd, capsys, mode=""):
    """(exit code, stdout and stderr together) of a command as a script prints it in a hint (`python X.py ...` runs
    this repository's X.py, `python -m tools.X ...` its module), run from cwd: in this process (run_script), or with
    mode SUB in a subprocess."""
    words = shlex.split(command)
    assert words[0] == "python" and (words[1].endswith(".py") or words[1] == "-m"), command
    script, args = (words[2].replace(".", "/") + ".py", words[3:]) if words[1] == "-m" else (words[1], words[2:])
    code, out, err = run_script(script, args, capsys, mode, cwd)
    return code, out + err


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """The real offline data set, made by prepare.py once per test session."""
    out = tmp_path_factory.mktemp("data")
    subprocess.run([sys.executable, os.path.join(ROOT, "prepare.py"), "--out_dir", str(out)], check=True,
                   capture_output=True)
    return str(out)


TINY = ["--n_layer=2", "--n_head=2", "--n_kv_head=1", "--n_embd=32", "--ffn_hidden=64", "--block_size=32",
        "--batch_size=4", "--eval_iters=2", "--device=cpu"]


# ---- shared inputs, made once per test run and read only: one tiny data set, one tiny run ----------------------

@pytest.fixture(scope="session")
def tiny_data(data_dir, tmp_path_factory):
    """A small copy of the prepared Shakespeare data: 4,000 train and 300 val tokens."""
    return shakespeare_sample(data_dir, tmp_path_factory.mktemp("tiny") / "data")


def shakespeare_sample(data_dir, out):
    """out/shakespeare: 4,000 train and 300 val tokens of the prepared Shakespeare data."""
    write_data_set(out / "shakespeare", np.fromfile(os.path.join(data_dir, "shakespeare", "train.bin"), np.uint16))
    return out


def write_data_set(folder, tokens, tokenizer="byte", vocab_size=257):
    os.makedirs(folder)
    tokens[:4000].tofile(folder / "train.bin")
    tokens[4000:4300].tofile(folder / "val.bin")
    meta = {"dataset": "shakespeare", "tokenizer": tokenizer, "vocab_size": vocab_size, "eot_token": 256,
            "dtype": "uint16", "train_tokens": 4000, "val_tokens": 300}
    (folder / "meta.json").write_text(json.dumps(meta))


@pytest.fixture(scope="session")
def tiny_run(tiny_data, tmp_path_factory):
    """A run of 2 steps: ckpt.pt and log.jsonl (a test that changes it changes a copy)."""
    import train
    out = tmp_path_factory.mktemp("tiny_run") / "run"
    train.main(["--data_dir", str(tiny_data), "--out_dir", str(out), "--max_iters=2", "--eval_interval=2", *TINY])
    return out
