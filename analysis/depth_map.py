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
    """model.depth_map(x) as a float tensor (rows, sources), on the first validation windows x: attnres's and aila's
    weights depend on the input, and skipmiddle's gates."""
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
    if n_rows == 2 * n_layer + 1:  # one row per sublayer, then the output (attnres)
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


def depth_map_layout(model, name, m):
    """How to draw the matrix m of model.depth_map(), as each model file's depth_map() docstring defines it: a dict
    of columns (tick labels: "emb" = the embedding, j = block j's output, or what the model's columns are), xlabel,
    cbar (what a cell holds), valid (bool, rows x columns: the cells a row can read; a row never reads a later
    block's output) and learned (the map is trained from a uniform start, so that the start can be recognised)."""
    rows, cols = m.shape
    causal = torch.ones(rows, cols, dtype=torch.bool).tril()  # row l reads columns 0..l
    sources = ["emb"] + [str(j) for j in range(1, cols)]
    layout = dict(columns=[str(c) for c in range(cols)], xlabel="source", cbar="weight",
                  valid=torch.ones(rows, cols, dtype=torch.bool), learned=False)
    if name == "vertical":  # alpha: row l reads the embedding and blocks 1..l-1
        layout.update(columns=sources, xlabel="source: the embedding (emb), then block j's output (j)",
                      cbar="alpha (softmax weight of the source)", valid=causal,
                      learned=getattr(model, "va_scores", None) is not None)
    elif name == "aila":  # mean alpha: layer j reads h_0..h_{j-1}; arch 1 also h~_j, in column j
        counts = [j + 1 + (cols > rows) for j in range(rows)]  # layer j (0-indexed): j + 1 sources, arch 1 also h~_j
        layout.update(columns=sources, cbar="mean alpha (over tokens and heads)", learned=True,
                      valid=read_counts(counts, rows, cols),
                      xlabel="source: the embedding (emb), then block j's output (j)"
                      + ("; row j's column j: its own block output" if cols > rows else ""))
    elif name == "attnres":  # mean softmax weight: the embedding, then block n's (partial) sum
        full = getattr(model.config, "attn_res", "") == "full"
        layout.update(columns=sources, cbar="mean softmax weight (over tokens)", learned=True,
                      valid=read_counts(model.sources_per_mix(), rows, cols),
                      xlabel="source: the embedding (emb), then " + ("sublayer n's output (n)" if full else
                                                                      "block n's sum (n; partial while open)"))
    elif name == "skiplayer":  # fixed: the fraction of layer l's query heads reading layer j's keys and values
        layout.update(columns=[str(j) for j in range(1, cols + 1)], valid=causal,
                      xlabel="the block whose keys and values the heads read", cbar="fraction of the query heads")
    elif name == "skipmiddle":  # the mean gate of every block
        layout.update(columns=["mean gate"], xlabel="", cbar="mean gate (1: the block runs, 0: skipped)")
    return layout


def read_counts(counts, rows, cols):
    """The valid cells of a map whose row r reads its first counts[r] columns."""
    return torch.arange(cols)[None, :] < torch.tensor(counts)[:, None]


def at_uniform_start(m, layout):
    """True when a learned map is still where training starts it: every row uniform over the sources it can read
    (within 1e-3), in a map where some row has two or more sources."""
    valid = layout["valid"]
    n = valid.sum(1, keepdim=True)
    if not layout["learned"] or not (n >= 2).any():
        return False
    return bool(((m - valid.float() / n.clamp(min=1)).abs() <= 1e-3).all())


def uniform_note(result):
    return (f"note: the depth map of {result['out_dir']} is still at its uniform start (every row equal over its "
            "sources): it has not learned yet; train longer (vertical: or raise --va_lr)")


def plot_depth_map(plt, m, n_layer, layout, title, path):
    """The map as a heat map with the numbers in the cells a row can read; the cells it cannot read are blank
    (grey), not zeros. Returns the (closed) figure, whose axes and texts can still be read."""
    rows, cols = m.shape
    valid = layout["valid"]
    width = min(max(6.0, 3.5 + 0.6 * cols), 16)
    fig, ax = plt.subplots(figsize=(width, min(2.5 + 0.4 * rows, 16)))
    cmap = plt.get_cmap("Blues").with_extremes(bad="0.85")  # grey: the cells a row cannot read
    shown = np.ma.masked_array(m.numpy(), mask=~valid.numpy())
    image = ax.imshow(shown, cmap=cmap, vmin=0, vmax=max(1.0, m.max().item()), aspect="auto")
    if rows * cols <= 400:  # the numbers too, as in the paper's tables, while they still fit
        for r, c in valid.nonzero().tolist():
            ax.text(c, r, f"{m[r, c].item():.2f}", ha="center", va="center", fontsize=7,
                    color="white" if m[r, c] > 0.6 else "black")
    ax.set_xticks(range(cols), labels=layout["columns"])
    ax.set_yticks(range(rows), labels=row_labels(rows, n_layer))
    ax.set(xlabel=layout["xlabel"], title=textwrap.fill(title, int(width * 8)))
    fig.colorbar(image, ax=ax, label=layout["cbar"])
    caption = ("grey: a source this row cannot read. " if not valid.all() else "") + DEPTH_MAP_AND_WIRING
    fig.text(0.01, 0.01, textwrap.fill(caption, int(width * 16)), fontsize=7, color="0.3", va="bottom")
    if at_uniform_start(m, layout):
        warning = "warning: still at its uniform start (every row equal over its sources): not trained yet"
        fig.suptitle(textwrap.fill(warning, int(width * 12)), color="darkred", fontsize=9, fontweight="bold")
    fig.tight_layout(rect=(0, 0.1 + 0.45 / fig.get_figheight(), 1, 1))  # room for the caption below
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return fig
