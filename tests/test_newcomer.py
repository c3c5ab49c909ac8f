"""A newcomer's first hour: advice that points at the runs there are, a training run that ends by saying where its
checkpoint is and what to run next, a short warm-up said at the start, statistics a console line can hold, figures
that mark their points and say each run's steps, and every tool's usage as it is run. Each hint is followed as
printed (conftest.run_printed), and must work."""
import json
import os
import re
import shutil

import pytest

import train
from conftest import ROOT, TINY, run_printed, run_script, shakespeare_sample
from test_errors import assert_one_error_line


@pytest.fixture(scope="module")
def data(data_dir, tmp_path_factory):
    return shakespeare_sample(data_dir, tmp_path_factory.mktemp("newcomer") / "data")


@pytest.fixture
def here(data, tmp_path):
    """A folder to work in, as the README's commands do: data/ prepared, one run in out/vanilla."""
    os.symlink(data, tmp_path / "data")
    train.main(["--out_dir", str(tmp_path / "out" / "vanilla"), "--data_dir", str(data), "--max_iters=2",
                "--eval_interval=2", *TINY])
    return tmp_path


def hint(err):
    found = re.findall(r"`([^`]+)`", err)
    assert found, err
    return found[0]


@pytest.mark.parametrize("script", ["sample.py", "eval.py"])
def test_no_out_dir_names_the_run_there_is_and_the_command_works(script, here, capsys):
    """Without --out_dir (out/, the default, holds no checkpoint of its own but a run in out/vanilla): the run is
    named, with the command of this script that uses it; no advice to train into out/, beside the runs."""
    code, out = run_printed(f"python {script}", here, capsys)
    assert code == 1 and "the runs here are out/vanilla" in out and "train.py" not in out, out
    command = hint(out)
    assert command == f"python {script} --out_dir out/vanilla"
    extra = " --max_new_tokens 4 --num_samples 1" if script == "sample.py" else " --tokens 40"
    code, out = run_printed(command + extra, here, capsys)
    assert code in (0, None), out


def test_a_data_set_folder_as_out_dir_gets_no_advice_to_train_there(here, capsys):
    before = sorted(os.listdir(here / "data" / "shakespeare"))
    shutil.rmtree(here / "out")  # no run anywhere near: still no training into the data set's folder
    code, out = run_printed("python sample.py --out_dir data/shakespeare", here, capsys)
    assert code == 1 and "data/shakespeare holds a prepared data set, not a run" in out, out
    assert "`" not in out  # no command: none would help
    assert sorted(os.listdir(here / "data" / "shakespeare")) == before


def test_an_empty_or_new_folder_still_gets_the_train_command_that_makes_it(here, capsys):
    shutil.rmtree(here / "out")
    code, out = run_printed("python sample.py --out_dir runs/first", here, capsys)
    assert code == 1 and hint(out) == "python train.py --out_dir runs/first", out


def test_a_run_ends_on_one_line_saying_where_it_is_and_what_to_run_next(data, tmp_path, capsys):
    """The last line of a run: its checkpoint, the step and loss it holds, and two commands that work as printed."""
    run = tmp_path / "my run"
    code, out, err = run_script("train.py", ["--data_dir", data, "--out_dir", run, "--max_iters=4",
                                             "--eval_interval=2", *TINY], capsys)
    assert code in (0, None), err
    last = out.strip().splitlines()[-1]
    best = min(r["val_loss"] for r in map(json.loads, open(run / "log.jsonl")) if "val_loss" in r)
    took, _, rest = last.partition(": ")  # the run's wall time, then where the run is and what to run next
    assert re.fullmatch(r"done in [\dhms]+", took), last
    assert rest.startswith(f"{run / 'ckpt.pt'} holds step 4 (best val loss {best:.4f}); sample from it: "
                           f"`python sample.py --out_dir '{run}'`; evaluate it: `python eval.py --out_dir '{run}'`; "
                           "to train on, run the same command with --resume and a larger --max_iters"), last
    for command in re.findall(r"`([^`]+)`", last):
        code, printed = run_printed(command + " --max_new_tokens 4 --num_samples 1" if "sample" in command else
                                    command + f" --tokens 40 --data_dir {data}", tmp_path, capsys)
        assert code in (0, None), (command, printed)


def test_a_run_within_its_warm_up_says_so_at_the_start(data, tmp_path, capsys):
    code, out, err = run_script("train.py", ["--data_dir", data, "--out_dir", tmp_path / "short", "--max_iters=4",
                                             "--warmup_iters=10", *TINY], capsys)
    assert code in (0, None), err
    assert ("note: --max_iters 4 ends within the warm-up of 10 steps: the learning rate rises to 0.0003 and never "
            "decays; lower --warmup_iters for a run that does") in err, err
    code, _, err = run_script("train.py", ["--data_dir", data, "--out_dir", tmp_path / "long", "--max_iters=4",
                                           "--warmup_iters=2", *TINY], capsys)
    assert code in (0, None) and "warm-up" not in err, err


def test_the_console_shows_a_statistic_of_every_gate_as_one_range_and_the_log_keeps_each(data, tmp_path, capsys):
    run = tmp_path / "gated"
    code, out, err = run_script("train.py", ["--model=skipmiddle", "--data_dir", data, "--out_dir", run,
                                             "--max_iters=2", "--eval_interval=2", *TINY], capsys)
    assert code in (0, None), err
    line = next(line for line in out.splitlines() if line.startswith("iter 2/2 | val_loss"))
    assert "gate0_mean" not in line and re.search(r"gate_mean\[0-0\] [\d.e-]+\.\.[\d.e-]+", line), line
    assert len(line) < 250, line
    record = [r for r in map(json.loads, open(run / "log.jsonl")) if r.get("iter") == 2 and "val_loss" in r][0]
    assert {"gate0_mean", "gate0_zero", "gate0_alpha", "gate0_beta", "est_flops_ratio"} <= set(record)


@pytest.mark.parametrize("module", ["tools.bench", "tools.kernels", "tools.sweep", "tools.gpu_tables", "hf.export"])
def test_a_tool_s_usage_shows_how_it_is_run(module, capsys):
    code, out, _ = run_script(module.replace(".", "/") + ".py", ["--help"], capsys)
    assert code in (0, None) and out.startswith(f"usage: python -m {module} "), out[:200]


def test_a_wrong_option_gets_its_hint_without_stray_punctuation(capsys):
    code, _, err = run_script("train.py", ["--max_iter", "3"], capsys)
    assert_one_error_line(code, err, "unrecognized arguments: --max_iter 3 (did you mean --max_iters?); see "
                                     "train.py --help")


def test_figures_mark_their_points_and_say_each_run_s_steps(data, tmp_path, capsys):
    """--curves: each validation loss a dot of its own, unjoined (a line between sparse evaluations lies above the
    curve), the training loss's records marked, and each run's steps in the legend where the runs differ; the
    logit lens: each checkpoint's step in the legend where they differ."""
    from analysis.curves import SMOOTH, plot_curves, read_run_log
    from analysis.figures import import_pyplot
    import eval as evalpy
    runs = []
    for steps, every in ((4, 2), (8, 4)):
        out = tmp_path / f"run{steps}"
        train.main(["--data_dir", str(data), "--out_dir", str(out), f"--max_iters={steps}",
                    f"--eval_interval={every}", "--log_interval=1", *TINY])
        runs.append({**read_run_log(str(out)), "label": out.name})
    fig = plot_curves(import_pyplot(), runs, str(tmp_path / "curves.png"))
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    trained = f"training loss (mean of {SMOOTH} records)"
    assert set(lines) == {f"run{s} ({s:,} steps): {what}" for s in (4, 8) for what in (trained, "validation loss")}
    for s in (4, 8):
        assert lines[f"run{s} ({s:,} steps): validation loss"].get_linestyle() == "None"
        assert lines[f"run{s} ({s:,} steps): {trained}"].get_marker() not in (None, "None", "")
    code, out, err = run_script("eval.py", ["--out_dir", tmp_path / "run4", tmp_path / "run8", "--logit_lens",
                                            "--tokens=40", "--plot_path", tmp_path / "lens.png"], capsys)
    assert code in (0, None), err
    results = [{"out_dir": str(tmp_path / f"run{s}"), "model": "vanilla", "step": s,
                "logit_lens": [{"layer": 1, "loss": 1.0, "p_correct": 0.5}]} for s in (4, 8)]
    fig = evalpy.plot_logit_lens(import_pyplot(), results, str(tmp_path / "lens2.png"))
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["vanilla (run4), step 4", "vanilla (run8), step 8"]


PRESET = os.path.join(ROOT, "config", "fineweb_edu_50m.py")


def test_a_preset_names_its_tokenizer_and_refuses_data_of_another(data, tmp_path, capsys):
    """A preset of a web data set: its prepare hint carries the tokenizer the preset needs, and data of that name
    made with another tokenizer is refused before anything is written, with the command that makes the right one."""
    empty = tmp_path / "data"
    code, _, err = run_script("train.py", [PRESET, "--data_dir", empty,
                                           "--out_dir", tmp_path / "run"], capsys)
    assert_one_error_line(code, err, "--tokenizer gpt2")
    shutil.copytree(os.path.join(data, "shakespeare"), empty / "fineweb-edu")  # byte-level data under that name
    code, _, err = run_script("train.py", [PRESET, "--data_dir", empty,
                                           "--out_dir", tmp_path / "run"], capsys)
    assert_one_error_line(code, err, "prepared with the byte tokenizer")
    assert hint(err).startswith("python prepare.py --dataset fineweb-edu --tokenizer gpt2")
    assert not os.path.exists(tmp_path / "run")


def test_resume_takes_the_checkpoint_s_model_and_says_it_resumes(data, tmp_path, capsys):
    """--resume without --model continues the model the checkpoint names, and its header says from which step; an
    explicit other --model is still refused."""
    run = tmp_path / "run"
    train.main(["--model=vertical", "--data_dir", str(data), "--out_dir", str(run), "--max_iters=2",
                "--eval_interval=2", *TINY])
    code, out, err = run_script("train.py", ["--resume", "--data_dir", data, "--out_dir", run, "--max_iters=3",
                                             *TINY], capsys)
    assert code in (0, None), err
    assert out.startswith("model_vertical.py: ") and "resumes at step 2 |" in out.splitlines()[0], out
    code, _, err = run_script("train.py", ["--resume", "--model=vanilla", "--data_dir", data, "--out_dir", run,
                                           "--max_iters=4", *TINY], capsys)
    assert_one_error_line(code, err, "trained with --model vertical, not vanilla")


def test_what_a_short_or_sized_run_says_at_its_start(data, tmp_path, capsys):
    """--max_iters 0 trains no step, so no warm-up note (it named a negative rate); the rate a short run names is the
    one its last step reaches; --size on byte-level data says the paper's count assumes its tokenizer."""
    code, _, err = run_script("train.py", ["--data_dir", data, "--out_dir", tmp_path / "zero", "--max_iters=0",
                                           *TINY], capsys)
    assert code in (0, None) and "warm-up" not in err, err
    code, _, err = run_script("train.py", ["--data_dir", data, "--out_dir", tmp_path / "short", "--max_iters=3",
                                           "--eval_interval=3", "--learning_rate=1e-3", *TINY], capsys)
    assert code in (0, None) and f"rises to {1e-3 * 2 / 100:.3g} and never decays" in err, err
    code, _, err = run_script("train.py", ["--data_dir", data, "--out_dir", tmp_path / "sized", "--size=50m",
                                           "--max_iters=0", "--block_size=32", "--batch_size=2", "--eval_iters=1",
                                           "--device=cpu"], capsys)
    assert code in (0, None) and "--size 50m on byte-level data" in err, err
