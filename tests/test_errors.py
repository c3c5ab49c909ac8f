"""Every bad input of train.py, sample.py and eval.py: one `error:` line on stderr that names the fix, a non-zero
exit, no traceback, and every file (data, checkpoint, log) unchanged, by checksum. (prepare.py's are in
test_prepare.py.)

Most cases run the script's real `__main__` block in this process (runpy), which saves a torch start-up per case;
the cases marked SUB run as a subprocess, so that each script's entry point is also covered for real."""
import hashlib
import json
import os
import shutil

import pytest
import torch

import train
from conftest import SUB, TINY, run_script

NO_GPU = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU: absent on every machine
CUDA = [] if torch.cuda.is_available() else ["cuda"]  # plain `--device cuda` without a GPU, where there is none


def checksums(*folders):
    """{path: sha256} of every file and folder under folders: any change, creation or removal shows."""
    sums = {}
    for folder in map(str, folders):
        for root, dirs, files in os.walk(folder):
            sums.update({os.path.join(root, d): "dir" for d in dirs})
            for f in files:
                with open(os.path.join(root, f), "rb") as fh:
                    sums[os.path.join(root, f)] = hashlib.sha256(fh.read()).hexdigest()
    return sums


def assert_one_error_line(code, err, fragment):
    """Exit code non-zero, no traceback, and one line on stderr: `error: ...fragment...` (notes aside: --device auto
    says which device it took)."""
    lines = [l for l in err.splitlines() if l.strip() and not l.startswith("note:")]
    assert code not in (0, None) and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], lines[0]


def damage_checkpoint(kind, good, path):
    """A ckpt.pt as a user may find one: cut short, empty, not a checkpoint at all, or a bare state_dict."""
    os.makedirs(path.parent, exist_ok=True)
    data = good.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(b"these are not the weights you are looking for\n" * 50)
    elif kind == "bare":
        torch.save(torch.load(good, weights_only=False)["model"], path)
    return kind


def damage_data(kind, folder):
    """The prepared data set, damaged in each way a user's copy can be: the same folder layout, one thing wrong."""
    meta = json.loads((folder / "meta.json").read_text())
    if kind == "odd_bytes":
        with open(folder / "train.bin", "ab") as f:
            f.write(b"\0")
    elif kind == "not_json":
        (folder / "meta.json").write_text("{'dtype': uint16")
    elif kind == "no_dtype":
        del meta["dtype"]
    elif kind == "wrong_dtype":
        meta["dtype"] = "uint32"
    elif kind == "small_vocab":
        meta["vocab_size"] = 100  # the byte ids go up to 256 (the end-of-text token, 256, named no more)
        meta.pop("eot_token", None)
    elif kind == "no_val":
        os.remove(folder / "val.bin")
    elif kind == "other_tokenizer":
        meta.update(tokenizer="gpt2", vocab_size=50257)
    if kind not in ("odd_bytes", "not_json", "no_val"):
        (folder / "meta.json").write_text(json.dumps(meta))


# ---- train.py -------------------------------------------------------------------------------------------------

# (id, arguments after the data set's and run's, the expected fragment of the error line, damaged data, damaged
# checkpoint, mode). "{new}" is an out_dir that does not exist yet (a failed run must not create it), "{run}" the
# tiny run (or, with a damaged checkpoint, a copy of it holding that checkpoint), "{file}" an existing file.
TRAIN_CASES = [
    ("batch_size_0", ["--out_dir={new}", "--batch_size=0"], "--batch_size must be 1 or more", None, None, SUB),
    ("batch_size_negative", ["--out_dir={new}", "--batch_size=-4"], "--batch_size must be 1 or more", None, None, ""),
    ("eval_interval_0", ["--out_dir={new}", "--eval_interval=0"], "--eval_interval must be 1 or more", None, None, ""),
    ("log_interval_0", ["--out_dir={new}", "--log_interval=0"], "--log_interval must be 1 or more", None, None, ""),
    ("eval_iters_0", ["--out_dir={new}", "--eval_iters=0"], "--eval_iters must be 1 or more", None, None, ""),
    ("n_head_0", ["--out_dir={new}", "--n_head=0"], "--n_head must be 1 or more", None, None, ""),
    ("n_kv_head_0", ["--out_dir={new}", "--n_kv_head=0"], "--n_kv_head must be 1 or more", None, None, ""),
    ("n_embd_0", ["--out_dir={new}", "--n_embd=0"], "--n_embd must be 1 or more", None, None, ""),
    ("n_layer_0", ["--out_dir={new}", "--n_layer=0"], "--n_layer must be 1 or more", None, None, ""),
    ("ffn_hidden_0", ["--out_dir={new}", "--ffn_hidden=0"], "--ffn_hidden must be 1 or more", None, None, ""),
    ("block_size_0", ["--out_dir={new}", "--block_size=0"], "--block_size must be 1 or more", None, None, ""),
    ("block_size_negative", ["--out_dir={new}", "--block_size=-8"], "--block_size must be 1 or more", None, None, ""),
    ("max_iters_negative", ["--out_dir={new}", "--max_iters=-1"], "--max_iters must be 0 or more", None, None, ""),
    ("learning_rate_negative", ["--out_dir={new}", "--learning_rate=-1e-3"], "--learning_rate must be above 0",
     None, None, ""),
    ("accumulation_0", ["--out_dir={new}", "--gradient_accumulation_steps=0"],
     "--gradient_accumulation_steps must be 1 or more", None, None, ""),
    ("dtype_float16", ["--out_dir={new}", "--dtype=float16"], "--dtype float16", None, None, ""),
    *[(f"device_{d}", ["--out_dir={new}", f"--device={d}"], f"--device {d}", None, None, "") for d in [*CUDA, NO_GPU]],
    ("preset_syntax_error", ["{preset}", "--out_dir={new}"], "line 2", None, None, ""),
    ("out_dir_is_a_file", ["--out_dir={file}"], "File exists; a file is in the way of a folder", None, None, ""),
    ("block_size_over_val", ["--out_dir={new}", "--block_size=299"], "the val split of shakespeare holds 300 tokens",
     None, None, ""),
    ("bin_odd_bytes", ["--out_dir={new}"], "holds 8001 bytes, not the 4000 uint16 tokens", "odd_bytes", None, ""),
    ("meta_not_json", ["--out_dir={new}"], "meta.json (JSONDecodeError", "not_json", None, ""),
    ("meta_no_dtype", ["--out_dir={new}"], "meta.json: its field dtype is missing", "no_dtype", None, ""),
    ("meta_wrong_dtype", ["--out_dir={new}"], "holds 8000 bytes, not the 4000 uint32 tokens", "wrong_dtype",
     None, ""),
    ("meta_vocab_below_ids", ["--out_dir={new}"], "holds token id 122 but the model's vocab_size is 100",
     "small_vocab", None, ""),
    ("no_val_bin", ["--out_dir={new}"], "val.bin does not exist; run prepare.py again", "no_val", None, ""),
    ("resume_other_tokenizer", ["--out_dir={run}", "--resume"], "trained on data of the byte tokenizer",
     "other_tokenizer", None, ""),
    ("resume_other_shape", ["--out_dir={run}", "--resume", "--n_layer=3"], "--n_layer 3 (saved: 2)", None, None, ""),
    ("resume_truncated", ["--out_dir={run}", "--resume"], "the file is truncated, empty or not a checkpoint", None, "truncated", SUB),
    ("resume_empty", ["--out_dir={run}", "--resume"], "the file is truncated, empty or not a checkpoint", None, "empty", ""),
    ("resume_garbage", ["--out_dir={run}", "--resume"], "the file is truncated, empty or not a checkpoint", None, "garbage", ""),
    ("resume_bare_state_dict", ["--out_dir={run}", "--resume"], "it has no model_name (it is a bare state_dict)",
     None, "bare", ""),
]


@pytest.mark.parametrize("case", TRAIN_CASES, ids=[c[0] for c in TRAIN_CASES])
def test_train_refuses(case, tiny_data, tiny_run, tmp_path, capsys):
    _, args, fragment, bad_data, bad_ckpt, mode = case
    data, run = tiny_data, tiny_run
    if bad_data:
        data = tmp_path / "data"
        shutil.copytree(tiny_data, data)
        damage_data(bad_data, data / "shakespeare")
    if bad_ckpt:
        run = tmp_path / "run"
        shutil.copytree(tiny_run, run)
        damage_checkpoint(bad_ckpt, tiny_run / "ckpt.pt", run / "ckpt.pt")
    (tmp_path / "notes.txt").write_text("a file, not a folder\n")
    (tmp_path / "preset.py").write_text("n_layer = 2\nn_head = = 2\n")
    places = {"{new}": tmp_path / "new", "{run}": run, "{file}": tmp_path / "notes.txt",
              "{preset}": tmp_path / "preset.py"}
    args = [a.format(**{k[1:-1]: v for k, v in places.items()}) if "{" in a else a for a in args]
    before = checksums(data, run, tmp_path)
    presets = [a for a in args if a.endswith(".py")]  # preset files lead the command line
    code, _, err = run_script("train.py", [*presets, "--data_dir", data, *TINY, *[a for a in args if a not in presets]],
                              capsys, mode)
    assert_one_error_line(code, err, fragment)
    assert checksums(data, run, tmp_path) == before


# ---- sample.py and eval.py ------------------------------------------------------------------------------------

# (id, arguments after --out_dir, the expected fragment of the error line, damaged checkpoint, mode)
SAMPLE_CASES = [
    ("top_p_negative", ["--top_p=-0.1"], "--top_p must be between 0 and 1", None, ""),
    ("temperature_negative", ["--temperature=-1"], "--temperature must be 0 or more", None, ""),
    ("top_k_negative", ["--top_k=-5"], "--top_k must be 0 or more", None, ""),
    ("max_new_tokens_negative", ["--max_new_tokens=-1"], "--max_new_tokens must be 0 or more", None, ""),
    ("num_samples_0", ["--num_samples=0"], "--num_samples must be 1 or more", None, ""),
    ("dtype_float16", ["--dtype=float16"], "--dtype float16", None, ""),
    *[(f"device_{d}", [f"--device={d}"], f"--device {d}", None, "") for d in [*CUDA, NO_GPU]],
    ("start_not_utf8", ["--start", b"ROMEO \xff\xfe"], "--start is not valid UTF-8", None, SUB),
    ("start_file_not_utf8", ["--start=FILE:{latin1}"], "is not UTF-8 text", None, ""),
    ("checkpoint_truncated", [], "the file is truncated, empty or not a checkpoint", "truncated", ""),
    ("checkpoint_empty", [], "the file is truncated, empty or not a checkpoint", "empty", ""),
    ("checkpoint_garbage", [], "the file is truncated, empty or not a checkpoint", "garbage", ""),
    ("checkpoint_bare_state_dict", [], "it has no model_name (it is a bare state_dict)", "bare", ""),
]

EVAL_CASES = [
    *[(f"device_{d}", [f"--device={d}"], f"--device {d}", None, "") for d in [*CUDA, NO_GPU]],
    ("dtype_float16", ["--dtype=float16"], "--dtype float16", None, ""),
    ("checkpoint_truncated", [], "the file is truncated, empty or not a checkpoint", "truncated", ""),
    ("checkpoint_empty", [], "the file is truncated, empty or not a checkpoint", "empty", SUB),
    ("checkpoint_garbage", [], "the file is truncated, empty or not a checkpoint", "garbage", ""),
    ("checkpoint_bare_state_dict", [], "it has no model_name (it is a bare state_dict)", "bare", ""),
    ("val_bin_odd_bytes", ["--data_dir={data}"], "holds 601 bytes, not the 300 uint16 tokens", None, ""),
]


def check_checkpoint_script(script, case, tiny_data, tiny_run, tmp_path, capsys):
    _, args, fragment, bad_ckpt, mode = case
    run = tiny_run
    if bad_ckpt:
        run = tmp_path / "run"
        damage_checkpoint(bad_ckpt, tiny_run / "ckpt.pt", run / "ckpt.pt")
    (tmp_path / "latin1.txt").write_bytes("ROMÉO:".encode("latin-1"))
    if "--data_dir={data}" in args:  # the data set the run was trained on, damaged: val.bin cut mid-token
        shutil.copytree(tiny_data, tmp_path / "data")
        with open(tmp_path / "data" / "shakespeare" / "val.bin", "ab") as f:
            f.write(b"\0")
    args = [a.format(latin1=tmp_path / "latin1.txt", data=tmp_path / "data") if isinstance(a, str) else a
            for a in args]
    before = checksums(tiny_data, tiny_run, tmp_path)
    code, _, err = run_script(script, ["--out_dir", run, *args], capsys, mode)
    assert_one_error_line(code, err, fragment)
    assert checksums(tiny_data, tiny_run, tmp_path) == before


@pytest.mark.parametrize("case", SAMPLE_CASES, ids=[c[0] for c in SAMPLE_CASES])
def test_sample_refuses(case, tiny_data, tiny_run, tmp_path, capsys):
    check_checkpoint_script("sample.py", case, tiny_data, tiny_run, tmp_path, capsys)


@pytest.mark.parametrize("case", EVAL_CASES, ids=[c[0] for c in EVAL_CASES])
def test_eval_refuses(case, tiny_data, tiny_run, tmp_path, capsys):
    check_checkpoint_script("eval.py", case, tiny_data, tiny_run, tmp_path, capsys)


# ---- what a run leaves behind: a stale ckpt.pt.tmp, the log of a new or a resumed run ---------------------------

def test_new_run_starts_its_log_and_drops_a_stale_tmp(tiny_data, tmp_path):
    out = tmp_path / "run"
    os.makedirs(out)
    (out / "log.jsonl").write_text('{"iter": 7, "loss": 1.0}\n')  # an older run's, without a checkpoint
    (out / "ckpt.pt.tmp").write_bytes(b"half a checkpoint")  # as a run killed while saving leaves it
    train.main(["--data_dir", str(tiny_data), "--out_dir", str(out), "--max_iters=0", *TINY])
    assert not (out / "ckpt.pt.tmp").exists()
    assert [json.loads(l)["iter"] for l in open(out / "log.jsonl")] == [0]
