"""
Plumbing a learner may skip: what train.py shows while it trains. A progress bar on a terminal; where stderr is not
one (a cluster's log file, `> log.txt 2>&1`) every record a line of its own, with the step out of the total and the
time left. A statistic of every block or gate in short (log.jsonl keeps each figure); Weights & Biases on --wandb_log.
"""
import os
import re
import sys
import time

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/console.py is a library module (what train.py shows); run `python train.py --help`")


class Console:
    """The bar, the lines and wandb of one process: every method does nothing where show is False (a torchrun
    process other than rank 0's)."""

    def __init__(self, total, start, show, header, every, wandb_config=None, project="", name=""):
        from tqdm import tqdm
        self.show, self.wandb, self.began = show, None, time.perf_counter()  # began: at the run's first line
        self.recent = [(start, self.began)]  # (step, time) of the start or last evaluation, then of the last 5 records
        self.every, self.evaluation = every, 0.0  # steps between evaluations, and the last one's seconds
        self.bar = tqdm(total=total, initial=start, disable=None if show else True, dynamic_ncols=True)
        if show:
            self.bar.write(header)
        if show and wandb_config is not None:
            import wandb
            self.wandb = wandb.init(project=project, name=name or None, config=wandb_config)

    def record(self, record, line=False):
        """A record: a line of its own where line is True (an evaluation) or there is no bar, else the bar's text."""
        if not self.show:
            return
        if self.wandb is not None:
            self.wandb.log(record, step=record["iter"])
        now = time.perf_counter()
        if line:  # an evaluation, since the last training record: its time, and the pace measured afresh after it
            self.evaluation, self.recent = now - self.recent[-1][1], [(record["iter"], now)]
        else:
            self.recent = [*self.recent[-5:], (record["iter"], now)]
        if line or self.bar.disable:  # as nanoGPT prints them, out of the total
            rest = self.bar.total, self.every, self.evaluation
            left = "" if line else f" | {duration(time_left(*zip(*self.recent), *rest))} left"
            self.bar.write(f"iter {record['iter']}/{self.bar.total} | {short(record)}{left}")
        else:
            self.bar.set_postfix_str(short(record))  # the bar shows the step, the total and its time left




def bar_note(text):
    """A note on a line of its own above the progress bar, where one is drawn (tqdm clears the bar's line, writes the
    note, and draws the bar again); under torchrun rank 0's."""
    if os.environ.get("RANK", "0") == "0":
        from tqdm import tqdm
        tqdm.write(f"note: {text}", file=sys.stderr)


def time_left(steps, times, total, every, evaluation):
    """Seconds to step total: the steps left at the pace from the first to the last of these steps, done at these
    wall-clock times (a machine that slows down shows), and the evaluations left (every `every` steps and at the
    last) at `evaluation` seconds each."""
    evaluations = total // every - steps[-1] // every + (total % every > 0)
    return (total - steps[-1]) * (times[-1] - times[0]) / (steps[-1] - steps[0]) + evaluations * evaluation


def duration(seconds):
    """42s, 7m12s, 1h05m."""
    m, s = divmod(round(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s" if m else f"{s}s"


def short(record):
    """A record's text on the console but its step: a statistic of every block or gate (gate0_mean, gate1_mean, ...)
    as the range of its values, gate_mean[0-5] 0.91..1."""
    out, families = {}, {}
    for k, v in record.items():
        m = re.fullmatch(r"([a-z]+)(\d+)_(\w+)", k) if isinstance(v, float) else None
        if m:
            families.setdefault(f"{m[1]}_{m[3]}", {})[int(m[2])] = v
        elif k != "iter":
            out[k] = f"{v:.4g}" if isinstance(v, float) else v
    for name, m in families.items():
        out[f"{name}[{min(m)}-{max(m)}]"] = f"{min(m.values()):.3g}..{max(m.values()):.3g}"
    return " | ".join(f"{k} {v}" for k, v in out.items())
