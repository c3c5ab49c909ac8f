"""What a user is handed is read, never run, and what a script replaces it replaces whole: a checkpoint holding a
pickled callable is refused by every script that reads checkpoints (one reader, torch.load(weights_only=True)); a
data set is swapped in by one rename, also when prepare.py is killed mid-way, and a corpus too small to train on
replaces nothing; a resumed run keeps its learning-rate schedule. (A preset with a function call: test_files.py.)"""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import train
from conftest import ROOT, TINY, run_script, shakespeare_sample
from test_errors import assert_one_error_line, checksums

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(data_dir, tmp_path_factory):
    return shakespeare_sample(data_dir, tmp_path_factory.mktemp("trust") / "data")


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
    ("hf/export.py", ["--to", "{tmp}/exported"]),
    ("train.py", ["--resume", "--max_iters=4", "--data_dir", "{data}", *TINY]),
    ("tools/bench.py", ["--close_gates=0", "--sample_tokens=2"]),  # --checkpoint: the option reads the run's ckpt.pt
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
    option = "--checkpoint" if script == "tools/bench.py" else "--out_dir"
    args = [a.format(tmp=tmp_path, data=data) for a in args]
    code, out, err = run_script(script, [option, hostile, *args], capsys)
    assert_one_error_line(code, err, f"{hostile / 'ckpt.pt'} holds posix.system")
    assert "could run code" in err and not marker.exists()
    assert checksums(tmp_path) == before


def test_curves_read_no_pickled_callable(run, tmp_path, capsys):
    """eval.py --curves reads a run's tokens per step from its checkpoint: a hostile one runs nothing, and the curves
    are plotted against steps, as for any checkpoint it cannot read."""
    hostile = tmp_path / "run"
    shutil.copytree(run, hostile)
    ckpt = torch.load(run / "ckpt.pt", weights_only=True)
    ckpt["run"]["note"] = Payload(tmp_path / "ran")
    torch.save(ckpt, hostile / "ckpt.pt")
    code, out, err = run_script("eval.py", ["--curves", hostile, "--plot=false"], capsys)
    assert code == 0 and "2 steps" in out and not (tmp_path / "ran").exists(), out + err


# ---- prepare.py: a data set is replaced whole or not at all ----------------------------------------------------

def killed_prepare(point, argv, exchange):
    """prepare.main(argv) in a forked copy of this process, killed (SIGKILL, as by the OOM killer) just before or
    just after the n-th call of one of the file system steps that replace a data set (point "before:n" or
    "after:n"); exchange False runs it as on a system without an atomic exchange of two folders (renames one by
    one). Returns the steps it called and how it ended: "killed" or its exit code."""
    import prepare
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own copies of os.rename and the others, so the test process keeps the real ones
        code = 1
        try:
            os.close(read)
            when, n = point.split(":")
            steps = []

            def killing(f, name):
                def step(*args):
                    steps.append(name)
                    os.write(write, name.encode() + b" ")
                    if when == "before" and len(steps) == int(n):
                        os.kill(os.getpid(), signal.SIGKILL)
                    out = f(*args)
                    if when == "after" and len(steps) == int(n):
                        os.kill(os.getpid(), signal.SIGKILL)
                    return out
                return step
            os.rename, shutil.rmtree = killing(os.rename, "rename"), killing(shutil.rmtree, "rmtree")
            prepare.exchange = killing(prepare.exchange if exchange else lambda a, b: False, "exchange")
            prepare.main(argv)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        steps = f.read().split()
    _, status = os.waitpid(pid, 0)
    return steps, "killed" if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def readable(folder):
    """What train.py checks before it trains on a data set: meta.json, and both splits whole and as it says."""
    from plumbing.files import read_meta
    from plumbing.files import open_split
    meta = read_meta(str(folder.parent), folder.name)
    for split in ("train", "val"):
        open_split(str(folder.parent), folder.name, split, meta, meta["vocab_size"], 256)
    return meta["dataset"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the killed copy of the process is made with os.fork (POSIX)")
@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "renames"])
def test_a_killed_prepare_leaves_a_whole_data_set(exchange, tmp_path):
    """Killed at every step that replaces the data set, prepare.py leaves the old one or the new one, whole (with
    renames one by one, the next run puts the old one back); the next run removes what the killed one left, and a
    corpus too small to train on replaces nothing."""
    import prepare
    from plumbing.errors import ConfigError
    (tmp_path / "old.txt").write_text("The data set a killed run must not split. " * 20)
    (tmp_path / "new.txt").write_text("Its replacement, whole or not at all. " * 20)
    (tmp_path / "tiny.txt").write_text("\n\n\n")
    data = tmp_path / "data"
    args = ["--out_dir", str(data), "--name=d", "--num_proc=1", "--files"]
    prepare.main([*args, str(tmp_path / "old.txt")])
    original = checksums(data / "d")
    steps, _ = killed_prepare("after:99", [*args, str(tmp_path / "new.txt")], exchange)
    assert steps == (["exchange", "rmtree"] if exchange else ["exchange", "rename", "rename", "rmtree"])
    for point in [f"{when}:{n}" for n in range(1, len(steps) + 1) for when in ("before", "after")]:
        prepare.main([*args, str(tmp_path / "old.txt")])
        assert checksums(data / "d") == original and os.listdir(data) == ["d"]
        _, end = killed_prepare(point, [*args, str(tmp_path / "new.txt")], exchange)
        assert end == "killed", point
        if exchange or point == "before:1":  # swapped in one step: whole at every point
            assert readable(data / "d") in ("old.txt", "new.txt"), point
        with pytest.raises(ConfigError, match="tiny.txt: 4 tokens in all, too few to train on"):
            prepare.main([*args, str(tmp_path / "tiny.txt")])  # it first puts back or removes what was left
        assert os.listdir(data) == ["d"], (point, os.listdir(data))
        assert readable(data / "d") in ("old.txt", "new.txt"), point
        if readable(data / "d") == "old.txt":
            assert checksums(data / "d") == original, point
    prepare.main([*args, str(tmp_path / "new.txt")])
    assert readable(data / "d") == "new.txt" and os.listdir(data) == ["d"]
    assert sorted(os.listdir(data / "d")) == ["meta.json", "train.bin", "val.bin"]


def test_prepare_replaces_no_folder_that_holds_files_of_the_users(tmp_path):
    import prepare
    from plumbing.errors import ConfigError
    (tmp_path / "new.txt").write_text("A data set is replaced whole. " * 30)
    os.makedirs(tmp_path / "data" / "d")
    (tmp_path / "data" / "d" / "notes.txt").write_text("mine")
    before = checksums(tmp_path)
    with pytest.raises(ConfigError, match="holds notes.txt, which prepare.py did not write"):
        prepare.main(["--files", str(tmp_path / "new.txt"), "--out_dir", str(tmp_path / "data"), "--name=d",
                      "--num_proc=1"])
    assert checksums(tmp_path) == before


def test_prepare_replaces_a_linked_data_set_where_it_is(tmp_path):
    """data/d as a link to a folder on another disk: the set is replaced there, and the link stays."""
    import prepare
    (tmp_path / "new.txt").write_text("A data set kept on another disk. " * 30)
    os.makedirs(tmp_path / "big" / "d")
    os.makedirs(tmp_path / "data")
    os.symlink(tmp_path / "big" / "d", tmp_path / "data" / "d")
    prepare.main(["--files", str(tmp_path / "new.txt"), "--out_dir", str(tmp_path / "data"), "--name=d",
                  "--num_proc=1"])
    assert os.path.islink(tmp_path / "data" / "d") and readable(tmp_path / "data" / "d") == "new.txt"
    assert os.listdir(tmp_path / "big") == ["d"] and os.listdir(tmp_path / "data") == ["d"]


# ---- the learning-rate schedule survives --resume --------------------------------------------------------------

def lrs(run):
    return [r["lr"] for r in map(json.loads, open(run / "log.jsonl")) if "lr" in r]


def same_state(a, b):
    """The weights and the optimiser state of two checkpoints, bit for bit."""
    a, b = (torch.load(r / "ckpt.pt", weights_only=True) for r in (a, b))
    assert a["iter_num"] == b["iter_num"]
    for name, t in a["model"].items():
        assert torch.equal(t, b["model"][name]), name
    for i, state in a["optimizer"]["state"].items():
        assert all(torch.equal(v, b["optimizer"]["state"][i][k]) for k, v in state.items()), i


@pytest.mark.parametrize("options", [[], ["--warmup_iters=2"]], ids=["defaults", "short_warmup"])
def test_a_run_resumed_with_more_steps_is_the_longer_run(options, data, tmp_path, capsys):
    """4 steps, resumed to 8, equal 8 steps bit for bit with the default options (saved within the warm-up, the run
    takes the new horizon, and the next checkpoint saves it). With a cosine that has begun (a short warm-up), the
    resumed run keeps the horizon it was saved with (step 4), says so in one line, and equals the run that had that
    horizon from the start: the learning rate never jumps back up."""
    args = ["--data_dir", str(data), "--log_interval=1", *TINY, *options]
    train.main([*args, "--out_dir", str(tmp_path / "part"), "--max_iters=4"])
    capsys.readouterr()
    train.main([*args, "--out_dir", str(tmp_path / "part"), "--max_iters=8", "--resume"])
    notes = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith("note:") and "warm-up" not in line]
    horizon = [] if not options else ["--lr_decay_iters=4"]  # the uninterrupted run the resumed one must equal
    train.main([*args, "--out_dir", str(tmp_path / "full"), "--max_iters=8", *horizon])
    same_state(tmp_path / "part", tmp_path / "full")
    assert lrs(tmp_path / "part") == lrs(tmp_path / "full")
    if options:
        assert notes == ["note: the run keeps its learning-rate schedule: the cosine reaches --min_lr at step 4 as "
                         "saved, not at --max_iters 8; pass --lr_decay_iters to set another step"], notes
        assert lrs(tmp_path / "part")[4:] == [1e-4] * 4  # past the horizon: min_lr, not a jump back up
        saved = torch.load(tmp_path / "part" / "ckpt.pt", weights_only=True)["train_config"]
        assert (saved["lr_decay_iters"], saved["max_iters"]) == (4, 8)  # the horizon is kept for the next resume
    else:
        assert notes == []
        saved = torch.load(tmp_path / "part" / "ckpt.pt", weights_only=True)["train_config"]
        assert (saved["lr_decay_iters"], saved["max_iters"]) == (0, 8)  # as the uninterrupted run's


# ---- memory that cannot be allocated: one line at the one allocation boundary (plumbing/errors.py's main_boundary) ------------

# (id, train.py options, the expected fragment): a width whose weights cannot be allocated, a batch whose first
# forward pass cannot (before anything is written), and a vocabulary whose gradients and AdamW state (allocated at
# the first optimiser step, after the checkpoint of step 0) cannot; each in a process whose address space is
# limited to what train.py's imports map plus 1.875 GiB (a CUDA build of torch maps about 3 GiB of libraries, the
# CPU build about 0.6 GiB, before anything is allocated)
OUT_OF_MEMORY = [
    ("width", ["--n_layer=1", "--n_embd=16384", "--n_head=1", "--n_kv_head=1", "--ffn_hidden=8"],
     "out of memory: an allocation of 3.0 GiB failed; lower --batch_size"),
    ("batch", ["--n_layer=1", "--n_embd=8", "--n_head=1", "--n_kv_head=1", "--ffn_hidden=8", "--block_size=256",
               "--batch_size=16", "--vocab_size=131072"],  # logits of 16 x 256 tokens: 2 GiB
     "out of memory: an allocation of 2.0 GiB failed; lower --batch_size"),
    ("first_step", ["--n_layer=1", "--n_embd=512", "--n_head=1", "--n_kv_head=1", "--ffn_hidden=8", "--block_size=8",
                    "--batch_size=1", "--vocab_size=131072"],
     "out of memory at step 0: an allocation of 256 MiB failed; the checkpoint of step 0 is kept in"),
]


def imported_address_space():
    """Bytes of address space a process holds once it has imported train.py (torch and its libraries mapped)."""
    probe = ("import re, train; print(re.search(r'VmSize:\\s+(\\d+) kB', open('/proc/self/status').read())"
             ".group(1))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT})
    return int(out.stdout) << 10


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS limits allocations on Linux")
@pytest.mark.parametrize("case", OUT_OF_MEMORY, ids=[c[0] for c in OUT_OF_MEMORY])
def test_memory_that_cannot_be_allocated_is_one_line(case, data, tmp_path):
    import resource
    _, options, fragment = case
    size = imported_address_space() + (15 << 27)
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (size, size))  # noqa: E731
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--data_dir", str(data), "--out_dir",
                           str(tmp_path / "run"), "--max_iters=2", "--eval_iters=1", "--warmup_iters=0", "--device=cpu",
                           *options],
                          capture_output=True, text=True, preexec_fn=limit, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert_one_error_line(proc.returncode, proc.stderr, fragment)
    assert "or the model's size in a new run (--n_embd, --n_layer, --block_size)" in proc.stderr
    if case[0] == "first_step":  # what was saved is whole
        assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["iter_num"] == 0
    else:
        assert not (tmp_path / "run").exists()


# ---- hints that lead somewhere when followed -------------------------------------------------------------------

def test_a_file_as_the_run_folder_names_a_folder_only_where_it_holds_a_checkpoint(run, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    code, _, err = run_script("sample.py", ["--out_dir", tmp_path / "notes.txt"], capsys)
    assert_one_error_line(code, err, "is a file, not a run folder")
    assert "perhaps" not in err  # tmp_path holds no checkpoint: no folder is suggested
    code, _, err = run_script("sample.py", ["--out_dir", run / "log.jsonl"], capsys)
    assert_one_error_line(code, err, f"(perhaps --out_dir {run}, which holds ckpt.pt)")
    code, out, err = run_script("sample.py", ["--out_dir", run, "--num_samples=1", "--max_new_tokens=2"], capsys)
    assert code == 0 and out, err  # followed, the hint works


def test_init_from_a_folder_of_another_model_suggests_a_model_that_loads_it(run, data, tmp_path, capsys):
    """A custom-code folder of another model file is checked whole before --model is suggested: passing the
    suggested --model then starts the run; a folder that could not load under any --model says what it lacks."""
    skip = ["--model=skipmiddle", "--data_dir", str(data), *TINY]
    train.main([*skip, "--out_dir", str(tmp_path / "sm"), "--max_iters=0"])
    code, _, err = run_script("hf/export.py", ["--out_dir", tmp_path / "sm", "--to", tmp_path / "folder"], capsys)
    assert code == 0, err
    base = ["--data_dir", data, *TINY, "--max_iters=0", "--init_from", tmp_path / "folder"]
    code, _, err = run_script("train.py", [*base, "--out_dir", tmp_path / "a"], capsys)
    assert_one_error_line(code, err, "holds a model_skipmiddle.py run, not a model_vanilla.py one; pass --model "
                          "skipmiddle")
    code, _, err = run_script("train.py", [*base, "--out_dir", tmp_path / "a", "--model=skipmiddle"], capsys)
    assert code == 0, err
    config = json.loads((tmp_path / "folder" / "config.json").read_text())
    (tmp_path / "folder" / "config.json").write_text(json.dumps({**config, "model_name": "vertical"}))
    for model in ("vanilla", "vertical"):  # it holds no model_vertical.py: --model vertical would not load it either
        code, _, err = run_script("train.py", [*base, "--out_dir", tmp_path / "b", f"--model={model}"], capsys)
        assert_one_error_line(code, err, "lacks model_vertical.py")
    (tmp_path / "folder" / "config.json").write_text(json.dumps({**config, "model_name": "nosuch"}))
    shutil.copy(tmp_path / "folder" / "model_skipmiddle.py", tmp_path / "folder" / "model_nosuch.py")
    code, _, err = run_script("train.py", [*base, "--out_dir", tmp_path / "b"], capsys)
    assert_one_error_line(code, err, "names model_nosuch.py, which this repository does not have")


@pytest.mark.parametrize("train_args,fragment", [
    ("--max_iter 3", "unrecognized arguments: --max_iter 3 (the sweep sets --max_iters for every run: use "
     "python -m tools.sweep --train_iters); see train.py --help"),  # one way: not a hint to --max_iters, which it sets
    ("--eval_iters=1 --lerning_rate=1e-3", "(did you mean --learning_rate?); see train.py --help"),
    ("--va_lr=0.1", "drop --va_lr (the sweep sets --model for every run: use python -m tools.sweep --runs)"),
    ("--warmup_iters=-1", "--warmup_iters must be 0 or more, not -1"),
], ids=["owned", "typo", "other_model", "bad_value"])
def test_sweep_checks_its_train_args_before_any_run(train_args, fragment, data, tmp_path, capsys):
    code, out, err = run_script("tools/sweep.py", ["--train_args", train_args, "--data_dir", data, "--runs_dir",
                                                   tmp_path / "runs", "--results", tmp_path / "results", "--reuse=",
                                                   "--train_iters=2", "--seeds=1", "--device=cpu", "--runs=vanilla"],
                                capsys)
    assert_one_error_line(code, err, fragment)
    assert "did you mean --max_iters" not in err
    assert not out and not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()


def test_bench_checks_close_gates_before_measuring(capsys):
    code, out, err = run_script("tools/bench.py", ["--close_gates=99", "--size=small", "--device=cpu"], capsys)
    assert_one_error_line(code, err, "--close_gates must be between 0 and 2 for 3 gates")
    assert not out  # nothing measured, not even vanilla


# ---- transformers' generate() on an exported folder: what Llama's folder does, ours does -----------------------

@pytest.mark.extras
@pytest.mark.parametrize("name", ["vertical", "skipmiddle"])
def test_generate_takes_a_row_of_pads_and_hidden_states_past_the_context(name, data, tmp_path, capsys):
    """A batch with a row of pads only generates (the row has nothing to continue: its first token is drawn from
    zeros, then it goes on from it); generate(output_hidden_states=True) past the context gives each step's window
    and the same greedy tokens as without."""
    transformers = pytest.importorskip("transformers")
    train.main([f"--model={name}", "--data_dir", str(data), "--out_dir", str(tmp_path / "run"), "--max_iters=0",
                *TINY])
    code, _, err = run_script("hf/export.py", ["--out_dir", tmp_path / "run", "--to", tmp_path / "hf"], capsys)
    assert code == 0, err
    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    ids, mask = torch.tensor([[256, 256, 256], [65, 66, 67]]), torch.tensor([[0, 0, 0], [1, 1, 1]])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=256)
    alone = model.generate(input_ids=ids[1:], max_new_tokens=3, do_sample=False, pad_token_id=256)
    assert out.shape == (2, 6) and torch.equal(out[1], alone[0])  # the real row as it generates alone
    assert out[0, 3] == 0  # zeros: greedy takes the first token
    prompt = torch.randint(0, 256, (2, 30), generator=torch.Generator().manual_seed(0))  # the context is 32
    plain = model.generate(input_ids=prompt, max_new_tokens=6, do_sample=False, pad_token_id=256)
    full = model.generate(input_ids=prompt, max_new_tokens=6, do_sample=False, pad_token_id=256,
                          output_hidden_states=True, return_dict_in_generate=True)
    assert torch.equal(full.sequences, plain) and len(full.hidden_states) == 6
    # the last step read 35 tokens: its window restarted at 33 - 32 // 2 = 17 when the 33rd token came (generate.py)
    last, seq = full.hidden_states[-1], full.sequences[:, :35]
    _, _, blocks = model.model(seq[:, 17:], return_hidden=True)
    assert torch.allclose(last[-1][:, 17:], blocks[-1], atol=1e-5) and not last[-1][:, :17].any()
