"""Windows and macOS, played on Linux: subprocesses under tests/winlike/sitecustomize.py, a Python whose repository
files find the POSIX-only modules and names absent (fcntl, resource, termios, pty, os.sysconf, os.fork, os.killpg,
SIGPIPE, SIGKILL, SIGHUP), whose only start method is spawn and whose default text encoding is cp1252
(WINLIKE=windows), or whose default start method is spawn and nothing else (WINLIKE=macos). The default tier checks
the played Python itself and every command's start (--help) under it; the slow tier the suite's collection under
it, and the quick start under both: prepare.py twice, a few steps of every model file, --resume, sample.py,
eval.py's figures, two DDP ranks, a tiny tools.sweep and hf/export.py."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, TINY, model_names, shakespeare_sample, tracked

WINLIKE = os.path.join(ROOT, "tests", "winlike")
PLAYS = ["windows", "macos"]
# what the played Windows writes to a pipe, and so what its output is read back with
ENCODINGS = {"windows": "cp1252", "macos": "utf-8"}


def played(play, root=None):
    """The environment of a subprocess under the played platform (its repository files: root, default the
    repository's)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([WINLIKE, ROOT]), "WINLIKE": play, "PYTHONUTF8": "0",
           "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONIOENCODING", None)
    if root:
        env["WINLIKE_ROOT"] = str(root)
    return env


def run(play, *argv, root=None, cwd=ROOT, timeout=300):
    """(exit code, stdout, stderr) of `python argv` under the played platform."""
    proc = subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, env=played(play, root), capture_output=True,
                          timeout=timeout)
    return (proc.returncode, proc.stdout.decode(ENCODINGS[play], "replace"),
            proc.stderr.decode(ENCODINGS[play], "replace"))


def ran(result, what):
    """Assert that a command ran: exit code 0, and say which command and how it failed where it did not."""
    code, out, err = result
    assert code == 0, f"{what} under the played platform: exit code {code}\n{err[-3000:]}"
    return out


# ---- the played Python itself -------------------------------------------------------------------------------

PROBE = """
import multiprocessing, os, signal, sys
absent = []
for name in ("fcntl", "resource", "termios", "pty"):
    try:
        exec(f"import {name}")  # the import statement, as a repository file has it
    except ModuleNotFoundError:
        absent.append(name)
absent += [f"os.{n}" for n in ("sysconf", "fork", "killpg") if not hasattr(os, n)]
absent += [f"signal.{n}" for n in ("SIGPIPE", "SIGKILL", "SIGHUP") if not hasattr(signal, n)]
try:
    from os import sysconf
except ImportError:
    absent.append("from os import sysconf")
try:
    multiprocessing.get_context("fork")
except ValueError:
    absent.append("fork")
try:
    open("written.txt", "w").write("\\u0394")
    written = "written"
except UnicodeEncodeError as e:
    written = e.encoding
open("utf8.txt", "w", encoding="utf-8").write("\\u0394")
import library, numpy, filelock
print(json.dumps({"absent": absent, "start": multiprocessing.get_start_method(), "written": written,
                  "stdout": sys.stdout.encoding, "library": library.SEES, "signal": int(signal.SIGINT)}))
"""


@pytest.mark.parametrize("play", PLAYS)
def test_the_played_python_plays_its_platform(play, tmp_path):
    """Its repository files (here: a file in tmp_path) find the POSIX-only modules and names absent, the start
    method is spawn, an open() without encoding writes cp1252 ('Δ' raises UnicodeEncodeError) while one with
    encoding="utf-8" writes it; a library file still sees them (numpy and filelock import here, torch and
    matplotlib under the commands below); the macOS play changes only the start method."""
    repository, library = tmp_path / "repository", tmp_path / "library"  # a file of each
    repository.mkdir(), library.mkdir()
    (repository / "probe.py").write_text("import json\n" + PROBE)
    (library / "library.py").write_text("import fcntl, os, resource, signal\nSEES = hasattr(os, 'sysconf') and "
                                        "hasattr(signal, 'SIGPIPE')\n")
    env = {**played(play, repository), "PYTHONPATH": os.pathsep.join([WINLIKE, str(library)])}
    proc = subprocess.run([sys.executable, str(repository / "probe.py")], cwd=repository, capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout)
    windows = play == "windows"
    assert seen["absent"] == (["fcntl", "resource", "termios", "pty", "os.sysconf", "os.fork", "os.killpg",
                               "signal.SIGPIPE", "signal.SIGKILL", "signal.SIGHUP",
                               "from os import sysconf", "fork"] if windows else [])
    assert seen["start"] == "spawn" and seen["library"] and seen["signal"] == 2
    assert (seen["written"], seen["stdout"]) == (("charmap", "cp1252") if windows else ("written", "utf-8"))
    assert (repository / "utf8.txt").read_bytes() == "Δ".encode("utf-8")


def commands():
    """Every file of the repository outside tests/ that runs as a command (a `__main__` block), as a path with "/"
    (a file at the top runs as a file, one in a folder as a module). hf/hf_model.py needs transformers
    (requirements-eval.txt)."""
    found = []
    for path in tracked("*.py") + tracked("*/*.py"):  # the repository's, not a learner's own scripts
        rel = os.path.relpath(path, ROOT)
        if rel.startswith("tests") or "__main__" not in open(path, encoding="utf-8").read():
            continue
        if rel == os.path.join("hf", "hf_model.py") and importlib.util.find_spec("transformers") is None:
            continue
        found.append(rel.replace(os.sep, "/"))
    return found


START = """
import runpy, sys, traceback
failed = {}
for rel in sys.argv[1:]:
    sys.argv = [rel, "--help"]
    try:
        if "/" in rel:
            runpy.run_module(rel[:-3].replace("/", "."), run_name="__main__", alter_sys=False)
        else:
            runpy.run_path(rel, run_name="__main__")
    except SystemExit:
        pass  # the help, or a library module's note of what to run
    except BaseException as e:
        failed[rel] = traceback.format_exc(limit=-3)
    sys.stdout.flush()
print("\\n---\\n".join(f"{rel}:\\n{tb}" for rel, tb in failed.items()), file=sys.stderr)
sys.exit(1 if failed else 0)
"""


def test_every_command_starts_on_the_played_windows():
    """Every script, tool and module that runs as a command prints its --help (or its note that it is a library
    module) under the played Windows: nothing on its way imports or reads a POSIX-only name, and its help, on a
    pipe, is written in cp1252. One process for all of them (one torch import)."""
    code, _, err = run("windows", "-c", START, *commands())
    assert code == 0, err[-6000:]


def collected(play=None):
    """(tests collected, the collection's errors) of `python -m pytest --collect-only` over every tier, in a
    process: under the played platform, or the plain one."""
    argv = ["-m", "pytest", "--collect-only", "-q", "-m", "", "-p", "no:cacheprovider", "tests"]
    env = played(play) if play else {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, timeout=600)
    out = proc.stdout.decode(ENCODINGS.get(play, "utf-8"), "replace")
    count = re.search(r"(\d+) tests? collected", out)
    errors = re.findall(r"^ERROR (\S+)", out, re.M)
    return (int(count.group(1)) if count else None), errors, out


@pytest.mark.slow  # two collections of the whole suite, about 10 s of CPU each
def test_the_suite_collects_on_the_played_windows():
    """`python -m pytest --collect-only` under the played Windows collects every test of a plain collection, with no
    error: the POSIX-only imports of tests/ sit in the tests that need them, which skip there."""
    plain, plain_errors, out = collected()
    assert plain and not plain_errors, out[-3000:]
    count, errors, out = collected("windows")
    assert not errors and count == plain, (errors, count, plain, out[-3000:])


# ---- the quick start, under each play (slow: about 75 s of CPU each, 16 processes) ------------------------------

@pytest.fixture(scope="module", params=PLAYS)
def play(request):
    return request.param


@pytest.fixture(scope="module")
def quick(play, tmp_path_factory):
    """The quick start's data, prepared twice by prepare.py (the second replaces the first), and a few steps of every
    model file on a small copy of it: {"prepare": the two results, "data": the small copy, name: (result, run)}."""
    folder = tmp_path_factory.mktemp(f"quick-{play}")
    state = {"prepare": [run(play, "prepare.py", "--out_dir", folder / "data") for _ in range(2)]}
    if (folder / "data" / "shakespeare" / "meta.json").exists():  # (a second run that failed left the first's)
        state["data"] = shakespeare_sample(str(folder / "data"), folder / "small")
        for name in model_names():
            out = folder / "runs" / name
            state[name] = run(play, "train.py", "--model", name, "--data_dir", state["data"], "--out_dir", out,
                              "--max_iters=2", "--eval_interval=2", *TINY), out
    return state


def trained(quick, name="vertical"):
    """A run of the quick start (vertical: it has a depth map), or a failed test naming why there is none."""
    if "data" not in quick:
        pytest.fail("no data set: prepare.py failed under the played platform")
    ran(quick[name][0], f"train.py --model {name}")
    return quick[name][1]


@pytest.mark.slow
def test_prepare_twice(quick):
    """prepare.py, then prepare.py again over the data set it made (a pool of spawned processes both times)."""
    for n, result in enumerate(quick["prepare"], 1):
        assert "wrote" in ran(result, f"prepare.py (run {n})")


@pytest.mark.slow
@pytest.mark.parametrize("name", model_names())
def test_a_few_steps_of_every_model_file(quick, name):
    run_folder = trained(quick, name)
    assert (run_folder / "ckpt.pt").exists() and (run_folder / "log.jsonl").exists()


@pytest.mark.slow
def test_resume(quick, play, tmp_path):
    run_folder = shutil.copytree(trained(quick, "vanilla"), tmp_path / "vanilla")
    ran(run(play, "train.py", "--model", "vanilla", "--data_dir", quick["data"], "--out_dir", run_folder,
            "--max_iters=4", "--eval_interval=2", *TINY, "--resume"), "train.py --resume")
    steps = [json.loads(line).get("iter") for line in open(run_folder / "log.jsonl", encoding="utf-8")]
    assert max(s for s in steps if s is not None) == 4


@pytest.mark.slow
def test_sample(quick, play):
    out = ran(run(play, "sample.py", "--out_dir", trained(quick), "--num_samples=2", "--max_new_tokens=64",
                  "--device=cpu"), "sample.py")
    assert out.strip()


@pytest.mark.slow
def test_eval_and_its_figures(quick, play, tmp_path):
    """eval.py's loss and depth map, then --curves over two runs: the figures are written."""
    pytest.importorskip("matplotlib", reason="the figures need matplotlib")
    vertical = shutil.copytree(trained(quick), tmp_path / "vertical")
    vanilla = shutil.copytree(trained(quick, "vanilla"), tmp_path / "vanilla")
    ran(run(play, "eval.py", "--out_dir", vertical, "--depth_map", "--tokens=512", "--device=cpu"),
        "eval.py --depth_map")
    ran(run(play, "eval.py", "--curves", vertical, vanilla), "eval.py --curves")
    assert (vertical / "depth_map.png").stat().st_size > 1000 and (vertical / "curves.png").stat().st_size > 1000


@pytest.mark.slow
def test_two_ddp_ranks(quick, play, tmp_path):
    """torchrun, two processes on gloo (train.py's choice where there is no nccl)."""
    trained(quick, "vanilla")
    ran(run(play, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", "--model",
            "vanilla", "--data_dir", quick["data"], "--out_dir", tmp_path / "ddp", "--max_iters=2",
            "--eval_interval=2", *TINY), "torchrun --nproc_per_node 2 train.py")
    assert (tmp_path / "ddp" / "ckpt.pt").exists()


@pytest.mark.slow
def test_a_tiny_sweep(quick, play, tmp_path):
    """tools.sweep on a tiny budget: its runs, results.json and RESULTS.md (whose table says 'Δ')."""
    trained(quick, "vanilla")
    ran(run(play, "-m", "tools.sweep", "--size=small", "--n_layer=1", "--block_size=32", "--batch_size=2",
            "--device=cpu", "--runs=vanilla,vertical", "--train_iters=2", "--seeds=1", "--eval_points=1",
            f"--data_dir={quick['data']}", f"--results={tmp_path / 'results'}", f"--runs_dir={tmp_path / 'runs'}",
            "--reuse=", "--train_args=--eval_iters=1"), "python -m tools.sweep")
    assert "Δ" in (tmp_path / "results" / "RESULTS.md").read_text(encoding="utf-8")
    assert len(json.loads((tmp_path / "results" / "results.json").read_text(encoding="utf-8"))["runs"]) == 2


@pytest.mark.slow
def test_hf_export(quick, play, tmp_path):
    ran(run(play, "-m", "hf.export", "--out_dir", trained(quick, "vanilla"), "--to", tmp_path / "hf"),
        "python -m hf.export")
    assert (tmp_path / "hf" / "config.json").exists()
