"""eval.py's figures read back from the matplotlib objects: the depth map's labels, columns and blank cells, the
warning of a map still at its uniform start, a learned map read against its start, and --curves on two tiny real
runs, on runs of different lengths and on bad input."""
import importlib
import json
import os
import re

import numpy as np
import pytest
import torch

from conftest import ROOT, model_names
from test_scripts import TINY, one_line_error
import train
from train import ConfigError

from analysis import curves
from analysis import depth_map
from analysis import figures
evalpy = importlib.import_module("eval")
SHAPE = dict(n_layer=4, n_head=2, n_kv_head=1, n_embd=32, ffn_hidden=64, block_size=16)


def test_matplotlib_is_a_default_dependency():
    names = lambda f: [re.split(r"[\s<>=#]", l.strip())[0].lower()
                       for l in open(os.path.join(ROOT, f), encoding="utf-8") if l.strip() and not l.startswith("#")]
    assert "matplotlib" in names("requirements.txt")
    assert "matplotlib" not in names("requirements-eval.txt")


@pytest.fixture(scope="module")
def plt():
    pytest.importorskip("matplotlib", reason="matplotlib is in requirements.txt: pip install -r requirements.txt")
    return figures.import_pyplot()


def blank_cells(ax):
    """The cells of the heat map drawn blank (masked), as a bool tensor."""
    return torch.from_numpy(np.ma.getmaskarray(ax.images[0].get_array()).copy())


def depth_map_figure(plt, name, tmp_path, model=None, **overrides):
    """(model, map, layout, figure) of a tiny untrained model of model_<name>.py, its map on one batch."""
    module = importlib.import_module(f"model_{name}")
    torch.manual_seed(0)
    config = module.GPTConfig(vocab_size=256, **SHAPE, **overrides)
    model = model or module.GPT(config).eval()
    with torch.no_grad():
        m = model.depth_map(torch.randint(0, 256, (2, 16))).detach().float().cpu()
    layout = depth_map.depth_map_layout(model, m)
    fig = depth_map.plot_depth_map(plt, m, config.n_layer, layout, f"out/{name}, step 7: model_{name}.py depth map",
                                tmp_path / f"{name}.png")
    assert (tmp_path / f"{name}.png").stat().st_size > 0
    return model, m, layout, fig


def cells(ax):
    """The (row, column) of every number written in the heat map."""
    return {(round(t.get_position()[1]), round(t.get_position()[0])) for t in ax.texts}


def map_and_bar(fig):
    """The depth map's panel (the weights) and its colour bar."""
    ax = fig.axes[0]
    return ax, ax.images[0].colorbar.ax


def test_vertical_depth_map_figure(plt, tmp_path):
    _, m, layout, fig = depth_map_figure(plt, "vertical", tmp_path)
    ax, bar = map_and_bar(fig)
    L = SHAPE["n_layer"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["emb", "1", "2", "3"]  # sources: embedding, blocks
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"block {l}" for l in range(1, L + 1)]
    assert "embedding" in ax.get_xlabel() and "alpha" in bar.get_ylabel()
    assert "out/vertical" in ax.get_title() and "step 7" in ax.get_title()
    blank = blank_cells(ax)  # above the diagonal: sources a layer cannot read, drawn blank
    assert blank.tolist() == [[c > r for c in range(L)] for r in range(L)]
    assert cells(ax) == {(r, c) for r in range(L) for c in range(r + 1)}  # no 0.00 written where nothing is read
    assert "uniform start" in fig.get_suptitle()  # zero scores: the start, and the figure says so


def test_a_learned_map_gets_no_warning(plt, tmp_path):
    module = importlib.import_module("model_vertical")
    model = module.GPT(module.GPTConfig(vocab_size=256, **SHAPE)).eval()
    with torch.no_grad():
        model.va_scores.normal_()  # a map that has moved
    _, m, layout, fig = depth_map_figure(plt, "vertical", tmp_path, model=model)
    assert not depth_map.at_start(m, layout) and fig.get_suptitle() == ""
    m = torch.tensor([[1.0, 0, 0], [0.5005, 0.4995, 0], [1 / 3, 1 / 3, 1 / 3]])  # within 1e-3 of the start
    valid = torch.ones(3, 3).tril().bool()
    assert depth_map.at_start(m, dict(valid=valid, start=valid / valid.sum(1, keepdim=True)))
    assert not depth_map.at_start(m, dict(valid=valid, start=None))  # a map that is not trained has no start


@pytest.mark.parametrize("name,overrides", [("skiplayer", {}), ("attnres", {}), ("attnres", {"attn_res": "full"}),
                                            ("aila", {}), ("aila", {"aila_arch": 1}), ("skipmiddle", {})])
def test_every_depth_map_figure(plt, name, overrides, tmp_path):
    """Every model's columns are labelled as its depth_map() defines them, and every row's weight lies in the
    cells drawn (rows sum to 1 over them), none in the blank ones; a map that is not trained (no start) is one
    panel, a learned one has its change from the start beside it."""
    if name not in model_names():
        pytest.skip(f"model_{name}.py is not there")
    _, m, layout, fig = depth_map_figure(plt, name, tmp_path, **overrides)
    ax, bar = map_and_bar(fig)
    assert len(fig.axes) == (2 if layout.get("start") is None else 4)  # each panel with its colour bar
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert len(labels) == m.size(1) and bar.get_ylabel()
    blank = blank_cells(ax)
    assert cells(ax) == {tuple(rc) for rc in (~blank).nonzero().tolist()}
    if name == "skipmiddle":
        assert labels == ["mean gate"] and "gate" in bar.get_ylabel()
        return
    assert torch.allclose(m.masked_fill(blank, 0).sum(1), torch.ones(m.size(0)), atol=1e-5)
    assert blank.any()  # a first row that reads everything would be no depth map
    assert labels[:2] == (["1", "2"] if name == "skiplayer" else ["emb", "1"])
    if name == "attnres":  # zero pseudo-queries: a uniform start, and the figure says so
        assert "uniform start" in fig.get_suptitle()
    if name == "skiplayer":  # a fixed map: never a warning
        assert fig.get_suptitle() == ""


def test_dwa_depth_map_is_signed_and_shows_the_cells_it_learns(plt, tmp_path):
    """DenseFormer's alpha: a scale centred on 0 (a negative weight is not a small one), the cells of each row's
    sources (model_dwa.dwa_sources) drawn and no other, and a warning at its identity start, none once it moved."""
    if "dwa" not in model_names():
        pytest.skip("model_dwa.py is not there")
    model, m, layout, fig = depth_map_figure(plt, "dwa", tmp_path, dwa_map="x0")
    ax, _ = map_and_bar(fig)
    L = SHAPE["n_layer"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["emb", *map(str, range(1, L + 1))]
    sources = importlib.import_module("model_dwa").dwa_sources(model.config)
    assert (~blank_cells(ax)).nonzero().tolist() == [[i - 1, j] for i, src in enumerate(sources, 1) for j in src]
    assert "identity start" in fig.get_suptitle()
    low, high = ax.images[0].get_clim()
    assert ax.images[0].get_cmap().name.startswith("RdBu") and low == -high
    with torch.no_grad():
        model.dwa_alpha[0][0, 0] = -0.5  # the first row's weight on the embedding: a backout
        model.dwa_alpha[1][0, 0] = -0.001  # the second's: a weight that rounds to nothing reads 0.00, not -0.00
    _, m, layout, fig = depth_map_figure(plt, "dwa", tmp_path, model=model, dwa_map="x0")
    assert m[0, 0] == -0.5 and not depth_map.at_start(m, layout) and fig.get_suptitle() == ""
    moved = fig.axes[1]  # the change from the identity start: row i starts 1 on its own block's output
    assert [t.get_text() for t in moved.get_yticklabels()] == [f"block {l} (start 1 on {l})" for l in range(1, L + 1)]
    assert {t.get_text() for t in moved.texts if t.get_position() == (0, 0)} == {"-0.50"}
    assert "identity start" in moved.get_title()
    printed = depth_map.format_depth_map(m, L, layout)
    weights = fig.axes[0]
    assert m[1, 0] < 0 and {t.get_text() for t in weights.texts if t.get_position() == (0, 1)} == {"0.00"}
    assert "-0.00" not in "".join(printed)


def test_a_learned_map_is_read_against_its_start(plt, tmp_path):
    """A vertical map that moved: beside the weights, a panel of each weight's change from its uniform start, on a
    scale centred on 0, each row labelled with its start (block 4 starts at 0.25 on each of its 4 sources), the
    caption saying what the second panel is; the printed table says the start and prints the change, row by row."""
    module = importlib.import_module("model_vertical")
    torch.manual_seed(0)
    model = module.GPT(module.GPTConfig(vocab_size=256, **SHAPE)).eval()
    with torch.no_grad():
        model.va_scores.normal_()  # a map that has moved
    _, m, layout, fig = depth_map_figure(plt, "vertical", tmp_path, model=model)
    L, start = SHAPE["n_layer"], layout["start"]
    change = lambda r, c: f"{round((m[r, c] - start[r, c]).item(), 2) + 0.0:+.2f}"  # +0.11, never -0.00
    moved = fig.axes[1]
    assert [t.get_text() for t in moved.get_yticklabels()] == [f"block {l} (start {1 / l:.2f})"
                                                                 for l in range(1, L + 1)]
    assert [t.get_text() for t in moved.get_xticklabels()] == ["emb", "1", "2", "3"]
    written = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in moved.texts}
    assert written == {(r, c): change(r, c) for r in range(L) for c in range(r + 1)}
    assert written[(1, 0)] not in ("+0.00", "-0.00")  # block 2's weight on emb moved from its start, 0.5
    drawn = moved.images[0].get_array()
    assert np.allclose(drawn[layout["valid"].numpy()], (m - start)[layout["valid"]].numpy())
    low, high = moved.images[0].get_clim()
    assert low == -high and moved.images[0].get_cmap().name.startswith("RdBu")
    assert "uniform start" in moved.get_title() and "start" in moved.images[0].colorbar.ax.get_ylabel()
    assert any("centred on 0" in t.get_text() and "start" in t.get_text() for t in fig.texts)
    lines = depth_map.format_depth_map(m, L, layout)
    assert lines[L + 1] == "start: the uniform start (every row equal over its sources)"
    for l, line in enumerate(lines[L + 4:], 1):  # after the table of weights, the start and the change's header
        label, values = line.split(" | ")
        assert label.strip() == f"block {l} (start {1 / l:.2f})"
        assert values.split() == [change(l - 1, c) for c in range(l)]
    assert len(lines) == 2 * (L + 1) + 2
    assert depth_map.row_labels(3, 5) == ["row 1", "row 2", "row 3"]  # rows count from 1, as blocks do

# ---- eval.py end to end: the note, and --curves on two tiny real runs ------------------------------------------

@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    """Two tiny runs: vanilla, and vertical with --va_lr 0, whose map stays at its start."""
    root = tmp_path_factory.mktemp("figure_runs")
    out = {"vanilla": str(root / "vanilla"), "vertical": str(root / "vertical")}
    for name, extra in (("vanilla", []), ("vertical", ["--va_lr=0"])):
        train.main(["--model", name, "--data_dir", data_dir, "--out_dir", out[name], "--max_iters=20",
                    "--eval_interval=10", "--log_interval=5", *extra, *TINY])
    return out


def test_depth_map_note_at_the_uniform_start(plt, runs, capsys):
    evalpy.main(["--out_dir", runs["vertical"], "--loss=false", "--depth_map"])
    out = capsys.readouterr().out
    assert "still at its uniform start" in out and "depth_map.png" in out
    assert "start: the uniform start" in out and "block 2 (start 0.50) | +0.00 +0.00" in out  # the table's start
    assert os.path.getsize(os.path.join(runs["vertical"], "depth_map.png")) > 0


def test_depth_map_and_wiring_say_what_each_measures_in_the_same_words(plt, runs, tmp_path, capsys):
    """One sentence, in blocks (not layers), says what the depth map and the wiring figure measure and why they
    differ: where each prints, in each figure, and in the docs that describe them."""
    from analysis import wiring
    said = figures.DEPTH_MAP_AND_WIRING
    flat = lambda text: " ".join(text.split())
    assert "block" in said and "layer" not in said and "alpha" in said and "1/||h||" in said and "autograd" in said
    evalpy.main(["--out_dir", runs["vertical"], "--loss=false", "--depth_map"])
    assert said in flat(capsys.readouterr().out)
    fig = depth_map_figure(plt, "vertical", tmp_path)[3]
    assert any(said in flat(t.get_text()) for t in fig.texts)
    assert not any("layer" in t.get_text() for t in fig.axes[0].get_yticklabels())
    evalpy.main(["--wiring", runs["vanilla"], "--plot_path", str(tmp_path / "wiring.png")])
    assert said in flat(capsys.readouterr().out)
    panel = ("vanilla", torch.eye(3), ["1", "2", "head"], ["emb", "1", "2"])
    fig = wiring.plot_wiring(plt, [panel], tmp_path / "one.png", "in these runs")
    assert flat(fig.get_suptitle()).startswith("What each block reads directly, in these runs:")
    assert said in flat(fig.get_suptitle())
    for doc in ("docs/scripts.md", "docs/tests.md"):
        assert said in flat(open(os.path.join(ROOT, doc), encoding="utf-8").read()), doc


def test_curves_of_two_runs(plt, runs, tmp_path, capsys):
    png = tmp_path / "both.png"
    evalpy.main(["--curves", runs["vanilla"], runs["vertical"], "--plot_path", str(png)])
    lines = capsys.readouterr().out.splitlines()
    assert png.stat().st_size > 0 and lines[-1] == f"curves: {png}"
    for name, line in zip(("vanilla", "vertical"), lines):  # one line per run: steps, tokens, last val loss
        assert line.startswith(f"{name}: 20 steps (2,560 tokens), last val loss ") and "(step 20)" in line
    logs = [curves.read_run_log(runs[n]) for n in ("vanilla", "vertical")]
    for r, name in zip(logs, ("vanilla", "vertical")):
        r["label"] = name
    fig = curves.plot_curves(plt, logs, tmp_path / "again.png")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "tokens seen" and "loss" in ax.get_ylabel()
    mean = f"training loss (mean of {curves.SMOOTH} records)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        f"vanilla: {mean}", "vanilla: validation loss", f"vertical: {mean}", "vertical: validation loss"]
    train, val = ax.lines[2], ax.lines[3]  # the vertical run's, in its own colour
    assert list(val.get_xdata()) == [0, 10 * 128, 20 * 128]  # steps x 4 windows x 32 tokens
    assert list(train.get_xdata()) == [s * 128 for s in (5, 10, 15, 20)]
    losses = [v for _, _, v in logs[1]["train"]]  # each drawn point the mean of the 5 records centred on it
    assert list(train.get_ydata()) == pytest.approx([sum(losses[:3]) / 3, sum(losses) / 4, sum(losses) / 4,
                                                     sum(losses[1:]) / 3])
    assert ax.lines[0].get_color() == ax.lines[1].get_color() != train.get_color() == val.get_color()
    assert train.get_zorder() < val.get_zorder() and train.get_alpha() < 1  # drawn under, pale: the eye goes to val
    # one seed each: the figure and the printout say what the comparison cannot show, in the README's numbers
    assert curves.ONE_SEED in " ".join(fig.get_suptitle().split()) and f"note: {curves.ONE_SEED}" in lines
    assert fig.axes[1].get_ylabel() == ax.get_ylabel() == "loss (nats per token)"


def test_curves_default_path_and_steps_without_a_checkpoint(plt, tmp_path, capsys):
    run_dir = tmp_path / "logs_only"
    run_dir.mkdir()
    records = [{"iter": 0, "val_loss": 5.5}, {"iter": 10, "loss": 3.0, "lr": 1e-3}, {"iter": 10, "val_loss": 2.9}]
    # the last line cut short, as while train.py writes it: left out
    (run_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"iter": 20, "lo')
    evalpy.main(["--curves", str(run_dir)])
    out = capsys.readouterr().out
    assert "logs_only: 10 steps, last val loss 2.9000 (step 10), last training loss 3.0000" in out
    assert (run_dir / "curves.png").stat().st_size > 0
    r = curves.read_run_log(str(run_dir))
    r["label"] = "logs_only"
    assert curves.plot_curves(plt, [r], tmp_path / "x.png").axes[0].get_xlabel().startswith("step")
    (run_dir / "curves.png").unlink()
    evalpy.main(["--curves", str(run_dir), "--plot", "false"])  # the line per run, and no figure
    assert "logs_only: 10 steps" in capsys.readouterr().out and not (run_dir / "curves.png").exists()


def test_curves_zoom_on_the_end_of_training_fits_the_final_losses(plt, tmp_path):
    """Two runs that fall from 5.5 to final losses 0.03 apart: the whole run's panel cannot tell them apart, the
    zoom on the last 40% of training (axes[1]) spans only their late losses, with both final values inside."""
    logs = []
    for name, final in (("a", 2.00), ("b", 2.03)):
        train = [(s, s * 128, final + 3.5 * 0.7 ** (s / 10)) for s in range(0, 201, 10)]
        val = [(s, t, v + 0.01) for s, t, v in train[::5]]
        logs.append({"folder": name, "label": name, "train": train, "val": val})
    fig = curves.plot_curves(plt, logs, tmp_path / "zoom.png")
    assert len(fig.axes) == 2
    whole, zoom = fig.axes
    late = [v for r in logs for s, _, v in curves.smoothed(r["train"]) + r["val"] if s >= 0.6 * 200]  # as drawn
    lo, hi = zoom.get_ylim()
    assert lo <= min(late) and max(late) <= hi and hi - lo < 1.2 * (max(late) - min(late))
    assert (hi - lo) < 0.1 * (whole.get_ylim()[1] - whole.get_ylim()[0])
    assert zoom_window(zoom) == (15400, 25600)  # 0.6 x 25,600 tokens = 15,360, written 15.4K
    assert zoom.get_xlim()[0] < 0.6 * 200 * 128 and 200 * 128 < zoom.get_xlim()[1]
    assert "last 40% of training" in zoom.get_title()
    assert figures.zoom_range([[(0, 1.0), (10, 1.0)]]) is None  # flat: nothing to zoom on
    assert figures.zoom_range([[(0, 5.0), (6, 3.0), (8, 2.5), (10, 2.0)]]) == ((6, 10), (2.0 - 0.05, 3.0 + 0.05))
    # one window for every curve, the last 40% of the longest: a short curve does not move it
    assert figures.zoom_range([[(0, 5.0), (6, 3.0), (10, 2.0)], [(0, 5.0), (2, 4.0)]])[0] == (6, 10)


def zoom_window(zoom):
    """(from, to) in tokens as the zoom's title writes them: "tokens 2.46M to 4.1M"."""
    found = re.search(r"tokens ([\d.]+)([KM]?) to ([\d.]+)([KM]?)", " ".join(zoom.get_title().split()))
    assert found, zoom.get_title()
    unit = {"": 1, "K": 1e3, "M": 1e6}
    return round(float(found[1]) * unit[found[2]]), round(float(found[3]) * unit[found[4]])


def test_curves_zoom_covers_the_window_its_title_names(plt, tmp_path):
    """Runs of 4.1M tokens and of 0.82M: the zoom covers the last 40% of training as its title states it (tokens
    2.46M to 4.1M, the shorter run ending before it), every point of that window drawn and none before it, each with
    a margin to the edges (no marker cut in half); neither panel writes an offset such as "1e6" beside an axis,
    and token ticks read 1M, 2M."""
    logs, top = [], 1000 * 4096
    for name, steps, final in (("vanilla", 200, 3.00), ("vertical", 1000, 2.93)):
        train = [(s, s * 4096, final + 3.5 * 0.7 ** (s / 50)) for s in range(0, steps + 1, 10)]
        val = [(s, t, v + 0.01) for s, t, v in train[::10]]  # one at 600 steps: the window's first token
        logs.append({"folder": name, "label": name, "train": train, "val": val})
    fig = curves.plot_curves(plt, logs, tmp_path / "zoom.png")
    whole, zoom = fig.axes
    assert zoom_window(zoom) == (2_460_000, 4_100_000)  # 0.6 x 4,096,000 = 2,457,600 and 4,096,000
    assert "vanilla ends before it, at 0.82M" in " ".join(zoom.get_title().split())
    window = [(t, v) for r in logs for _, t, v in curves.smoothed(r["train"]) + r["val"] if t >= 0.6 * top]
    plotted = sorted((x, y) for line in zoom.lines for x, y in zip(line.get_xdata(), line.get_ydata()))
    assert plotted == sorted(window)  # every point of the window, none from before it
    (lo, hi), (bottom, ceiling) = zoom.get_xlim(), zoom.get_ylim()
    assert 0 < 0.6 * top - lo <= 0.05 * (hi - lo)  # it starts where the title says, with a margin for the marker
    assert lo + 0.01 * (hi - lo) <= min(x for x, _ in plotted) and max(x for x, _ in plotted) <= hi - 0.01 * (hi - lo)
    assert bottom + 0.01 * (ceiling - bottom) <= min(y for _, y in plotted)
    assert max(y for _, y in plotted) <= ceiling - 0.01 * (ceiling - bottom)
    for panel in (whole, zoom):
        assert panel.xaxis.get_offset_text().get_text() == panel.yaxis.get_offset_text().get_text() == ""
        ticks = [t.get_text() for t in panel.get_xticklabels()]
        assert "3M" in ticks and not any("e" in t for t in ticks), ticks


def test_curves_errors(tmp_path, script):
    one_line_error(script("eval.py", "--curves", tmp_path / "nowhere"), "--curves", "no run folder", "nowhere")
    with pytest.raises(ConfigError, match="has no log.jsonl"):
        evalpy.main(["--curves", str(tmp_path)])
    (tmp_path / "log.jsonl").write_text('{"iter": 0, "val_loss": 5.5}\nnot json\n{"iter": 1, "loss": 5.0}\n')
    with pytest.raises(ConfigError, match="line 2 is not a record of train.py"):
        evalpy.main(["--curves", str(tmp_path)])
    (tmp_path / "log.jsonl").write_text('{"iter": 0, "val_loss": "x"}\n')
    with pytest.raises(ConfigError, match="line 1"):
        evalpy.main(["--curves", str(tmp_path)])
    (tmp_path / "log.jsonl").write_text("")
    with pytest.raises(ConfigError, match="holds no loss yet"):
        evalpy.main(["--curves", str(tmp_path)])
    with pytest.raises(ConfigError, match="--curves reads only"):
        evalpy.main(["--curves", str(tmp_path), "--depth_map"])
