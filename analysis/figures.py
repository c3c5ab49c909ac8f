"""
The figures eval.py and its analyses draw: matplotlib to PNG files, where --plot asks for them.
"""
import os

from plumbing.errors import ConfigError, handling
from plumbing.files import written

# what the depth map (eval.py --depth_map) and the wiring figure (--wiring) measure, said the same way by both
DEPTH_MAP_AND_WIRING = ("The depth map prints the weights each block learned for its sources (the Vertical Attention "
                        "paper's alpha, before its eq. 3 re-weighting by 1/||h||); the wiring figure measures, with "
                        "autograd, how much of what each block reads comes from each source, which also counts each "
                        "source's norm ||h||: the two differ where the norms do.")


def run_folder(out_dir):
    """The run folder of --out_dir: the folder itself, or the folder of a .pt file."""
    return (os.path.dirname(out_dir) or ".") if out_dir.endswith(".pt") else out_dir


def import_pyplot():
    """matplotlib.pyplot drawing to files only, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def pyplot_for(plot):
    """matplotlib.pyplot where --plot asks for figures (auto: where matplotlib is installed), else None."""
    if plot == "false":
        return None
    plt = import_pyplot()
    if plt is None and plot == "true":
        raise ConfigError("--plot needs matplotlib: pip install matplotlib")
    return plt


def zoom_range(curves, share=0.4, margin=0.05):
    """The zoom on the end of training that a comparison concludes from: ((x0, x1), (y0, y1)) around the points
    (x, y) of every curve in the last `share` of its own x-range, the y-range fitting just them (with a `margin`
    of their spread each side), so that final losses a few hundredths apart are told apart; None where there is
    nothing to zoom on (the late points at one x, or all at one y)."""
    late = []
    for points in curves:
        xs = [x for x, _ in points]
        if xs:
            start = max(xs) - share * (max(xs) - min(xs))
            late += [(x, y) for x, y in points if x >= start]
    xs, ys = [x for x, _ in late], [y for _, y in late]
    if len(set(xs)) < 2 or max(ys) == min(ys):
        return None
    pad = margin * (max(ys) - min(ys))
    return (min(xs), max(xs)), (min(ys) - pad, max(ys) + pad)


FIGURE_FIX = "pass --plot false, or --plot_path to save it elsewhere"  # a figure that cannot be written where it goes


def save_png(fig, path, **kwargs):
    """fig as a PNG at path, whole or not at all and never into a FIFO (written()); kwargs: savefig's. A figure that
    cannot be written there says how to do without it, or where else to put it."""
    with handling(path, FIGURE_FIX, FIGURE_FIX), written(path, "wb") as f:
        fig.savefig(f, format="png", **kwargs)
