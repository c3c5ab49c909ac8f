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
    with ctx:
        m = model.depth_map(first_windows(data, block_size, batch_size, device))
    return m.detach().float().cpu()


def first_windows(data, block_size, batch_size, device):
    """The first validation windows (B, T) of data, as many as a batch holds (at least one), for the hooks that
    compute on a batch they are given: depth_map(), stats()."""
    T = min(block_size, len(data))
    n = max(1, min(batch_size, len(data) // T))
    return torch.from_numpy(data[:n * T].astype(np.int64)).view(n, T).to(device)


def row_labels(n_rows, n_layer):
    if n_rows == n_layer:
        return [f"block {l + 1}" for l in range(n_rows)]
    if n_rows == 2 * n_layer + 1:  # one row per sublayer (attention, MLP), then the output
        return [f"{kind} {l // 2 + 1}" for l, kind in zip(range(2 * n_layer), ["attn", "mlp"] * n_layer)] + ["output"]
    return [f"row {r + 1}" for r in range(n_rows)]


def format_depth_map(m, n_layer, layout=None, decimals=2):
    """The map as text lines: one row per block, one column per source (the Vertical Attention paper's
    Tables 5-7), labelled as depth_map_layout() says; a cell the row cannot read is blank. A learned map (a layout
    with a start) then says where training starts it and prints a second table: each weight's change from its
    start, each row labelled with its start."""
    labels = layout["rows"] if layout else row_labels(m.size(0), n_layer)
    columns = layout["columns"] if layout else [str(c) for c in range(m.size(1))]
    valid = layout["valid"] if layout else torch.ones(m.shape, dtype=torch.bool)
    lines = table(labels, columns, m, valid, lambda v: f"{round(v, decimals) + 0.0:.{decimals}f}")  # never -0.00
    start = start_of(m, layout)
    if start is not None:
        lines += [f"start: the {layout['start_text']}", "the change from the start (each row's start in brackets):"]
        starts = row_starts(start, valid, columns)
        lines += table([f"{label} (start {s})" for label, s in zip(labels, starts)], columns, m - start, valid,
                       lambda v: signed(v, decimals))
    return lines


def table(labels, columns, m, valid, write):
    """Text lines: a header of the columns, then one line per row, the cells it cannot read blank."""
    width, cell = max(len(s) for s in labels), max(len(write(-1.0)), *map(len, columns))
    lines = [" " * width + " | " + " ".join(f"{c:>{cell}}" for c in columns) + "   (source)"]
    for label, row, ok in zip(labels, m.tolist(), valid.tolist()):
        lines.append(f"{label:>{width}} | " + " ".join(f"{write(v):>{cell}}" if o else " " * cell
                                                         for v, o in zip(row, ok)).rstrip())
    return lines


def signed(v, decimals=2):
    """A change with its sign: +0.11, -0.02, and +0.00 (never -0.00) for one that rounds to nothing."""
    return f"{round(v, decimals) + 0.0:+.{decimals}f}"


def start_of(m, layout):
    """The start of the map m as a float tensor of m's shape, as its layout declares it; None where the map is not
    trained (no start)."""
    start = (layout or {}).get("start")
    if start is None:
        return None
    start = torch.as_tensor(start, dtype=torch.float32).cpu()
    return start if start.shape == m.shape else None


def row_starts(start, valid, columns):
    """Each row's start, in words short enough for a row label: its value where the start is equal over the row's
    sources (a uniform start: "0.25"), else where it is not 0 ("1 on 3": 1 on source 3, 0 elsewhere)."""
    words = []
    for row, ok in zip(start.tolist(), valid.tolist()):
        read = [(c, v) for c, v, o in zip(columns, row, ok) if o]
        values = [v for _, v in read]
        if values and max(values) - min(values) <= 1e-6:
            words.append(f"{values[0]:.2f}")
            continue
        nonzero = [f"{round(v, 2):g} on {c}" for c, v in read if abs(v) > 1e-6]
        words.append(", ".join(nonzero) if len(nonzero) <= 2 else "as the caption says")
    return words


def depth_map_layout(model, m):
    """How to draw the matrix m of model.depth_map(), as its file's depth_map_layout() declares it (docs/contract.md),
    over these defaults: rows (labels: "block l", or a sublayer's), columns (tick labels: "emb" = the embedding, j =
    block j's output, or what the model's columns are), xlabel, cbar (what a cell holds), valid (bool, rows x
    columns: the cells a row reads; a row never reads a later block's output), signed (weights of either sign: a
    scale centred on 0, as also where m holds a negative weight), and start with start_text (a learned map: where
    training starts it, so that an untrained map is recognised; None for a map that is not trained)."""
    rows, cols = m.shape
    layout = dict(rows=row_labels(rows, model.config.n_layer), columns=[str(c) for c in range(cols)],
                  xlabel="source", cbar="weight", signed=False, start=None,
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
    (grey), not zeros. A learned map (a layout with a start) gets a second panel beside it: each weight's change
    from its start, on a scale centred on 0, each row labelled with its start, so that a weight is read against
    where training started it (0.61 on a row that started at 0.50 moved +0.11). Returns the (closed) figure, whose
    axes and texts can still be read: axes[0] the map, axes[1] the change where there is one, then the colour
    bars."""
    rows, cols = m.shape
    valid = layout["valid"]
    start = start_of(m, layout)
    labels = layout["rows"]
    width = min(max(6.0, 3.5 + 0.6 * cols), 16)
    if start is not None:  # two panels side by side, the second as wide as the first
        width = min(2 * width - 1.0, 22)
    fig, axes = plt.subplots(1, 1 if start is None else 2, figsize=(width, min(2.5 + 0.4 * rows, 16)), squeeze=False)
    ax = axes[0, 0]
    top = max(1.0, m[valid].abs().max().item() if valid.any() else 0.0)
    # signed weights on a scale centred on 0 (red below, blue above), so that a negative weight is not a small one
    heat_map(plt, ax, m, valid, "RdBu" if layout["signed"] else "Blues", -top if layout["signed"] else 0, top,
             lambda v: f"{round(v, 2) + 0.0:.2f}", layout["cbar"])  # 0.00, never -0.00
    ax.set_xticks(range(cols), labels=layout["columns"])
    ax.set_yticks(range(rows), labels=labels)
    ax.set(xlabel=layout["xlabel"], title=textwrap.fill(title, int(width * (4 if start is not None else 8))))
    caption = ("Grey: a source this row cannot read. " if not valid.all() else "") + DEPTH_MAP_AND_WIRING
    if start is not None:
        moved = m.float() - start
        most = moved[valid].abs().max().item() if valid.any() else 0.0
        right = axes[0, 1]
        heat_map(plt, right, moved, valid, "RdBu", -max(most, 0.01), max(most, 0.01), signed,
                 "change from the start (blue: up, red: down)")
        right.set_xticks(range(cols), labels=layout["columns"])
        right.set_yticks(range(rows), labels=[f"{label} (start {s})"
                                              for label, s in zip(labels, row_starts(start, valid, layout["columns"]))])
        right.set(xlabel=layout["xlabel"], title=textwrap.fill(
            f"the change from the start: the {layout['start_text']}", int(width * 5)))
        caption = ("Left: the weights; right: each weight minus where training starts it (each row's start beside "
                   "its label), on a scale centred on 0. ") + caption
    fig.text(0.01, 0.01, textwrap.fill(caption, int(width * 16)), fontsize=7, color="0.3", va="bottom")
    if at_start(m, layout):
        warning = f"warning: still at its {layout['start_text']}: not trained yet"
        fig.suptitle(textwrap.fill(warning, int(width * 12)), color="darkred", fontsize=9, fontweight="bold")
    fig.tight_layout(rect=(0, 0.1 + 0.45 / fig.get_figheight(), 1, 1))  # room for the caption below
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return fig


def heat_map(plt, ax, m, valid, cmap, low, high, write, label):
    """m on ax from low to high with its colour bar, the cells not valid blank (grey), and while they fit the
    numbers (as write(value) writes them) in the valid cells, as in the paper's tables."""
    cmap = plt.get_cmap(cmap).with_extremes(bad="0.85")  # grey: not read
    image = ax.imshow(np.ma.masked_array(m.numpy(), mask=~valid.numpy()), cmap=cmap, vmin=low, vmax=high,
                      aspect="auto")
    rows, cols = m.shape
    if rows * cols <= 400:  # the numbers too, while they still fit
        edge = 0.6 * max(abs(low), abs(high))
        for r, c in valid.nonzero().tolist():
            ax.text(c, r, write(m[r, c].item()), ha="center", va="center", fontsize=7,
                    color="white" if abs(m[r, c]) > edge else "black")
    ax.figure.colorbar(image, ax=ax, label=label)
