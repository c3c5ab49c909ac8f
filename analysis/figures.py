"""
The figures eval.py and its analyses draw: matplotlib to PNG files, where --plot asks for them.
"""
import os

from plumbing.errors import ConfigError
from plumbing.files import written


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


def save_png(fig, path, **kwargs):
    """fig as a PNG at path, whole or not at all and never into a FIFO (written()); kwargs: savefig's."""
    with written(path, "wb") as f:
        fig.savefig(f, format="png", **kwargs)
