"""A run is a transaction: what a refused, failed, resumed, interrupted or concurrent run leaves in its out_dir.
Nothing already saved is lost: log.jsonl is append-only (records after a checkpoint move to log.superseded.jsonl),
and a second run in the same folder is refused."""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest
import torch

import train
from plumbing.files import LOCK, run_folder
from plumbing.files import read_checkpoint
from conftest import ROOT, TINY, run_script, shakespeare_sample
from test_errors import assert_one_error_line, checksums


@pytest.fixture(scope="module")
def data(data_dir, tmp_path_factory):
    return shakespeare_sample(data_dir, tmp_path_factory.mktemp("runs") / "data")


@pytest.fixture(scope="module")
def saved_run(data, tmp_path_factory):
    """A run of 4 steps, evaluated and saved at 0 and 4, with a training record every step."""
    out = tmp_path_factory.mktemp("saved") / "run"
    train.main(["--data_dir", str(data), "--out_dir", str(out), "--max_iters=4", "--eval_interval=4",
                "--log_interval=1", *TINY])
    return out


def records(path):
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


# (id, arguments, expected fragment): a run refused after the out_dir already holds a run's files; every file of
# that folder stays as it was, by checksum
REFUSED_IN_A_RUN_FOLDER = [
    ("model_option_its_file_rejects", ["--model=aila", "--aila_heads=3"], "--aila_heads 3 must divide --n_embd 32"),
    ("new_run_over_a_checkpoint", [], "already holds a checkpoint"),
    ("resume_with_nan_option", ["--resume", "--adam_eps=nan"], "--adam_eps must be a finite number"),
    ("resume_with_min_lr_above_lr", ["--resume", "--min_lr=0.1"], "--min_lr 0.1 is above --learning_rate"),
    ("resume_of_another_model", ["--resume", "--model=vertical"], "--model vanilla"),
]


@pytest.mark.parametrize("case", REFUSED_IN_A_RUN_FOLDER, ids=[c[0] for c in REFUSED_IN_A_RUN_FOLDER])
def test_a_refused_run_leaves_the_folder_as_it_was(case, data, saved_run, tmp_path, capsys):
    _, args, fragment = case
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    before = checksums(run, data)
    code, _, err = run_script("train.py", ["--data_dir", data, *TINY, "--out_dir", run, *args], capsys)
    assert_one_error_line(code, err, fragment)
    assert checksums(run, data) == before


def test_a_resume_whose_optimiser_state_does_not_fit_leaves_the_log(data, saved_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    ckpt = torch.load(run / "ckpt.pt", weights_only=False)
    ckpt["optimizer"]["param_groups"] = ckpt["optimizer"]["param_groups"][:1]  # one group short
    torch.save(ckpt, run / "ckpt.pt")
    before = checksums(run)
    code, _, err = run_script("train.py", ["--data_dir", data, *TINY, "--out_dir", run, "--resume", "--max_iters=8"],
                              capsys)
    assert_one_error_line(code, err, "optimiser state")
    assert checksums(run) == before


def test_resume_keeps_every_record_and_moves_the_later_ones_aside(data, saved_run, tmp_path):
    """The log holds records past the checkpoint (a run killed after step 4's checkpoint, having logged steps 5 and
    6), and the resumed run's --eval_interval does not divide 4: step 4's evaluation stays, the records of steps 5
    and 6 move to log.superseded.jsonl, and the resumed run logs its own steps 5 to 8 once."""
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    original = records(run / "log.jsonl")
    with open(run / "log.jsonl", "a") as f:
        f.write(json.dumps({"iter": 5, "loss": 9.0}) + "\n" + json.dumps({"iter": 6, "loss": 9.0}) + "\n")
        f.write('{"iter": 7, "lo')  # cut short by the crash
    train.main(["--data_dir", str(data), "--out_dir", str(run), "--max_iters=8", "--eval_interval=3",
                "--log_interval=1", "--resume", *TINY])
    log = records(run / "log.jsonl")
    assert log[:len(original)] == original  # nothing before the checkpoint changed
    assert [r["iter"] for r in log if "val_loss" in r] == [0, 4, 6, 8]  # 4 once: not evaluated again
    assert [r["iter"] for r in log[len(original):] if "loss" in r] == [5, 6, 7, 8]
    moved = open(run / "log.superseded.jsonl").read().splitlines()
    assert [json.loads(line)["iter"] for line in moved[:2]] == [5, 6] and moved[2] == '{"iter": 7, "lo'


def test_a_new_run_moves_an_old_log_aside(data, tmp_path):
    out = tmp_path / "run"
    os.makedirs(out)
    (out / "log.jsonl").write_text('{"iter": 7, "loss": 1.0}\n')  # an older run's, without a checkpoint
    train.main(["--data_dir", str(data), "--out_dir", str(out), "--max_iters=0", *TINY])
    assert [r["iter"] for r in records(out / "log.jsonl")] == [0]
    assert records(out / "log.superseded.jsonl") == [{"iter": 7, "loss": 1.0}]


def test_a_second_run_in_the_same_folder_is_refused(data, saved_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    with run_folder(str(run)):  # as a run in progress holds it
        before = checksums(run)
        code, _, err = run_script("train.py", ["--data_dir", data, *TINY, "--out_dir", run, "--resume",
                                               "--max_iters=8"], capsys)
        assert_one_error_line(code, err, "another run is writing to")
        assert checksums(run) == before
    train.main(["--data_dir", str(data), "--out_dir", str(run), "--max_iters=5", "--resume", *TINY])  # free again


def test_the_run_folder_is_taken_before_the_checks_and_a_refused_new_run_leaves_none(data, tmp_path, capsys):
    """The folder of a new run is made and locked before its checks (a second run is refused from then on); a run
    refused by a check removes the folders it made, so that it leaves nothing behind."""
    new = tmp_path / "runs" / "new"
    with run_folder(str(new)):
        assert new.is_dir() and os.listdir(new) == [LOCK]  # nothing inside but the lock's own file
        code, _, err = run_script("train.py", ["--data_dir", data, *TINY, "--out_dir", new], capsys)
        assert_one_error_line(code, err, "another run is writing to")
    assert not (tmp_path / "runs").exists()  # the holder wrote nothing: the folders it made are gone
    code, _, err = run_script("train.py", ["--data_dir", data, *TINY, "--out_dir", new, "--batch_size=0"], capsys)
    assert_one_error_line(code, err, "--batch_size")
    code, _, err = run_script("train.py", ["--data_dir", data, *TINY, "--out_dir", new, "--block_size=100000"], capsys)
    assert_one_error_line(code, err, "too few for --block_size")  # refused by a check after the folder was taken
    assert not (tmp_path / "runs").exists()


def start(data, out, *args):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), "--data_dir", str(data), "--out_dir",
                             str(out), *TINY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


# (first, second, when the second starts): two real processes in one folder, new or resumed, the second started
# with the first, while the first imports and checks, or once it trains
TWO_RUNS = [("new", "new", "together"), ("resume", "resume", "together")] + [
    pytest.param(a, b, when, marks=pytest.mark.slow) for a in ("new", "resume") for b in ("new", "resume")
    for when in ("together", "checking", "training") if (a, b, when) not in [("new", "new", "together"),
                                                                              ("resume", "resume", "together")]]


def training(out, proc):
    """Wait until the run of proc records a step after the saved run's last (4), or ends."""
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline and not any(
            r.get("iter", 0) > 4 for r in records(out / "log.jsonl")):
        time.sleep(0.05)


def holding(out, procs):
    """The process of procs that holds the lock on the folder out, as /proc/locks shows it (Linux), or None."""
    try:
        inode, locks = os.stat(out / LOCK).st_ino, open("/proc/locks").read().split("\n")
    except OSError:
        return None
    pids = {str(p.pid): p for p in procs}
    return next((pids[f[4]] for f in map(str.split, locks) if len(f) > 5 and f[1] == "FLOCK" and f[4] in pids
                 and f[5].endswith(f":{inode}")), None)


def hold_while_the_other_ends(out, procs):
    """Stop the run that holds the folder until the other has ended, then let it go on: the other then meets a run
    in progress however fast this machine trains, never one that has already finished."""
    deadline = time.time() + 120
    while time.time() < deadline and all(p.poll() is None for p in procs):
        holder = holding(out, procs)
        if holder is not None:
            holder.send_signal(signal.SIGSTOP)
            try:
                next(p for p in procs if p is not holder).wait(timeout=300)
            finally:
                holder.send_signal(signal.SIGCONT)
            return
        time.sleep(0.01)


@pytest.mark.parametrize("first,second,when", TWO_RUNS)
def test_two_runs_in_one_folder_one_trains_and_the_other_is_refused(first, second, when, data, saved_run, tmp_path):
    """However two runs in one folder are timed, at most one trains; the other ends in one line before it writes,
    and the folder holds the one run's checkpoint and log, each step once, with nothing moved aside."""
    out = tmp_path / "run"
    if "resume" in (first, second):
        shutil.copytree(saved_run, out)  # saved at step 4
    steps = {"new": ["--max_iters=400", "--eval_interval=200"],
             "resume": ["--max_iters=404", "--eval_interval=200", "--resume"]}
    procs = [start(data, out, *steps[first])]
    if when == "checking":
        time.sleep(1.0)  # importing torch, then its checks
    elif when == "training":
        training(out, procs[0])
    procs.append(start(data, out, *steps[second]))
    hold_while_the_other_ends(out, procs)
    ended = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    trained = [kind for kind, (code, _) in zip((first, second), ended) if code == 0]
    assert len(trained) <= 1, ended
    for code, err in ended:
        if code != 0:
            lines = [line for line in err.splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith("error: ") and (
                "another run is writing to" in lines[0] or "already holds a checkpoint" in lines[0]), err
    if not trained:  # a new run refused by the saved one's checkpoint, and a resumed one by the lock: a third
        trained = ["resume"]
        assert start(data, out, *steps["resume"]).wait(timeout=300) == 0
    for kind in ("loss", "val_loss"):  # every step of the one run once, in order
        steps_logged = [r["iter"] for r in records(out / "log.jsonl") if kind in r]
        assert steps_logged == sorted(set(steps_logged)), steps_logged
    assert [r["iter"] for r in records(out / "log.jsonl") if "val_loss" in r][-1] == \
        read_checkpoint(str(out / "ckpt.pt"), ("model_name", "iter_num"))["iter_num"] == \
        (404 if trained[0] == "resume" else 400)
    assert not (out / "log.superseded.jsonl").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_an_interrupted_run_says_where_it_stopped_in_one_line(sig, data, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), "--data_dir", str(data), "--out_dir",
                             str(out), *TINY, "--max_iters=100000", "--eval_interval=100000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "ckpt.pt").exists() and time.time() < deadline:  # step 0's checkpoint
        time.sleep(0.2)
    time.sleep(1.0)  # a few steps
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and "Traceback" not in err and len(lines) == 1, err
    step = int(re.search(r"interrupted at step (\d+);", lines[0]).group(1))
    assert step > 0 and f"the checkpoint of step {step} is kept" in lines[0], lines[0]  # the step it stopped at
    assert "stopping after this step" in err  # said at once, while the step still runs
    saved = torch.load(out / "ckpt.pt", weights_only=False)
    assert saved["iter_num"] == step and saved["tokens_seen"] == step * 4 * 32
    assert [r["iter"] for r in records(out / "log.jsonl") if "loss" in r][-1] <= step


def pty_run(argv, until, then=None, timeout=120):
    """The output of `python train.py argv` in a terminal (a pseudo-terminal: tqdm draws its bar there), read until
    until(output) holds, then then(proc, output) (a signal), then to the end; (exit code, output)."""
    import select
    import fcntl
    import termios
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal 100 columns wide
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *map(str, argv)], stdin=slave,
                            stdout=slave, stderr=slave)
    os.close(slave)
    out, acted, deadline = b"", False, time.time() + timeout
    while time.time() < deadline:
        if not acted and until(out.decode("utf-8", "replace")):
            then(proc, out.decode("utf-8", "replace"))
            acted = True
        if select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal's other end is closed: the process is gone
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None and acted:
            break
    os.close(master)
    return proc.wait(timeout=60), out.decode("utf-8", "replace")


@pytest.mark.skipif(sys.platform == "win32", reason="a terminal: a pseudo-terminal (POSIX)")
def test_in_a_terminal_the_stop_note_starts_a_line_of_its_own(data, tmp_path):
    """The bar holds its line; the note Ctrl-C prints clears it first, and the bar is drawn again below."""
    code, out = pty_run(["--data_dir", data, "--out_dir", tmp_path / "run", *TINY, "--max_iters=100000",
                         "--eval_interval=100000"], lambda out: re.search(r" [1-9]\d*/100000 \[", out),
                        lambda proc, out: proc.send_signal(signal.SIGINT))
    pieces = re.split(r"[\r\n]", out)  # what a terminal shows on each line, the last carriage return's
    notes = [p for p in pieces if "stopping after this step" in p]
    assert code == 1 and notes and all(p.startswith("note: stopping after this step") for p in notes), out[-2000:]


@pytest.mark.slow  # a checkpoint big enough to be caught while it is written: about 20 s
@pytest.mark.skipif(sys.platform == "win32", reason="a terminal: a pseudo-terminal (POSIX)")
def test_a_second_ctrl_c_during_the_stop_save_keeps_the_previous_checkpoint(data, tmp_path):
    """Ctrl-C saves the step it stopped at; a second Ctrl-C while that checkpoint is written stops at once, and the
    checkpoint of the step before stays whole, with no temporary file left beside it."""
    out = tmp_path / "run"
    big = ["--n_layer=4", "--n_embd=1024", "--n_head=8", "--n_kv_head=8", "--ffn_hidden=4096", "--block_size=32",
           "--batch_size=1", "--eval_iters=1", "--device=cpu", "--eval_interval=100000", "--max_iters=100000"]
    first = lambda text: re.search(r" [1-9]\d*/100000 \[", text)  # noqa: E731 (step 0 saved, steps running)
    before = {}

    def twice(proc, text):
        before["ckpt"] = torch.load(out / "ckpt.pt", weights_only=False)["iter_num"]
        proc.send_signal(signal.SIGINT)
        deadline = time.time() + 120
        while not list(out.glob("ckpt.pt.tmp-*")) and time.time() < deadline:  # the stop's save has begun
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
    code, text = pty_run(["--data_dir", data, "--out_dir", out, *big], first, twice, timeout=300)
    assert code == 1 and "Traceback" not in text, text[-2000:]
    assert before["ckpt"] == 0 and torch.load(out / "ckpt.pt", weights_only=False)["iter_num"] == 0
    assert not list(out.glob("ckpt.pt.tmp-*")) and "the checkpoint of step 0 is kept" in text


def test_only_leading_arguments_are_preset_files(data, tmp_path, monkeypatch, capsys):
    """A value ending in .py is a value: --out_dir run.py names a folder, and is not executed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.py").write_text("raise SystemExit('executed')\n")
    train.main(["--data_dir", str(data), "--out_dir", "out.py", "--wandb_run_name", "run.py", "--max_iters=0", *TINY])
    assert (tmp_path / "out.py" / "ckpt.pt").exists()
    code, _, err = run_script("train.py", ["--data_dir", data, *TINY, "run.py"], capsys)
    assert_one_error_line(code, err, "preset files go first")


def test_prepare_reads_file_names_literally(tmp_path):
    (tmp_path / "notes[1].txt").write_text("the bracketed one. " * 50)
    (tmp_path / "notes1.txt").write_text("the plain one! " * 50)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "prepare.py"), "--files", str(tmp_path / "notes[1].txt"),
                           "--out_dir", str(tmp_path / "data"), "--num_proc=1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "data" / "notes[1]"
    ids = open(folder / "train.bin", "rb").read() + open(folder / "val.bin", "rb").read()
    text = bytes(b for b in ids[::2] if b < 256).decode()  # uint16 little-endian byte ids
    assert "bracketed" in text and "plain" not in text


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "."])
def test_prepare_keeps_name_inside_out_dir(name, tmp_path, capsys):
    (tmp_path / "t.txt").write_text("some text " * 20)
    before = checksums(tmp_path)
    code, _, err = run_script("prepare.py", ["--files", tmp_path / "t.txt", "--out_dir", tmp_path / "data", "--name",
                                          name, "--num_proc=1"], capsys)
    assert_one_error_line(code, err, "--name")
    assert checksums(tmp_path) == before


def test_a_resumed_run_keeps_its_global_batch(data, tmp_path, capsys):
    """Saved with 2 micro-steps per optimiser step and resumed without saying so (as after a run on 2 processes
    continued on 1): the run keeps 2, says so, and ends where the uninterrupted run ends."""
    args = ["--data_dir", str(data), "--eval_interval=2", "--log_interval=1", *TINY]
    train.main([*args, "--out_dir", str(tmp_path / "full"), "--max_iters=4", "--gradient_accumulation_steps=2"])
    train.main([*args, "--out_dir", str(tmp_path / "part"), "--max_iters=2", "--gradient_accumulation_steps=2"])
    capsys.readouterr()
    train.main([*args, "--out_dir", str(tmp_path / "part"), "--max_iters=4", "--resume"])
    assert "keeps its global batch: 2 micro-steps per optimiser step" in capsys.readouterr().err
    full, part = (torch.load(tmp_path / r / "ckpt.pt", weights_only=False) for r in ("full", "part"))
    assert part["run"]["gradient_accumulation_steps"] == 2
    assert part["run"]["tokens_per_step"] == full["run"]["tokens_per_step"]
    assert part["best_val_loss"] == full["best_val_loss"]
    for name, t in full["model"].items():
        assert torch.equal(t, part["model"][name]), name


@pytest.mark.slow  # torchrun, two processes
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="the worker is killed with SIGKILL (POSIX)")
def test_a_killed_process_of_a_torchrun_run_is_one_line(data, tmp_path):
    """kill -9 of one of two processes: the one left ends in one `error:` line naming the checkpoint kept (its
    collective lost its peer), not a traceback; the checkpoint and the log are whole."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "train.py"), "--data_dir", str(data), "--out_dir", str(run), "--max_iters=100000",
           "--eval_interval=20", "--eval_iters=1", "--batch_size=2", *TINY]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 120
        while not os.path.exists(run / "ckpt.pt") or len(records(run / "log.jsonl")) < 2:  # saved at step 0 and 20
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "timeout"
            time.sleep(0.2)
        workers = subprocess.run(["pgrep", "-f", f"train.py --data_dir {data} --out_dir {run}"], capture_output=True,
                                 text=True).stdout.split()
        os.kill(int(max(workers, key=int)), signal.SIGKILL)  # the later-started worker
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    ours = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and "another process of this run stopped" in ours[0] and "is kept in" in ours[0], err[-3000:]
    assert "[rank" not in err  # no worker's traceback (torchrun's own report of the killed worker follows)
    read_checkpoint(str(run / "ckpt.pt"))
    assert all("iter" in r for r in records(run / "log.jsonl"))


@pytest.mark.slow  # torchrun, two processes
@pytest.mark.skipif(not hasattr(os, "killpg"), reason="a terminal's Ctrl-C to a process group needs os.killpg (POSIX)")
def test_ctrl_c_stops_both_processes_of_a_torchrun_run_at_one_saved_step(data, tmp_path):
    """Ctrl-C in the terminal reaches torchrun and both workers: the ranks agree on the next logged step, save it
    together and stop; the checkpoint holds that step, and --resume goes on from it."""
    run = tmp_path / "run"
    args = [os.path.join(ROOT, "train.py"), "--data_dir", str(data), "--out_dir", str(run), "--eval_interval=100000",
            "--eval_iters=1", "--batch_size=2", "--log_interval=5", *TINY]
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args,
                             "--max_iters=100000"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        deadline = time.time() + 120
        while len([r for r in records(run / "log.jsonl") if "loss" in r]) < 2:  # steps 5 and 10 logged
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "timeout"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    ours = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and "[rank" not in err, err[-3000:]
    step = int(re.search(r"interrupted at step (\d+);", ours[0]).group(1))
    assert step >= 10 and step % 5 == 0 and f"the checkpoint of step {step} is kept" in ours[0], ours[0]
    assert read_checkpoint(str(run / "ckpt.pt"), ("model_name", "iter_num"))["iter_num"] == step
    resumed = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                              *args, f"--max_iters={step + 5}", "--resume"], capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_checkpoint(str(run / "ckpt.pt"), ("model_name", "iter_num"))["iter_num"] == step + 5


def test_a_resume_with_another_global_batch_counts_its_tokens_on(data, saved_run, tmp_path, capsys):
    """--batch_size changed on --resume: the run says so in one note and counts on from the saved tokens at its own
    tokens per step; every record holds the count, and eval.py --curves reads it (never steps x one batch)."""
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    saved = read_checkpoint(str(run / "ckpt.pt"), ("model_name", "run", "tokens_seen"), mmap=True)
    per_step = saved["run"]["tokens_per_step"]
    assert saved["tokens_seen"] == 4 * per_step == 4 * 4 * 32  # 4 steps of 4 windows of 32 tokens
    code, _, err = run_script("train.py", ["--data_dir", data, "--out_dir", run, "--max_iters=6", "--eval_interval=2",
                                           "--log_interval=1", *TINY, "--batch_size=2", "--resume"], capsys)
    assert code == 0 and "note: the run resumes with 64 tokens per optimiser step where it saved 128" in err, err
    resumed = read_checkpoint(str(run / "ckpt.pt"), ("model_name", "tokens_seen"), mmap=True)
    assert resumed["tokens_seen"] == 4 * 128 + 2 * 64
    log = records(run / "log.jsonl")
    assert [(r["iter"], r["tokens"]) for r in log if "loss" in r][-3:] == [(4, 512), (5, 576), (6, 640)]
    code, out, _ = run_script("eval.py", ["--curves", run, "--plot", "false"], capsys)
    assert code == 0 and "6 steps (640 tokens)" in out, out
