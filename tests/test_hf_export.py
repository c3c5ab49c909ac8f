"""Every model file in the Hugging Face ecosystem: export.py writes a run of any model file (and each of its VARIANTS)
as a transformers custom-code folder, which AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True) loads
offline with the same logits and the same greedy tokens as this repository; train.py --init_from DIR reads it back
whole; lm-evaluation-harness's own `hf` model type scores it as eval.py --lm_eval does. Tiny random runs (the
method's own parameters moved away from their init, so that a lost one shows)."""
import ast
import contextlib
import filecmp
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="the exported folders are checked with transformers: "
                                   "pip install -r requirements-eval.txt")
pytestmark = [pytest.mark.extras, pytest.mark.usefixtures("one_thread")]

from common import decode_bytes, encode_bytes, get_tokenizer, model_from_checkpoint
from hf import convert, export
import train
from conftest import ROOT, model_cases, run_script
from generate import generate

from test_errors import assert_one_error_line

TINY = ["--n_layer=4", "--n_head=4", "--n_kv_head=2", "--n_embd=32", "--ffn_hidden=64", "--block_size=32",
        "--batch_size=2", "--eval_iters=1", "--device=cpu"]
CASES = model_cases()
IDS = [f"{name}-{variant}" for name, variant, _ in CASES]
# the padded batches through transformers take about 4 s a case: vanilla's and vertical's by default, the rest slow
PADDED = [case if case[:2] in (("vanilla", "default"), ("vertical", "default")) else
          pytest.param(*case, marks=pytest.mark.slow) for case in CASES]


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
    ours, _, _ = model_from_checkpoint(str(run))
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

    # and sample.py's text, from a checkpoint, is what pipeline("text-generation") prints after the same prompt, with
    # the folder's tokenizer
    code, text, err = run_script("sample.py", ["--out_dir", run, "--start", "ROMEO:", "--num_samples=1",
                                               f"--max_new_tokens={n}", "--temperature=0", "--device=cpu"], capsys)
    generator = transformers.pipeline("text-generation", model=str(folder), trust_remote_code=True)
    generator.model.generation_config.eos_token_id = None  # (a random model says end of text too)
    printed = generator("ROMEO:", max_new_tokens=n, do_sample=False)[0]["generated_text"]
    assert code == 0 and text.split("\n---------------")[0] == printed

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


# ---- padding, and the rest of what transformers passes --------------------------------------------------------

PROMPTS = ["ROMEO:", "JULIET:\nO Romeo, Romeo", "A"]  # 6, 22 and 1 byte tokens


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("name,variant,overrides", PADDED, ids=IDS)
def test_a_padded_batch_computes_what_each_row_computes_alone(name, variant, overrides, data_dir, tmp_path):
    """The folder's tokenizer pads PROMPTS on either side; through transformers each row's logits at its real
    positions are those of the prompt alone, and greedy generate() continues each row as sample.py does (the custom
    folders past the context of 32, where the window restarts; transformers' Llama within it). The custom folders
    also: use_cache off, sampling, beam search, labels, output_hidden_states and return_dict."""
    run = make_run(name, overrides, data_dir, tmp_path / "run")
    folder = tmp_path / "hf"
    export.main(["--out_dir", str(run), "--to", str(folder)])
    ours, _, _ = model_from_checkpoint(str(run))
    ours.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True).eval()
    model.generation_config.eos_token_id = None  # sample.py does not stop at end-of-text either
    alone = [torch.tensor([list(p.encode())]) for p in PROMPTS]
    n = 10 if name == "vanilla" else 40
    want = [generate(ours, ids, n, temperature=0)[0] for ids in alone]  # sample.py's tokens
    for side in ("left", "right"):
        batch = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side=side)
        real = batch["attention_mask"].bool()
        assert not real.all() and (real[:, 0] if side == "right" else real[:, -1]).all()
        with torch.no_grad():
            logits = model(**batch).logits
            for i, ids in enumerate(alone):
                assert rel(logits[i][real[i]], model(ids).logits[0]) <= 1e-5, (side, i)
        if name == "vanilla" and side == "right":
            continue  # transformers' Llama predicts a right-padded row's first new token at a pad (it warns so)
        for use_cache in (True, False):
            got = model.generate(**batch, max_new_tokens=n, do_sample=False, use_cache=use_cache)
            real_and_new = torch.cat([real, torch.ones(len(PROMPTS), n, dtype=torch.bool)], dim=1)
            for i in range(len(PROMPTS)):
                assert torch.equal(got[i][real_and_new[i]], want[i]), (side, use_cache, i)
    if name == "vanilla":
        return  # the rest is hf_model.py's (transformers' own Llama)

    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    # sampling: the same tokens with the cache and without (the same random numbers drawn)
    torch.manual_seed(0)
    sampled = model.generate(**batch, max_new_tokens=n, do_sample=True, top_k=50, temperature=2.0)
    torch.manual_seed(0)
    assert torch.equal(sampled, model.generate(**batch, max_new_tokens=n, do_sample=True, top_k=50, temperature=2.0,
                                               use_cache=False))
    # beam search reorders and repeats rows between steps: each row's beams are those of its prompt alone, computed
    # without the cache
    beams = model.generate(**batch, max_new_tokens=n, num_beams=3, do_sample=False)
    own = [model.generate(ids, max_new_tokens=n, num_beams=3, do_sample=False, use_cache=False)[0] for ids in alone]
    for i in range(len(PROMPTS)):
        assert torch.equal(beams[i][-own[i].numel():], own[i]), i
    assert any(not torch.equal(o, w) for o, w in zip(own, want))  # beam search, not greedy decoding

    # labels (pads -100): the mean next-token loss of the real tokens, on the right-padded batch
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="right")
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        out = model(**batch, labels=batch["input_ids"].masked_fill(~real, -100), output_hidden_states=True)
        pairs = [(ours(ids)[0][0, :-1], ids[0, 1:]) for ids in alone]
        loss = F.cross_entropy(torch.cat([l for l, _ in pairs]), torch.cat([t for _, t in pairs]))
        assert out.loss.item() == pytest.approx(loss.item(), rel=1e-5)
        # hidden states: the embeddings and every block's output (the model file's return_hidden)
        assert len(out.hidden_states) == ours.config.n_layer + 1
        for i, ids in enumerate(alone):
            last = ours(ids, return_hidden=True)[2][-1][0]
            assert rel(out.hidden_states[-1][i][real[i]], last) <= 1e-5
        as_tuple = model(**batch, return_dict=False)
        assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], model(**batch).logits)


# ---- the tokenizer a folder carries -----------------------------------------------------------------------------

TEXTS = ["ROMEO:\nBut, soft!", "  two  spaces\tand a tab\n\n", "caf\u00e9 \u65e5\u672c <|endoftext|> end", ""]


def test_the_byte_tokenizer_is_a_tokenizer_json_that_transformers_loads(data_dir, tmp_path, capfd):
    """A run on the byte tokenizer (the quick start's) exports its tokenizer: 256 byte tokens at their byte values and
    end of text 256, which AutoTokenizer loads as transformers' own tokenizer class, without a question or a
    warning (a custom-code folder with trust_remote_code=True, which AutoTokenizer needs to read its config.json;
    PreTrainedTokenizerFast without it), encoding and decoding as prepare.py does. Every file is written with the
    mode the umask gives."""
    umask = os.umask(0o022)
    os.umask(umask)
    for name, trust in (("vanilla", {}), ("vertical", {"trust_remote_code": True})):
        folder = tmp_path / f"{name}-hf"
        export.main(["--out_dir", str(make_run(name, {}, data_dir, tmp_path / name)), "--to", str(folder)])
        assert {f: os.stat(folder / f).st_mode & 0o777 for f in os.listdir(folder)} == \
            {f: 0o666 & ~umask for f in os.listdir(folder)}
        vocab = json.load(open(folder / "tokenizer.json"))["model"]["vocab"]
        assert vocab == {convert.bytes_to_unicode()[b]: b for b in range(256)}
        capfd.readouterr()
        tokenizers = [transformers.AutoTokenizer.from_pretrained(str(folder), **trust),
                      transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))]  # tokenizer files only
        assert capfd.readouterr().err == ""  # no question, no warning
        for tokenizer in tokenizers:
            assert type(tokenizer).__module__.startswith("transformers.")
            assert tokenizer.eos_token == tokenizer.bos_token == tokenizer.pad_token == "<|endoftext|>"
            assert tokenizer.eos_token_id == tokenizer.bos_token_id == tokenizer.pad_token_id == 256
            for text in TEXTS:
                assert tokenizer(text)["input_ids"] == encode_bytes(text), text  # "<|endoftext|>" in a text is text
            g = torch.Generator().manual_seed(0)
            for _ in range(200):  # any ids, broken UTF-8 and end of text among them
                ids = torch.randint(0, 257, (int(torch.randint(0, 12, (1,), generator=g)),), generator=g).tolist()
                assert tokenizer.decode(ids, skip_special_tokens=True) == decode_bytes(ids), ids


def test_a_gpt2_run_exports_gpt2s_tokenizer_from_tiktokens_files_or_is_refused(data_dir, tmp_path, monkeypatch,
                                                                                capsys):
    """GPT-2's tokenizer is made from tiktoken's ranks (here a small vocabulary that tiktoken's own trainer makes
    with GPT-2's rules, in place of GPT-2's files, which are not here offline): its tokenizer.json encodes as tiktoken
    does. Without tiktoken's files the export is refused in one line naming --tokenizer, which then gives the
    tokenizer."""
    import tiktoken
    from test_lm_eval import OFFLINE
    from tiktoken._educational import bpe_train
    from tiktoken_ext import openai_public
    import prepare
    text = "".join(prepare.shakespeare_documents())
    with contextlib.redirect_stdout(io.StringIO()):  # the trainer shows its every merge
        ranks = bpe_train(text[:60_000], 400, openai_public.r50k_pat_str)
    tiktokens = {"name": "gpt2", "pat_str": openai_public.r50k_pat_str, "mergeable_ranks": ranks,
                 "special_tokens": {"<|endoftext|>": 400}}
    enc = tiktoken.Encoding(**tiktokens)
    run = make_run("vertical", {}, data_dir, tmp_path / "run")
    ckpt = torch.load(run / "ckpt.pt", weights_only=False)
    ckpt["meta"] = {**ckpt["meta"], "tokenizer": "gpt2", "vocab_size": 401, "eot_token": 400}
    train.save_checkpoint(str(run / "ckpt.pt"), ckpt)

    for k, v in {**OFFLINE, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty")}.items():
        monkeypatch.setenv(k, v)  # tiktoken has to download GPT-2's files, and cannot
    code, _, err = run_script("hf/export.py", ["--out_dir", run, "--to", tmp_path / "refused"], capsys)
    assert_one_error_line(code, err, "pass --tokenizer DIR")
    assert not (tmp_path / "refused").exists()

    monkeypatch.setitem(openai_public.ENCODING_CONSTRUCTORS, "gpt2", lambda: tiktokens)  # tiktoken's files at hand
    export.main(["--out_dir", str(run), "--to", str(tmp_path / "made")])
    monkeypatch.undo()
    (tmp_path / "tok").mkdir()
    shutil.copy(tmp_path / "made" / "tokenizer.json", tmp_path / "tok")
    export.main(["--out_dir", str(run), "--to", str(tmp_path / "given"), "--tokenizer", str(tmp_path / "tok")])
    held_out = text[100_000:200_000] + "".join(TEXTS)
    for folder in ("made", "given"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / folder), trust_remote_code=True)
        assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 400
        ids = tokenizer(held_out)["input_ids"]
        assert ids == enc.encode_ordinary(held_out) and tokenizer.decode(ids) == held_out
    code, _, err = run_script("hf/export.py", ["--out_dir", run, "--to", tmp_path / "other", "--tokenizer",
                                            tmp_path / "made-not"], capsys)
    assert_one_error_line(code, err, "has no tokenizer.json")


def test_the_readme_hub_snippet_runs_as_written(data_dir, tmp_path, monkeypatch, capsys):
    """docs/huggingface.md's Python snippet under "Share a run on the Hub", run as it is written on a folder exported
    where it looks: the pipeline prints sample.py's greedy text, and generate() samples a left-padded batch of two."""
    page = open(os.path.join(ROOT, "docs", "huggingface.md"), encoding="utf-8").read()
    section = page[page.index("\n## Share a run on the Hub\n"):]
    start = section.index("```python\n") + len("```python\n")
    snippet = section[start:section.index("```\n", start)]
    run = make_run("vertical", {}, data_dir, tmp_path / "run")
    export.main(["--out_dir", str(run), "--to", str(tmp_path / "models" / "vertical-shakespeare")])
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    exec(compile(snippet, "docs/huggingface.md", "exec"), {})
    greedy, sampled = capsys.readouterr().out.removesuffix("\n").rsplit("\n", 1)
    ours, _, _ = model_from_checkpoint(str(run))
    want = generate(ours.eval(), torch.tensor([list(b"ROMEO:")]), 100, temperature=0)[0].tolist()
    assert 256 not in want and greedy == decode_bytes(want)  # past the context of 32: the window restarts
    prompts, sampled = ["ROMEO:", "JULIET:\nO Romeo"], ast.literal_eval(sampled)  # (unseeded: any continuation)
    assert len(sampled) == 2 and all(t.startswith(p) for t, p in zip(sampled, prompts))


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


@pytest.mark.slow  # lm-eval on every model file: about 35 s
@pytest.mark.parametrize("name", sorted({name for name, _, _ in CASES}))
def test_lm_eval_hf_model_type_agrees_with_eval_py_at_any_batch_size(name, tokenized, tmp_path, monkeypatch, capsys):
    """lm-evaluation-harness's own `hf` model type on an exported folder, at --batch_size 1 and 4: the same numbers on
    the multiple-choice task (eval.py --lm_eval's) and on a generation task (generate_until, its contexts
    left-padded in a batch of 4), whose continuations are generate.py's greedy tokens."""
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
    results, responses = {}, {}
    for batch_size in (1, 4):
        out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={folder},trust_remote_code=True,device=cpu",
                                      tasks=["shakespeare_mc", "shakespeare_gen"], num_fewshot=0, batch_size=batch_size,
                                      log_samples=True, task_manager=TaskManager(include_path=TASKS,
                                                                                 include_defaults=False))
        results[batch_size] = {f"{task} {metric.split(',')[0]}": value for task, numbers in out["results"].items()
                               for metric, value in numbers.items() if metric.endswith(",none")
                               and "stderr" not in metric}
        responses[batch_size] = {s["doc"]["context"]: s["filtered_resps"][0] for s in out["samples"]["shakespeare_gen"]}
    print(f"{name}: eval.py --lm_eval acc {ours['acc,none']:.4f} acc_norm {ours['acc_norm,none']:.4f}; lm-eval hf "
          + "; ".join(f"batch {b}: " + ", ".join(f"{k} {v:.4f}" for k, v in r.items()) for b, r in results.items()))
    assert results[1] == results[4] and responses[1] == responses[4]
    assert results[1]["shakespeare_mc acc"] == pytest.approx(ours["acc,none"], abs=1e-12)
    assert results[1]["shakespeare_mc acc_norm"] == pytest.approx(ours["acc_norm,none"], abs=1e-12)
    # each continuation: generate.py's greedy tokens after the context (its last 32 - 8 tokens), up to a newline
    model, _, ckpt = model_from_checkpoint(str(run))
    encode, decode, _, eot = get_tokenizer(ckpt["meta"]["tokenizer"])
    for context, response in responses[1].items():
        ids = encode(context)[-24:]
        new = generate(model.eval(), torch.tensor([ids]), 8, temperature=0)[0, len(ids):].tolist()
        assert response == decode(new[:new.index(eot)] if eot in new else new).split("\n")[0], context
    assert len(set(responses[1].values())) > 1


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
    "bad_model_args": (lambda d: edit_config(d, n_head="four"), [], "--n_head must be int, not 'four' "
                       "(model_vertical.py, from"),
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


@pytest.mark.parametrize("name", ["vanilla", "vertical"])  # a Llama folder and a custom-code one
def test_a_write_that_fails_is_one_line_and_leaves_no_folder(name, data_dir, tmp_path):
    """hf/export.py under a file-size limit (ulimit -f; SIGXFSZ ignored, so a write past it returns EFBIG, as a full
    disk returns ENOSPC): the failed write, safetensors' own error or an OSError, is one line naming --to, and
    neither --to nor the temporary folder beside it is left."""
    resource = pytest.importorskip("resource", reason="a file-size limit needs the POSIX module resource")
    run = make_run(name, {}, data_dir, tmp_path / "run")
    limit = 16 << 10  # config.json fits, model.safetensors does not

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    to = tmp_path / "out" / "hf"
    proc = subprocess.run([sys.executable, "-m", "hf.export", "--out_dir", str(run), "--to", str(to)],
                          capture_output=True, text=True, timeout=300, preexec_fn=limited,
                          env={**os.environ, "PYTHONPATH": ROOT, "PYTHONDONTWRITEBYTECODE": "1"})
    assert_one_error_line(proc.returncode, proc.stderr, f"cannot use {to}")
    assert "File too large" in proc.stderr and "--to" in proc.stderr
    # the Llama folder's first file past the limit is model.safetensors (safetensors' own error); the custom-code
    # folder's is the model file (an OSError)
    assert ("SafetensorError" in proc.stderr) == (name == "vanilla"), proc.stderr
    assert not to.exists() and os.listdir(tmp_path / "out") == []
