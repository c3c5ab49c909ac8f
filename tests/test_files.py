"""Every kind of file a script reads, made bad in every way a file can be bad, beside test_options.py's bad
options. From one good file per reader, the variants: missing, a folder, empty, truncated at half, random bytes,
not UTF-8, the right format with a field of the wrong type, NaN where a number must be finite, and a value nested
5,000 deep (JSON, and a preset's literal), which a reader that recursed into it would end in a RecursionError. Each
run ends
in success or in exactly one `error:` line that names the file, with a non-zero exit and no traceback, and every
file that existed before is unchanged (a success may add its own output)."""
import json
import os
import random
import shutil

import numpy as np
import pytest
import torch

from hf import export
import train
from conftest import TINY, run_script, write_data_set
from test_errors import assert_one_error_line, checksums

VARIANTS = ["missing", "folder", "empty", "truncated", "random_bytes", "not_utf8", "wrong_type", "nan", "deep"]
DEEP = "[" * 5000 + "]" * 5000


def jsonl(*records):
    return "".join(json.dumps(r) + "\n" for r in records)


MC = jsonl(*[{"context": f"Question {i}: which word ends the line?", "choices": ["the king", "a horse"], "label": i % 2}
             for i in range(3)])
LOG_FIELDS = '{"iter": 0, "val_loss": 5.5}\n{"iter": 10, "loss": 3.0, "lr": 0.001}\n'

# reader: (the file, relative to the sandbox; the command, from the sandbox's root; what a field of the wrong type
# and a NaN look like in that file: a function of the good text, or None where the format has no fields)
READERS = {
    "prepare_txt": ("in.txt", lambda r: ("prepare.py", ["--files", f"{r}/in.txt", "--out_dir", f"{r}/prepared"]),
                    None, None),
    "prepare_jsonl": ("in.jsonl", lambda r: ("prepare.py", ["--files", f"{r}/in.jsonl", "--out_dir", f"{r}/prepared"]),
                      lambda t: '{"text": 5}\n' + t, lambda t: '{"text": NaN}\n' + t),
    "prepare_parquet": ("in.parquet", lambda r: ("prepare.py", ["--files", f"{r}/in.parquet", "--out_dir",
                                                                f"{r}/prepared"]), None, None),
    "hf_tokenizer": ("tok/tokenizer.json", lambda r: ("prepare.py", ["--files", f"{r}/in.txt", "--tokenizer",
                                                                     f"hf:{r}/tok", "--out_dir", f"{r}/prepared"]),
                     lambda t: t.replace('"model": {', '"model": 5, "unused": {', 1),
                     lambda t: t.replace('"dropout": null', '"dropout": NaN', 1)),
    "mc": ("mc.jsonl", lambda r: ("eval.py", ["--out_dir", f"{r}/run", "--loss=false", "--mc", f"{r}/mc.jsonl",
                                              "--k_shot=1"]),
           lambda t: t.replace('"label": 0', '"label": "zero"', 1),
           lambda t: t.replace('"label": 0', '"label": NaN', 1)),
    "log_curves": ("run/log.jsonl", lambda r: ("eval.py", ["--curves", f"{r}/run", "--plot=false"]),
                   lambda t: t.replace('"iter": 0', '"iter": "zero"', 1),
                   lambda t: t.replace('"val_loss": ', '"val_loss": NaN, "was": ', 1)),
    "log_resume": ("run/log.jsonl", lambda r: ("train.py", ["--data_dir", f"{r}/data", "--out_dir", f"{r}/run",
                                                            "--resume", "--max_iters=3", *TINY]),
                   lambda t: t.replace('"iter": 0', '"iter": "zero"', 1),
                   lambda t: t.replace('"val_loss": ', '"val_loss": NaN, "was": ', 1)),
    "checkpoint": ("run/ckpt.pt", lambda r: ("sample.py", ["--out_dir", f"{r}/run", "--num_samples=1",
                                                           "--max_new_tokens=3"]), "ckpt_wrong_type", "ckpt_nan"),
    "meta": ("data/shakespeare/meta.json", lambda r: ("train.py", ["--data_dir", f"{r}/data", "--out_dir",
                                                                   f"{r}/new", "--max_iters=1", *TINY]),
             lambda t: t.replace('"vocab_size": 257', '"vocab_size": "257"'),
             lambda t: t.replace('"vocab_size": 257', '"vocab_size": NaN')),
    "train_bin": ("data/shakespeare/train.bin", lambda r: ("train.py", ["--data_dir", f"{r}/data", "--out_dir",
                                                                        f"{r}/new", "--max_iters=1", *TINY]),
                  None, None),
    # --max_iters=1 after the preset: an empty preset is a good one, and would train for the default 1000 steps
    "preset": ("preset.py", lambda r: ("train.py", [f"{r}/preset.py", "--data_dir", f"{r}/data", "--out_dir",
                                                    f"{r}/new", "--max_iters=1", *TINY]),
               lambda t: t.replace("learning_rate = 1e-3", "learning_rate = 'fast'"),
               lambda t: t.replace("learning_rate = 1e-3", "learning_rate = float('nan')")),
    "hf_config": ("hf/config.json", lambda r: ("train.py", ["--init_from", f"{r}/hf", "--data_dir", f"{r}/data",
                                                            "--out_dir", f"{r}/new", "--max_iters=0",
                                                            "--block_size=32"]),
                  lambda t: t.replace('"hidden_size": 32', '"hidden_size": "32"'),
                  lambda t: t.replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": NaN')),
    "hf_weights": ("hf/model.safetensors", lambda r: ("train.py", ["--init_from", f"{r}/hf", "--data_dir",
                                                                   f"{r}/data", "--out_dir", f"{r}/new",
                                                                   "--max_iters=0", "--block_size=32"]),
                   None, None),
    "results": ("results/results.json", lambda r: ("tools/sweep.py", ["--table_only", f"--results={r}/results",
                                                                f"--data_dir={r}/data", "--reuse=", "--block_size=32",
                                                                "--device=cpu"]),
                lambda t: t.replace('"runs": []', '"runs": "none"'),
                lambda t: t.replace('"seeds"', '"x": NaN, "seeds"')),
}

# what a success rewrites besides new files: train.py --resume continues the run (a log's lines that are not records
# move to log.superseded.jsonl)
REWRITES = {"log_resume": ("run/ckpt.pt", "run/log.jsonl")}


@pytest.fixture(scope="module")
def good(data_dir, tmp_path_factory):
    """A sandbox with one good file of every kind: a data set, a run, a Hugging Face folder, inputs."""
    root = tmp_path_factory.mktemp("files")
    tokens = np.fromfile(os.path.join(data_dir, "shakespeare", "train.bin"), dtype=np.uint16)
    write_data_set(root / "data" / "shakespeare", tokens)
    train.main(["--data_dir", str(root / "data"), "--out_dir", str(root / "run"), "--max_iters=2", "--eval_interval=2",
                *TINY])
    export.main(["--out_dir", str(root / "run"), "--to", str(root / "hf")])
    text = "ROMEO: But soft, what light through yonder window breaks?\n" * 20
    (root / "in.txt").write_text(text)
    (root / "in.jsonl").write_text(jsonl({"text": text}, {"text": text.upper()}))
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": [text, text.lower()]}), root / "in.parquet")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(dropout=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet))
    os.makedirs(root / "tok")
    tok.save(str(root / "tok" / "tokenizer.json"))
    (root / "mc.jsonl").write_text(MC)
    (root / "preset.py").write_text("max_iters = 1\nlearning_rate = 1e-3\n")
    os.makedirs(root / "results")
    (root / "results" / "results.json").write_text(json.dumps({"seeds": [1337], "runs": []}))
    return root


def spoil(path, variant, wrong_type, nan):
    """Make the file at path bad in the way variant names; False where that way does not apply to its format."""
    data = open(path, "rb").read()
    if variant == "missing":
        os.remove(path)
    elif variant == "folder":
        os.remove(path)
        os.makedirs(path)
    elif variant == "empty":
        open(path, "wb").close()
    elif variant == "truncated":
        open(path, "wb").write(data[:len(data) // 2])
    elif variant == "random_bytes":
        open(path, "wb").write(random.Random(0).randbytes(max(64, len(data) // 4)))
    elif variant == "not_utf8":
        if path.endswith((".bin", ".pt", ".safetensors", ".parquet")):
            return False  # not a text format
        open(path, "wb").write(data[:len(data) // 2] + b"\xff\xfe\xc3" + data[len(data) // 2:])
    elif variant == "deep":
        if path.endswith(".py"):
            open(path, "w").write(f"learning_rate = {DEEP}\n")
        elif path.endswith(".jsonl"):  # the first record
            open(path, "w").write(f'{{"iter": {DEEP}}}\n' + data.decode().split("\n", 1)[1])
        elif path.endswith(".json"):
            open(path, "w").write(DEEP)
        else:
            return False  # not a format that nests
    elif variant in ("wrong_type", "nan"):
        change = wrong_type if variant == "wrong_type" else nan
        if change is None:
            return False
        if path.endswith(".pt"):
            ckpt = torch.load(path, weights_only=False)
            if change == "ckpt_wrong_type":
                ckpt["model_args"] = "a string"
            else:
                ckpt["model"]["norm.weight"][0] = float("nan")  # every logit NaN
            torch.save(ckpt, path)
        else:
            changed = change(data.decode())
            assert changed != data.decode(), (path, variant)  # the mutation applies to the good file
            open(path, "w").write(changed)
    return True


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("reader", list(READERS))
def test_every_bad_file_is_one_line_and_keeps_every_file(reader, variant, good, tmp_path, capsys):
    root = tmp_path / "sandbox"
    shutil.copytree(good, root)
    name, command, wrong_type, nan = READERS[reader]
    path = str(root / name)
    if not spoil(path, variant, wrong_type, nan):
        pytest.skip(f"{os.path.basename(path)} has no {variant.replace('_', ' ')} variant")
    before = checksums(root)
    script, args = command(root)
    code, _, err = run_script(script, args, capsys)
    assert "Traceback" not in err, err[-3000:]
    after = checksums(root)
    if code == 0:  # a success may write its own output, and nothing else
        kept = {p: v for p, v in before.items() if os.path.relpath(p, root) not in REWRITES.get(reader, ())}
        assert {p: after.get(p) for p in kept} == kept
        return
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err[-2000:]
    assert os.path.basename(path) in lines[0] or os.path.basename(os.path.dirname(path)) in lines[0], lines[0]
    assert after == before, lines[0]


# ---- the cases a hostile probe found, each once ------------------------------------------------------------------

def test_a_preset_is_read_not_run(good, tmp_path, capsys):
    """A preset is `name = literal` lines, read with ast.literal_eval: an import, a function call or a function is
    refused with its line number, and runs nothing, not even for --help; a plain value is an option."""
    preset = tmp_path / "plain.py"
    preset.write_text("# a comment\nn_layer = 2  # and another\nn_embd = 32\nmax_iters = 1\nlearning_rate = 1e-3\n")
    values = train.parse_args([str(preset), "--data_dir", str(good / "data")])
    assert (values[0].max_iters, values[0].learning_rate, values[1]["n_layer"], values[1]["n_embd"]) == (1, 1e-3, 2, 32)
    (tmp_path / "other.py").write_text("max_iters = 1\nsizes = [1, 2]\n")  # a plain value is an option: named
    code, _, err = run_script("train.py", [tmp_path / "other.py", "--data_dir", good / "data"], capsys)
    assert code == 1 and "unknown option(s) sizes" in err, err
    marker = tmp_path / "ran"
    for text, line, what in [(f"n_layer = 2\nmax_iters = len(open({str(marker)!r}, 'w').name)\n", 2, "not a literal"),
                             ("import os\nn_layer = 2\n", 1, "'import os' is not a `name = value`"),
                             ("def f():\n    return 1\n", 1, "is not a `name = value`"),
                             ("n_layer, n_head = 2, 2\n", 1, "is not a `name = value`")]:
        (tmp_path / "hostile.py").write_text(text)
        for extra in ([], ["--help"]):
            code, out, err = run_script("train.py", [tmp_path / "hostile.py", *extra, "--data_dir", good / "data"],
                                        capsys)
            assert_one_error_line(code, err, f"hostile.py line {line}")
            assert what in err and not out and not marker.exists(), err


def test_a_checkpoint_that_is_a_folder_is_named_as_such(good, tmp_path, capsys):
    os.makedirs(tmp_path / "run" / "ckpt.pt")
    code, _, err = run_script("sample.py", ["--out_dir", tmp_path / "run"], capsys)
    assert code == 1 and "is a folder, not a file" in err and "train one" not in err, err


def test_mc_says_the_shots_it_used_and_json_is_strict(good, tmp_path, capsys):
    two = tmp_path / "two.jsonl"
    two.write_text("".join(MC.splitlines(keepends=True)[:2]))
    code, out, err = run_script("eval.py", ["--out_dir", good / "run", "--loss=false", "--mc", two], capsys)
    assert code == 0 and "1-shot, 2 questions" in out and "1-shot, not 4-shot" in err, out + err
    # weights that are finite but overflow the logits: a loss that is not finite, written as null (JSON has no NaN)
    run = tmp_path / "overflow"
    shutil.copytree(good / "run", run)
    ckpt = torch.load(run / "ckpt.pt", weights_only=False)
    ckpt["model"]["lm_head.weight"].fill_(3e38)
    torch.save(ckpt, run / "ckpt.pt")
    code, out, err = run_script("eval.py", ["--out_dir", run, "--json", "--data_dir", good / "data"], capsys)
    record = json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in --json output"))
    assert code == 0 and record["loss"] is None and "written as null" in err, out + err
    code, out, err = run_script("eval.py", ["--out_dir", run, "--data_dir", good / "data"], capsys)
    assert code == 0 and "loss not finite" in out and "nan" not in out.lower(), out
