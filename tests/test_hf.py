"""Hugging Face models in and out (hf/convert.py): train.py --init_from DIR, hf/export.py and prepare.py --tokenizer hf:DIR,
checked against transformers' own LlamaForCausalLM and Qwen3ForCausalLM. The models are tiny and random, made and
saved here (offline); the data is the real Shakespeare set from prepare.py (byte tokenizer, vocab 257, so the
folders have vocab_size 257), and one test makes its own tokenizer.json with `tokenizers`."""
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="tests/test_hf.py compares with transformers' models: "
                                   "pip install -r requirements-eval.txt")
pytestmark = [pytest.mark.extras, pytest.mark.usefixtures("one_thread")]

from common import hf_tokenizer, model_from_checkpoint
from plumbing.config import load_model_module
from hf import convert, export
from hf.convert import split_fused
from plumbing.files import read_meta
import train
from conftest import ROOT, model_names, run_script
from generate import generate

RUN = ["--block_size=64", "--batch_size=4", "--eval_iters=2", "--device=cpu", "--log_interval=1"]
SIZES = dict(vocab_size=257, hidden_size=64, intermediate_size=96, num_key_value_heads=2, num_attention_heads=4,
             max_position_embeddings=64, bos_token_id=None, eos_token_id=None, pad_token_id=None)
# Llama: biases everywhere, untied head, n_embd // n_head heads. Qwen3: QK-norm, head_dim 24 (not 64 / 4 = 16),
# tied embeddings, rope_theta 1e6 as Qwen3's, saved in shards.
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SIZES, num_hidden_layers=2, attention_bias=True, mlp_bias=True),
    "qwen3": lambda: transformers.Qwen3Config(**SIZES, num_hidden_layers=4, head_dim=24, rope_theta=1e6,
                                              tie_word_embeddings=True),
}
CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def main(*args):
    train.main([str(a) for a in args])


def randomise(model, seed):
    """Every parameter away from its init (norm weights and biases too), so that a wrong mapping shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.05 if name.endswith("bias") else 0.2))
    return model


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    """{arch: (folder, transformers model)}: Llama in one model.safetensors, Qwen3 sharded with an index."""
    out = {}
    for seed, (arch, config) in enumerate(CONFIGS.items()):
        model = randomise(transformers.AutoModelForCausalLM.from_config(config()), seed).eval()
        folder = tmp_path_factory.mktemp("hf") / arch
        model.save_pretrained(folder, max_shard_size="40KB" if arch == "qwen3" else "1GB")
        out[arch] = (str(folder), model)
    assert os.path.exists(os.path.join(out["qwen3"][0], "model.safetensors.index.json"))
    assert os.path.exists(os.path.join(out["llama"][0], "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def imported(hf_models, data_dir, tmp_path_factory):
    """{arch: run folder}: train.py --init_from DIR --max_iters 0, the converted checkpoint without training."""
    runs = {}
    for arch, (folder, _) in hf_models.items():
        runs[arch] = str(tmp_path_factory.mktemp("run") / arch)
        main("--init_from", folder, "--data_dir", data_dir, "--out_dir", runs[arch], "--max_iters=0", *RUN)
    return runs


def load_run(run):
    model, _, ckpt = model_from_checkpoint(run)
    return model.eval(), ckpt


def ids(B=2, T=48, seed=0, vocab=257):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# ---- the import computes what transformers computes -----------------------------------------------------------

@pytest.mark.parametrize("arch", CONFIGS)
def test_logits_gradients_and_greedy_tokens_match_transformers(arch, hf_models, imported, record_property):
    ref = hf_models[arch][1]
    ours, ckpt = load_run(imported[arch])
    assert ckpt["iter_num"] == 0 and ckpt["model_args"]["qk_norm"] == (arch == "qwen3")
    assert ckpt["model_args"]["head_dim"] == (24 if arch == "qwen3" else 0)
    assert ckpt["model_args"]["rope_theta"] == (1e6 if arch == "qwen3" else 10000.0)
    x = ids()
    with torch.no_grad():
        logits, want = ours(x)[0], ref(x).logits
    diff = (logits - want).abs().max().item()
    record_property(f"max_abs_logit_diff_{arch}", diff)
    print(f"{arch}: max |logit difference| {diff:.3g} (logits up to {want.abs().max().item():.3g})")
    assert diff < 1e-4, diff
    # the same loss and, parameter by parameter, the same gradients
    ref.zero_grad(set_to_none=True)
    inputs, targets = x[:, :-1].contiguous(), x[:, 1:].contiguous()
    _, loss = ours(inputs, targets)
    loss.backward()
    ref_loss = F.cross_entropy(ref(inputs).logits.flatten(0, 1), targets.flatten())
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    theirs = dict(ref.named_parameters())
    grads = split_fused({name: p.grad for name, p in ours.named_parameters()}, ours.config)  # q_proj, ...
    for name, grad in grads.items():
        torch.testing.assert_close(grad, theirs[convert.to_hf_name(name)].grad, rtol=1e-4, atol=1e-5)
    ref.zero_grad(set_to_none=True)
    # greedy decoding: ours with its key/value cache, theirs with their cache
    prompt = x[:, :8]
    mine = generate(ours, prompt, 40, temperature=0)
    with torch.no_grad():
        other = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False)
    assert torch.equal(mine, other)


@pytest.mark.parametrize("arch", CONFIGS)
def test_export_then_import_is_the_identity(arch, imported, data_dir, tmp_path, capsys):
    folder = tmp_path / "exported"
    export.main(["--out_dir", imported[arch], "--to", str(folder)])
    # byte data: the byte tokenizer as a tokenizer.json, which --init_from checks against the data's
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    config = json.load(open(folder / "config.json"))
    assert config["architectures"] == [CLASSES[arch]] and config["tie_word_embeddings"] == (arch == "qwen3")
    main("--init_from", folder, "--data_dir", data_dir, "--out_dir", tmp_path / "again", "--max_iters=0", *RUN)
    before = torch.load(os.path.join(imported[arch], "ckpt.pt"), weights_only=False)
    after = torch.load(tmp_path / "again" / "ckpt.pt", weights_only=False)
    assert before["model_args"] == after["model_args"]
    assert before["model"].keys() == after["model"].keys()
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in before["model"])
    # transformers loads the exported folder and computes the run's logits
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(ref).__name__ == CLASSES[arch]
    ours, _ = load_run(imported[arch])
    with torch.no_grad():
        assert (ours(ids())[0] - ref(ids()).logits).abs().max().item() < 1e-4


# ---- every model file starts from the folder ------------------------------------------------------------------

# what each docstring claims about step 0 after --init_from, and the logits that check it
CLAIMS = {"vanilla": "function-preserving, exactly", "attnres": "function-preserving up to the norms' eps",
          "vertical": "not function-preserving", "skiplayer": "not function-preserving",
          "aila": "not function-preserving", "skipmiddle": "not function-preserving",
          "dwa": "function-preserving, exactly", "mhc": "not function-preserving",
          "value": "not function-preserving", "mudd": "not function-preserving"}
# other settings whose claim a docstring also states
MORE = {"skiplayer": [(dict(skip_heads=0), "function-preserving, exactly")],
        "attnres": [(dict(attn_res="full"), "function-preserving up to the norms' eps"),
                    (dict(recency_bias=3.0), "not function-preserving")],
        "dwa": [(dict(dwa_map=m), "function-preserving, exactly") for m in ("x0", "unet")]
        + [(dict(dwa_dilation=2, dwa_period=2), "function-preserving, exactly")],
        "mhc": [(dict(hc_kind="hc"), "function-preserving, exactly")],
        "value": [(dict(value_lambda1=0.0, value_lambda2=1.0), "function-preserving, exactly"),
                  (dict(value_mode="learned"), "not function-preserving"),
                  (dict(value_mode="embed"), "not function-preserving")]}


def start_from(name, folder, meta, **overrides):
    """A model_<name>.py GPT built and loaded as train.py --init_from builds it (seeded)."""
    module = load_model_module(name)
    args = {f.name: f.default for f in dataclasses.fields(module.GPTConfig)} | overrides | {"block_size": 64}
    args = convert.init_args(folder, module, args, [], meta)
    torch.manual_seed(0)
    model = module.GPT(module.GPTConfig(**args))
    convert.load_folder(model, folder)
    return model.eval()


@pytest.mark.parametrize("name", model_names())
def test_step_zero_claims(name, hf_models, data_dir, capsys, record_property):
    doc = " ".join(open(os.path.join(ROOT, "docs", f"{name}.md")).read().split())  # where each file's notes are
    assert f"Step 0 from a pretrained model (train.py --init_from) is {CLAIMS[name]}" in doc
    folder = hf_models["qwen3"][0]
    meta = read_meta(data_dir, "shakespeare")
    x = ids()
    for overrides, claim in [({}, CLAIMS[name])] + MORE.get(name, []):
        models = [start_from(n, folder, meta, **o) for n, o in (("vanilla", {}), (name, overrides))]
        if claim.endswith("up to the norms' eps"):  # the claim: exact as eps -> 0
            for m in (m for model in models for m in model.modules() if type(m).__name__ == "RMSNorm"):
                m.eps = 1e-12
        with torch.no_grad():
            want, got = (m(x)[0] for m in models)
        diff = (got - want).abs().max().item()
        record_property(f"max_abs_logit_diff_from_vanilla {overrides}", diff)
        if claim.startswith("not"):
            assert diff > 0.1, (overrides, diff)
        else:
            assert diff < 1e-4, (overrides, diff)
    assert "could not be checked" in capsys.readouterr().err


@pytest.mark.parametrize("name", model_names())
def test_every_model_trains_from_the_folder(name, hf_models, data_dir, tmp_path):
    out = tmp_path / name
    main("--model", name, "--init_from", hf_models["qwen3"][0], "--data_dir", data_dir, "--out_dir", out,
         "--max_iters=8", "--eval_interval=8", "--learning_rate=2e-3", "--warmup_iters=0", "--decay_lr=false", *RUN)
    records = [json.loads(line) for line in open(out / "log.jsonl")]
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(vals) == 2 and vals[1] < vals[0], vals
    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    assert ckpt["model_args"]["qk_norm"] and ckpt["model_args"]["head_dim"] == 24
    assert ckpt["train_config"]["init_from"] == hf_models["qwen3"][0]


# ---- every bad input is one line ------------------------------------------------------------------------------

def assert_one_error_line(code, err, fragment):
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("note:")]
    assert code not in (0, None) and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], lines[0]


def edit_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    config = json.load(open(path))
    config.update(changes)
    json.dump(config, open(path, "w"))


def make_tokenizer(text, vocab_size=300):
    """A byte-level BPE tokenizer trained on text, with <|endoftext|>: a tokenizer.json as models ship them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    return tok


TEXT = ("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
        "arrows of outrageous fortune, or to take arms against a sea of troubles, and by opposing end them.\n")

BAD_FOLDERS = {  # case: (arch to copy, how to spoil it, extra options, the fragment of the one error line)
    "absent": ("llama", lambda d: shutil.rmtree(d), [], "model/config.json does not exist; pass a Hugging Face"),
    "no_config": ("llama", lambda d: os.remove(os.path.join(d, "config.json")), [], "config.json does not exist"),
    "no_weights": ("llama", lambda d: os.remove(os.path.join(d, "model.safetensors")), [],
                   "model.safetensors does not exist"),
    "missing_shard": ("qwen3", lambda d: os.remove(os.path.join(d, sorted(f for f in os.listdir(d) if "-of-" in f)[1])),
                      [], "-of-00021.safetensors does not exist; pass a Hugging Face model folder, whole"),
    "damaged_weights": ("llama", lambda d: open(os.path.join(d, "model.safetensors"), "r+b").truncate(1000), [],
                        "model.safetensors (SafetensorError: Error while deserializing header"),
    "gpt2": ("llama", lambda d: transformers.GPT2Config(vocab_size=257).save_pretrained(d), [],
             "describes a gpt2 model"),
    "vocab": ("llama", lambda d: edit_config(d, vocab_size=300), [], "vocab_size 300 but the data's byte tokenizer"),
    "shape": ("llama", lambda d: edit_config(d, intermediate_size=128), [],  # load_state_dict's words, in our names
              "model.safetensors (RuntimeError: Error(s) in loading state_dict for GPT: size mismatch for "
              "blocks.0.mlp.w13.weight"),
    "rope_scaling": ("llama", lambda d: edit_config(d, rope_parameters=dict(rope_type="llama3", rope_theta=5e5)), [],
                     "RoPE scaling 'llama3' is not supported"),
    "tokenizer": ("llama", lambda d: make_tokenizer(TEXT, 257).save(os.path.join(d, "tokenizer.json")), [],
                  "is not the one the data was prepared with (byte)"),
    "option": ("llama", lambda d: None, ["--n_layer=3"], "--n_layer 3 (config.json: 2) contradicts"),
}


@pytest.mark.parametrize("case", BAD_FOLDERS)
def test_bad_folder_is_one_error_line(case, hf_models, data_dir, tmp_path, capsys):
    arch, spoil, extra, fragment = BAD_FOLDERS[case]
    folder = tmp_path / "model"
    shutil.copytree(hf_models[arch][0], folder)
    spoil(str(folder))
    out = tmp_path / "out"
    code, _, err = run_script("train.py", ["--init_from", folder, "--data_dir", data_dir, "--out_dir", out,
                                        "--max_iters=0", *extra, *RUN], capsys)
    assert_one_error_line(code, err, fragment)
    assert not out.exists()  # failed before anything was written


def test_export_refuses_a_full_folder(hf_models, data_dir, tmp_path, capsys):
    """(Other model files export as custom-code folders: tests/test_hf_export.py.)"""
    run = tmp_path / "skiplayer"
    main("--model=skiplayer", "--init_from", hf_models["llama"][0], "--data_dir", data_dir, "--out_dir", run,
         "--max_iters=0", *RUN)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    code, _, err = run_script("hf/export.py", ["--out_dir", run, "--to", tmp_path / "full"], capsys)
    assert_one_error_line(code, err, "exists and is not an empty folder")
    assert not (tmp_path / "to").exists() and os.listdir(tmp_path / "full") == ["keep.txt"]


# ---- a model's own tokenizer: prepare.py --tokenizer hf:DIR, train, sample, export ---------------------------

def test_hf_tokenizer_from_prepare_to_sample_and_export(tmp_path, capsys):
    tok = make_tokenizer(TEXT)
    folder = tmp_path / "model"
    config = transformers.Qwen3Config(**{**SIZES, "vocab_size": tok.get_vocab_size()}, num_hidden_layers=2,
                                      head_dim=16, tie_word_embeddings=True)
    randomise(transformers.AutoModelForCausalLM.from_config(config), 3).save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    text = tmp_path / "some.txt"
    text.write_text(TEXT * 40)
    data = tmp_path / "data"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "prepare.py"), "--files", str(text), "--tokenizer",
                           f"hf:{folder}", "--out_dir", str(data), "--num_proc=1", "--val_fraction=0.1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    meta = json.load(open(data / "some" / "meta.json"))
    eot = tok.token_to_id("<|endoftext|>")
    assert meta["tokenizer"] == f"hf:{os.path.abspath(folder)}" and meta["vocab_size"] == tok.get_vocab_size()
    assert meta["eot_token"] == eot
    encode, decode, _, _ = hf_tokenizer(str(folder))
    # one document: train holds its first tokens, val the last ones and the end-of-text token
    tokens = np.concatenate([np.fromfile(data / "some" / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")])
    assert tokens[-1] == eot and decode(tokens[:-1].tolist()) == TEXT * 40
    assert decode(encode(TEXT)) == TEXT and encode("<|endoftext|>") != [eot]  # a separator in the text is text

    run = tmp_path / "run"
    main("--init_from", folder, "--data_dir", data, "--dataset=some", "--out_dir", run, "--max_iters=4",
         "--block_size=32", "--batch_size=4", "--eval_iters=2", "--device=cpu")
    assert "could not be checked" not in capsys.readouterr().err  # this folder's tokenizer was checked
    code, out, err = run_script("sample.py", ["--out_dir", run, "--start", "To be", "--num_samples=1",
                                              "--max_new_tokens=12", "--device=cpu"], capsys)
    assert code == 0, err
    assert out.startswith("To be") and len(out.split("---------------")[0]) > len("To be\n")  # decoded text

    exported = tmp_path / "exported"
    export.main(["--out_dir", str(run), "--to", str(exported)])
    # its tokenizer.json as it is, and a tokenizer_config.json that names the end-of-text token
    assert sorted(os.listdir(exported)) == ["config.json", "model.safetensors", "tokenizer.json",
                                            "tokenizer_config.json"]
    assert (exported / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    hf_tok = transformers.AutoTokenizer.from_pretrained(exported)
    assert hf_tok(TEXT, add_special_tokens=False).input_ids == encode(TEXT)
    assert hf_tok.eos_token_id == hf_tok.pad_token_id == eot
    assert json.load(open(exported / "config.json"))["eos_token_id"] == eot

    # prepare.py with a folder that has no tokenizer.json: one line
    code, _, err = run_script("prepare.py", ["--files", text, "--tokenizer", f"hf:{tmp_path}", "--out_dir", data],
                           capsys)
    assert_one_error_line(code, err, "has no tokenizer.json")


def test_a_config_without_num_key_value_heads_is_multi_head_attention(tmp_path):
    """transformers' default: num_key_value_heads absent means one key/value head per query head."""
    transformers.LlamaForCausalLM(CONFIGS["llama"]()).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["num_key_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = convert.read_config(str(tmp_path))
    assert args["n_kv_head"] == args["n_head"] == SIZES["num_attention_heads"]
