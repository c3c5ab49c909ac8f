"""The pages: every command in README.md and docs/*.md names a script that exists and only options that script
(and, for train.py, the model file it names) has; every generated table's markers are in exactly one page, which
tools.tables.update_readme rewrites; the README stays short and opens on the wiring figure."""
import contextlib
import importlib
import io
import json
import os
import re
import shlex

import pytest

from plumbing.config import model_names
from conftest import ROOT, tracked
from tools import tables

PAGES = [os.path.join(ROOT, "README.md")] + tracked("docs/*.md")  # the repository's pages, not a learner's
LOOP = re.compile(r"for (\w+) in ([^;]+); do (.+); done")


def commands(text):
    """Every `python X.py ...`, `python -m folder.X ...` (as folder/X.py) or `torchrun ... X.py ...` command of a
    page: the lines of its sh blocks (a trailing backslash continues a line) and its inline code spans; a for loop's
    body with its first value."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        found += block.replace("\\\n", " ").splitlines()
    found += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    out = []
    for line in found:
        loop = LOOP.search(line)
        if loop:
            var, values, body = loop.groups()
            line = re.sub(r"\$\{%s\}|\$%s\b" % (var, var), values.split()[0], body)
        for part in re.split(r"&&|;", line):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:  # an unbalanced quote: prose in backticks, not a command
                continue
            while words and re.fullmatch(r"\w+=\S*", words[0]):  # OMP_NUM_THREADS=1 python ...
                words = words[1:]
            if words[:1] == ["python"] and len(words) > 1 and words[1].endswith(".py"):
                out.append((words[1], words[2:]))
            elif words[:2] == ["python", "-m"] and os.path.isdir(os.path.join(ROOT, words[2].split(".")[0])):  # tools
                out.append((words[2].replace(".", "/") + ".py", words[3:]))
            elif words[:1] == ["torchrun"]:
                i = next(i for i, w in enumerate(words) if w.endswith(".py"))
                out.append((words[i], words[i + 1:]))
    return out


@contextlib.contextmanager
def quiet():
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
        yield out


def options_of(script, argv):
    """The options a script's own --help defines (train.py: with those of the model file argv names, or of every
    model file where it names a placeholder such as NAME)."""
    module = importlib.import_module(script[:-3].replace("/", "."))
    model = argv[argv.index("--model") + 1] if "--model" in argv else None
    models = [model] if model in model_names() else model_names() if model else [None]
    known = set()
    for name in models:
        with quiet() as out, pytest.raises(SystemExit):
            module.parse_args((["--model", name] if name else []) + ["--help"])
        known |= set(re.findall(r"(?m)^  (?:-\w, )?(--\w+)", out.getvalue()))  # defined, not named in prose
    return known


def test_every_command_names_a_script_and_options_that_exist():
    seen, bad = 0, []
    for page in PAGES:
        for script, argv in commands(open(page, encoding="utf-8").read()):
            where = f"{os.path.relpath(page, ROOT)}: {script} {' '.join(argv)}"
            if not os.path.isfile(os.path.join(ROOT, script)):
                if os.path.dirname(script).startswith(".."):  # another checkout's file (nanoGPT's model.py)
                    continue
                bad.append(f"{where}: no such script")
                continue
            known = options_of(script, argv)
            for word in argv:
                name = word.split("=")[0]
                if name.startswith("--") and name not in known:
                    bad.append(f"{where}: {script} has no {name}")
            seen += 1
    assert not bad, "\n".join(bad)
    assert seen > 80  # the pages' commands were found


def test_a_misspelt_option_is_caught():
    text = ("```sh\npython eval.py --out_dir out/x --wirring\n```\nand `python train.py --model vertical --va_lrr 1`"
            " or `python -m tools.bench --size small --runz x`")
    found = commands(text)
    assert found == [("eval.py", ["--out_dir", "out/x", "--wirring"]),
                     ("train.py", ["--model", "vertical", "--va_lrr", "1"]),
                     ("tools/bench.py", ["--size", "small", "--runz", "x"])]
    assert "--wirring" not in options_of("eval.py", found[0][1]) and "--wiring" in options_of("eval.py", [])
    assert "--va_lr" in options_of("train.py", found[1][1]) and "--va_lr" not in options_of("train.py", [])
    assert "--runz" not in options_of(*found[2]) and "--runs" in options_of(*found[2])


def test_each_generated_table_lives_in_one_page_and_is_rewritten_there(tmp_path, monkeypatch):
    tags = {}
    for page in PAGES:
        for tag in re.findall(r"<!-- (\S+):start -->", open(page, encoding="utf-8").read()):
            tags.setdefault(tag, []).append(os.path.relpath(page, ROOT))
    assert all(len(pages) == 1 for pages in tags.values()), tags
    assert tags["results"] == ["README.md"] and tags["recipes"] == ["docs/recipes.md"]
    assert tags["results/kernels.json"] == ["docs/benchmarks.md"]
    # update_readme finds the page that holds the markers, in a copy of the layout
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("intro\n<!-- results:start -->\nold\n<!-- results:end -->\n")
    (tmp_path / "docs" / "benchmarks.md").write_text("a\n<!-- results/kernels.json:start -->\nold\n"
                                                    "<!-- results/kernels.json:end -->\nb\n")
    monkeypatch.setattr(tables, "ROOT", str(tmp_path))
    assert tables.update_readme("new\n", "results/kernels.json") == [str(tmp_path / "docs" / "benchmarks.md")]
    assert (tmp_path / "docs" / "benchmarks.md").read_text() == ("a\n<!-- results/kernels.json:start -->\nnew\n"
                                                                 "<!-- results/kernels.json:end -->\nb\n")
    assert "old" in (tmp_path / "README.md").read_text()
    assert tables.update_readme("x\n", "results/none") == []  # no page holds it: a note, nothing written


def test_the_readme_is_short_and_opens_on_the_wiring_figure():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    lines = text.splitlines()
    assert len(lines) <= 350
    first_figure = re.search(r"!\[[^\]]*\]\(([^)]+)\)", text).group(1)
    assert first_figure == "docs/wiring.png" and os.path.isfile(os.path.join(ROOT, first_figure))
    assert lines.index("## Quick start") < 80
    for link in re.findall(r"\]\((docs/[^)#]+)", text):  # every page it sends the reader to is there
        assert os.path.isfile(os.path.join(ROOT, link)), link
    for page in ("scripts", "results", "benchmarks", "huggingface", "recipes", "tests"):
        assert f"(docs/{page}.md)" in text, page


def test_open_attnres_is_dated_2026_everywhere():
    """The README dates Open AttnRes 2026 (its report's own "March 2025" is a slip: it reproduces a paper of March
    2026, arXiv 2603.15031); the model file and its page say so too."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert re.search(r"\| Open AttnRes \|[^|]+\| Cheng Luo, Zefan Cai \| 2026", readme)
    for path in ("model_attnres.py", "docs/attnres.md"):
        text = " ".join(open(os.path.join(ROOT, path), encoding="utf-8").read().split())
        assert "Cheng Luo and Zefan Cai, 2026" in text and "2025" not in text, path


def test_a_figure_written_at_the_top_is_ignored_and_the_committed_ones_are_not():
    """A bare `eval.py --wiring` writes wiring.png into the current folder: git ignores PNGs at the top only."""
    import subprocess
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    ignored = lambda path: subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0
    assert ignored("wiring.png") and ignored("curves.png")
    tracked = subprocess.run(["git", "ls-files", "*.png"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert "docs/wiring.png" in tracked and "results/curves.png" in tracked
    assert not any(ignored(p) for p in tracked + ["docs/new.png", "results/L12/new.png"])


def readme_section(text, heading):
    start = text.index(f"\n## {heading}\n")
    return text[start:text.index("\n## ", start + 1)]


def test_the_quick_start_comes_first_and_says_what_gap_is_noise():
    """A learner's first commands are within the README's first 60 lines, and beside them what gap between two
    single-seed runs is noise (the Results' 0.02 to 0.04) and how to train several seeds."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    lines = text.splitlines()
    quick = readme_section(text, "Quick start")
    start = lines.index("## Quick start")
    end = start + quick.count("\n")
    commands = [i for i in range(start, end) if lines[i].startswith(("python ", "pip "))]
    assert commands and max(commands) < 60, commands
    assert "python -m pytest -q" in lines[start:end] and "python prepare.py" in quick and "pip install" in quick
    from analysis.curves import SEED_NOISE  # eval.py --curves says it too
    assert SEED_NOISE in " ".join(quick.split()) and SEED_NOISE in " ".join(readme_section(text, "Results").split())
    assert "--seeds" in quick and "python -m tools.sweep --help" in quick


def test_the_readme_defines_each_term_before_it_uses_it():
    """(a phrase that uses a term, the phrase that defines it): the first use is not before the definition."""
    text = " ".join(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().split())
    pairs = [("attnres", "`--model NAME` trains `model_NAME.py`"), ("skip-middle", "(skip-middle)"),
             ("block L+1−l", "that block's mirror, block L+1−l"),
             ("ALA(", "ALA(−), the name the Vertical Attention paper gives its simplified form of Adaptive Layerwise"),
             ("doubly stochastic", "doubly stochastic matrix (its entries positive, each row and each column summing"),
             ("Sinkhorn-Knopp", "which Sinkhorn-Knopp's normalisations"),
             ("depth map", "its depth map, a table of the weights"), ("va_entropy", "An `_entropy` is the mean"),
             ("est_flops_ratio", "`est_flops_ratio` is skip-middle's"),
             ("‖h‖", "‖h‖ its length"), ("U-Net", "U-Net (every block reads"), ("I-Net", "I-Net (every block reads"),
             ("aila-arch1", "(its architecture 1)"), ("architecture 2", "(the paper's architecture 2"),
             (" L ", " L is the number of blocks"), (" d ", " d is the width of the residual stream")]
    for use, definition in pairs:
        assert definition in text, definition
        assert text.index(use) >= text.index(definition), f"the README uses {use!r} before {definition!r}"


def test_the_readme_counts_attnres_parameters_as_the_model_file_does():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    row = next(l for l in text.splitlines() if l.startswith("| `model_attnres.py` |"))
    model = " ".join(open(os.path.join(ROOT, "model_attnres.py"), encoding="utf-8").read().split())
    assert "Extra parameters: 2d(2L + 1)." in model
    assert row.split("|")[-2].strip().startswith("2d(2L+1)")


def prose_sentences(text):
    """The README's prose as a learner reads it: outside code blocks, tables, figures, HTML comments and the generated
    results, in sentences split at . ! or ? before a capital or a backtick."""
    prose, code = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            code = not code
        elif not (code or line.lstrip().startswith(("|", "![", "<!--"))):
            prose.append(line)
    body = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", "\n".join(prose))  # a link counts as its words
    paragraphs = [p.replace("\n", " ") for p in re.split(r"\n\s*\n", body) if p.strip() and not p.startswith("#")]
    return [s.strip() for p in paragraphs for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", p) if len(s.split()) > 2]


def test_the_readme_reads_as_a_first_page():
    """Short: about nanoGPT's length in words, sentences of about 20 words and none over 40, few asides, and the first
    command near the top."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    lengths = [len(s.split()) for s in prose_sentences(text)]
    assert sum(lengths) <= 1500 and sum(lengths) / len(lengths) <= 20, (sum(lengths), sum(lengths) / len(lengths))
    assert max(lengths) <= 40, [s for s in prose_sentences(text) if len(s.split()) > 40]
    assert sum(s.count("(") for s in prose_sentences(text)) <= 30
    assert text.splitlines().index("```sh") + 2 <= 15  # the first command by line 15
    assert prose_sentences("A one. Two words here. And `three` is (a) sentence!\n\n| a | b |\n```sh\nx y z\n```") == \
        ["Two words here.", "And `three` is (a) sentence!"]  # (the counting itself: "A one." is too short to count)


def stated(pattern, text):
    """The numbers of the first match of pattern in text, with their thousands commas dropped."""
    found = re.search(pattern, text)
    assert found, pattern
    return [float(g.replace(",", "")) for g in found.groups()]


def wall_minutes(printed):
    """The wall time of the last "done in 1h2m3s" line a script printed, in whole minutes."""
    h, m, s = (int(g or 0) for g in re.findall(r"done in (?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", printed)[-1])
    return round(h * 60 + m + s / 60)


def test_the_readme_states_what_its_files_hold():
    """Every number the README states about runs is the one its files hold: the quick start's budget is train.py's and
    model_vanilla.py's defaults, its time and loss are those of the run recorded in results/quickstart/ (the quick
    start's train.py command, its log.jsonl and what it printed), the comparison's runs and time (to the minute)
    those its sweep printed in results/compare/, and the Results' budget and losses are results/results.json's."""
    import train
    import model_vanilla
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    quick, results = (" ".join(readme_section(text, h).split()) for h in ("Quick start", "Results"))
    cfg, shape = train.TrainConfig(), model_vanilla.GPTConfig(vocab_size=257)
    blocks, width, millions = stated(r"(\d+) blocks of width (\d+), (\d+(?:\.\d+)?)M parameters", quick)
    params = sum(p.numel() for p in model_vanilla.GPT(shape).parameters())
    assert (blocks, width, millions) == (shape.n_layer, shape.n_embd, round(params / 1e6, 1))
    steps, batch, T, tokens = stated(r"([\d,]+) steps of (\d+) x (\d+) tokens, ([\d,]+) tokens in all", quick)
    assert (steps, batch, T, tokens) == (cfg.max_iters, cfg.batch_size, shape.block_size, steps * batch * T)
    assert stated(r"a checkpoint every ([\d,]+) steps", quick) == [cfg.eval_interval]
    # the recorded run: the quick start's own command, through to its last step
    record = os.path.join(ROOT, "results", "quickstart")
    printed = open(os.path.join(record, "printed.txt"), encoding="utf-8").read()
    log = [json.loads(line) for line in open(os.path.join(record, "log.jsonl"), encoding="utf-8")]
    assert log[-1]["iter"] == cfg.max_iters and log[-1]["tokens"] == tokens, log[-1]
    assert stated(r"about (\d+) minutes on 2 CPU cores", quick) == [wall_minutes(printed)]
    loss = round(log[-1]["val_loss"], 2)
    assert stated(r"validation loss of about (\d+(?:\.\d+)?)", quick) == [loss]
    # the comparison's sweep: its time as its own command printed it, in results/compare/
    printed = open(os.path.join(ROOT, "results", "compare", "printed.txt"), encoding="utf-8").read()
    runs = int(re.search(r"done in \S+: (\d+) runs trained by this command", printed).group(1))
    command = "python -m tools.sweep --runs vanilla,vertical --seeds 3"
    assert re.search(re.escape(command) + r" +# ", quick) and f"| command | `{command}` |" in printed
    assert stated(r"# (\d+) runs: about (\d+) minutes on 2 CPU cores", quick) == [runs, wall_minutes(printed)]
    # the sweep's budget, and how it compares
    saved = json.load(open(os.path.join(ROOT, "results", "results.json"), encoding="utf-8"))
    steps, batch, T, swept = stated(r"([\d,]+) steps of (\d+) x (\d+) tokens, ([\d,]+) tokens", results)
    assert (steps, batch, T) == (saved["train_iters"], saved["batch_size"], saved["shape"]["block_size"])
    assert swept == steps * batch * T
    share = {2: "half", 3: "a third", 4: "a quarter", 8: "an eighth"}[tokens / swept]
    assert f"That is {share} of the quick start's tokens" in results
    vanilla = next(row["mean"] for row in saved["summary"] if row["label"] == "vanilla")
    assert stated(r"vanilla ends near (\d+(?:\.\d+)?) here and (\d+(?:\.\d+)?) there", results) == \
        [round(vanilla, 2), loss]
    dwa = max(abs(row["delta"]) for row in saved["summary"] if row["label"].startswith("dwa"))
    assert stated(r"DenseFormer's weighted average stays within (\d+(?:\.\d+)?) of vanilla", results) == [round(dwa, 3)]
