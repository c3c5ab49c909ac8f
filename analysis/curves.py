"""
eval.py --curves: the training and validation loss of runs side by side, from their log.jsonl (no checkpoint is
evaluated), one colour per run, against the tokens each has seen; a run is one seed, which the figure and the
printout say where they compare runs.
"""
import os
import textwrap

from analysis.figures import FIGURE_FIX, in_units, plain_units, pyplot_for, run_folder, save_png, zoom_range
from plumbing.config import check_record
from plumbing.errors import ConfigError
from plumbing.files import LogRecord, parse_json, read_checkpoint, read_text
from plumbing.options import check_output

# the spread of the final validation loss over seeds at the Results' budget (the README's words and numbers)
SEED_NOISE = "0.02 to 0.04"
ONE_SEED = (f"One seed per run: final losses less than about {SEED_NOISE} apart differ by the seed alone, which is "
            "no evidence either way; `python -m tools.sweep --seeds 3` compares runs with a standard error.")
SMOOTH = 5  # training records averaged into each point of the drawn training loss


def read_run_log(run):
    """A run folder's log.jsonl as {"folder", "train": [(step, tokens, loss)], "val": [(step, tokens, val_loss)]}:
    tokens is the count the record holds, or for a log of an older train.py step x the tokens per step its
    ckpt.pt records (None where there is no readable checkpoint). A last line cut short (train.py still writing
    it, or killed while it did) is left out; any other line that is not a record of train.py (LogRecord) is a
    ConfigError."""
    folder = run_folder(run)
    if not os.path.isdir(folder):
        raise ConfigError(f"--curves: no run folder {run}; pass folders that train.py wrote (its --out_dir)")
    path = os.path.join(folder, "log.jsonl")
    if not os.path.isfile(path):
        raise ConfigError(f"--curves: {folder} has no log.jsonl; train.py writes one in every --out_dir it trains")
    lines = read_text(path, "--curves: the log", "train the run again, or leave it out").split("\n")
    train, val, per_step = [], [], None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fix = "delete the line or train the run again"
        try:
            record = check_record(LogRecord, parse_json(line), f"--curves: {path} line {n}", fix)
        except (ValueError, ConfigError) as e:
            if n == len(lines):  # no newline after it: cut short while it was written
                break
            raise ConfigError(f"--curves: {path} line {n} is not a record of train.py ({str(e)[:80]}); {fix}"
                              if isinstance(e, ValueError) else str(e))
        tokens = record.get("tokens")
        if tokens is None:  # a log of an older train.py: its steps at the tokens per step the checkpoint records
            per_step = per_step or tokens_per_step(folder) or 0
            tokens = record["iter"] * per_step or None
        for key, points in (("loss", train), ("val_loss", val)):
            if key in record:
                points.append((record["iter"], tokens, record[key]))
    if not train and not val:
        raise ConfigError(f"--curves: {path} holds no loss yet; train.py logs one every --log_interval steps")
    return {"folder": folder, "train": train, "val": val}


def tokens_per_step(folder):
    """The tokens of one optimiser step (all processes and micro-steps), as the run's ckpt.pt records them
    (memory-mapped: the weights are not read), or None where there is no readable checkpoint."""
    path = os.path.join(folder, "ckpt.pt")
    if not os.path.isfile(path):
        return None
    try:
        return read_checkpoint(path, ("run",), mmap=True)["run"].get("tokens_per_step")
    except ConfigError:  # another version's or a damaged one: plot against steps
        return None


def smoothed(points, n=SMOOTH):
    """(step, tokens, loss) points with each loss the mean of the n records centred on it (fewer at the ends): the
    per-batch loss jumps from batch to batch, and the mean shows its trend without lagging behind it."""
    losses, half = [v for _, _, v in points], n // 2
    window = [losses[max(0, i - half):i + half + 1] for i in range(len(losses))]
    return [(s, t, sum(w) / len(w)) for (s, t, _), w in zip(points, window)]


def plot_curves(plt, runs, path, share=0.4):
    """The training loss (a thin, pale line under the rest: the mean of the SMOOTH records centred on each)
    and validation loss (its evaluations as dots,
    unjoined: a straight line between sparse evaluations would lie above the curve, and a run evaluated less often
    would look worse) of every run, one colour per run, against tokens seen as the logs record them, or against
    steps where a run's tokens are unknown; the legend gives each run's steps where they differ. A second panel
    zooms on the last `share` of training (analysis.figures.zoom_range: of the tokens, or steps, the longest run
    saw; one window for every run, its bounds in the title), drawing only the points in it, its y-range fitted to their
    losses (the whole run's range hides final losses a few hundredths apart) and its x-range padded so that no
    marker is cut at an edge. Both token axes read in plain units (0.5M, 1M), with no "1e6" beside them. Returns the
    (closed) figure: axes[0] the whole run, axes[1] the zoom."""
    tokens = all(t is not None for r in runs for _, t, _ in r["train"] + r["val"])
    last = [max(s for s, _, _ in r["train"] + r["val"]) for r in runs]
    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    colours = plt.get_cmap("tab10").colors
    curves = []  # (colour, style, label, points (x, y)) of every curve
    for i, (r, steps) in enumerate(zip(runs, last)):
        colour, run = colours[i % 10], r["label"] + (f" ({steps:,} steps)" if len(set(last)) > 1 else "")
        for points, style, label in ((smoothed(r["train"]), dict(linewidth=1, alpha=0.45, zorder=1, marker=".",
                                                                 markersize=2),
                                      f"training loss (mean of {SMOOTH} records)"),
                                     (r["val"], dict(marker="o", linestyle="none", markersize=6, zorder=3),
                                      "validation loss")):
            if points:
                curves.append((colour, style, f"{run}: {label}", [(t if tokens else s, v) for s, t, v in points]))
    for colour, style, label, points in curves:
        ax.plot(*zip(*points), color=colour, label=label, **style)
    xlabel = "tokens seen" if tokens else "step (tokens unknown: a log of an older train.py, no readable ckpt.pt)"
    ax.set(xlabel=xlabel, ylabel="loss (nats per token)", title="loss during training (each run's log.jsonl)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    drawn = [points for _, _, _, points in curves]
    top = max(x for points in drawn for x, _ in points)
    limits = zoom_range(drawn, share)
    if limits is None:  # one point, or flat curves: nothing to zoom on
        zoom.set_title("the end of training: nothing to zoom on", fontsize=9)
    else:
        (x0, x1), ylim = limits
        tolerance = 1e-9 * max(abs(x0), abs(x1), 1)  # a point on the window's start, in float arithmetic
        for colour, style, _, points in curves:  # only the points in the window: the zoom shows what it names
            late = [(x, y) for x, y in points if x >= x0 - tolerance]
            if late:
                zoom.plot(*zip(*late), color=colour, **style)
        pad = 0.04 * (x1 - x0)  # a marker on the window's first or last x is drawn whole
        zoom.set(xlim=(x0 - pad, x1 + pad), ylim=ylim)
        what = "tokens" if tokens else "steps"
        ends = [(r["label"], max(s if not tokens else t for s, t, _ in r["train"] + r["val"])) for r in runs]
        before = [f"{label} ends before it, at {in_units(end, top)}" for label, end in ends if end < x0 - tolerance]
        whose = "training" if len({end for _, end in ends}) == 1 else "the longest run"
        span = "; ".join([f"{what} {in_units(x0, top)} to {in_units(x1, top)}"] + before)
        title = f"the last {share:.0%} of {whose} ({span}), the y-axis fitted to its losses"
        zoom.set_title(textwrap.fill(title, 75), fontsize=9)
    zoom.set(xlabel=xlabel if tokens else "step", ylabel="loss (nats per token)")
    zoom.grid(alpha=0.3)
    for panel in (ax, zoom):  # plain units, no offset ("1e6") beside either axis
        panel.xaxis.set_major_formatter(plain_units(top))
        panel.ticklabel_format(axis="y", useOffset=False)
    if len(runs) > 1:  # what the comparison can show
        fig.suptitle(textwrap.fill(ONE_SEED, 150), fontsize=10, color="darkred")
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return fig


def curves(args):
    """--curves: the runs' curves in one PNG and one line per run."""
    if args.plot != "false" and not args.plot_path:  # the figure's path, before any log is read
        check_output("--plot_path", os.path.join(args.curves[0], "curves.png"), "file", FIGURE_FIX)
    runs = [read_run_log(run) for run in args.curves]
    names = [os.path.basename(os.path.abspath(r["folder"])) for r in runs]
    for r, name in zip(runs, names):  # by folder name, or by path where two runs share a name
        r["label"] = name if names.count(name) == 1 else os.path.normpath(r["folder"])
        steps, tokens, _ = max(r["train"] + r["val"], key=lambda p: p[0])
        line = f"{r['label']}: {steps:,} steps"
        if tokens is not None:
            line += f" ({tokens:,} tokens)"
        if r["val"]:
            line += f", last val loss {r['val'][-1][2]:.4f} (step {r['val'][-1][0]:,})"
        if r["train"]:
            line += f", last training loss {r['train'][-1][2]:.4f}"
        print(line)
    if len(runs) > 1:
        print(f"note: {ONE_SEED}")
    plt = pyplot_for(args.plot)
    if plt is None:
        if args.plot == "auto":
            print("note: PNG skipped, matplotlib is not installed (pip install matplotlib)")
        return
    path = args.plot_path or os.path.join(runs[0]["folder"], "curves.png")
    plot_curves(plt, runs, path)
    print(f"curves: {path}")
