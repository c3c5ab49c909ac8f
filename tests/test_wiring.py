"""eval.py --wiring: what each block (attnres: each sublayer) reads directly, measured with autograd on the model
files at initialisation, has the non-zero pattern each paper states, for every model and variant the figure draws."""
import importlib
import os

import pytest

from conftest import ROOT, labels, model_names, run_script

from analysis import wiring
from common import paper
evalpy = importlib.import_module("eval")

# every label of the tables, captioned by its paper, and skip-middle with its middle gates closed; AILA's residual
# merge, whose layer outputs no module returns, has no panel
CAPTIONS = [f"{paper(name)}: {label}" for label, name, _ in labels() if label != "aila-residual"]
CAPTIONS.insert(CAPTIONS.index("Skip the Middle Layers: skipmiddle") + 1,
                "Skip the Middle Layers: skipmiddle, middle gates closed")


@pytest.fixture(scope="module")
def panels():
    """The figure's panels exactly as `eval.py --wiring` draws them, by caption."""
    args = evalpy.parse_args(["--wiring"])
    return {caption: (gains, rows, cols) for caption, gains, rows, cols in wiring.wiring_panels(args)}


def chain(L):
    """Vanilla: block l (0-indexed) reads only its predecessor, column l (column 0 the embedding, column c block c's
    output, 1-indexed)."""
    return [{l} for l in range(L)]


def vertical_fixed(kind, L):
    """Vertical Attention's fixed maps, sources 1-indexed (1 = the embedding): the I-Net layer l reads sources 1, 2
    and l; the U-Net layer l reads source l and its mirror L + 2 - l, where that is an earlier source."""
    out = []
    for l in range(1, L + 1):
        sources = {1, 2, l} if kind == "inet" else {l, L + 2 - l}
        out.append({i - 1 for i in sources if i <= l})
    return out


def expected(label, L, H, skip_layers):
    """Each panel's rows as its paper states them (the head's row last), by the label of its caption."""
    head = [{L}]
    if label in ("vanilla", "skipmiddle-dense") or label.split("-")[0] in ("dwa", "mudd"):  # both start as vanilla
        return chain(L) + head
    if label == "vertical":  # eq. 4: v^l mixes every source 1..l
        return [set(range(l + 1)) for l in range(L)] + head
    if label in ("vertical-unet", "vertical-inet"):
        return vertical_fixed(label.split("-")[1], L) + head
    if label == "skiplayer":  # the skip heads of layer l > n_l read the keys and values of layer l - n_l
        return [{l} | ({l - skip_layers} if l >= skip_layers else set()) for l in range(L)] + head
    if label == "skiplayer-ala":  # ALA(-): the last layer's head i reads layer L - K*i (1-indexed), K = 2
        K = 2
        return chain(L)[:-1] + [{L - 1 - K * i for i in range(H) if L - 1 - K * i >= 0}] + head
    if label in ("attnres", "attnres-full"):  # every sublayer, and the output mix, reads every earlier one
        return [set(range(s + 1)) for s in range(2 * L)] + [set(range(2 * L + 1))]
    if label in ("mhc", "mhc-hc"):  # each sublayer's output goes into the streams (post), which every later sublayer
        # and the head read (pre, and comb's mix): mHC's weights are all positive, HC's B = 1 writes into every stream
        return [set(range(s + 1)) for s in range(2 * L)] + [set(range(2 * L + 1))]
    if label in ("value", "value-learned"):  # block l >= 2 mixes in V_1, the values block 1 computes of the embedding
        return [{0, l} for l in range(L)] + head
    if label == "value-embed":  # a token table is no earlier representation: the chain
        return chain(L) + head
    if label in ("aila", "aila-arch1"):  # layer j attends over h_0 .. h_{j-1}
        return [set(range(l + 1)) for l in range(L)] + head
    if label == "skipmiddle":  # eqs. 1-2, gates open: block l's gate sums s_0..s_m of the streams entering
        # blocks 0..m, m = min(l, L-1-l) (a second-half block uses its mirror's gate)
        return [{l} | set(range(min(l, L - 1 - l) + 1)) for l in range(L)] + head
    if label == "skipmiddle, middle gates closed":  # gate K closed: blocks K..L-1-K skipped, reading nothing
        K = ((L + 1) // 2) // 2
        return [set() if K <= l <= L - 1 - K else {l} for l in range(L)] + head
    raise AssertionError(f"no pattern stated for the panel {label!r}")


def test_the_figure_draws_every_label_of_the_tables(panels):
    """Every model file at its defaults and with each of the VARIANTS its paper compares, captioned by its PAPER (a
    learner's own model file beside them gets its panel too, which this suite leaves alone)."""
    assert {name for label, name, _ in labels()} == set(model_names())
    assert [caption for caption in panels if caption in CAPTIONS] == CAPTIONS


def test_the_committed_figure_has_a_panel_for_every_model_file():
    """docs/wiring.png, the README's first figure, names its panels in its PNG text (eval.py --wiring writes them):
    a model file added since it was drawn has none, and this fails until `eval.py --wiring init` draws it anew."""
    from PIL import Image
    figure = Image.open(os.path.join(ROOT, "docs", "wiring.png"))
    assert figure.text["panels"].split("\n") == CAPTIONS, "regenerate docs/wiring.png (docs/tests.md says how)"
    assert figure.text["Title"].startswith("What each block reads")


@pytest.mark.parametrize("caption", CAPTIONS)
def test_each_panel_reads_what_its_paper_states(panels, caption):
    gains, rows, cols = panels[caption]
    L, H = 6, 4  # the model files' default shape, which the figure draws
    skip_layers = round(3 * L / 4)  # the SLA paper's default n_l
    want = expected(caption.split(": ", 1)[1], L, H, skip_layers)
    got = [{c for c in range(len(cols)) if gains[r, c] != 0} for r in range(len(rows))]
    assert got == want, caption
    assert (gains >= 0).all() and gains.isfinite().all()


def test_vanilla_is_the_chain_and_a_later_block_never_reads_ahead(panels):
    gains, rows, cols = panels["baseline: vanilla"]
    assert rows[-1] == "head" and cols[0] == "emb"
    assert [[c for c in range(len(cols)) if gains[r, c] != 0] for r in range(len(rows))] == [[r] for r in range(7)]
    for caption, (gains, rows, cols) in panels.items():  # causality in depth: nothing reads a later representation
        for r in range(len(rows) - 1):
            assert (gains[r, r + 1:] == 0).all(), caption


def test_wiring_of_trained_runs_and_its_errors(data_dir, tmp_path, capsys):
    """`--wiring RUN`: one panel per run, on the run's validation tokens; a folder without a checkpoint and options
    that do something else end in one error line naming --wiring."""
    import train
    run = tmp_path / "run"
    train.main(["--model", "vertical", "--data_dir", str(data_dir), "--out_dir", str(run), "--max_iters=0",
                "--n_layer=2", "--n_embd=16", "--n_head=2", "--n_kv_head=1", "--ffn_hidden=32", "--block_size=16",
                "--device=cpu"])
    code, out, err = run_script("eval.py", ["--wiring", str(run), "--plot", "false"], capsys)
    assert code in (0, None), err
    assert "vertical, step 0" in out and "2 reads emb" in out and "3 reads" not in out, out
    for argv in (["--wiring", str(tmp_path / "none")], ["--wiring", "--depth_map"], ["--wiring=nan"]):
        code, out, err = run_script("eval.py", argv, capsys)
        lines = [l for l in err.splitlines() if l.startswith("error: ")]
        assert code not in (0, None) and len(lines) == 1 and "--wiring" in lines[0], (argv, err)
