"""What the machine does to a run, answered by the one boundary of each script (plumbing/errors.py), not by a check
per input: a file-size limit (EFBIG) or a full disk while a file is written, a symbolic link that loops, a name the
system cannot hold or that is not UTF-8, a closed pipe, Ctrl-C to a pool of workers. Each ends in one line naming the
file or the step and the fix, with nothing saved lost; a closed pipe ends quietly. Each runs in a process of its
own: a resource limit, a signal and a pipe are a process's."""
import glob
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, TINY

ENV = {**os.environ, "PYTHONPATH": ROOT}


def run(args, limit=None, env=ENV, **kwargs):
    """(exit code, stdout, stderr) of `python args` from the repository, under a file-size limit of limit bytes (a
    test that sets one skips where there is no resource module: Windows)."""
    set_limit = None
    if limit is not None:
        try:
            import resource
        except ImportError:
            pytest.skip("a file-size limit needs the POSIX module resource")

        def set_limit():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    args = [a if isinstance(a, bytes) else str(a) for a in args]
    p = subprocess.run([sys.executable, os.path.join(ROOT, args[0]), *args[1:]], capture_output=True, env=env,
                       timeout=300, preexec_fn=set_limit, **kwargs)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def one_line(code, err, *words):
    """The script failed in one `error:` line holding every one of words, without a traceback."""
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("note:")]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert all(w in lines[0] for w in words), (words, lines[0])
    return lines[0]


def digest(folder):
    return {f: hashlib.sha256(open(os.path.join(folder, f), "rb").read()).hexdigest() for f in sorted(os.listdir(folder))}


@pytest.mark.parametrize("fails", ["the log", "the checkpoint"])
def test_a_file_size_limit_while_resume_rewrites_the_log_or_writes_the_checkpoint(tiny_data, tiny_run, tmp_path, fails):
    """EFBIG wherever a resumed run writes: one line naming the file and the limit, and the run's files as they were
    (the checkpoint of the step it resumed is kept, and said to be). The limit leaves room for what torch writes of
    its own (a module it generates on import): the write that fails is the run's. A log.jsonl over the limit fails
    where the resumed run rewrites it; else the checkpoint of step 4 does (it is larger)."""
    import shutil
    out = tmp_path / "run"
    shutil.copytree(tiny_run, out)
    if fails == "the log":  # the records of steps 0 and 2 again and again: all kept, so all rewritten
        log = (out / "log.jsonl").read_text()
        (out / "log.jsonl").write_text(log * (30_000 // len(log)))
    before = digest(out)
    code, _, err = run(["train.py", "--resume", "--out_dir", out, "--data_dir", tiny_data, "--max_iters=4",
                        "--eval_interval=2", "--batch_size=4", "--eval_iters=2", "--device=cpu"], limit=20_000)
    line = one_line(code, err, "File too large", "ulimit -f")
    assert (f"cannot use {out / 'log.jsonl'}:" if fails == "the log" else "checkpoint of step 2 is kept") in line, line
    after = digest(out)  # a failed rewrite leaves the log as it was; later records are appended to it
    assert after["ckpt.pt"] == before["ckpt.pt"] and (fails != "the log" or after == before), err


def test_a_new_run_whose_first_checkpoint_cannot_be_written_says_none_was(tiny_data, tmp_path):
    out = tmp_path / "run"
    code, _, err = run(["train.py", "--out_dir", out, "--data_dir", tiny_data, "--max_iters=2", "--eval_interval=2",
                        *TINY], limit=20_000)
    line = one_line(code, err, "ckpt.pt", "File too large", "no checkpoint was written")
    assert "is kept" not in line
    assert not os.path.exists(out / "ckpt.pt")


def test_prepare_under_a_file_size_limit_keeps_the_data_set_it_replaces(tmp_path):
    code, _, err = run(["prepare.py", "--out_dir", tmp_path, "--max_tokens=30000"])
    assert code == 0, err
    before = digest(tmp_path / "shakespeare")
    code, _, err = run(["prepare.py", "--out_dir", tmp_path, "--max_tokens=300000", "--num_proc=1"], limit=100_000)
    one_line(code, err, f"cannot use {tmp_path / 'shakespeare'}: File too large")
    assert digest(tmp_path / "shakespeare") == before and os.listdir(tmp_path) == ["shakespeare"]


def test_names_the_system_cannot_hold_are_refused_before_any_work(tmp_path):
    """A name whose temporary sibling would be too long, a path over the system's limit, a link that loops: one line
    each, and nothing made."""
    code, _, err = run(["prepare.py", "--out_dir", tmp_path, "--name", "n" * 250])
    one_line(code, err, "--name", "shorter")
    code, _, err = run(["prepare.py", "--out_dir", str(tmp_path) + ("/" + "d" * 200) * 25])
    one_line(code, err, "--out_dir", "shorter")
    os.symlink("loop", tmp_path / "loop")
    code, _, err = run(["sample.py", "--out_dir", tmp_path / "loop" / "ckpt.pt"])
    one_line(code, err, "symbolic link")
    assert sorted(os.listdir(tmp_path)) == ["loop"]


def test_a_run_folder_named_with_a_dash_or_bytes_that_are_not_utf8(tiny_data, tmp_path):
    """The run succeeds and says so (a name that is not UTF-8 prints escaped, not as a crash of the last print), and
    the commands it prints run when pasted."""
    out = os.fsencode(tmp_path) + b"/-run\xff"
    code, stdout, err = run(["train.py", "--out_dir", out, "--data_dir", tiny_data, "--max_iters=2",
                             "--eval_interval=2", *TINY], env={**ENV, "PYTHONIOENCODING": "utf-8:strict"})
    assert code == 0 and "Traceback" not in err, err
    assert "\\udcff" in stdout or "\\xff" in stdout, stdout
    dashed = tmp_path / "-run"
    code, stdout, err = run(["train.py", f"--out_dir={dashed}", "--data_dir", tiny_data, "--max_iters=2",
                             "--eval_interval=2", *TINY])
    assert code == 0, err
    sample = stdout.split("sample from it: `")[1].split("`")[0]
    words = shlex.split(sample)
    code, _, err = run([*words[1:], "--max_new_tokens=3", "--num_samples=1", "--device=cpu"])
    assert code == 0, (sample, err)


@pytest.mark.parametrize("script", ["sample.py", "eval.py"])
def test_a_closed_pipe_ends_quietly(tiny_run, tiny_data, script):
    args = ["--out_dir", tiny_run, "--device=cpu"] + (["--max_new_tokens=200", "--num_samples=5"] if script ==
                                                     "sample.py" else ["--json", "--data_dir", tiny_data])
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, script), *map(str, args)], env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # `| head -c 0`: the reader is gone before the script writes
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) != 0 and "Traceback" not in err and "error" not in err.lower(), err


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="a terminal's Ctrl-C to a process group needs os.killpg (POSIX)")
def test_ctrl_c_stops_prepare_and_its_workers_at_once_in_one_line(tmp_path):
    text = tmp_path / "big.txt"
    text.write_text("All the world's a stage, and all the men and women merely players.\n\n" * 400_000)
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "prepare.py"), "--files", str(text), "--out_dir",
                          str(tmp_path / "data"), "--num_proc=2", "--max_tokens=0"], env=ENV, stderr=subprocess.PIPE,
                         stdout=subprocess.PIPE, start_new_session=True)
    # into the tokenising, however slow the machine: the first tokens are in its temporary folder's train.bin (of the
    # 400,000 documents, far more are left than are tokenised in the time it takes to see them)
    while not any(os.path.getsize(f) for f in glob.glob(str(tmp_path / "data" / ".big.tmp-*" / "train.bin"))):
        assert p.poll() is None, p.stderr.read().decode()
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    code = p.wait(timeout=300)  # only a guard against a hang: stopping at once is what the data set shows
    err = p.stderr.read().decode()
    one_line(code, err, "interrupted")
    assert not os.path.exists(tmp_path / "data" / "big")  # stopped before the data set was finished
    with pytest.raises(ProcessLookupError):  # no worker left behind
        os.killpg(p.pid, 0)
