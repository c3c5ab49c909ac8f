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
    """The zoom on the end of training that a comparison concludes from: ((x0, x1), (y0, y1)), where x0 to x1 is
    the last `share` of the tokens (or steps) of the longest curve, counted from 0 (where training starts; from
    the smallest x where that is below 0), the same window for every curve, so that a shorter or longer run does
    not move it; x1 is the largest x of any curve. The y-range fits just the points (x, y) in the window (with a
    `margin` of their spread each side), so that final losses a few hundredths apart are told apart. None where
    there is nothing to zoom on (the points in the window at one x, or all at one y)."""
    xs = [x for points in curves for x, _ in points]
    if not xs:
        return None
    x1 = max(xs)
    x0 = x1 - share * (x1 - min(0, min(xs)))
    tolerance = 1e-9 * max(abs(x0), abs(x1), 1)  # a point on the window's start, in float arithmetic
    late = [(x, y) for points in curves for x, y in points if x >= x0 - tolerance]
    xs, ys = [x for x, _ in late], [y for _, y in late]
    if len(set(xs)) < 2 or max(ys) == min(ys):
        return None
    pad = margin * (max(ys) - min(ys))
    return (x0, x1), (min(ys) - pad, max(ys) + pad)


def plain_units(top):
    """A matplotlib FuncFormatter that writes an axis reaching `top` (tokens, steps) in plain units: 0.5M, 1M,
    1.5M (K, M or B as top's size asks), with no offset or "1e6" written beside the axis."""
    from matplotlib.ticker import FuncFormatter
    scale, unit = next(((s, u) for s, u in ((1e9, "B"), (1e6, "M"), (1e3, "K")) if abs(top) >= s), (1, ""))
    return FuncFormatter(lambda x, pos=None: f"{round(x / scale, 6) + 0.0:,g}{unit}" if round(x / scale, 6) else "0")


def in_units(x, top):
    """x as plain_units(top) writes it on the axis: 2.46M."""
    return plain_units(top)(round(x, -max(0, len(str(int(abs(top)))) - 3)))


FIGURE_FIX = "pass --plot false, or --plot_path to save it elsewhere"  # a figure that cannot be written where it goes


def save_png(fig, path, **kwargs):
    """fig as a PNG at path, whole or not at all and never into a FIFO (written()); kwargs: savefig's. A figure that
    cannot be written there says how to do without it, or where else to put it."""
    with handling(path, FIGURE_FIX, FIGURE_FIX), written(path, "wb") as f:
        fig.savefig(f, format="png", **kwargs)
