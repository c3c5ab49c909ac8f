"""
eval.py --wiring: which earlier representations each block reads directly, and how much of what it computes comes
from each, measured with autograd on the model files (docs/tests.md, "The wiring figure"): every model file and the
variants its paper compares (plumbing.config.labelled_models, the tables' labels) at initialisation, or trained runs.
"""
import os
import sys
import textwrap

import numpy as np
import torch

from analysis.figures import DEPTH_MAP_AND_WIRING, FIGURE_FIX, pyplot_for, run_folder, save_png
from common import close_gates, model_from_checkpoint, paper
from plumbing.errors import ConfigError
from plumbing.files import open_split, read_meta, to_json
from plumbing.config import build_model, labelled_models, load_model_module
from plumbing.options import check_output

def wiring_points(model):
    """(the modules whose outputs are the representations later blocks read, row labels, whether a row is the
    module's update, its output minus its input), or None where no module returns them: the model file's
    wiring_points() where it has one (docs/contract.md), else its blocks. A residual block's output is its input
    plus what it computes: the update leaves out that identity, so that a block whose gate is closed reads nothing."""
    if hasattr(model, "wiring_points"):
        return model.wiring_points()
    return list(model.blocks), [str(l + 1) for l in range(model.config.n_layer)], True


def wiring(model, idx, seed):
    """(strengths (rows + 1, 1 + rows), row labels, column labels): row r is point r of wiring_points (a block, or
    a sublayer), the last row the input of the final norm (what the head reads); column 0 is the
    embedding, column c point c - 1's output. Every representation h_c is detached and a zero perturbation e_c
    that requires grad is added to it, so that the only path from e_c to row r's output is a direct read: no
    gradient passes through a block in between. Strength [r, c] = rms(h_c) ||J^T u|| / ||u|| for a Gaussian probe
    u of row r (J = d row_r / d e_c; ||J^T u|| / ||u|| estimates J's RMS singular value): the change of row r per
    relative change of h_c, which no rescaling of h_c alters (a block reads its input through a norm). Vertical
    Attention's row is then its map alpha, not alpha / ||h||. An exact 0 where row r does not read c at all."""
    if wiring_points(model) is None:
        raise ConfigError(f"--wiring: no module of this {type(model).__module__}.py model returns what its blocks read "
                          "(its wiring_points() says so for these options)")
    points, labels, update = wiring_points(model)
    eps, rms, read = [], [], []

    def perturb(out):
        e = torch.zeros_like(out, requires_grad=True)
        eps.append(e)
        rms.append(out.detach().cpu().double().pow(2).mean().sqrt().item())  # float64 on the CPU: MPS has none
        return out.detach() + e

    def at_point(module, args, out):
        read.append(out - args[0] if update else out)
        return perturb(out)

    hooks = [model.tok_emb.register_forward_hook(lambda m, args, out: perturb(out))]
    hooks += [p.register_forward_hook(at_point) for p in points]
    hooks.append(model.norm.register_forward_pre_hook(lambda m, args: read.append(args[0])))
    try:
        with torch.enable_grad():
            model(idx)
            gen = torch.Generator().manual_seed(seed)
            gains = torch.zeros(len(read), len(eps))
            for r, out in enumerate(read):
                probe = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.dtype).to(out.device)
                grads = torch.autograd.grad(out, eps, probe, retain_graph=True, allow_unused=True)
                for c, g in enumerate(grads):
                    if g is not None:
                        gains[r, c] = rms[c] * (g.cpu().double().norm() / probe.cpu().double().norm()).item()
    finally:
        for hook in hooks:
            hook.remove()
    return gains, labels + ["head"], ["emb"] + labels


def wiring_panels(args):
    """[(caption, gains, row labels, column labels)]: one panel per model and variant at init, or per run."""
    panels = []
    for entry in args.wiring:
        if entry == "init":
            for label, name, options in labelled_models():
                torch.manual_seed(args.seed)
                model = build_model(load_model_module(name), options).eval()
                if wiring_points(model) is None:
                    print(f"note: --wiring leaves out {label}: its wiring_points() finds no module that returns what "
                          "its blocks read", file=sys.stderr)
                    continue
                idx = torch.randint(model.config.vocab_size, (2, min(64, model.config.block_size)),
                                    generator=torch.Generator().manual_seed(args.seed))
                panels.append((f"{paper(name)}: {label}", *wiring(model, idx, args.seed)))
                if getattr(model, "gates", None):  # the middle blocks skipped by every token, as
                    close_gates(model, len(model.gates) // 2)  # tools.bench's --close_gates (blocks 2 to 5 of 6)
                    panels.append((f"{paper(name)}: {label}, middle gates closed", *wiring(model, idx, args.seed)))
            continue
        try:
            model, _, ckpt = model_from_checkpoint(entry, keys=("model_name", "model_args", "model", "train_config"))
        except ConfigError as e:
            raise ConfigError(f"--wiring {entry}: {e} (or `init` for the models at initialisation)")
        model.eval()
        idx = wiring_tokens(args, ckpt, model.config)
        folder = os.path.basename(os.path.abspath(run_folder(entry)))  # short: one line over a narrow panel
        caption = f"{folder}: {ckpt['model_name']}, step {ckpt.get('iter_num', '?')}"
        panels.append((caption, *wiring(model, idx, args.seed)))
    return panels


def wiring_tokens(args, ckpt, config):
    """Two windows from the start of the run's validation split (weights computed per token, and gates, depend on
    the tokens), or random tokens with a note where the data set is not here."""
    T = min(64, config.block_size)
    saved = ckpt.get("train_config", {})
    data_dir, dataset = args.data_dir or saved.get("data_dir"), args.dataset or saved.get("dataset")
    try:
        data = open_split(data_dir, dataset, "val", read_meta(data_dir, dataset), config.vocab_size)
        if len(data) >= 2 * T:
            return torch.from_numpy(data[:2 * T].astype(np.int64)).view(2, T)
    except (ConfigError, KeyError, OSError, TypeError):  # TypeError: no data set named
        pass
    print("note: no validation data for the run here; its wiring is read on random tokens", file=sys.stderr)
    return torch.randint(config.vocab_size, (2, T), generator=torch.Generator().manual_seed(args.seed))


def reads(gains, rows, cols):
    """One line per row: the representations it reads, with each one's share of the row's gains."""
    lines = []
    for r, row in enumerate(rows):
        total = gains[r].sum().item()
        cells = [f"{cols[c]} {gains[r, c].item() / total:.2f}" for c in range(len(cols)) if gains[r, c] > 0]
        lines.append(f"  {row:>4} reads {', '.join(cells) if cells else 'nothing'}")
    return lines


def plot_wiring(plt, panels, path, when):
    """One panel per model: the share of each row's gains that each representation takes, on a log scale over three
    decades; blank where a row reads nothing, grey where a column is not earlier than the row. The title says what
    the figure shows and `when` (at initialisation, or the runs' steps); the PNG's text keeps the panels' captions
    (its "panels"), so that a test finds the model a panel is missing for. Returns the (closed) figure."""
    from matplotlib.colors import LogNorm
    cols = min(4, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.1 * cols + 1, 3.0 * nrows + 0.6), squeeze=False,
                             layout="constrained")
    cmap = plt.get_cmap("viridis_r").with_extremes(bad="white", under=plt.get_cmap("viridis_r")(0.0))
    image = None
    for ax, (caption, gains, rows, labels) in zip(axes.flat, panels):
        share = gains / gains.sum(1, keepdim=True).clamp(min=1e-30)
        n_rows = len(rows)
        image = ax.imshow(np.ma.masked_equal(share.numpy(), 0.0), cmap=cmap, norm=LogNorm(1e-3, 1.0),
                          aspect="auto", interpolation="nearest")
        later = np.array([[c > r and r < n_rows - 1 for c in range(len(labels))] for r in range(n_rows)])
        ax.imshow(np.ma.masked_where(~later, np.ones_like(later, float)), cmap="Greys", vmin=0, vmax=5,
                  aspect="auto", interpolation="nearest")
        ax.set_title(textwrap.fill(caption, 34), fontsize=9)
        step = 1 if len(labels) <= 14 else 2
        ax.set_xticks(range(0, len(labels), step), labels[::step], fontsize=7, rotation=90 if len(labels) > 8 else 0)
        ax.set_yticks(range(0, n_rows, step), rows[::step], fontsize=7)
        ax.axhline(n_rows - 1.5, color="0.5", linewidth=0.6)  # the head's row below the blocks'
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.supxlabel("reads: the embedding, or block j's output (aj, mj: block j's attention or MLP sublayer)", fontsize=9)
    fig.supylabel("block l (or its sublayer), then the head", fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.5, label="share of the row's direct reads")
    title = (f"What each block reads directly, {when}: each cell is an earlier representation's share of what its row "
             "reads from the representations before it, measured with autograd (eval.py --wiring)")
    fig.suptitle(textwrap.fill(title, int(28 * cols + 10)) + "\n" +  # and how it differs from the depth map
                 textwrap.fill(DEPTH_MAP_AND_WIRING, int(32 * cols + 10)), fontsize=9)
    save_png(fig, path, dpi=110, metadata={"Title": title, "panels": "\n".join(c for c, *_ in panels)})
    plt.close(fig)
    return fig


def draw_wiring(args):
    """--wiring: the panels, one summary per panel printed, and the figure."""
    plt = pyplot_for(args.plot)
    first = next((e for e in args.wiring if e != "init"), None)
    path = args.plot_path or os.path.join(run_folder(first) if first else ".", "wiring.png")
    if plt is not None and not args.plot_path:
        check_output("--plot_path", path, "file", FIGURE_FIX)
    panels = wiring_panels(args)
    if not args.json:
        print(textwrap.fill(DEPTH_MAP_AND_WIRING, 110))
    for caption, gains, rows, cols in panels:
        if args.json:
            print(to_json({"wiring": caption, "rows": rows, "columns": cols, "gains": gains.tolist()}))
        else:
            print(caption, *reads(gains, rows, cols), sep="\n")
    say = sys.stderr if args.json else sys.stdout
    if plt is not None:
        plot_wiring(plt, panels, path, "at initialisation" if set(args.wiring) == {"init"} else "in these runs")
        print(f"wiring figure: {path}", file=say)
    elif args.plot == "auto":
        print("note: PNG skipped, matplotlib is not installed (pip install matplotlib)", file=say)
