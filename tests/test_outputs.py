"""Every output path a script writes, made bad in every way a path can be bad (test_files.py's sibling for the
files scripts write): each run ends, before any work, in exactly one `error:` line naming the option, and nothing
is created. Then every hint the scripts print: the command between its backticks is run, as printed, and it no
longer fails for the reason that printed it."""
import os
import re
import shlex

import pytest

from conftest import SUB, alarm, run_printed, run_script
from test_errors import assert_one_error_line

# script -> its options that name something it writes: (option, "file" or "folder"); the arguments it needs besides
OUTPUTS = {
    "train.py": [("out_dir", "folder")],
    "prepare.py": [("out_dir", "folder")],
    "tools/bench.py": [("json", "file")],
    "eval.py": [("plot_path", "file")],
    "hf/export.py": [("to", "folder")],
    "tools/sweep.py": [("results", "folder"), ("runs_dir", "folder")],
    "tools/kernels.py": [("json", "file")],
}
UNWRITABLE = "/sys/outputs-test"  # sysfs takes no new file, also for root (a chmod'ed folder would not stop root)


def bad_paths(tmp, kind):
    """(way, path) for every way an output path can be bad."""
    a_file = tmp / "a_file"
    a_file.write_text("x")
    (tmp / "a_folder").mkdir()
    os.mkfifo(tmp / "a_fifo")
    ways = [("parent is a file", str(a_file / "out")), ("cannot be written", f"{UNWRITABLE}/out"),
            ("name refused", str(tmp / ("n" * 300))), ("NUL in the name", str(tmp / "a\0b")),
            ("a FIFO", str(tmp / "a_fifo"))]
    ways.append(("a folder where a file goes", str(tmp / "a_folder")) if kind == "file" else
                ("a file where a folder goes", str(a_file)))
    return ways


CASES = [(script, option, kind, way) for script, options in OUTPUTS.items() for option, kind in options
         for way in ("parent is a file", "cannot be written", "name refused", "NUL in the name", "a FIFO",
                     "a folder where a file goes" if kind == "file" else "a file where a folder goes")]


@pytest.mark.parametrize("script,option,kind,way", CASES, ids=[f"{s}-{o}-{w}" for s, o, _, w in CASES])
def test_a_bad_output_path_is_one_line_before_any_work(script, option, kind, way, tmp_path, capsys):
    if way == "cannot be written" and not os.path.isdir("/sys"):
        pytest.skip("no /sys here to stand for a folder that cannot be written")
    path = dict(bad_paths(tmp_path, kind))[way]
    extra = ["--out_dir", str(tmp_path / "run")] if script == "hf/export.py" else []
    before = sorted(os.listdir(tmp_path))
    with alarm():
        code, _, err = run_script(script, [*extra, f"--{option}", path], capsys)  # its one error boundary, in-process
    assert_one_error_line(code, err, f"--{option}")
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, nothing started


def test_a_fifo_where_a_script_writes_a_file_of_its_own_is_one_line(data_dir, tmp_path, capsys):
    """The files a script writes without an option naming them: the run folder's (its checkpoint, its log and the
    records a resumed run moves aside), eval.py's figures in the run folder, a sweep's results: each a FIFO in turn
    is refused in one line before any work, and nothing waits on it."""
    import train
    run = tmp_path / "run"
    train.main(["--data_dir", data_dir, "--out_dir", str(run), "--max_iters=2", "--eval_interval=2", "--n_layer=1",
                "--n_head=2", "--n_kv_head=1", "--n_embd=16", "--ffn_hidden=32", "--block_size=16", "--batch_size=2",
                "--eval_iters=1", "--device=cpu"])
    resume = ["train.py", "--data_dir", data_dir, "--out_dir", run, "--resume", "--max_iters=3"]
    cases = [("log.superseded.jsonl", resume),
             ("curves.png", ["eval.py", "--curves", run]),
             ("depth_map.png", ["eval.py", "--out_dir", run, "--loss=false", "--depth_map"]),
             ("logit_lens.png", ["eval.py", "--out_dir", run, "--tokens=40", "--logit_lens"]),
             ("wiring.png", ["eval.py", "--wiring", run])]
    for name, (script, *args) in cases:
        os.mkfifo(run / name)
        before = sorted(os.listdir(run))
        with alarm():
            code, _, err = run_script(script, args, capsys)
        assert_one_error_line(code, err, "not a regular file")
        assert name in err and sorted(os.listdir(run)) == before, err
        os.remove(run / name)
    results = tmp_path / "results"
    for name in ("RESULTS.md", "results.json", "curves.png"):
        results.mkdir(exist_ok=True)
        os.mkfifo(results / name)
        with alarm():
            code, _, err = run_script("tools/sweep.py", ["--table_only", "--results", results, "--data_dir", data_dir,
                                                         "--reuse=", "--device=cpu"], capsys)
        assert_one_error_line(code, err, "not a regular file")
        assert name in err, err
        os.remove(results / name)


def test_a_figure_that_cannot_be_written_names_the_option_that_chose_its_path(tiny_run, tmp_path, monkeypatch,
                                                                              capsys):
    """A figure eval.py puts in a run folder of its own accord (--plot_path ''), where that folder cannot be written
    (a read-only file system, as the temporary file that the check writes finds it): one line before any work, naming
    the options that choose where the figure goes (--plot_path, --plot false), not the option that named the run
    (--curves, --wiring, --out_dir: another run is no fix); nothing is printed or written."""
    import errno
    import shutil
    import tempfile
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    real = tempfile.TemporaryFile

    def read_only(*args, dir=None, **kwargs):
        if dir is not None and os.path.samefile(dir, run):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(*args, dir=dir, **kwargs)
    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    before = sorted(os.listdir(run))
    for name, args in [("curves.png", ["--curves", run]), ("wiring.png", ["--wiring", run]),
                       ("logit_lens.png", ["--out_dir", run, "--tokens=40", "--logit_lens"]),
                       ("depth_map.png", ["--out_dir", run, "--loss=false", "--depth_map"])]:
        code, out, err = run_script("eval.py", args, capsys)
        assert_one_error_line(code, err, "pass --plot false")
        assert name in err and "Read-only file system" in err and not out, err
        assert ("--plot_path" in err) == (name != "depth_map.png"), err  # the depth map's folder is the run's
        assert not any(option in err for option in ("--curves", "--wiring", "--out_dir")), err
        assert sorted(os.listdir(run)) == before


# ---- hints --------------------------------------------------------------------------------------------------

def hint(err):
    """The command between the backticks of an error line."""
    found = re.findall(r"`([^`]+)`", err)
    assert found, err
    return found[0]


@pytest.fixture
def run(capsys):
    """run(command, cwd): the command as printed, run in this process from cwd (conftest.run_printed); mode SUB runs
    it in a subprocess."""
    return lambda command, cwd, mode="": run_printed(command, cwd, capsys, mode)


@pytest.fixture
def sandbox(tmp_path, data_dir):
    """A folder to run from, with the prepared data under data/ as the scripts' defaults expect."""
    os.symlink(data_dir, tmp_path / "data")
    return tmp_path


FAST = ["--max_iters", "2", "--eval_iters", "1", "--batch_size", "2", "--block_size", "32", "--n_layer", "1"]


def test_a_misspelt_data_set_names_the_one_that_exists(sandbox, tmp_path_factory, run):
    data = tmp_path_factory.mktemp("empty_data")
    code, out = run(f"python train.py --dataset shakspeare --data_dir {data}", sandbox)
    assert code == 1 and "did you mean --dataset shakespeare?" in out
    command = hint(out)
    assert command == f"python prepare.py --dataset shakespeare --out_dir {data}"
    code, out = run(command, sandbox)
    assert code == 0, out  # it prepares the data set train.py now finds
    code, out = run(f"python train.py --dataset shakespeare --data_dir {data} --out_dir run {' '.join(FAST)}", sandbox)
    assert code == 0, out


def test_a_data_set_already_prepared_under_a_close_name(sandbox, run):
    code, out = run("python train.py --dataset shakespear", sandbox)
    assert code == 1 and "did you mean --dataset shakespeare? (data holds it)" in out


def test_a_name_of_your_own_gets_prepare_files(sandbox, run):
    code, out = run("python train.py --dataset my_notes", sandbox)
    command = hint(out)
    assert command == "python prepare.py --files FILE ... --name my_notes" and "knows no data set" in out
    (sandbox / "notes.txt").write_text("ROMEO: a line of my own.\n" * 400)
    code, out = run(command.replace("FILE ...", "notes.txt"), sandbox)  # the one placeholder, filled
    assert code == 0, out
    code, out = run(f"python train.py --dataset my_notes --out_dir run {' '.join(FAST)}", sandbox)
    assert code == 0, out


def test_a_web_data_set_gets_its_prepare_command(sandbox, tmp_path_factory, run, monkeypatch):
    data = tmp_path_factory.mktemp("empty_data")
    code, out = run(f"python train.py --dataset openwebtext --data_dir {data}", sandbox)
    command = hint(out)
    assert command == f"python prepare.py --dataset openwebtext --out_dir {data}"
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # the hub reads them when it is imported: a new process
        monkeypatch.setenv(k, "1")
    code, out = run(command, sandbox, SUB)
    assert "is not one of" not in out  # prepare.py takes the name; offline, it then says the hub cannot be reached


def test_no_checkpoint_gets_the_train_command_that_makes_it(sandbox, run):
    code, out = run("python sample.py --out_dir runs/first", sandbox)
    command = hint(out)
    assert code == 1 and command == "python train.py --out_dir runs/first"
    code, out = run(f"{command} {' '.join(FAST)}", sandbox)  # as printed, shortened to two steps
    assert code == 0, out
    code, out = run("python sample.py --out_dir runs/first --num_samples 1 --max_new_tokens 4", sandbox)
    assert code == 0, out


def test_a_file_given_as_the_run_folder_names_no_command_that_cannot_work(sandbox, run):
    (sandbox / "runs").mkdir()
    (sandbox / "runs" / "log.jsonl").write_text("{}\n")
    code, out = run("python sample.py --out_dir runs/log.jsonl", sandbox)
    assert code == 1 and "is a file, not a run folder" in out and "`" not in out


def test_a_path_with_a_space_is_quoted_in_the_command(sandbox, run):
    code, out = run("python sample.py --out_dir 'my runs/x'", sandbox)
    command = hint(out)
    assert code == 1 and command == "python train.py --out_dir 'my runs/x'"
    code, out = run(f"{command} {' '.join(FAST)}", sandbox)
    assert code == 0, out
    code, out = run("python sample.py --out_dir 'my runs/x' --num_samples 1 --max_new_tokens 4", sandbox)
    assert code == 0, out


def test_a_checkpoint_file_of_another_name_is_not_sent_to_train_py(sandbox, run):
    """train.py writes ckpt.pt, so a missing best.pt gets no train.py command (it would not make best.pt); where the
    folder holds a ckpt.pt, the folder is named, and passing it works."""
    code, out = run("python sample.py --out_dir runs/x/best.pt", sandbox)
    assert code == 1 and "`" not in out and "pass an existing .pt file or a run folder" in out, out
    code, out = run(f"python train.py --out_dir runs/x {' '.join(FAST)}", sandbox)
    assert code == 0, out
    code, out = run("python sample.py --out_dir runs/x/best.pt", sandbox)
    assert code == 1 and "perhaps --out_dir runs/x," in out, out
    code, out = run("python sample.py --out_dir runs/x --num_samples 1 --max_new_tokens 4", sandbox)
    assert code == 0, out


@pytest.mark.parametrize("name", ["a/b", "..", "."])
def test_a_data_set_name_that_is_no_folder_name_gets_no_command_prepare_refuses(name, sandbox, run):
    code, out = run(f"python train.py --dataset {shlex.quote(name)}", sandbox)
    assert code == 1 and "`" not in out and "names one folder inside --data_dir" in out, out


def test_a_half_prepared_data_set_is_not_suggested_as_itself(sandbox, tmp_path_factory, run):
    data = tmp_path_factory.mktemp("half")
    (data / "broken").mkdir()
    (data / "broken" / "meta.json").write_text((sandbox / "data" / "shakespeare" / "meta.json").read_text())
    code, out = run(f"python train.py --dataset broken --data_dir {data}", sandbox)
    assert code == 1 and "did you mean" not in out, out
    command = hint(out)
    assert command == f"python prepare.py --files FILE ... --name broken --out_dir {data}"
    (sandbox / "notes.txt").write_text("ROMEO: a line of my own.\n" * 400)
    code, out = run(command.replace("FILE ...", "notes.txt"), sandbox)
    assert code == 0, out
    code, out = run(f"python train.py --dataset broken --data_dir {data} --out_dir run {' '.join(FAST)}", sandbox)
    assert code == 0, out


def test_a_split_too_small_for_any_block_size_asks_for_more_text(sandbox, tmp_path_factory, run):
    """prepare.py makes no data set too small to train on; one made otherwise (an older prepare.py's, or by hand)
    gets train.py's own line, which asks for more text too."""
    data = tmp_path_factory.mktemp("tiny")
    (sandbox / "tiny.txt").write_text("ROMEO: too short.\n" * 5)
    code, out = run(f"python prepare.py --files tiny.txt --out_dir {data}", sandbox)
    assert code == 1 and "tiny.txt: 91 tokens in all, too few to train on" in out and "add text" in out, out
    assert not (data / "tiny").exists()
    (data / "tiny").mkdir()
    ids = list(b"ROMEO: too short.\n" * 5)
    (data / "tiny" / "train.bin").write_bytes(b"".join(i.to_bytes(2, "little") for i in ids[:-2]))
    (data / "tiny" / "val.bin").write_bytes(b"".join(i.to_bytes(2, "little") for i in ids[-2:]))
    (data / "tiny" / "meta.json").write_text('{"tokenizer": "byte", "vocab_size": 257, "dtype": "uint16"}')
    code, out = run(f"python train.py --data_dir {data} --dataset tiny --block_size 32", sandbox)
    assert code == 1 and "lower --block_size" not in out and "prepare more text" in out, out


@pytest.mark.parametrize("script", ["sample.py", "eval.py", "hf/export.py", "tools/sweep.py", "tools/bench.py"])
def test_an_unknown_option_gets_no_unrelated_did_you_mean(script, capsys):
    code, _, err = run_script(script, ["--model", "vanilla"], capsys)
    assert code == 1 and "did you mean" not in err, err


def test_a_run_resumed_past_max_iters_says_so(sandbox, run):
    code, out = run(f"python train.py --out_dir run {' '.join(FAST)}", sandbox)
    assert code == 0, out
    code, out = run("python train.py --out_dir run --resume --max_iters 1", sandbox)
    assert code == 1 and "at step 2, past --max_iters 1" in out, out
    code, out = run("python train.py --out_dir run --resume --max_iters 3", sandbox)  # as the line says
    assert code == 0, out


def test_the_stop_and_divergence_lines_name_only_what_helps():
    """--resume only where a checkpoint was written; --dtype float32 only where the run computed in another dtype."""
    import types
    from plumbing.errors import diverged, stopped
    cfg, proc = types.SimpleNamespace(out_dir="run"), types.SimpleNamespace(world=1)
    assert "continue with --resume" in str(stopped(KeyboardInterrupt(), 3, 2, cfg, proc))
    unsaved = str(stopped(KeyboardInterrupt(), 3, None, cfg, proc))
    assert "--resume" not in unsaved and "run the same command again" in unsaved
    import train
    cfg = train.parse_args(["--out_dir", "run"])[0]
    assert "--dtype float32" in str(diverged("loss", float("nan"), 1, cfg, {}, set(), None, "bfloat16"))
    assert "--dtype float32" not in str(diverged("loss", float("nan"), 1, cfg, {}, set(), None, "float32"))


@pytest.mark.parametrize("module", ["common.py", "generate.py", "hf/convert.py", "plumbing/options.py",
                                    "tools/tables.py", "model_vanilla.py", "model_vertical.py"])
def test_a_library_module_run_as_a_script_says_which_script_to_run(module, sandbox, run):
    code, out = run(f"python {module} --help", sandbox)
    assert code == 1 and ("not a script" in out or "library module" in out), out
    command = hint(out)
    if "--model" in command:  # a model file's: trains; shortened to two steps
        command += " --out_dir run " + " ".join(FAST)
    code, out = run(command, sandbox)
    assert code == 0, out


def test_a_required_option_shows_no_default(capsys):
    code, out, _ = run_script("hf/export.py", ["--help"], capsys)
    line = " ".join(out.split("--to STR", 1)[1].split("--dtype")[0].split())
    assert code == 0 and "default" not in line, line
    code, _, err = run_script("hf/export.py", [], capsys)
    assert_one_error_line(code, err, "--to")


def test_help_has_one_options_heading_and_shows_an_empty_choice(capsys):
    """--help lists a script's options under argparse's one `options:` heading (beside --help), and an empty choice
    as '' (train.py --size: '' = the model file's own defaults)."""
    for script in ("sample.py", "eval.py", "prepare.py", "tools/bench.py", "hf/export.py"):
        code, out, _ = run_script(script, ["--help"], capsys)
        assert code == 0 and out.count("\noptions:\n") == 1, (script, out)
    code, out, _ = run_script("train.py", ["--help"], capsys)
    assert code == 0 and "(choices: '', 50m, 100m, 300m)" in " ".join(out.split())
    code, out, _ = run_script("sample.py", ["--help"], capsys)  # a blank default shown as it is, not as nothing
    assert code == 0 and "(default: '\\n')" in " ".join(out.split()), out
