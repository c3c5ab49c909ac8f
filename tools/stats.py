"""
A statistic that model files log, over the training of a sweep's runs: every seed of the labels asked for.

    python -m tools.stats --results results/L12 --stat hc_gain --runs mhc,mhc-hc --plot_path results/L12/hc_gain.png

The sweep keeps what train.py logged at each evaluation in results.json (each run's stats_curve): the model file's
stats(), such as mHC's composite gain (hc_gain), Vertical Attention's map entropy (va_entropy) or value-learned's
mean lambda (value_lambda). This draws one of them against the tokens seen, a line per run, a colour per label,
and prints each run's value at its last evaluation. It trains nothing and writes nothing but the figure.
"""
import os
import sys
from dataclasses import dataclass

if __package__ in (None, ""):  # run as a file: the modules it imports are at the repository root
    sys.exit("run it from the repository root as `python -m tools.stats`")

from analysis.figures import FIGURE_FIX, plain_units, pyplot_for, save_png
from plumbing.config import option
from plumbing.errors import ConfigError, main_boundary, printable
from plumbing.options import check_output, parse_simple
from tools.sweep import read_sweep


@dataclass
class StatsConfig:
    results: str = option("out/sweep", "the sweep's folder, which holds its results.json", path=True)
    stat: str = option("", "the statistic: a name the model files' stats() log (hc_gain, va_entropy, ...)",
                       required=True)
    runs: str = option("", "comma-separated labels; '' = every label whose runs logged the statistic")
    plot_path: str = option("", "the figure; '' = <results>/<stat>.png", path=True, out="file")
    plot: str = option("auto", "auto (a PNG where matplotlib is installed), true, false",
                       choices=("auto", "true", "false"))


def curves(runs, stat, labels):
    """{label: [(seed, [(tokens, value), ...]), ...]} of the runs of labels (all, where labels is empty) whose
    stats_curve holds stat, in their results' order."""
    out = {}
    for r in runs:
        points = [(tokens, logged[stat]) for tokens, logged in r.get("stats_curve") or [] if stat in logged]
        if points and (not labels or r["label"] in labels):
            out.setdefault(r["label"], []).append((r["seed"], points))
    return out


def plot(plt, found, stat, path):
    """A line per run (its evaluations' values, marked), a colour per label, against the tokens seen."""
    fig, ax = plt.subplots(figsize=(8, 5))
    colours = plt.get_cmap("tab10").colors
    top = max(t for runs in found.values() for _, points in runs for t, _ in points)
    for i, (label, runs) in enumerate(found.items()):
        for n, (seed, points) in enumerate(runs):
            ax.plot(*zip(*points), color=colours[i % 10], marker="o", markersize=3, linewidth=1.2,
                    label=f"{label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})" if n == 0 else None)
    ax.set(xlabel="tokens seen", ylabel=stat, title=f"{stat} during training: one line per run (seed)")
    ax.xaxis.set_major_formatter(plain_units(top))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return fig


def parse_args(argv):
    return parse_simple(StatsConfig, argv, __doc__)


def main(argv):
    args = parse_args(argv)
    path = args.plot_path or os.path.join(args.results, f"{args.stat}.png")
    if args.plot != "false":
        check_output("--plot_path", path, "file", FIGURE_FIX)
    json_path = os.path.join(args.results, "results.json")
    if not os.path.isfile(json_path):
        raise ConfigError(f"--results {printable(args.results)} holds no results.json; name the folder of a sweep "
                          "(python -m tools.sweep --results)")
    labels = [label for label in args.runs.split(",") if label]
    found = curves(read_sweep(json_path)["runs"], args.stat, labels)
    missing = [label for label in labels if label not in found]
    if not found or missing:
        raise ConfigError(f"no run of {', '.join(missing) or 'the sweep'} in {printable(json_path)} logged --stat "
                          f"{args.stat}; a run records the stats train.py logged since the sweep kept them "
                          "(stats_curve): check the name, or train the runs again")
    for label, runs in found.items():
        for seed, points in runs:
            print(f"{label}, seed {seed}: {args.stat} {points[-1][1]:.4g} at {points[-1][0]:,} tokens "
                  f"(from {points[0][1]:.4g}; largest {max(v for _, v in points):.4g})")
    plt = pyplot_for(args.plot)
    if plt is not None:
        plot(plt, found, args.stat, path)
        print(f"figure: {path}")


if __name__ == "__main__":
    main_boundary(main)
