"""Every file is read whole before it is trusted (its fields held to declarations in the options' form, plumbing/config.py's
check_record): each field of a real file, in turn removed,
set to a value of the wrong type and set to NaN, read by every script that reads that kind of file, gives a run
that works, or one line naming the file and no traceback, and leaves every existing file as it was. The files: a
checkpoint of a tiny run (sample.py, eval.py, train.py --resume, hf/export.py), a data set's meta.json (train.py,
eval.py), and the tools' results (tools/bench.py --decode --table_only, tools/gpu_tables.py --summary,
tools/kernels.py --table_only and --merge, tools/sweep.py --table_only), generated from the files themselves, so
that a field added to a file is tried the day it is written."""
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

import train
from conftest import ROOT, alarm, run_script, shakespeare_sample
from plumbing.config import check_record
from plumbing.errors import ConfigError
from plumbing.files import Checkpoint, Meta, read_checkpoint
from test_errors import assert_one_error_line, checksums
from tools.bench import read_bench
from tools.kernels import read_counts
from tools.sweep import read_sweep

TINY = ["--n_layer=1", "--n_head=2", "--n_kv_head=1", "--n_embd=16", "--ffn_hidden=32", "--block_size=16",
        "--batch_size=2", "--eval_iters=1", "--device=cpu"]


def fields(value, path=()):
    """Every field of a nested value: each key of a dict, and the first item of a list (the others are alike). Of a
    dict that maps names to tensors (a state dict) its first and last tensors, which stand for the rest."""
    if isinstance(value, dict):
        keys = list(value)
        if len(keys) > 2 and all(torch.is_tensor(v) for v in value.values()):
            keys = [keys[0], keys[-1]]
        for key in keys:
            yield path + (key,)
            yield from fields(value[key], path + (key,))
    elif isinstance(value, (list, tuple)) and value:
        yield path + (0,)
        yield from fields(value[0], path + (0,))


def wrong_type(value):
    """A value of another type than value's."""
    return 7 if isinstance(value, str) else "x"


def nan_like(value):
    return torch.full_like(value, math.nan) if torch.is_tensor(value) and value.is_floating_point() else math.nan


def mutations(value):
    """(name, mutated copy) for every field of value: removed (from a dict), of the wrong type, NaN."""
    for path in fields(value):
        for kind in ("removed", "wrong type", "NaN"):
            if kind == "removed" and not isinstance(get(value, path[:-1]), dict):
                continue
            change = {"removed": None, "wrong type": wrong_type, "NaN": nan_like}[kind]
            yield f"{'.'.join(map(str, path))} {kind}", changed(value, path, change)


def changed(value, path, change):
    """A copy of value with the field at path replaced by change(it), or removed where change is None (the fields
    on the path copied, the rest shared)."""
    if not path:
        return change(value)
    head, rest = path[0], path[1:]
    out = dict(value) if isinstance(value, dict) else list(value)
    if not rest and change is None:
        del out[head]
    else:
        out[head] = changed(value[head], rest, change)
    return out


def get(value, path):
    for key in path:
        value = value[key]
    return value


def works_or_one_line(code, err, names):
    """The run worked, or it ended in one `error:` line that names the file (one of names), without a traceback."""
    assert "Traceback" not in err, err
    if code == 0:
        return True
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert any(name in lines[0] for name in names), lines[0]
    return False


@pytest.fixture(scope="module")
def data(data_dir, tmp_path_factory):
    return shakespeare_sample(data_dir, tmp_path_factory.mktemp("schemas") / "data")


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("schemas_run") / "run"
    train.main(["--data_dir", str(data), "--out_dir", str(out), "--max_iters=2", "--eval_interval=2", *TINY])
    return out


def test_the_real_files_match_their_declarations(run, data):
    """The declarations hold the files the scripts write (so a refusal below is of the mutation, not of the file):
    a checkpoint's fields, its train_config by train.py's own options, meta.json."""
    ckpt = read_checkpoint(str(run / "ckpt.pt"))
    check_record(train.TrainConfig, ckpt["train_config"], "ckpt.pt's train_config", "fix")
    check_record(Meta, json.load(open(data / "shakespeare" / "meta.json")), "meta.json", "fix")
    for field, value in (("iter_num", math.nan), ("iter_num", -1), ("model_name", None)):
        with pytest.raises(ConfigError, match=f"ckpt.pt: its field {field} must"):
            check_record(Checkpoint, {**ckpt, field: value}, "ckpt.pt", "fix")
    with pytest.raises(ConfigError, match="its field learning_rate must be above 0"):
        check_record(train.TrainConfig, {**ckpt["train_config"], "learning_rate": 0.0}, "ckpt.pt", "fix")


@pytest.mark.parametrize("full", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["each_once", "in_full"])
def test_every_field_of_a_checkpoint(full, run, data, tmp_path, capsys):
    """Every mutation of the checkpoint read by the four scripts that read one: in the default tier each mutation by
    one of them in turn (every field and every script tried), in the slow tier by all four (over 400 runs)."""
    ckpt = torch.load(run / "ckpt.pt", weights_only=True)
    steps, tried, worked = ckpt["iter_num"], 0, 0
    for n, (name, mutated) in enumerate(mutations(ckpt)):
        folder = tmp_path / f"run{n}"
        shutil.copytree(run, folder)
        torch.save(mutated, folder / "ckpt.pt")
        before = checksums(folder, data)
        readers = [
            ("sample.py", ["--out_dir", folder, "--max_new_tokens=2", "--num_samples=1", "--device=cpu"]),
            ("eval.py", ["--out_dir", folder, "--tokens=40", "--data_dir", data, "--device=cpu"]),
            ("train.py", ["--resume", "--out_dir", folder, "--data_dir", data, f"--max_iters={steps}",
                          "--batch_size=2", "--eval_iters=1", "--device=cpu"]),
            ("hf/export.py", ["--out_dir", folder, "--to", tmp_path / f"hf{n}"])]
        for script, args in readers if full else [readers[n % len(readers)]]:
            code, _, err = run_script(script, args, capsys)
            worked += works_or_one_line(code, err, [str(folder)])
            tried += 1
            assert checksums(folder, data) == before, (name, script)
        shutil.rmtree(folder)
    assert tried > (400 if full else 100) and 0 < worked < tried  # tolerated (an optional field removed), refused


@pytest.mark.parametrize("case", ["integer weight", "complex weight", "model_args without block_size"])
def test_what_torch_would_take_without_a_word_is_one_line(case, run, data, tmp_path, capsys):
    """load_state_dict casts a weight of integers or complex numbers to its parameter's dtype, and GPTConfig fills
    in a field that model_args lack with the model file's default: every reader of a checkpoint (sample.py, eval.py,
    train.py --resume, hf/export.py) refuses it in one line naming the file, what is wrong and the fix, before it
    prints or writes anything."""
    ckpt = torch.load(run / "ckpt.pt", weights_only=True)
    weight = next(iter(ckpt["model"]))
    if case == "model_args without block_size":
        del ckpt["model_args"]["block_size"]
    else:
        ckpt["model"][weight] = ckpt["model"][weight].to(torch.int64 if case == "integer weight" else torch.complex64)
    folder, to = tmp_path / "run", tmp_path / "hf"
    shutil.copytree(run, folder)
    torch.save(ckpt, folder / "ckpt.pt")
    before = checksums(folder, data)
    for script, args in [("sample.py", ["--out_dir", folder, "--max_new_tokens=2", "--device=cpu"]),
                         ("eval.py", ["--out_dir", folder, "--tokens=40", "--data_dir", data, "--device=cpu"]),
                         ("train.py", ["--resume", "--out_dir", folder, "--data_dir", data, "--max_iters=3",
                                       "--batch_size=2", "--eval_iters=1", "--device=cpu"]),
                         ("hf/export.py", ["--out_dir", folder, "--to", to])]:
        code, out, err = run_script(script, args, capsys)
        assert_one_error_line(code, err, str(folder / "ckpt.pt"))
        said = ["block_size", "model_vanilla.py"] if "block_size" in case else [weight, "not floating point"]
        assert all(words in err for words in said) and "train again" in err, err
        assert not out and checksums(folder, data) == before and not to.exists(), script


def test_every_field_of_meta_json(data, tmp_path, capsys):
    meta = json.load(open(data / "shakespeare" / "meta.json"))
    for n, (name, mutated) in enumerate(mutations(meta)):
        folder = tmp_path / f"data{n}"
        shutil.copytree(data, folder)
        (folder / "shakespeare" / "meta.json").write_text(json.dumps(mutated))  # NaN as JSON's extension writes it
        before = checksums(folder)
        code, _, err = run_script("train.py", ["--data_dir", folder, "--out_dir", tmp_path / f"run{n}",
                                               "--max_iters=0", *TINY], capsys)
        works_or_one_line(code, err, ["meta.json", str(folder)])
        if code == 0:
            code, _, err = run_script("eval.py", ["--out_dir", tmp_path / f"run{n}", "--data_dir", folder,
                                                  "--tokens=40", "--device=cpu"], capsys)
            works_or_one_line(code, err, ["meta.json", str(folder)])
        assert checksums(folder) == before, name
        shutil.rmtree(folder)


# the tools' results: a committed file of each kind, its reader (the records each tool declares), and the commands
# that read it (FILE: the mutated copy)
RESULTS = {
    "decode": ("results/decode/cpu-1-thread.json", lambda path: read_bench(path, "the file", "fix", decode=True)),
    "bench": ("results/h100/bench_300m_1024.json", lambda path: read_bench(path, "the file", "fix", decode=False)),
    "kernels": ("results/kernels_compiled.json", lambda path: read_counts(path, "the file", "fix")),
    "sweep": ("results/ablations/va_lr/results.json", read_sweep),
}


def test_the_real_results_files_hold_to_their_records(tmp_path):
    """The tools' records hold the committed files (so a refusal below is of the mutation, not of the file), each
    item of a list or an object of records included; a field of an item is named with the item."""
    for name, read in RESULTS.values():
        read(os.path.join(ROOT, name))
    saved = json.load(open(os.path.join(ROOT, RESULTS["sweep"][0])))
    for field, value, says in [("stats", {"va_entropy": "x"}, "its field stats holds an item that is not a number"),
                               ("curve", [[0, 1.0, 2.0]], "its field curve holds an item that is not a pair"),
                               ("curve", None, "its field curve must be list, not None"),
                               ("seed", -1, "its field seed must be 0 or more")]:
        path = tmp_path / "results.json"
        path.write_text(json.dumps({**saved, "runs": [saved["runs"][0], {**saved["runs"][1], field: value}]}))
        with pytest.raises(ConfigError, match=fr"results.json's runs\[1\]: {says}"):
            read_sweep(str(path))


def results_path(kind, folder):
    """Where in folder the commands of readers() read a results file of kind: a sweep's ablation in its own folder."""
    name = {"decode": "decode.json", "sweep": os.path.join("ablations", "va_lr", "results.json")}.get(
        kind, os.path.basename(RESULTS[kind][0]))
    os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
    return os.path.join(folder, name)


def readers(kind, path, data):
    """[(script, args)] of the commands that read a results file of kind at path (results_path())."""
    folder = os.path.dirname(path)
    if kind == "decode":
        return [("tools/bench.py", ["--decode", "--table_only", "--json", path]),
                ("tools/gpu_tables.py", ["--summary", "--out", folder, "--update_readme=false"])]
    if kind == "bench":
        return [("tools/gpu_tables.py", ["--summary", "--out", folder, "--update_readme=false"])]
    if kind == "kernels":
        part = os.path.join(folder, "parts")
        os.makedirs(part, exist_ok=True)
        shutil.copy(path, os.path.join(part, "vanilla.json"))
        return [("tools/kernels.py", ["--table_only", "--json", path]),
                ("tools/kernels.py", ["--compiled", "--size=small", "--runs=vanilla", "--json",
                                      os.path.join(folder, "merged.json"), "--merge", part])]
    results = os.path.dirname(os.path.dirname(folder))  # above ablations/va_lr/
    return [("tools/sweep.py", ["--ablation=va_lr", "--table_only", "--results", results, "--data_dir", data,
                                "--device=cpu"])]


@pytest.mark.parametrize("kind", list(RESULTS))
def test_every_field_of_a_results_file(kind, data, tmp_path, capsys):
    name, _ = RESULTS[kind]
    saved = json.load(open(os.path.join(ROOT, name)))
    refused, tried = set(), set()
    for n, (field, mutated) in enumerate(mutations(saved)):
        folder = tmp_path / f"case{n}"
        folder.mkdir()
        path = results_path(kind, str(folder))
        with open(path, "w") as f:
            json.dump(mutated, f)  # NaN as Python's json writes it: a token that strict JSON refuses
        before = checksums(folder)
        for script, args in readers(kind, path, data):
            code, _, err = run_script(script, args, capsys)
            tried.add(script)
            if works_or_one_line(code, err, [path, str(folder)]):
                continue
            refused.add(script)
            after = checksums(folder)
            assert {k: v for k, v in after.items() if k in before} == before, (field, script)
        shutil.rmtree(folder)
    assert refused == tried  # every reader read the file (and refused some of its mutations)

@pytest.mark.parametrize("kind", list(RESULTS))
def test_a_results_file_nested_5000_deep_is_one_line(kind, data, tmp_path, capsys):
    """Every reader of every kind of results file, given one nested 5,000 deep (JSON's parser recurses into it), ends
    in one line naming the file; a merge part and the tools' summary too."""
    path = results_path(kind, str(tmp_path))
    with open(path, "w") as f:
        f.write("[" * 5000 + "]" * 5000)
    for script, args in readers(kind, path, data):
        if "--merge" in args:  # the part deep, the file it would write absent
            shutil.copy(path, os.path.join(args[args.index("--merge") + 1], "vanilla.json"))
        code, _, err = run_script(script, args, capsys)
        assert not works_or_one_line(code, err, [path, str(tmp_path)]), (script, err)
        assert "nested too deep" in err, err


# ---- the edges a hostile user found: each one line, nothing changed ----------------------------------------------

def special_files(root, run, data):
    """(what, script, arguments) for every kind of file the scripts read, each given as a FIFO under root."""
    def fifo(*parts):
        path = root.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.unlink()
        os.mkfifo(path)
        return path

    def data_with(name):  # a copy of the data set with one of its files a FIFO
        copy = root / f"data_{name.split('.')[0]}"
        shutil.copytree(data, copy)
        fifo(copy.name, "shakespeare", name)
        return copy

    def run_with(name):  # a copy of the run with one of its files a FIFO
        copy = root / f"run_{name.split('.')[0]}"
        shutil.copytree(run, copy)
        fifo(copy.name, name)
        return copy

    (root / "child.py").write_text('base = "preset.py"\nmax_iters = 2\n')
    fifo("preset.py")
    new = ["--out_dir", root / "new", *TINY]
    cases = [("a preset", "train.py", [root / "preset.py", "--data_dir", data, *new]),
             ("a preset's base", "train.py", [root / "child.py", "--data_dir", data, *new]),
             ("meta.json", "train.py", ["--data_dir", data_with("meta.json"), *new]),
             ("train.bin", "train.py", ["--data_dir", data_with("train.bin"), *new]),
             ("val.bin", "eval.py", ["--out_dir", run, "--data_dir", data_with("val.bin"), "--device=cpu"]),
             ("val.bin", "tools/bench.py", ["--checkpoint", run, "--data_dir", root / "data_val", "--device=cpu"]),
             ("ckpt.pt", "sample.py", ["--out_dir", run_with("ckpt.pt"), "--device=cpu"]),
             ("ckpt.pt", "eval.py", ["--out_dir", root / "run_ckpt", "--device=cpu"]),
             ("ckpt.pt", "hf/export.py", ["--out_dir", root / "run_ckpt", "--to", root / "new"]),
             ("ckpt.pt", "train.py", ["--resume", "--data_dir", data, "--out_dir", root / "run_ckpt", *TINY]),
             ("log.jsonl", "train.py", ["--resume", "--data_dir", data, "--out_dir", run_with("log.jsonl"), *TINY]),
             ("--start FILE:", "sample.py", ["--out_dir", run, f"--start=FILE:{fifo('prompt.txt')}", "--device=cpu"]),
             ("--mc", "eval.py", ["--out_dir", run, "--mc", fifo("mc.jsonl"), "--device=cpu"]),
             ("--files", "prepare.py", ["--files", fifo("text.txt"), "--out_dir", root / "new"]),
             ("--merge", "tools/kernels.py", ["--merge", fifo("parts", "vanilla.json").parent, "--runs", "vanilla",
                                              "--json", root / "new.json"]),
             ("--reuse", "tools/sweep.py", ["--reuse", fifo("results.json"), "--table_only", "--results", root / "new",
                                            "--data_dir", data]),
             ("--baseline", "tools/bench.py", ["--decode", "--baseline", fifo("checkout", "model_vanilla.py").parent,
                                               "--runs", "vanilla", "--n_layer=1", "--device=cpu"])]
    if importlib.util.find_spec("lm_eval"):  # without lm-eval installed, --lm_eval says that first
        cases.append(("--lm_eval", "eval.py", ["--out_dir", run, "--lm_eval", fifo("task.yaml"), "--device=cpu"]))
    return cases


def test_a_fifo_is_refused_before_it_is_opened(run, data, tmp_path, capsys):
    """A FIFO (or a socket or a device) as any input is refused without opening it, which would wait for a writer
    forever: every kind of file a script reads, each in turn a FIFO. Each script runs here under an alarm, so that
    one which waits fails the test instead of holding up the suite."""
    from test_errors import assert_one_error_line
    for what, script, args in special_files(tmp_path, run, data):
        with alarm():
            code, _, err = run_script(script, args, capsys)
        assert_one_error_line(code, err, "is not a regular file")
        assert not any(p.name.startswith("new") for p in tmp_path.iterdir()), (what, script)


def test_presets_are_read_within_limits_and_name_where_a_value_was_set(data, tmp_path, capsys):
    from test_errors import assert_one_error_line
    cases = {"huge.py": "max_iters = 0x" + "f" * 5000 + "\n",  # parsed, but past any option's 64 bits
             "big.py": "# " + "x" * 1_000_001 + "\n"}
    for n in range(40):  # a chain of base presets longer than PRESET_DEPTH
        cases[f"chain{n}.py"] = f'base = "chain{n + 1}.py"\n' if n < 39 else "max_iters = 2\n"
    cases["base.py"] = "learning_rate = 5\nmax_iters = 2\nmin_lr = 1e-5\n"
    cases["child.py"] = 'base = "base.py"\nmax_iters = 3\nweight_decay = -1\n'
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    expect = {"huge.py": "--max_iters must be a finite number that fits in 64 bits, not an integer of 20,000 bits (set "
                         f"in {tmp_path / 'huge.py'} line 1)",
              "big.py": "holds 1,000,004 bytes, more than the 1,000,000",
              "chain0.py": "base presets is more than 16 files long",
              "child.py": "--weight_decay must be 0 or more, not -1 (set in " + str(tmp_path / "child.py") + " line 3)"}
    for name, fragment in expect.items():
        code, _, err = run_script("train.py", [tmp_path / name, "--data_dir", data, "--out_dir", tmp_path / "run",
                                               *TINY], capsys)
        assert_one_error_line(code, err, fragment)
    # a bad value set in a base is named where the base set it, not in the child that layers on it
    (tmp_path / "base.py").write_text("learning_rate = 5\nmax_iters = -2\n")
    (tmp_path / "child.py").write_text('base = "base.py"\nweight_decay = 0.1\n')
    code, _, err = run_script("train.py", [tmp_path / "child.py", "--data_dir", data, "--out_dir", tmp_path / "run",
                                           *TINY], capsys)
    assert_one_error_line(code, err, f"--max_iters must be 0 or more, not -2 (set in {tmp_path / 'base.py'} line 2)")
    assert not (tmp_path / "run").exists()


def test_a_bad_merge_part_or_summary_file_changes_nothing(tmp_path, capsys):
    """tools/kernels.py --merge builds the whole file and checks it before it replaces --json; gpu_tables.py
    --summary reads each file against its records (tools/bench.py's), and reads a folder that it cannot write."""
    from test_errors import assert_one_error_line
    saved = json.load(open(os.path.join(ROOT, "results", "kernels_compiled.json")))
    parts = tmp_path / "parts"
    parts.mkdir()
    out = tmp_path / "kernels.json"
    out.write_text("the file the merge would replace\n")
    for broken in ({}, {"train": "208", "decode": 56}):
        (parts / "vanilla.json").write_text(json.dumps({"shape": saved["shape"], "models": {"vanilla": broken}}))
        code, _, err = run_script("tools/kernels.py", ["--compiled", "--size=small", "--runs=vanilla", "--json", out,
                                                       "--merge", parts], capsys)
        assert_one_error_line(code, err, str(parts / "vanilla.json"))
        assert out.read_text() == "the file the merge would replace\n"
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    text = open(os.path.join(ROOT, "results", "h100", "decode.json")).read()
    (gpu / "decode.json").write_text(text[:len(text) // 2])  # cut short
    code, _, err = run_script("tools/gpu_tables.py", ["--summary", "--out", gpu, "--update_readme=false"], capsys)
    assert_one_error_line(code, err, "decode.json (JSONDecodeError: Unterminated string")
    (gpu / "decode.json").write_text(json.dumps({"results": [{"label": "vanilla"}]}))  # another tool's file
    code, _, err = run_script("tools/gpu_tables.py", ["--summary", "--out", gpu, "--update_readme=false"], capsys)
    assert_one_error_line(code, err, "decode.json: its field")
    shutil.copy(os.path.join(ROOT, "results", "h100", "decode.json"), gpu / "decode.json")
    os.chmod(gpu, 0o555)  # read-only (root writes anyway, but nothing is written: the summary only reads it)
    try:
        code, out_text, err = run_script("tools/gpu_tables.py", ["--summary", "--out", gpu, "--update_readme=false"],
                                         capsys)
    finally:
        os.chmod(gpu, 0o755)
    assert code == 0 and "| vanilla |" in out_text, err


def test_prepare_makes_one_set_at_a_time_and_train_names_a_set_left_aside(tmp_path, monkeypatch, capsys):
    """Two prepare.py runs that make the same new set at once: the one that comes second says so in one line and
    the first one's set is kept whole; a set that a killed run left renamed aside (.NAME.old-PID, where the system
    has no atomic exchange) is named by train.py with what puts it back."""
    import prepare
    from plumbing.errors import ConfigError
    (tmp_path / "notes.txt").write_text("A corpus for two runs at once. " * 400)
    out = tmp_path / "data"
    argv = ["--files", str(tmp_path / "notes.txt"), "--out_dir", str(out), "--num_proc=1"]
    rename = os.rename

    def meanwhile(a, b):  # after this run found no set there, before its rename: another process makes the set
        subprocess.run([sys.executable, os.path.join(ROOT, "prepare.py"), *argv], check=True, capture_output=True)
        monkeypatch.setattr(os, "rename", rename)
        return rename(a, b)
    monkeypatch.setattr(os, "rename", meanwhile)
    with pytest.raises(ConfigError, match="another prepare.py run made .* while this one ran, and it is kept"):
        prepare.main(argv)
    assert sorted(os.listdir(out)) == ["notes"] and sorted(os.listdir(out / "notes")) == [
        "meta.json", "train.bin", "val.bin"]
    aside = out / f".notes.old-{os.getpid() + 1}"
    os.rename(out / "notes", aside)  # as a run killed between its two renames leaves it
    code, _, err = run_script("train.py", ["--data_dir", out, "--dataset", "notes", "--out_dir", tmp_path / "run",
                                           *TINY], capsys)
    assert code == 1 and f"{aside}, where" in err and f"rename that folder back to {out / 'notes'}" in err and \
        "Traceback" not in err, err
