"""The paper recipes in config/ and the table of commands in docs/recipes.md: every command is accepted by its
script, and every training run sets what its paper did."""
import importlib
import os
import re
import shlex

import pytest
import torch

from hf import export
from plumbing.errors import ConfigError
from plumbing.options import read_config_file
import prepare
import sample
import train
from conftest import ROOT, tracked

evalpy = importlib.import_module("eval")

# per recipe, what its paper gives: (tokens per optimiser step, steps, peak learning rate, data set)
PAPERS = {
    "fineweb_edu_50m": (256 * 4096, 20_000, 1e-4, "fineweb-edu"),  # the Vertical Attention paper, section 4.1
    "fineweb_edu_100m": (256 * 4096, 20_000, 1e-4, "fineweb-edu"),
    "fineweb_edu_300m": (256 * 4096, 20_000, 1e-4, "fineweb-edu"),
    "openwebtext_gpt2_small": (524_288, 18_000, 1.5e-4, "openwebtext"),  # the SLA paper, section 4.2
    "openwebtext_gpt2_medium": (524_288, 18_000, 1.5e-4, "openwebtext"),
    "openwebtext_gpt2_large": (524_288, 18_000, 1.5e-4, "openwebtext"),
    "fineweb_edu_qwen3_100m": (64 * 2048, 20_000, 6e-4, "fineweb-edu"),  # Open AttnRes and its authors' script
    "fineweb_edu_qwen3_600m": (32 * 2048, 20_000, 3e-4, "fineweb-edu"),
    "fineweb_gpt2_small": (524_288, 19_073, 1e-3, "fineweb"),  # the skip-middle paper, Table 2 and section 3.1
}
# runs that start from a pretrained Hugging Face model (--init_from, no preset): Open AttnRes's Experiment 2, with
# the settings of its authors' later paper (32 x 4096 tokens per step, 10k steps, lr 1e-4)
FINE_TUNING = {"models/Qwen3-0.6B": (32 * 4096, 10_000, 1e-4, "fineweb-edu-qwen3"),
               "models/Qwen3-1.7B": (32 * 4096, 10_000, 1e-4, "fineweb-edu-qwen3")}
SEED_000_SLA = {"50m": (4, 1), "100m": (6, 3), "300m": (9, 6)}  # the Vertical Attention paper, section 4.1
LOOP = re.compile(r"for (\w+) in ([^;]+); do (.+); done")


def readme_rows():
    """(paper, run, command) for every row of docs/recipes.md's recipe table that has a command."""
    text = open(os.path.join(ROOT, "docs", "recipes.md"), encoding="utf-8").read()
    table = text.split("<!-- recipes:start -->")[1].split("<!-- recipes:end -->")[0]
    rows = []
    for line in table.strip().splitlines()[2:]:
        paper, run, command = (c.strip() for c in line.strip().strip("|").split("|"))
        if command.startswith("`"):
            rows.append((paper, run, command.strip("`")))
    return rows


def expand(command):
    """A row's command, or the commands of its one `for VAR in ...; do ...; done` loop."""
    loop = LOOP.fullmatch(command)
    if not loop:
        return [command]
    var, values, body = loop.groups()
    return [re.sub(r"\$\{%s\}|\$%s\b" % (var, var), value, body) for value in values.split()]


def parsed_commands():
    """[(paper, script, argv, parsed options)] for every command of the table, each parsed by its own script."""
    out = []
    for paper, _, command in readme_rows():
        for single in expand(command):
            words = shlex.split(single)
            if words[0] == "torchrun":
                script, argv = "train.py", words[words.index("train.py") + 1:]
            else:
                assert words[0] == "python", single
                module = words[1] == "-m"  # python -m hf.export: hf/export.py
                script, argv = (words[2].replace(".", "/") + ".py", words[3:]) if module else (words[1], words[2:])
            parse = {"train.py": train.parse_args, "prepare.py": prepare.parse_args, "eval.py": evalpy.parse_args,
                     "sample.py": sample.parse_args, "hf/export.py": export.parse_args}[script]
            out.append((paper, script, argv, parse(argv)))
    return out


@pytest.fixture(scope="module")
def commands():
    here = os.getcwd()
    os.chdir(ROOT)  # the commands run from the repository's root
    try:
        return parsed_commands()
    finally:
        os.chdir(here)


def test_the_table_covers_every_paper_and_recipe(commands):
    assert {paper for paper, _, _ in readme_rows()} == {"Vertical Attention", "SLA", "Open AttnRes", "AILA",
                                                        "skip-middle"}  # the README's short names
    used = {os.path.basename(a[0])[:-3] for _, script, a, _ in commands
            if script == "train.py" and a[0].endswith(".py")}
    assert used == set(PAPERS)
    started = {a[a.index("--init_from") + 1] for _, script, a, _ in commands if "--init_from" in a}
    assert started == set(FINE_TUNING)
    presets = {os.path.basename(p)[:-3] for p in tracked("config/*.py")}
    assert used <= presets and len(presets) <= 10


def test_training_runs_set_what_their_papers_did(commands):
    out_dirs = []
    for _, script, argv, parsed in commands:
        if script != "train.py":
            continue
        o, model_args, _, _ = parsed
        recipe = os.path.basename(argv[0])[:-3]
        tokens, steps, lr, dataset = PAPERS[recipe] if argv[0].endswith(".py") else FINE_TUNING[o.init_from]
        assert model_args["block_size"] * o.batch_size * o.gradient_accumulation_steps == tokens, argv
        assert o.max_iters == steps or "--max_iters" in argv, argv
        assert o.learning_rate == lr and o.dataset == dataset, argv
        assert o.gradient_accumulation_steps % 16 == 0, argv  # 1, 2, 4, 8 or 16 GPUs share it out
        if o.model == "skiplayer" and o.size:  # the Vertical Attention paper's SLA at its sizes
            assert (model_args["skip_layers"], model_args["skip_heads"]) == SEED_000_SLA[o.size], argv
        if o.model == "vertical":
            assert model_args["va_weight_decay"] == 0.01 and (model_args["va_lr"] == 0.01 or "--va_lr" in argv)
        if recipe == "fineweb_gpt2_small":  # the skip-middle paper clips no gradients and decays no weights
            assert o.grad_clip == 0 and o.weight_decay == 0
        out_dirs.append(o.out_dir)
    assert len(out_dirs) == len(set(out_dirs)) and "out" not in out_dirs  # no run overwrites another


def test_evaluations_read_runs_the_table_trains_on_data_it_prepares(commands):
    trained = {o[0].out_dir for _, script, _, o in commands if script == "train.py"}
    read = [d for _, script, _, a in commands if script == "eval.py" for d in a.out_dir]
    read += [a.out_dir for _, script, _, a in commands if script == "sample.py"]
    assert read and set(read) <= trained
    for paper in ("Vertical Attention", "SLA", "Open AttnRes", "skip-middle"):
        prepared = {a.name or a.dataset for p, script, _, a in commands if p == paper and script == "prepare.py"}
        used = {o[0].dataset for p, script, _, o in commands if p == paper and script == "train.py"}
        assert used and used <= prepared, paper
    for _, script, _, a in commands:
        if script == "prepare.py":
            assert a.max_tokens == 0 or a.tokenizer.startswith("hf:")  # all of a corpus, or the fine-tuning's budget
            assert a.tokenizer == "gpt2" or a.tokenizer == "hf:" + os.path.join(ROOT, "models", "Qwen3-0.6B")


def test_size_defaults_fill_only_what_the_command_line_leaves():
    recipe = os.path.join(ROOT, "config", "fineweb_edu_50m.py")
    _, m, _, _ = train.parse_args([recipe, "--model", "skiplayer", "--skip_heads", "2"])
    assert (m["n_layer"], m["n_embd"], m["skip_layers"], m["skip_heads"]) == (6, 192, 4, 2)
    _, m, _, _ = train.parse_args(["--model", "skiplayer", "--size", "100m"])
    assert (m["n_layer"], m["skip_layers"], m["skip_heads"]) == (8, 6, 3)
    _, m, _, _ = train.parse_args(["--model", "skiplayer"])  # no size: the SLA paper's 3/4 rule
    assert (m["skip_layers"], m["skip_heads"]) == (-1, -1)
    recipe = os.path.join(ROOT, "config", "fineweb_edu_100m.py")
    _, m, _, _ = train.parse_args([recipe, "--model", "vertical", "--n_layer", "4"])
    assert (m["n_layer"], m["n_embd"], m["va_lr"]) == (4, 384, 0.01)


def test_model_on_the_command_line_overrides_a_recipes_model(tmp_path):
    recipe = tmp_path / "recipe.py"
    recipe.write_text('model = "vertical"\nn_layer = 3\n')
    o, m, module, _ = train.parse_args([str(recipe)])
    assert o.model == "vertical" and "va_lr" in m
    o, m, module, _ = train.parse_args([str(recipe), "--model", "vanilla"])
    assert o.model == "vanilla" and module.__name__ == "model_vanilla" and m["n_layer"] == 3


def test_a_recipe_trains_through_train_py(data_dir, tmp_path):
    """The Vertical Attention paper's 50m recipe with skiplayer, shortened to one step on Shakespeare (byte-level
    data: --tokenizer '' lifts the preset's gpt2): its shape and the model file's size defaults reach the checkpoint."""
    out, threads = str(tmp_path / "run"), torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small runs faster on one thread than on several fighting over it
    try:
        train.main([os.path.join(ROOT, "config", "fineweb_edu_50m.py"), "--model", "skiplayer", "--dataset",
                    "shakespeare", "--tokenizer", "", "--data_dir", data_dir, "--out_dir", out, "--device", "cpu",
                    "--block_size", "32", "--batch_size", "2", "--gradient_accumulation_steps", "1", "--max_iters",
                    "1", "--eval_iters", "1"])
    finally:
        torch.set_num_threads(threads)
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)
    m, o = ckpt["model_args"], ckpt["train_config"]
    assert (m["n_embd"], m["n_layer"], m["n_head"], m["n_kv_head"], m["ffn_hidden"]) == (192, 6, 3, 1, 768)
    assert (m["skip_layers"], m["skip_heads"]) == (4, 1) and ckpt["iter_num"] == 1
    assert o["learning_rate"] == 1e-4 and o["decay_lr"] is False and o["weight_decay"] == 0.01


def test_a_size_preset_layers_on_its_recipe(tmp_path):
    """base = "x.py" reads the preset beside it first: a size's file holds only what differs; a loop is refused."""
    read = lambda name: read_config_file(os.path.join(ROOT, "config", name))[0]  # noqa: E731
    assert read("fineweb_edu_100m.py") == {**read("fineweb_edu_50m.py"), "size": "100m"}
    large, small = read("openwebtext_gpt2_large.py"), read("openwebtext_gpt2_small.py")
    assert large["n_layer"] == 36 and large["max_iters"] == small["max_iters"] and "base" not in large
    (tmp_path / "a.py").write_text('base = "b.py"\nmax_iters = 5\n')
    (tmp_path / "b.py").write_text('base = "a.py"\n')
    with pytest.raises(ConfigError, match="leads back to it"):
        read_config_file(str(tmp_path / "a.py"))
    (tmp_path / "b.py").write_text('max_iters = 7\nbatch_size = 3\n')
    assert read_config_file(str(tmp_path / "a.py"))[0] == {"max_iters": 5, "batch_size": 3}
