"""
eval.py --depth_map: a model's learned cross-layer weights (its depth_map()) as a table of blocks x sources, as the
Vertical Attention paper's Tables 5-7 print them, and as a heat map in which a cell the row cannot read is blank.
"""
import textwrap

import numpy as np
import torch

from analysis.figures import DEPTH_MAP_AND_WIRING, save_png
from plumbing.errors import ConfigError


@torch.no_grad()
def read_depth_map(model, model_name, data, block_size, batch_size, device, ctx):
    """model.depth_map(x) as a float tensor (rows, sources), on the first validation windows x: a map may depend
    on the input (weights computed per token, gates)."""
    if not hasattr(model, "depth_map"):
        raise ConfigError(f"model_{model_name}.py has no depth_map(): it learns no cross-layer weights to show; "
                          "--depth_map applies to the models whose file defines one")
    T = min(block_size, len(data))
    n = max(1, min(batch_size, len(data) // T))
    x = torch.from_numpy(data[:n * T].astype(np.int64)).view(n, T).to(device)
    with ctx:
        m = model.depth_map(x)
    return m.detach().float().cpu()


def row_labels(n_rows, n_layer):
    if n_rows == n_layer:
        return [f"block {l + 1}" for l in range(n_rows)]
    if n_rows == 2 * n_layer + 1:  # one row per sublayer (attention, MLP), then the output
        return [f"{kind} {l // 2 + 1}" for l, kind in zip(range(2 * n_layer), ["attn", "mlp"] * n_layer)] + ["output"]
    return [f"row {r}" for r in range(n_rows)]


def format_depth_map(m, n_layer, layout=None, decimals=2):
    """The map as text lines: one row per block, one column per source (the Vertical Attention paper's
    Tables 5-7), labelled as depth_map_layout() says; a cell the row cannot read is blank."""
    labels = row_labels(m.size(0), n_layer)
    columns = layout["columns"] if layout else [str(c) for c in range(m.size(1))]
    valid = layout["valid"] if layout else torch.ones(m.shape, dtype=torch.bool)
    width, cell = max(len(s) for s in labels), max(decimals + 4, *map(len, columns))
    lines = [" " * width + " | " + " ".join(f"{c:>{cell}}" for c in columns) + "   (source)"]
    for label, row, ok in zip(labels, m.tolist(), valid.tolist()):
        lines.append(f"{label:>{width}} | " + " ".join(f"{v:{cell}.{decimals}f}" if o else " " * cell
                                                         for v, o in zip(row, ok)))
    return lines


def depth_map_layout(model, m):
    """How to draw the matrix m of model.depth_map(), as its file's depth_map_layout() declares it (docs/contract.md),
    over these defaults: columns (tick labels: "emb" = the embedding, j = block j's output, or what the model's
    columns are), xlabel, cbar (what a cell holds), valid (bool, rows x columns: the cells a row reads; a row never
    reads a later block's output), signed (weights of either sign: a scale centred on 0, as also where m holds a
    negative weight), and start with start_text (a learned map: where training starts it, so that an untrained map
    is recognised; None for a map that is not trained)."""
    rows, cols = m.shape
    layout = dict(columns=[str(c) for c in range(cols)], xlabel="source", cbar="weight", signed=False, start=None,
                  valid=torch.ones(rows, cols, dtype=torch.bool), start_text="start")
    if hasattr(model, "depth_map_layout"):
        layout.update(model.depth_map_layout())
    layout["signed"] = layout["signed"] or bool((m[layout["valid"]] < 0).any())
    return layout


def at_start(m, layout):
    """True when a learned map is still where training starts it: every cell a row reads within 1e-3 of the start,
    in a map where some row reads two or more sources (one source is no choice to learn)."""
    valid, start = layout["valid"], layout.get("start")
    if start is None or not (valid.sum(1) >= 2).any():
        return False
    return bool(((m - start).abs() <= 1e-3)[valid].all())


def start_note(result, start_text):
    return (f"note: the depth map of {result['out_dir']} is still at its {start_text}: it has not learned yet; train "
            "longer (or raise the learning rate of its map, where the model file has one)")


def plot_depth_map(plt, m, n_layer, layout, title, path):
    """The map as a heat map with the numbers in the cells a row can read; the cells it cannot read are blank
    (grey), not zeros. Returns the (closed) figure, whose axes and texts can still be read."""
    rows, cols = m.shape
    valid = layout["valid"]
    width = min(max(6.0, 3.5 + 0.6 * cols), 16)
    fig, ax = plt.subplots(figsize=(width, min(2.5 + 0.4 * rows, 16)))
    top = max(1.0, m[valid].abs().max().item() if valid.any() else 0.0)
    # signed weights on a scale centred on 0 (red below, blue above), so that a negative weight is not a small one
    cmap = plt.get_cmap("RdBu" if layout["signed"] else "Blues").with_extremes(bad="0.85")  # grey: not read
    shown = np.ma.masked_array(m.numpy(), mask=~valid.numpy())
    image = ax.imshow(shown, cmap=cmap, vmin=-top if layout["signed"] else 0, vmax=top, aspect="auto")
    if rows * cols <= 400:  # the numbers too, as in the paper's tables, while they still fit
        for r, c in valid.nonzero().tolist():
            ax.text(c, r, f"{m[r, c].item():.2f}", ha="center", va="center", fontsize=7,
                    color="white" if abs(m[r, c]) > 0.6 * top else "black")
    ax.set_xticks(range(cols), labels=layout["columns"])
    ax.set_yticks(range(rows), labels=row_labels(rows, n_layer))
    ax.set(xlabel=layout["xlabel"], title=textwrap.fill(title, int(width * 8)))
    fig.colorbar(image, ax=ax, label=layout["cbar"])
    caption = ("grey: a source this row cannot read. " if not valid.all() else "") + DEPTH_MAP_AND_WIRING
    fig.text(0.01, 0.01, textwrap.fill(caption, int(width * 16)), fontsize=7, color="0.3", va="bottom")
    if at_start(m, layout):
        warning = f"warning: still at its {layout['start_text']}: not trained yet"
        fig.suptitle(textwrap.fill(warning, int(width * 12)), color="darkred", fontsize=9, fontweight="bold")
    fig.tight_layout(rect=(0, 0.1 + 0.45 / fig.get_figheight(), 1, 1))  # room for the caption below
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return fig
