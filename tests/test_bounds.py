"""What a probe of hostile inputs found past the schemas, class by class, each ending in one line or working, with
nothing existing changed: fields a schema let through, a data set that eval.py read where train.py refused it,
shapes too large for any machine, hints that failed when followed, and what a resumed run changes without a word.
(Two runs in one folder: tests/test_runs.py; a FIFO where a script writes: tests/test_outputs.py; files nested
5,000 deep: tests/test_files.py and tests/test_schemas.py.)"""
import json
import os
import shutil

import numpy as np
import pytest
import torch

import train
from conftest import TINY, run_script
from test_errors import assert_one_error_line, checksums


@pytest.fixture
def data(tiny_data):
    return tiny_data  # conftest.py's, shared by the tests that read it


@pytest.fixture
def run(tiny_run):
    return tiny_run  # conftest.py's run of 2 steps, saved at 2 (copied where a test changes it)


def with_checkpoint(run, tmp_path, change):
    """A copy of run whose ckpt.pt change(ckpt) has edited."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    ckpt = torch.load(copy / "ckpt.pt", weights_only=False)
    change(ckpt)
    torch.save(ckpt, copy / "ckpt.pt")
    return copy


def resume(data, folder, *args):
    return ["train.py", "--data_dir", data, "--out_dir", folder, "--resume", "--max_iters=3", *TINY, *args]


# ---- fields a schema let through --------------------------------------------------------------------------------

CHECKPOINT_FIELDS = [  # (id, change, the script that read it, what its line says; None: the script works)
    ("rng_10_bytes", lambda c: c["rng"].update(torch=[torch.zeros(10, dtype=torch.uint8)]), "resume",
     "RNG state"),  # torch.set_rng_state's own check, translated with the file's name
    ("rng_empty", lambda c: c["rng"].update(torch=[]), "resume", "ckpt.pt"),
    ("optimizer_step_negative", lambda c: c["optimizer"]["state"][0].update(step=torch.tensor(-5.0)), "resume",
     "the optimiser's state does not fit"),
    ("optimizer_moment_shape", lambda c: c["optimizer"]["state"][0].update(exp_avg=torch.zeros(3)), "resume",
     "the optimiser's state does not fit"),
    ("weights_of_another_shape", lambda c: c["model"].update({"norm.weight": torch.ones(3)}), "sample",
     "size mismatch for norm.weight"),  # load_state_dict's own check
    ("a_weight_missing", lambda c: c["model"].pop("norm.weight"), "sample", "Missing key(s)"),
    ("integer_weights", lambda c: c["model"].update({"norm.weight": c["model"]["norm.weight"].long()}), "sample",
     "norm.weight is torch.int64, not floating point"),  # which load_state_dict would cast to the parameter's dtype
    ("eot_past_the_vocabulary", lambda c: c["meta"].update(eot_token=300), "export",
     "eot_token 300 is not below vocab_size"),
]


@pytest.mark.parametrize("case", CHECKPOINT_FIELDS, ids=[c[0] for c in CHECKPOINT_FIELDS])
def test_a_field_the_schema_let_through_is_one_line(case, data, run, tmp_path, capsys):
    _, change, reader, says = case
    folder = with_checkpoint(run, tmp_path, change)
    command = {"resume": resume(data, folder), "sample": ["sample.py", "--out_dir", folder, "--max_new_tokens=2"],
               "export": ["hf/export.py", "--out_dir", folder, "--to", tmp_path / "hf"]}[reader]
    before = checksums(tmp_path)
    code, _, err = run_script(command[0], command[1:], capsys)
    if says is None:
        assert code in (0, None), err
        return
    assert_one_error_line(code, err, says)
    assert str(folder) in err and checksums(tmp_path) == before


def test_the_optional_meta_fields_are_optional_for_bench(data, run, tmp_path, capsys):
    """tools.bench --checkpoint takes the data set from the run's train_config (its --dataset), not meta.json's
    description: a checkpoint whose meta lacks `dataset` works, and one whose meta names files (a --files data set)
    too; one that names no data set at all is one line."""
    def gated(c):
        c["meta"].pop("dataset")
    skip = tmp_path / "skip"
    train.main(["--model=skipmiddle", "--data_dir", str(data), "--out_dir", str(skip), "--max_iters=1", *TINY])
    for change in (gated, lambda c: c["meta"].update(dataset="notes.txt, more.jsonl")):
        folder = with_checkpoint(skip, tmp_path / change.__name__, change)
        code, out, err = run_script("tools/bench.py", ["--checkpoint", folder, "--data_dir", data, "--sample_tokens=2",
                                                       "--device=cpu"], capsys)
        assert code in (0, None) and "skip" in out, err
    nameless = with_checkpoint(skip, tmp_path / "nameless", lambda c: (c["meta"].pop("dataset"),
                                                                      c["train_config"].pop("dataset")))
    code, _, err = run_script("tools/bench.py", ["--checkpoint", nameless, "--data_dir", data, "--device=cpu"], capsys)
    assert_one_error_line(code, err, "names no data set")


# ---- one check of a data set's splits, shared by every reader -----------------------------------------------------

@pytest.mark.parametrize("damage", ["ids_past_the_vocabulary", "uint32_over_uint16_files"])
def test_eval_refuses_what_train_refuses(damage, data, run, tmp_path, capsys):
    bad = tmp_path / "data"
    shutil.copytree(data, bad)
    meta = json.loads((bad / "shakespeare" / "meta.json").read_text())
    if damage == "ids_past_the_vocabulary":
        tokens = np.fromfile(bad / "shakespeare" / "val.bin", np.uint16)
        tokens[5] = 300
        tokens.tofile(bad / "shakespeare" / "val.bin")
    else:  # the same bytes read as half as many uint32 ids: every id past the vocabulary
        meta.update(dtype="uint32", train_tokens=2000, val_tokens=150)
        (bad / "shakespeare" / "meta.json").write_text(json.dumps(meta))
    before = checksums(tmp_path)
    for script, args in [("train.py", ["--data_dir", bad, "--out_dir", tmp_path / "new", *TINY]),
                         ("eval.py", ["--out_dir", run, "--data_dir", bad, "--device=cpu"])]:
        code, _, err = run_script(script, args, capsys)
        assert_one_error_line(code, err, "holds token id")
        assert "run prepare.py again" in err
    assert checksums(tmp_path) == before


# ---- shapes that no machine holds: refused from the options, before anything is built ------------------------------

@pytest.mark.parametrize("option,value", [("n_layer", 10**6), ("vocab_size", 2**40), ("block_size", 2**40),
                                          ("n_embd", 2**24)])
def test_a_model_too_large_for_memory_is_one_line_naming_the_option(option, value, data, run, tmp_path, capsys):
    """train.py with the option, and sample.py with a checkpoint whose model_args hold it: one line naming the option
    before the model is built (10**6 layers took minutes to build; 2**40 tokens of context ended in 'out of memory
    ... use a smaller batch')."""
    shape = [a for a in TINY if not a.startswith(f"--{option}=")]
    if option == "n_embd":
        shape = [a for a in shape if not a.startswith(("--n_head", "--n_kv_head"))] + ["--n_head=1", "--n_kv_head=1"]
    code, _, err = run_script("train.py", ["--data_dir", data, "--out_dir", tmp_path / "new", *shape,
                                           f"--{option}={value}"], capsys)
    named = "--n_layer" if option == "n_embd" else f"--{option}"  # a wide model's weights are in its blocks
    # (a context of 2**40 tokens is longer than the data first: train.py's check of the splits names it too)
    assert_one_error_line(code, err, "lower --block_size" if option == "block_size" else f"memory here; lower {named}")
    assert not (tmp_path / "new").exists()
    folder = with_checkpoint(run, tmp_path, lambda c: c["model_args"].update({option: value}))
    code, _, err = run_script("sample.py", ["--out_dir", folder, "--max_new_tokens=2"], capsys)
    assert_one_error_line(code, err, f"lower {named}")


# ---- hints that work when followed ---------------------------------------------------------------------------------

def test_a_preset_whose_vocab_size_is_too_small_is_named(data, tmp_path, capsys):
    (tmp_path / "preset.py").write_text("max_iters = 1\nvocab_size = 100\n")
    code, _, err = run_script("train.py", [tmp_path / "preset.py", "--data_dir", data, "--out_dir", tmp_path / "new",
                                           *TINY], capsys)
    assert_one_error_line(code, err, f"--vocab_size 100 is smaller than the data's 257; drop the option (set in "
                                     f"{tmp_path / 'preset.py'} line 2)")


def test_a_preset_string_that_is_not_text_is_one_line(data, tmp_path, capsys):
    (tmp_path / "preset.py").write_text('out_dir = "runs/\\ud800"\n')
    code, _, err = run_script("train.py", [tmp_path / "preset.py", "--data_dir", data, *TINY], capsys)
    assert_one_error_line(code, err, "--out_dir is not text (it holds a lone surrogate")
    assert "preset.py line 1" in err


def test_a_sweep_stopped_after_its_first_checkpoint_goes_on_as_it_says(data, tmp_path, capsys):
    """A sweep's run stopped after its step-0 checkpoint (SIGTERM) said "run the same command again": the same
    command goes on from that checkpoint (with --resume), where it used to start anew and be refused."""
    from tools import sweep
    command = ["--runs=vanilla", "--seeds=1", "--train_iters=2", "--eval_points=1", "--n_layer=1", "--block_size=16",
               "--batch_size=2", f"--data_dir={data}", f"--results={tmp_path / 'results'}", "--reuse=",
               f"--runs_dir={tmp_path / 'runs'}", "--train_args=--eval_iters=1", "--device=cpu"]
    args = sweep.parse_args(command)
    meta = sweep.read_meta(args.data_dir, args.dataset)
    shape = sweep.model_shape(args, meta)
    plan = sweep.main_sweep(args)
    plan["points"] = [p for p in plan["points"] if p[0] == "vanilla"]  # as --runs=vanilla leaves it
    (label, options, key), = sweep.plan(plan, shape, args, "cpu", "float32", meta)[args.seed]
    out_dir = tmp_path / "runs" / f"{label}-seed{args.seed}-{key}"
    train.main([*options, f"--out_dir={out_dir}", f"--data_dir={data}", "--max_iters=0"])  # as if stopped after step 0
    code, out, err = run_script("tools/sweep.py", command, capsys)
    assert code in (0, None) and "Traceback" not in err, err
    assert torch.load(out_dir / "ckpt.pt", weights_only=True)["iter_num"] == 2


def test_a_tokenizer_json_that_cannot_be_read_is_said_so(data, run, tmp_path, capsys):
    """--init_from a folder whose tokenizer.json is damaged: the file cannot be read (not "another tokenizer", with
    a prepare command that would fail on the same file)."""
    from hf import export
    folder = tmp_path / "hf"
    export.main(["--out_dir", str(run), "--to", str(folder)])
    (folder / "tokenizer.json").write_text("{ not json")
    code, _, err = run_script("train.py", ["--init_from", folder, "--data_dir", data, "--out_dir", tmp_path / "new",
                                           "--block_size=32", "--max_iters=0"], capsys)
    assert_one_error_line(code, err, f"cannot read {folder / 'tokenizer.json'}")
    assert "prepare" not in err


def test_a_nan_in_a_llama_folder_names_the_file_and_the_tensor(data, run, tmp_path, capsys):
    """A vanilla run exported is a Llama folder (safetensors, read without transformers): a NaN in one of its tensors
    is named with its file when the folder is read, not reported as a training that diverged."""
    from hf import export
    from safetensors.torch import load_file, save_file
    folder = tmp_path / "hf"
    export.main(["--out_dir", str(run), "--to", str(folder)])
    tensors = load_file(folder / "model.safetensors")
    tensors["model.norm.weight"][0] = float("nan")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    code, _, err = run_script("train.py", ["--init_from", folder, "--data_dir", data, "--out_dir", tmp_path / "new",
                                           "--block_size=32", "--max_iters=1"], capsys)
    assert_one_error_line(code, err, f"model.norm.weight in {folder / 'model.safetensors'} holds NaN or infinity")
    assert "diverged" not in err and not (tmp_path / "new").exists()


def test_kernel_counts_of_zero_are_one_line_and_a_merge_replaces_nothing(tmp_path, capsys):
    saved = json.load(open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "results",
                                        "kernels_compiled.json")))
    saved["models"]["vanilla"]["train"] = 0
    (tmp_path / "zero.json").write_text(json.dumps(saved))
    code, _, err = run_script("tools/kernels.py", ["--table_only", "--json", tmp_path / "zero.json"], capsys)
    assert_one_error_line(code, err, "its field train must be 1 or more, not 0")
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "vanilla.json").write_text(json.dumps(saved))
    (tmp_path / "merged.json").write_text("kept")
    code, _, err = run_script("tools/kernels.py", ["--compiled", "--size=small", "--runs=vanilla", "--json",
                                                   tmp_path / "merged.json", "--merge", parts], capsys)
    assert_one_error_line(code, err, "models[vanilla]: its field train must be 1 or more, not 0")
    assert (tmp_path / "merged.json").read_text() == "kept"


# ---- a resumed run says what it changes ------------------------------------------------------------------------------

def test_a_resumed_run_names_every_option_it_changes(data, run, tmp_path, capsys):
    """Another data set (of the same tokenizer) and another warm-up: one note naming both, and the learning rate at
    the resumed step where the saved run's schedule gives another; the same options: no note."""
    other = tmp_path / "other"
    shutil.copytree(data, other)
    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    script, *args = resume(other, folder, "--warmup_iters=1")
    code, _, err = run_script(script, args, capsys)
    notes = [line for line in err.splitlines() if "options other than it saved" in line]
    assert code in (0, None) and len(notes) == 1, err
    assert f"--data_dir {other} (saved: {data})" in notes[0] and "--warmup_iters 1 (saved: 100)" in notes[0]
    # step 2 of a 100-step warm-up: 2/100 of the peak; of a 1-step warm-up, at step 2 of a cosine that ends at 3
    assert "its learning rate at step 2 is 0.0001, the saved run's 2e-05" in notes[0], notes[0]
    script, *args = resume(other, folder, "--warmup_iters=1", "--max_iters=4")
    code, _, err = run_script(script, args, capsys)
    assert code in (0, None) and "options other than it saved" not in err, err
