"""train.py's progress: a bar on a terminal; where stderr is a file or a pipe (a cluster's log, `> log.txt 2>&1`)
no bar and no carriage returns, every periodic record a line of its own."""
import json
import os
import re
import struct
import subprocess
import sys
import types

import pytest

from conftest import ROOT

TINY = ["--n_layer=1", "--n_head=2", "--n_kv_head=1", "--n_embd=16", "--ffn_hidden=32", "--block_size=8",
        "--batch_size=2", "--eval_iters=1", "--max_iters=4", "--eval_interval=2", "--log_interval=1", "--device=cpu"]


def train(data_dir, out_dir, stderr, stdout=subprocess.PIPE):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--data_dir", data_dir, "--out_dir",
                           str(out_dir), *TINY], stdout=stdout, stderr=stderr, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def terminal():
    """(main, other): a pseudo-terminal 100 columns wide (for the bar); the tests that need one skip where there is
    none (Windows has no pty, fcntl or termios)."""
    try:
        import fcntl
        import pty
        import termios
    except ImportError:
        pytest.skip("a pseudo-terminal needs the POSIX modules pty, fcntl and termios")
    main, other = pty.openpty()
    fcntl.ioctl(other, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    return main, other


DURATION = r"(\d+h\d\dm|\d+m\d\ds|\d+s)"  # 1h05m, 7m12s, 42s


def test_a_log_file_gets_lines_not_a_bar(data_dir, tmp_path):
    """Every record a line, with the figures to plan with: the step out of the total, a training record's time left,
    and the run's wall time on the closing line; log.jsonl's records stay as they were (the time left is the
    console's only)."""
    with open(tmp_path / "log.txt", "wb") as log:
        proc = train(data_dir, tmp_path / "run", log)
    out, err = proc.stdout.decode(), (tmp_path / "log.txt").read_bytes().decode()
    lines = out.splitlines()
    assert proc.returncode == 0, err
    assert "\r" not in out + err and "it/s" not in err  # no bar, no carriage-return updates
    for step in range(1, 5):  # every --log_interval record a line of its own
        assert sum(line.startswith(f"iter {step}/4 | loss ") for line in lines) == 1, out
        assert any(re.fullmatch(rf"iter {step}/4 \| loss .* \| {DURATION} left", line) for line in lines), out
    assert [line.split(" | ")[0] for line in lines if "val_loss" in line] == ["iter 0/4", "iter 2/4", "iter 4/4"], out
    assert re.match(rf"done in {DURATION}: ", lines[-1]), out
    records = [json.loads(line) for line in open(tmp_path / "run" / "log.jsonl")]
    assert [sorted(r) for r in records if "loss" in r] == [["iter", "loss", "lr", "tok_per_s", "tokens"]] * 4
    assert [sorted(r) for r in records if "val_loss" in r] == [["iter", "tokens", "val_loss"]] * 3


def test_the_time_left_is_at_the_recent_pace():
    """The arithmetic: the steps left at the pace from the first to the last of the steps and times given, so that a
    machine that slows down raises the estimate, and the evaluations left at the last one's time; and the durations
    as the lines show them."""
    from plumbing.console import duration, time_left
    assert time_left([0, 10, 20], [0.0, 1.0, 2.0], 100, 1000, 5.0) == 8.0 + 5.0  # 0.1 s a step, 80 steps left; the
    assert time_left([0, 10, 20], [0.0, 1.0, 4.0], 100, 1000, 5.0) == 16.0 + 5.0  # last evaluation; slower: 0.2 s
    assert time_left([50, 60], [10.0, 12.0], 100, 25, 2.0) == 8.0 + 2 * 2.0  # resumed at 50: evaluations at 75, 100
    assert time_left([50, 60], [10.0, 12.0], 90, 25, 2.0) == 6.0 + 2 * 2.0  # at 75, and at the last step, 90
    assert time_left([90, 100], [0.0, 1.0], 100, 25, 2.0) == 0.0  # the last evaluation is done
    assert [duration(s) for s in (0, 8.4, 59.6, 432, 3599, 3900, 90061)] == \
        ["0s", "8s", "1m00s", "7m12s", "59m59s", "1h05m", "25h01m"]


def test_the_lines_see_a_machine_that_slows_down(monkeypatch, capsys):
    """A line's time left is at the pace of the last five training records on the wall clock (the test's own clock
    here: no sleeps): once the steps take three times as long, the time left rises though fewer steps are left, and
    an evaluation's time counts."""
    from plumbing import console
    now = [0.0]
    monkeypatch.setattr(console, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    shown = console.Console(200, 0, True, "header", 100)
    assert shown.bar.disable and capsys.readouterr().out == "header\n"  # no terminal (pytest's): lines

    def left(step, seconds):  # the time left on the line of step, `seconds` after the last record
        now[0] += seconds
        shown.record({"iter": step, "loss": 5.0})
        return re.fullmatch(rf"iter {step}/200 \| loss 5 \| {DURATION} left", capsys.readouterr().out.strip())[1]
    assert [left(step, 1) for step in range(10, 60, 10)] == ["19s", "18s", "17s", "16s", "15s"]  # 0.1 s a step
    assert [left(step, 3) for step in range(60, 120, 10)] == ["20s", "23s", "26s", "29s", "30s", "27s"]  # 0.3 s
    now[0] += 6  # an evaluation of 6 s at step 110 (as if --eval_interval were 110)
    shown.record({"iter": 110, "val_loss": 5.0}, line=True)
    assert capsys.readouterr().out == "iter 110/200 | val_loss 5\n"
    # the pace after it, 0.3 s a step, for the 80 steps left, and the one evaluation left (at step 200) at its 6 s
    assert left(120, 3) == "30s"


def test_a_terminal_gets_the_bar(data_dir, tmp_path):
    """The same run with stderr on a terminal: the bar (carriage returns on stderr) carries the periodic records,
    and only the evaluations are lines."""
    main, other = terminal()
    try:
        proc = train(data_dir, tmp_path / "run", other)
        os.close(other)
        err = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal's other end is closed: all of it was read
                break
            if not chunk:
                break
            err += chunk
    finally:
        os.close(main)
    out = proc.stdout.decode()
    assert proc.returncode == 0, err
    assert b"\r" in err and b"4/4" in err
    assert not any(line.startswith("iter 1/4 | loss ") for line in out.splitlines()), out
    assert sum("val_loss" in line for line in out.splitlines()) == 3, out


def test_on_a_terminal_the_closing_line_comes_after_the_bar(data_dir, tmp_path):
    """stdout and stderr on one terminal, as a learner runs it: the `done:` line is the last thing drawn, on a line
    of its own, not into the bar, which is not drawn again below it."""
    main, other = terminal()
    try:
        proc = train(data_dir, tmp_path / "run", other, other)
        os.close(other)
        seen = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(main)
    assert proc.returncode == 0, seen
    before, done, after = seen.decode().rpartition("done in ")
    redrawn = re.search("\r(?!\n)", after)  # a carriage return of the bar (a terminal ends each line with \r\n)
    assert done and not redrawn and "4/4" in before and before.endswith("\n"), seen


def test_prepare_and_eval_write_no_carriage_returns_to_a_log_file(data_dir, tmp_path):
    """prepare.py's tokenizing bar and eval.py's evaluation bar, with stderr to a file: no bar, no carriage returns."""
    text = tmp_path / "notes.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 400)
    with open(tmp_path / "prepare.txt", "wb") as log:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "prepare.py"), "--files", str(text), "--out_dir",
                               str(tmp_path / "data"), "--num_proc", "1"], stdout=subprocess.PIPE,
                              stderr=log, timeout=300)
    assert proc.returncode == 0 and b"\r" not in (tmp_path / "prepare.txt").read_bytes() + proc.stdout
    assert train(data_dir, tmp_path / "run", subprocess.PIPE).returncode == 0
    with open(tmp_path / "eval.txt", "wb") as log:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--out_dir", str(tmp_path / "run"),
                               "--data_dir", data_dir, "--tokens", "200", "--device", "cpu"],
                              stdout=subprocess.PIPE, stderr=log, timeout=300)
    err = (tmp_path / "eval.txt").read_bytes()
    assert proc.returncode == 0 and b"perplexity" in proc.stdout, err
    assert b"\r" not in err + proc.stdout
