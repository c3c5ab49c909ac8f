"""
Plumbing a learner may skip: what train.py shows while it trains. A progress bar on a terminal that carries the
periodic records; where stderr is not a terminal (a cluster's log file, `> log.txt 2>&1`) no bar, and every record a
line of its own instead of thousands of carriage-return updates. A record's statistics of every block or gate in a
short form (log.jsonl keeps every figure), and Weights & Biases where --wandb_log asks for it.
"""
import re
import sys

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/console.py is a library module (what train.py shows); run `python train.py --help`")


class Console:
    """The bar, the lines and wandb of one process: every method does nothing where show is False (a torchrun
    process other than rank 0's)."""

    def __init__(self, total, start, show, header, wandb_config=None, project="", name=""):
        from tqdm import tqdm
        self.show, self.wandb = show, None
        self.bar = tqdm(total=total, initial=start, disable=None if show else True, dynamic_ncols=True)
        if show:
            self.bar.write(header)
        if show and wandb_config is not None:
            import wandb
            self.wandb = wandb
            wandb.init(project=project, name=name or None, config=wandb_config)

    def record(self, record, line=False):
        """A record: a line of its own where line is True (an evaluation) or there is no bar, else the bar's text."""
        if not self.show:
            return
        if self.wandb is not None:
            self.wandb.log(record, step=record["iter"])
        text = " | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in short(record).items())
        if line or self.bar.disable:  # as nanoGPT prints them
            self.bar.write(text)
        else:
            self.bar.set_postfix_str(text[len(f"iter {record['iter']} | "):])


def short(record):
    """A record as the console shows it: a statistic of every block or gate (gate0_mean, gate1_mean, ...) as the
    range of its values, gate_mean[0-5] 0.91..1."""
    out, families = {}, {}
    for k, v in record.items():
        m = re.fullmatch(r"([a-z]+)(\d+)_(\w+)", k) if isinstance(v, float) else None
        if m:
            families.setdefault(f"{m[1]}_{m[3]}", {})[int(m[2])] = v
        else:
            out[k] = v
    for name, m in families.items():
        out[f"{name}[{min(m)}-{max(m)}]"] = f"{min(m.values()):.3g}..{max(m.values()):.3g}"
    return out
