"""Every model file in the Hugging Face ecosystem: export.py writes a run of any model file (and each of its VARIANTS)
as a transformers custom-code folder, which AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True) loads
offline with the same logits and the same greedy tokens as this repository; train.py --init_from DIR reads it back
whole; lm-evaluation-harness's own `hf` model type scores it as eval.py --lm_eval does. Tiny random runs (the
method's own parameters moved away from their init, so that a lost one shows)."""
import filecmp
import hashlib
import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the exported folders are checked with transformers: "
                                   "pip install -r requirements-eval.txt")
pytestmark = [pytest.mark.extras, pytest.mark.usefixtures("one_thread")]

import common
import export
import train
from conftest import ROOT, model_cases, run_script
from generate import generate
from prepare import decode_bytes
from test_errors import assert_one_error_line

TINY = ["--n_layer=4", "--n_head=4", "--n_kv_head=2", "--n_embd=32", "--ffn_hidden=64", "--block_size=32",
        "--batch_size=2", "--eval_iters=1", "--device=cpu"]
CASES = model_cases()
IDS = [f"{name}-{variant}" for name, variant, _ in CASES]


def options(overrides):
    return [f"--{k}={v}" for k, v in overrides.items()]


def make_run(name, overrides, data_dir, out):
    """A checkpoint of model_<name>.py with every parameter and persistent buffer moved off its init."""
    train.main(["--model", name, "--data_dir", str(data_dir), "--out_dir", str(out), "--max_iters=0", *TINY,
                *options(overrides)])
    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    g = torch.Generator().manual_seed(7)
    for key, t in ckpt["model"].items():
        if t.is_floating_point():
            t.add_(torch.randn(t.shape, generator=g) * 0.05)
    train.save_checkpoint(str(out / "ckpt.pt"), ckpt)
    return out


def digests(folder):
    return {f: hashlib.sha256(open(os.path.join(folder, f), "rb").read()).hexdigest() for f in sorted(os.listdir(folder))}


@pytest.mark.parametrize("name,variant,overrides", CASES, ids=IDS)
def test_export_loads_in_transformers_computes_the_same_and_comes_back(name, variant, overrides, data_dir, tmp_path,
                                                                       capsys):
    run = make_run(name, overrides, data_dir, tmp_path / "run")
    folder = tmp_path / "hf"
    export.main(["--out_dir", str(run), "--to", str(folder)])
    ours, _, _ = common.model_from_checkpoint(str(run))
    ours.eval()
    if name == "vanilla":
        assert json.load(open(folder / "config.json"))["model_type"] in ("llama", "qwen3")
    else:
        config = json.load(open(folder / "config.json"))
        assert config["model_type"] == "layer_connections" and config["architectures"] == ["LayersForCausalLM"]
        assert set(config["auto_map"]) == {"AutoConfig", "AutoModelForCausalLM"}
        assert filecmp.cmp(folder / f"model_{name}.py", os.path.join(ROOT, f"model_{name}.py"), shallow=False)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True).eval()

    # the same logits for the same tokens, every position
    idx = torch.randint(0, 257, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mine, hf = ours(idx)[0], theirs(idx).logits
    assert (mine - hf).abs().max() <= 1e-6 * mine.abs().max(), (mine - hf).abs().max()

    # greedy generate() through transformers gives generate.py's tokens (sample.py's): past the context of 32 with
    # the model file's cache and window; vanilla's Llama folder within it (transformers' Llama has no window rule)
    prompt, n = idx[:, :5], 27 if name == "vanilla" else 40
    theirs.generation_config.eos_token_id = None  # sample.py does not stop at end-of-text either
    want = generate(ours, prompt, n, temperature=0)
    got = theirs.generate(prompt, max_new_tokens=n, do_sample=False)
    assert torch.equal(got, want)

    # and sample.py's text, from a checkpoint, equals transformers' greedy tokens after the same prompt
    code, text, err = run_script("sample.py", ["--out_dir", run, "--start", "ROMEO:", "--num_samples=1",
                                               f"--max_new_tokens={n}", "--temperature=0", "--device=cpu"], capsys)
    ids = theirs.generate(torch.tensor([list(b"ROMEO:")]), max_new_tokens=n, do_sample=False)[0].tolist()
    assert code == 0 and text.split("\n---------------")[0] == decode_bytes(ids)

    # export, then --init_from, then export: the same files, every tensor the method's own included
    again = tmp_path / "again"
    train.main(["--model", name, "--init_from", str(folder), "--data_dir", str(data_dir), "--out_dir",
                str(tmp_path / "back"), "--max_iters=0", "--batch_size=2", "--eval_iters=1", "--device=cpu"])
    back = torch.load(tmp_path / "back" / "ckpt.pt", weights_only=False)
    if name != "vanilla":
        assert back["model_args"] == dict(vars(ours.config))
        for key, t in ours.state_dict().items():
            assert torch.equal(back["model"][key], t), key
    export.main(["--out_dir", str(tmp_path / "back"), "--to", str(again)])
    assert digests(again) == digests(folder)


# ---- lm-evaluation-harness's own `hf` model type on an exported folder ---------------------------------------

@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    """Shakespeare's first 200,000 bytes prepared with a Hugging Face tokenizer (tokenizer.json), so that an
    exported folder carries the tokenizer lm-evaluation-harness loads with AutoTokenizer."""
    from test_hf import make_tokenizer
    import prepare
    root = tmp_path_factory.mktemp("tokenized")
    text = "".join(prepare.shakespeare_documents())[:200_000]
    tok = make_tokenizer(text, vocab_size=400)
    os.makedirs(root / "tok")
    tok.save(str(root / "tok" / "tokenizer.json"))
    # as model folders ship it: the end-of-text token, which lm-eval puts before a continuation without context
    (root / "tok" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None}))
    (root / "plays.txt").write_text(text)
    prepare.main(["--files", str(root / "plays.txt"), "--tokenizer", f"hf:{root / 'tok'}", "--out_dir",
                  str(root / "data"), "--name", "shakespeare"])
    return root / "data"


@pytest.mark.parametrize("name", sorted({name for name, _, _ in CASES}))
def test_lm_eval_hf_model_type_agrees_with_eval_py(name, tokenized, tmp_path, monkeypatch, capsys):
    from test_lm_eval import OFFLINE, TASKS
    import eval as evalpy
    import lm_eval
    from lm_eval.tasks import TaskManager
    for k, v in OFFLINE.items():
        monkeypatch.setenv(k, v)
    run = make_run(name, {}, tokenized, tmp_path / "run")
    folder = tmp_path / "hf"
    export.main(["--out_dir", str(run), "--to", str(folder)])
    task = os.path.join(TASKS, "shakespeare_mc.yaml")
    capsys.readouterr()
    evalpy.main(["--out_dir", str(run), "--loss=false", "--k_shot=0", "--device=cpu", "--json", "--lm_eval", task])
    ours = json.loads(capsys.readouterr().out)["lm_eval"]["shakespeare_mc"]
    out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={folder},trust_remote_code=True,device=cpu",
                                  tasks=["shakespeare_mc"], num_fewshot=0, task_manager=TaskManager(include_path=TASKS,
                                                                                                    include_defaults=False))
    theirs = out["results"]["shakespeare_mc"]
    print(f"{name}: eval.py --lm_eval acc {ours['acc,none']:.4f} acc_norm {ours['acc_norm,none']:.4f}; "
          f"lm-eval hf acc {theirs['acc,none']:.4f} acc_norm {theirs['acc_norm,none']:.4f}")
    assert theirs["acc,none"] == pytest.approx(ours["acc,none"], abs=1e-12)
    assert theirs["acc_norm,none"] == pytest.approx(ours["acc_norm,none"], abs=1e-12)


def edit_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    config = json.load(open(path))
    config["model_args"].update(changes)
    json.dump(config, open(path, "w"))


# case: (how to spoil the exported vertical folder, the options of the run that reads it, the error's fragment)
BAD_FOLDERS = {
    "another_model": (lambda d: None, ["--model=aila"], "holds a model_vertical.py run, not a model_aila.py one"),
    "no_model_file": (lambda d: os.remove(os.path.join(d, "model_vertical.py")), [], "lacks model_vertical.py"),
    "no_wrapper": (lambda d: os.remove(os.path.join(d, "hf_model.py")), [], "lacks hf_model.py"),
    "changed_config": (lambda d: edit_config(d, n_layer=2), [], "do not belong together"),
    "bad_model_args": (lambda d: edit_config(d, n_head="four"), [], "do not fit model_vertical.py"),
    "contradicted": (lambda d: None, ["--n_layer=2"], "contradicts"),
}


@pytest.mark.parametrize("case", BAD_FOLDERS)
def test_a_bad_exported_folder_is_one_line(case, data_dir, tmp_path, capsys):
    spoil, extra, fragment = BAD_FOLDERS[case]
    folder = tmp_path / "hf"
    export.main(["--out_dir", str(make_run("vertical", {}, data_dir, tmp_path / "run")), "--to", str(folder)])
    spoil(str(folder))
    out = tmp_path / "back"
    code, _, err = run_script("train.py", ["--model=vertical", *extra, "--init_from", folder, "--data_dir", data_dir,
                                           "--out_dir", out, "--max_iters=0"], capsys)
    assert_one_error_line(code, err, fragment)
    assert not out.exists()  # refused before anything was written
