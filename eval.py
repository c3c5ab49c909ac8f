"""
Evaluate checkpoints: python eval.py --out_dir out [out2 ...] [--tokens N] [analyses] [--json]

Loss and perplexity over the whole validation split (or its first --tokens tokens), read as consecutive
windows of the model's context so that every token is predicted exactly once. The analyses:
--logit_lens  for every layer, the loss and the mean probability of the correct next token when the final norm
              and the head read that layer's output (the Vertical Attention paper's Figure 9); one curve per
              --out_dir in one plot.
--depth_map   the model's cross-layer weights, depth_map(), as a layers x sources table (its Tables 5-7)
              and a heat map, read after one forward pass over --batch_size validation windows (the maps of
              attnres and aila depend on the input; skipmiddle's mean gates are measured on it).
--mc FILE     few-shot multiple choice (its Table 4, as lm-evaluation-harness scores it): every choice is
              scored by the log-likelihood of its continuation after --k_shot solved examples; acc, and
              acc_norm with the log-likelihood per character of the choice.
--lm_eval T   the tasks T (comma-separated names or .yaml files) through lm-evaluation-harness itself
              (pip install -r requirements-eval.txt).
--curves R..  the training and validation loss of your own runs side by side, from their log.jsonl (a PNG).
--wiring [R..] which earlier representations each block (attnres: each sublayer) reads directly, and how much of
              what it computes comes from each, measured with autograd on the model files: every model and the
              variants its paper compares at initialisation (bare --wiring, or `init`), or your runs (a PNG).

    python eval.py --out_dir out-vanilla out-vertical --logit_lens --depth_map
    python eval.py --curves out/vanilla out/vertical
    python eval.py --wiring --plot_path docs/wiring.png
    python eval.py --out_dir out-vertical --loss=false --mc hellaswag_val.jsonl --k_shot 4
"""
import contextlib
import math
import os
import random
import re
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from common import (DTYPES, autocast, build_model, describe_run, load_model_module, model_from_checkpoint, open_split,
                    resolve_device, resolve_dtype)
from plumbing.checkpoints import read_checkpoint
from plumbing.config import option
from plumbing.errors import ConfigError, main_boundary
from plumbing.files import has_nonfinite, parse_json, read_meta, read_text, to_json
from plumbing.options import check_output, parse_simple
from plumbing.schemas import LOG_RECORD, Mismatch, check
from prepare import get_tokenizer


@dataclass
class EvalConfig:
    out_dir: tuple = option(("out",), "run folder(s) holding ckpt.pt (or paths to .pt files); each is evaluated in "
                            "turn", path=True)
    data_dir: str = option("", "folder of prepared data sets; '' = the one the run trained on", path=True)
    dataset: str = option("", "'' = the data set the run trained on")
    split: str = option("val", "the split to evaluate on", choices=("val", "train"))
    tokens: int = option(0, "evaluate the first N tokens of the split; 0 = all", min=0)
    batch_size: int = option(8, "windows (or scored continuations) per forward pass", min=1)
    loss: bool = option(True, "loss and perplexity over the split; false = only the analyses asked for")
    logit_lens: bool = option(False, "per-layer loss and mean probability of the correct next token")
    depth_map: bool = option(False, "print the model's depth_map() (and save out_dir/depth_map.png)")
    curves: tuple = option((), "plot the training and validation loss of these run folders from their log.jsonl, one "
                           "colour per run, to --plot_path or curves.png in the first of them (no checkpoint is "
                           "evaluated)", path=True)
    wiring: tuple = option((), "draw which earlier representations each block reads: `init` (also a bare --wiring) = "
                           "every model file and the variants its paper compares at initialisation; run folders = "
                           "their checkpoints; to --plot_path, or wiring.png in the first run folder (init: in the "
                           "current folder); no loss is evaluated")
    mc: str = option("", "few-shot multiple choice on this jsonl file: context/choices/label, or HellaSwag "
                     "(ctx/endings/label), ARC (question/choices/answerKey), PIQA (goal/sol1/sol2/label)",
                     path=True)
    k_shot: int = option(4, "solved examples before each question (--mc, --lm_eval)", min=0)
    mc_limit: int = option(0, "score the first N questions only (--mc, --lm_eval); 0 = all", min=0)
    seed: int = option(1337, "draws the --k_shot examples (--wiring: the tokens and the probes)", min=0, max=2**32 - 1)
    lm_eval: str = option("", "lm-evaluation-harness tasks, comma-separated, e.g. hellaswag,piqa, or task .yaml files",
                          path=True)
    plot: str = option("auto", "save PNGs: auto = when matplotlib is installed, true, false",
                       choices=("auto", "true", "false"))
    plot_path: str = option("", "the logit lens figure (--curves, --wiring: their figure); '' = logit_lens.png "
                           "(curves.png, wiring.png) in the first out_dir", path=True, out="file")
    json: bool = option(False, "print the results as one JSON object per checkpoint, one per line")
    device: str = option("auto", "auto (CUDA where there is a GPU, else CPU), cpu, cuda, cuda:N, mps")
    dtype: str = option("auto", "auto = bfloat16 autocast on a GPU that has it, else float32", choices=DTYPES)


def run_folder(out_dir):
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


# ----------------------------------------------------------------------------------------------------------
# loss, perplexity and the logit lens

@torch.no_grad()
def evaluate_split(model, data, block_size, batch_size, device, ctx, logit_lens=False, progress=True, skip=False):
    """Mean next-token loss over data, read in consecutive windows; with logit_lens also per layer; skip: through
    the model's forward_skip() (skipmiddle: tokens whose gate is 0 skip their blocks for real)."""
    n_windows = math.ceil((len(data) - 1) / block_size)
    n_layers = model.config.n_layer
    nll = torch.zeros(n_layers + 1, dtype=torch.float64)  # per layer (logit lens) and the model's own output
    prob = torch.zeros(n_layers + 1, dtype=torch.float64)
    count = 0
    # a bar on a terminal only (disable=None): a captured log gets no carriage returns
    for start in tqdm(range(0, n_windows, batch_size), disable=None if progress else True, desc="eval", unit="batch"):
        xs, ys = [], []
        for w in range(start, min(start + batch_size, n_windows)):
            chunk = torch.from_numpy(data[w * block_size:(w + 1) * block_size + 1].astype(np.int64))
            xs.append(chunk[:-1])
            ys.append(chunk[1:])
        # the last window may be short: pad, and ignore the padding in the loss (-1)
        x = torch.nn.utils.rnn.pad_sequence(xs, batch_first=True).to(device)
        y = torch.nn.utils.rnn.pad_sequence(ys, batch_first=True, padding_value=-1).to(device)
        with ctx:
            if skip:
                (logits, _), hidden = model.forward_skip(x), []
            else:
                logits, _, hidden = model(x, return_hidden=True)
            outputs = [model.lm_head(model.norm(h)) for h in hidden] if logit_lens else []
        mask = y >= 0
        for i, out in enumerate(outputs + [logits]):
            slot = i if logit_lens else n_layers
            logp = F.log_softmax(out.float(), dim=-1).gather(-1, y.clamp(min=0)[..., None])[..., 0]
            nll[slot] += -logp[mask].double().sum().item()
            prob[slot] += logp[mask].exp().double().sum().item()
        count += mask.sum().item()
    return nll / count, prob / count, count


def plot_logit_lens(plt, results, path):
    """The Vertical Attention paper's Figure 9: loss and p(correct) of every layer's logit lens, one curve per
    checkpoint."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        layers = [row["layer"] for row in r["logit_lens"]]
        folder = os.path.basename(os.path.abspath(run_folder(r["out_dir"])))
        label = folder if r["model"] in folder else f"{r['model']} ({folder})"
        for ax, key in zip(axes, ("loss", "p_correct")):
            ax.plot(layers, [row[key] for row in r["logit_lens"]], marker="o", label=label)
    for ax, ylabel in zip(axes, ("loss (nats)", "p(correct next token)")):
        ax.set(xlabel="layer", ylabel=ylabel, title=f"logit lens: {ylabel}")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------
# the depth map

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
        return [f"layer {l + 1}" for l in range(n_rows)]
    if n_rows == 2 * n_layer + 1:  # one row per sublayer, then the output (attnres)
        return [f"{kind} {l // 2 + 1}" for l, kind in zip(range(2 * n_layer), ["attn", "mlp"] * n_layer)] + ["output"]
    return [f"row {r}" for r in range(n_rows)]


def format_depth_map(m, n_layer, layout=None, decimals=2):
    """The map as text lines: one row per layer, one column per source (the Vertical Attention paper's
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
    layer's output) and learned (the map is trained from a uniform start, so that the start can be recognised)."""
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
                      xlabel="source: the embedding (emb), then layer j's output (j)"
                      + ("; row j's column j: its own block output" if cols > rows else ""))
    elif name == "attnres":  # mean softmax weight: the embedding, then block n's (partial) sum
        full = getattr(model.config, "attn_res", "") == "full"
        layout.update(columns=sources, cbar="mean softmax weight (over tokens)", learned=True,
                      valid=read_counts(model.sources_per_mix(), rows, cols),
                      xlabel="source: the embedding (emb), then " + ("sublayer n's output (n)" if full else
                                                                      "block n's sum (n; partial while open)"))
    elif name == "skiplayer":  # fixed: the fraction of layer l's query heads reading layer j's keys and values
        layout.update(columns=[str(j) for j in range(1, cols + 1)], valid=causal,
                      xlabel="the layer whose keys and values the heads read", cbar="fraction of the query heads")
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
        for r in range(rows):
            for c in range(cols):
                if valid[r, c]:
                    ax.text(c, r, f"{m[r, c].item():.2f}", ha="center", va="center", fontsize=7,
                            color="white" if m[r, c] > 0.6 else "black")
    ax.set_xticks(range(cols), labels=layout["columns"])
    ax.set_yticks(range(rows), labels=row_labels(rows, n_layer))
    ax.set(xlabel=layout["xlabel"], title=textwrap.fill(title, int(width * 8)))
    fig.colorbar(image, ax=ax, label=layout["cbar"])
    if not valid.all():
        fig.text(0.01, 0.01, "grey: a source this row cannot read", fontsize=7, color="0.4")
    if at_uniform_start(m, layout):
        warning = "warning: still at its uniform start (every row equal over its sources): not trained yet"
        fig.suptitle(textwrap.fill(warning, int(width * 12)), color="darkred", fontsize=9, fontweight="bold")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


# ----------------------------------------------------------------------------------------------------------
# the curves of the user's own runs, from their log.jsonl

def read_run_log(run):
    """A run folder's log.jsonl as {"folder", "train": [(step, tokens, loss)], "val": [(step, tokens, val_loss)]}:
    tokens is the count the record holds, or for a log of an older train.py step x the tokens per step its
    ckpt.pt records (None where there is no readable checkpoint). A last line cut short (train.py still writing
    it, or killed while it did) is left out; any other line that is not a record of train.py (LOG_RECORD) is a
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
        try:
            record = parse_json(line)
            check(record, LOG_RECORD)
        except (ValueError, Mismatch) as e:
            if n == len(lines):  # no newline after it: cut short while it was written
                break
            reason = f"its {e.field} is not {e.expected}" if isinstance(e, Mismatch) else str(e)[:80]
            raise ConfigError(f"--curves: {path} line {n} is not a record of train.py ({reason}); delete the line "
                              "or train the run again")
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
        return read_checkpoint(path, ("model_name", "run"), mmap=True)["run"].get("tokens_per_step")
    except ConfigError:  # another version's or a damaged one: plot against steps
        return None


def pyplot_for(plot):
    """matplotlib.pyplot where --plot asks for figures (auto: where matplotlib is installed), else None."""
    if plot == "false":
        return None
    plt = import_pyplot()
    if plt is None and plot == "true":
        raise ConfigError("--plot needs matplotlib: pip install matplotlib")
    return plt


def plot_curves(plt, runs, path):
    """The training loss (thin line) and validation loss (dots) of every run, one colour per run, against tokens
    seen as the logs record them, or against steps where a run's tokens are unknown. Returns the (closed) figure."""
    tokens = all(t is not None for r in runs for _, t, _ in r["train"] + r["val"])
    fig, ax = plt.subplots(figsize=(10, 5.5))
    colours = plt.get_cmap("tab10").colors
    for i, r in enumerate(runs):
        colour = colours[i % 10]
        for points, style, label in ((r["train"], dict(linewidth=1, alpha=0.6), "training loss"),
                                     (r["val"], dict(marker="o", linewidth=2, markersize=4), "validation loss")):
            if points:
                ax.plot([t if tokens else s for s, t, _ in points], [v for _, _, v in points], color=colour,
                        label=f"{r['label']}: {label}", **style)
    ax.set(xlabel="tokens seen" if tokens else "step (tokens unknown: a log of an older train.py, no readable ckpt.pt)",
           ylabel="loss (nats per token)", title="loss during training (each run's log.jsonl)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def curves(args):
    """--curves: the runs' curves in one PNG and one line per run."""
    if args.plot != "false" and not args.plot_path:  # the figure's path, before any log is read
        check_output("--curves", os.path.join(args.curves[0], "curves.png"), "file")
    runs = [read_run_log(run) for run in args.curves]
    names = [os.path.basename(os.path.abspath(r["folder"])) for r in runs]
    for r, name in zip(runs, names):  # by folder name, or by path where two runs share a name
        r["label"] = name if names.count(name) == 1 else os.path.normpath(r["folder"])
    for r in runs:
        steps, tokens, _ = max(r["train"] + r["val"], key=lambda p: p[0])
        line = f"{r['label']}: {steps:,} steps"
        if tokens is not None:
            line += f" ({tokens:,} tokens)"
        if r["val"]:
            line += f", last val loss {r['val'][-1][2]:.4f} (step {r['val'][-1][0]:,})"
        if r["train"]:
            line += f", last training loss {r['train'][-1][2]:.4f}"
        print(line)
    plt = pyplot_for(args.plot)
    if plt is None:
        if args.plot == "auto":
            print("note: PNG skipped, matplotlib is not installed (pip install matplotlib)")
        return
    path = args.plot_path or os.path.join(runs[0]["folder"], "curves.png")
    plot_curves(plt, runs, path)
    print(f"curves: {path}")


# ----------------------------------------------------------------------------------------------------------
# log-likelihood of continuations: the multiple-choice scorer and the lm-evaluation-harness adapter share it

def encode_pair(encode, eot, context, continuation):
    """(context ids, continuation ids) split as lm-evaluation-harness splits them: the context's trailing
    whitespace moves to the continuation, whose ids are what encoding the whole adds after the context; an empty
    context is the end-of-text token (documents start after one in the training data)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole, context_ids = encode(context + continuation), encode(context)
    return (context_ids or [eot]), whole[len(context_ids):]


@torch.no_grad()
def score_continuations(model, pairs, block_size, batch_size, device, ctx, progress=False):
    """For (context ids, continuation ids) pairs: (sum of log p(continuation | context), whether greedy decoding
    gives the continuation). A prompt longer than block_size + 1 tokens is cut on the left (a continuation
    longer than block_size keeps only its last block_size tokens)."""
    order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))  # little padding
    scores = [None] * len(pairs)
    for start in tqdm(range(0, len(pairs), batch_size), disable=None if progress else True, desc="score",
                      unit="batch"):
        batch = order[start:start + batch_size]
        seqs = [(pairs[i][0] + pairs[i][1])[-(block_size + 1):] for i in batch]
        xs = [torch.tensor(s[:-1], dtype=torch.long) for s in seqs]
        x = torch.nn.utils.rnn.pad_sequence(xs, batch_first=True).to(device)
        with ctx:
            logits, _ = model(x)  # (B, T, vocab); right padding does not change the earlier positions
        for row, i, s in zip(logits, batch, seqs):
            n = min(len(pairs[i][1]), len(s) - 1)
            logp = F.log_softmax(row[len(s) - 1 - n:len(s) - 1].float(), dim=-1)  # predictions of the last n ids
            target = torch.tensor(s[len(s) - n:], dtype=torch.long, device=device)
            scores[i] = (logp.gather(-1, target[:, None]).sum().item(), bool((logp.argmax(-1) == target).all()))
    return scores


def rolling_pairs(ids, eot, block_size):
    """(context, continuation) windows that score every token of a document once (after the end-of-text token),
    each with as much context as fits: lm-evaluation-harness's loglikelihood_rolling."""
    tokens = [eot] + list(ids)
    pairs = []
    for start in range(1, len(tokens), block_size):
        end = min(start + block_size, len(tokens))
        pairs.append((tokens[max(0, end - 1 - block_size):start], tokens[start:end]))
    return pairs


# ----------------------------------------------------------------------------------------------------------
# few-shot multiple choice from a local jsonl file

def clean_hellaswag(text):
    # lm-evaluation-harness's preprocessing of the WikiHow part of HellaSwag
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def normalise_mc(item):
    """One question in any accepted format -> (context, choices, label index); ValueError names what is wrong.
    HellaSwag, ARC and PIQA get lm-evaluation-harness's prompts (its hellaswag, arc_easy and piqa tasks)."""
    if not isinstance(item, dict):
        raise ValueError("expected a JSON object")
    if "context" in item:  # this script's own format
        context, choices, label = item["context"], item["choices"], item["label"]
    elif "endings" in item:  # HellaSwag
        ctx = f"{item['ctx_a']} {item['ctx_b'].capitalize()}" if "ctx_a" in item else item["ctx"]
        topic = f"{item['activity_label']}: " if item.get("activity_label") else ""
        context = clean_hellaswag(topic + ctx)
        choices, label = [clean_hellaswag(e) for e in item["endings"]], item["label"]
    elif "question" in item:  # ARC: the Hugging Face layout, or the original one with the choices in the question
        q = item["question"]
        stem, options = (q["stem"], q["choices"]) if isinstance(q, dict) else (q, item["choices"])
        if isinstance(options, list):
            options = {"text": [o["text"] for o in options], "label": [o["label"] for o in options]}
        context, choices = f"Question: {stem}\nAnswer:", options["text"]
        if item["answerKey"] not in options["label"]:
            raise ValueError(f"answerKey {item['answerKey']!r} is not one of the labels {options['label']}")
        label = options["label"].index(item["answerKey"])
    elif "goal" in item:  # PIQA
        context, choices, label = f"Question: {item['goal']}\nAnswer:", [item["sol1"], item["sol2"]], item["label"]
    else:
        raise ValueError(f"unknown format (keys {', '.join(sorted(item))}); expected context/choices/label, "
                         "ctx/endings/label, question/choices/answerKey or goal/sol1/sol2/label")
    if not isinstance(context, str) or not isinstance(choices, list) or len(choices) < 2 \
            or not all(isinstance(c, str) for c in choices):
        raise ValueError("context must be a string and choices a list of at least two strings")
    label = int(label)
    if not 0 <= label < len(choices):
        raise ValueError(f"label {label} is not an index of the {len(choices)} choices")
    return context, choices, label


def read_mc(path):
    lines = read_text(path, "the --mc file", "pass a .jsonl file, one question per line").splitlines()
    items = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                items.append(normalise_mc(parse_json(line)))
            except KeyError as e:
                raise ConfigError(f"{path} line {n}: missing key {e}")
            except (ValueError, TypeError, AttributeError) as e:
                raise ConfigError(f"{path} line {n}: {e}")
    if len(items) < 2:
        raise ConfigError(f"{path} holds {len(items)} question(s); multiple choice needs at least 2")
    return items


def continuation(choice):
    # lm-evaluation-harness joins context and answer with one space; a choice starting with whitespace keeps its own
    return choice if choice[:1].isspace() else " " + choice


def multiple_choice(model, items, encode, eot, block_size, args, device, ctx):
    """acc and acc_norm of few-shot multiple choice: each question after k solved examples drawn (with --seed)
    from the other questions, every example written "context continuation\\n\\n"."""
    questions = items[:args.mc_limit or len(items)]
    k = min(args.k_shot, len(items) - 1)  # the examples come from the other questions of the file
    if k < args.k_shot:
        print(f"note: {args.mc} holds {len(items)} questions: {k}-shot, not {args.k_shot}-shot", file=sys.stderr)
    pairs = []
    for q, (context, choices, _) in enumerate(questions):
        rng = random.Random(args.seed * 1_000_003 + q)  # the same examples for every checkpoint
        shots = [i for i in rng.sample(range(len(items)), min(args.k_shot + 1, len(items))) if i != q]
        solved = [items[i] for i in shots[:k]]
        prefix = "".join(f"{c}{continuation(answers[label])}\n\n" for c, answers, label in solved)
        pairs += [encode_pair(encode, eot, prefix + context, continuation(choice)) for choice in choices]
    scores = iter(score_continuations(model, pairs, block_size, args.batch_size, device, ctx, progress=not args.json))
    acc = acc_norm = 0
    for _, choices, label in questions:
        logp = [next(scores)[0] for _ in choices]
        # lm-eval's acc_norm: per character of the choice, without the space that joins it to the context
        per_char = [lp / max(1, len(choice)) for lp, choice in zip(logp, choices)]
        acc += int(np.argmax(logp) == label)
        acc_norm += int(np.argmax(per_char) == label)
    n = len(questions)
    return {"file": args.mc, "questions": n, "k_shot": k, "acc": acc / n, "acc_norm": acc_norm / n,
            "chance": sum(1 / len(c) for _, c, _ in questions) / n}


# ----------------------------------------------------------------------------------------------------------
# lm-evaluation-harness (optional dependency)

def import_lm_eval():
    try:
        import lm_eval
        from lm_eval.api.model import LM
    except ImportError as e:
        raise ConfigError(f"--lm_eval needs lm-evaluation-harness ({e}): pip install lm-eval")
    return lm_eval, LM


def make_lm_eval_adapter(model, encode, eot, block_size, batch_size, device, ctx):
    """An lm_eval.api.model.LM over a loaded checkpoint; the class is made here, so lm_eval is imported only
    when it is used. It scores log-likelihoods (every multiple-choice and perplexity task); it does not generate."""
    _, LM = import_lm_eval()

    class LMEvalAdapter(LM):
        def loglikelihood(self, requests, disable_tqdm=False):
            pairs = [encode_pair(encode, eot, *r.args) for r in requests]
            return score_continuations(model, pairs, block_size, batch_size, device, ctx, progress=not disable_tqdm)

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            out = []
            for r in tqdm(requests, disable=disable_tqdm, desc="rolling", unit="doc"):
                windows = rolling_pairs(encode(r.args[0]), eot, block_size)
                out.append(sum(lp for lp, _ in score_continuations(model, windows, block_size, batch_size,
                                                                     device, ctx)))
            return out

        def generate_until(self, requests, disable_tqdm=False):
            raise NotImplementedError("eval.py's lm_eval adapter scores log-likelihoods only: choose tasks that do "
                                      "not generate text (hellaswag, arc_easy, arc_challenge, piqa, ...)")

    return LMEvalAdapter()


def read_task_file(path):
    """An lm-eval task .yaml file, checked: UTF-8 YAML holding a mapping (lm-evaluation-harness reads it again)."""
    import yaml  # lm-evaluation-harness's own dependency
    if not os.path.exists(path):
        raise ConfigError(f"--lm_eval: no task file {path}; pass a task name or the path of a task .yaml file")
    fix = "fix the file (lm-evaluation-harness's task YAML)"
    text = read_text(path, "the --lm_eval task file", fix)
    try:
        task = yaml.load(text, Loader=yaml.SafeLoader) if "!function" not in text else {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"the --lm_eval task file {path} is not readable YAML{where} "
                          f"({getattr(e, 'problem', None) or e}); {fix}")
    if not isinstance(task, dict):
        raise ConfigError(f"the --lm_eval task file {path} holds no task (a YAML mapping with a task name); {fix}")
    for data in task_data(task):  # lm-evaluation-harness would end a missing or empty one in a traceback
        if not os.path.exists(data):
            raise ConfigError(f"the --lm_eval task file {path} reads its data set from {data}, which does not exist; "
                              "make it, or fix the path in the task file")
        try:
            with open(data, "rb") if os.path.isfile(data) else contextlib.nullcontext(os.listdir(data)) as f:
                empty = not (f.read(1) if os.path.isfile(data) else f)
        except OSError as e:
            raise ConfigError(f"the --lm_eval task file {path} reads its data set from {data}, which cannot be read "
                              f"({e.strerror}); fix its permissions or the path in the task file")
        if empty:
            raise ConfigError(f"the --lm_eval task file {path} reads its data set from {data}, which is empty; fill "
                              "it, or fix the path in the task file")


def task_data(task):
    """The local paths a task reads its data set from: dataset_kwargs' data_files (a path, a list, or a dict of
    splits), and a dataset_path that names a file or folder on disk (else it is a Hugging Face hub name)."""
    kwargs = task.get("dataset_kwargs")
    files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
    paths = []
    for value in files.values() if isinstance(files, dict) else [files]:
        paths += [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]
    where = task.get("dataset_path")
    if isinstance(where, str) and (where.startswith((".", "/", "~")) or os.path.exists(where)):
        paths.append(os.path.expanduser(where))
    return [os.path.expanduser(p) for p in paths]


def run_lm_eval(model, encode, eot, block_size, args, device, ctx):
    """{task: {metric: value}} from lm_eval.simple_evaluate. A task given as a .yaml file is read from its folder,
    and lm-evaluation-harness's own task list (some 15,000 YAML files, indexed in seconds) only when a task is
    named by its registered name."""
    lm_eval, _ = import_lm_eval()
    from lm_eval.tasks import TaskManager
    adapter = make_lm_eval_adapter(model, encode, eot, block_size, args.batch_size, device, ctx)
    tasks = [t.strip() for t in args.lm_eval.split(",") if t.strip()]
    files = [t for t in tasks if t.endswith((".yaml", ".yml"))]
    folders = sorted({os.path.dirname(os.path.abspath(f)) for f in files})
    manager = TaskManager(include_path=folders or None, include_defaults=len(files) < len(tasks))
    try:
        out = lm_eval.simple_evaluate(model=adapter, tasks=tasks, num_fewshot=args.k_shot,
                                      limit=args.mc_limit or None, task_manager=manager, log_samples=False)
    except KeyError as e:  # lm_eval's word for a task it does not know
        raise ConfigError(f"--lm_eval: {e.args[0] if e.args else e}; see `lm-eval ls tasks`")
    except NotImplementedError as e:  # a task that generates text
        raise ConfigError(f"--lm_eval: {e}")
    return {task: {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            for task, metrics in out["results"].items()}


# ----------------------------------------------------------------------------------------------------------

def trained_on(args, ckpt, out_dir):
    """(data_dir, dataset) to evaluate on: the options', else the ones the run trained on."""
    saved = ckpt.get("train_config", {})
    data_dir, dataset = args.data_dir or saved.get("data_dir"), args.dataset or saved.get("dataset")
    if not (data_dir and dataset):
        raise ConfigError(f"the checkpoint of {out_dir} does not name the data set it trained on; pass --dataset "
                          "and --data_dir")
    return data_dir, dataset


def evaluate_checkpoint(out_dir, args, mc_items, device, ctx, plt):
    model, _, ckpt = model_from_checkpoint(out_dir, device, keys=("model_name", "model_args", "model", "meta",
                                                            "train_config"))
    model.eval()
    name, block_size = ckpt["model_name"], ckpt["model_args"]["block_size"]
    result = {"out_dir": out_dir, "model": name, "step": ckpt.get("iter_num"), "tokens_seen": ckpt.get("tokens_seen"),
              "run": describe_run(ckpt)}
    if args.loss or args.logit_lens or args.depth_map:
        data_dir, dataset = trained_on(args, ckpt, out_dir)
        meta = read_meta(data_dir, dataset)
        if meta["tokenizer"] != ckpt["meta"]["tokenizer"]:
            raise ConfigError(f"data set {dataset} uses the {meta['tokenizer']} tokenizer but the model was trained "
                              f"with {ckpt['meta']['tokenizer']}; choose a data set prepared with that tokenizer")
        data = open_split(data_dir, dataset, args.split, meta)
        if args.tokens:
            data = data[:args.tokens + 1]
        if len(data) < 2:
            raise ConfigError(f"the {args.split} split of {dataset} holds {len(data)} token(s); it needs 2 or more")
        result.update(dataset=dataset, split=args.split)
    if args.depth_map and not hasattr(model, "depth_map") and len(args.out_dir) > 1:
        print(f"note: model_{name}.py has no depth_map(); {out_dir} is compared without one",
              file=sys.stderr if args.json else sys.stdout)
    elif args.depth_map:  # before the loss pass: skipmiddle's map averages the forwards since the model was loaded
        m = read_depth_map(model, name, data, block_size, args.batch_size, device, ctx)
        result["depth_map"] = m.tolist()
        layout = depth_map_layout(model, name, m)
        result["depth_map_uniform"] = at_uniform_start(m, layout)
        if plt is not None:
            result["depth_map_png"] = os.path.join(run_folder(out_dir), "depth_map.png")
            title = (f"{os.path.normpath(run_folder(out_dir))}, step {ckpt.get('iter_num', '?')}: "
                     f"model_{name}.py depth map")
            plot_depth_map(plt, m, model.config.n_layer, layout, title, result["depth_map_png"])
    if args.loss or args.logit_lens:
        loss, prob, count = evaluate_split(model, data, block_size, args.batch_size, device, ctx,
                                           logit_lens=args.logit_lens, progress=not args.json)
        result.update(tokens=count, loss=loss[-1].item(), perplexity=math.exp(loss[-1].item()))
        if args.loss and getattr(model.config, "gated", False) and hasattr(model, "forward_skip"):
            loss_skip = evaluate_split(model, data, block_size, args.batch_size, device, ctx, progress=not args.json,
                                       skip=True)[0]
            result["loss_skip"] = loss_skip[-1].item()  # the same loss with the skipped blocks really skipped
        if args.logit_lens:
            result["logit_lens"] = [{"layer": l + 1, "loss": loss[l].item(), "p_correct": prob[l].item()}
                                    for l in range(len(loss) - 1)]
    if args.mc or args.lm_eval:
        encode, _, _, eot = get_tokenizer(ckpt["meta"]["tokenizer"])
        if args.mc:
            result["mc"] = multiple_choice(model, mc_items, encode, eot, block_size, args, device, ctx)
        if args.lm_eval:
            result["lm_eval"] = run_lm_eval(model, encode, eot, block_size, args, device, ctx)
    return result, model


def number(value, spec):
    """value formatted as spec, or 'not finite' (a table shows no NaN as a number)."""
    return format(value, spec) if math.isfinite(value) else "not finite"


def report(result, model, args):
    if args.json:
        if result.get("depth_map_uniform"):
            print(uniform_note(result), file=sys.stderr)
        if has_nonfinite(result):
            print(f"note: {result['out_dir']}: values that are not finite numbers are written as null", file=sys.stderr)
        print(to_json(result), flush=True)
        return
    line = f"{result['model']} ({result['out_dir']}, {result['run']})"
    if "loss" in result:
        line += (f" on {result['dataset']}/{result['split']}: {result['tokens']:,} tokens | "
                 f"loss {number(result['loss'], '.4f')} | perplexity {number(result['perplexity'], '.3f')}")
    if "loss_skip" in result:
        line += f" | loss with skipping {number(result['loss_skip'], '.4f')}"
    print(line)
    for row in result.get("logit_lens", []):
        print(f"  layer {row['layer']:>2}: loss {number(row['loss'], '.4f')} | "
              f"p(correct) {number(row['p_correct'], '.4f')}")
    if "depth_map" in result:
        m = torch.tensor(result["depth_map"])
        layout = depth_map_layout(model, result["model"], m)
        print(f"  depth map: a row per block; columns: {layout['xlabel'] or 'one'}; a cell: {layout['cbar']}")
        for line in format_depth_map(m, model.config.n_layer, layout):
            print("  " + line)
        if "depth_map_png" in result:
            print(f"  heat map: {result['depth_map_png']}")
        if result.get("depth_map_uniform"):
            print(textwrap.indent(textwrap.fill(uniform_note(result), 110), "  "))
    if "mc" in result:
        mc = result["mc"]
        print(f"  multiple choice, {mc['k_shot']}-shot, {mc['questions']} questions from {mc['file']}: "
              f"acc {mc['acc']:.4f} | acc_norm {mc['acc_norm']:.4f} | chance {mc['chance']:.4f}")
    for task, metrics in result.get("lm_eval", {}).items():
        print(f"  lm_eval {task}: " + " | ".join(f"{k} {number(v, '.4f')}" for k, v in metrics.items()))


# ---- --wiring: which earlier representations each block reads directly, measured with autograd --------------

# (model file, options, one-line caption): every model file at its defaults, and the variants its paper compares
WIRINGS = [
    ("vanilla", {}, "vanilla: the chain"),
    ("vertical", {}, "Vertical Attention, learned map"),
    ("vertical", {"va_map": "unet"}, "Vertical Attention, U-Net map"),
    ("vertical", {"va_map": "inet"}, "Vertical Attention, I-Net map"),
    ("skiplayer", {}, "Skip-Layer Attention (SLA)"),
    ("skiplayer", {"ala_every": 2}, "ALA(-), K = 2"),
    ("attnres", {}, "Attention Residuals, block"),
    ("attnres", {"attn_res": "full"}, "Attention Residuals, full"),
    ("aila", {}, "AILA, architecture 2"),
    ("aila", {"aila_arch": 1}, "AILA, architecture 1"),
    ("skipmiddle", {}, "skip-middle, gates open"),
    ("skipmiddle", {"closed": True}, "skip-middle, middle gates closed"),
]


def wiring_points(model):
    """(the modules whose outputs are the representations later blocks read, row labels, whether a row is the
    module's update, its output minus its input). A residual block's output is its input plus what it computes:
    the update leaves out that identity, so that a block whose gate is closed reads nothing. attnres's sublayers
    and AILA's merges add no identity to what they return: their whole output is what they compute."""
    L = model.config.n_layer
    if hasattr(model, "out_res"):  # attnres: every attention and MLP is a sublayer whose output is a source
        return ([m for b in model.blocks for m in (b.attn, b.mlp)],
                [f"{kind}{l + 1}" for l in range(L) for kind in ("a", "m")], False)
    if hasattr(model, "mix"):  # AILA: layer j's output is its merge of the block and the mix over earlier layers
        if not hasattr(model, "merge_norm"):
            raise ConfigError("--wiring reads AILA's layer outputs off its merge norms; aila_merge residual has none")
        return list(model.merge_norm), [str(l + 1) for l in range(L)], False
    return list(model.blocks), [str(l + 1) for l in range(L)], True


def wiring(model, idx, seed):
    """(strengths (rows + 1, 1 + rows), row labels, column labels): row r is point r of wiring_points (a block, or
    attnres's sublayer), the last row the input of the final norm (what the head reads); column 0 is the
    embedding, column c point c - 1's output. Every representation h_c is detached and a zero perturbation e_c
    that requires grad is added to it, so that the only path from e_c to row r's output is a direct read: no
    gradient passes through a block in between. Strength [r, c] = rms(h_c) ||J^T u|| / ||u|| for a Gaussian probe
    u of row r (J = d row_r / d e_c; ||J^T u|| / ||u|| estimates J's RMS singular value): the change of row r per
    relative change of h_c, which no rescaling of h_c alters (a block reads its input through a norm). Vertical
    Attention's row is then its map alpha, not alpha / ||h||. An exact 0 where row r does not read c at all."""
    points, labels, update = wiring_points(model)
    eps, rms, read = [], [], []

    def perturb(out):
        e = torch.zeros_like(out, requires_grad=True)
        eps.append(e)
        rms.append(out.detach().double().pow(2).mean().sqrt().item())
        return out.detach() + e

    def at_point(module, args, out):
        read.append(out - args[0] if update else out)
        return perturb(out)

    hooks = [model.tok_emb.register_forward_hook(lambda m, args, out: perturb(out))]
    hooks += [p.register_forward_hook(at_point) for p in points]
    hooks.append(model.norm.register_forward_pre_hook(lambda m, args: read.append(args[0])))
    try:
        with torch.enable_grad():
            model(idx)
            gen = torch.Generator().manual_seed(seed)
            gains = torch.zeros(len(read), len(eps))
            for r, out in enumerate(read):
                probe = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out)
                grads = torch.autograd.grad(out, eps, probe, retain_graph=True, allow_unused=True)
                for c, g in enumerate(grads):
                    if g is not None:
                        gains[r, c] = rms[c] * (g.double().norm() / probe.double().norm()).item()
    finally:
        for hook in hooks:
            hook.remove()
    return gains, labels + ["head"], ["emb"] + labels


def close_middle_gates(model):
    """skip-middle with the middle half of its blocks skipped by every token: bench.py's --close_gates at gate
    n_gates // 2 (blocks 1 to 4 of 6)."""
    from tools.bench import close_gates
    close_gates(model, len(model.gates) // 2)


def wiring_panels(args):
    """[(caption, gains, row labels, column labels)]: one panel per model and variant at init, or per run."""
    panels = []
    for entry in args.wiring:
        if entry == "init":
            for name, options, caption in WIRINGS:
                options = dict(options)
                closed = options.pop("closed", False)
                module = load_model_module(name)
                torch.manual_seed(args.seed)
                model = build_model(module, options).eval()
                if closed:
                    close_middle_gates(model)
                idx = torch.randint(model.config.vocab_size, (2, min(64, model.config.block_size)),
                                    generator=torch.Generator().manual_seed(args.seed))
                panels.append((caption, *wiring(model, idx, args.seed)))
            continue
        try:
            model, _, ckpt = model_from_checkpoint(entry, keys=("model_name", "model_args", "model", "train_config"))
        except ConfigError as e:
            raise ConfigError(f"--wiring {entry}: {e} (or `init` for the models at initialisation)")
        model.eval()
        idx = wiring_tokens(args, ckpt, model.config)
        folder = os.path.basename(os.path.abspath(run_folder(entry)))  # short: one line over a narrow panel
        caption = f"{folder}: {ckpt['model_name']}, step {ckpt.get('iter_num', '?')}"
        panels.append((caption, *wiring(model, idx, args.seed)))
    return panels


def wiring_tokens(args, ckpt, config):
    """Two windows from the start of the run's validation split (the maps of aila, attnres and skip-middle's gates
    depend on the tokens), or random tokens with a note where the data set is not here."""
    T = min(64, config.block_size)
    try:
        data_dir, dataset = trained_on(args, ckpt, "the run")
        data = open_split(data_dir, dataset, "val", read_meta(data_dir, dataset))
        if len(data) >= 2 * T:
            return torch.from_numpy(data[:2 * T].astype(np.int64)).view(2, T)
    except (ConfigError, KeyError, OSError):
        pass
    print("note: no validation data for the run here; its wiring is read on random tokens", file=sys.stderr)
    return torch.randint(config.vocab_size, (2, T), generator=torch.Generator().manual_seed(args.seed))


def reads(gains, rows, cols):
    """One line per row: the representations it reads, with each one's share of the row's gains."""
    lines = []
    for r, row in enumerate(rows):
        total = gains[r].sum().item()
        cells = [f"{cols[c]} {gains[r, c].item() / total:.2f}" for c in range(len(cols)) if gains[r, c] > 0]
        lines.append(f"  {row:>4} reads {', '.join(cells) if cells else 'nothing'}")
    return lines


def plot_wiring(plt, panels, path):
    """One panel per model: the share of each row's gains that each representation takes, on a log scale over three
    decades; blank where a row reads nothing, grey where a column is not earlier than the row. Returns the (closed)
    figure."""
    from matplotlib.colors import LogNorm
    cols = min(4, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.1 * cols + 1, 3.0 * nrows + 0.6), squeeze=False,
                             layout="constrained")
    cmap = plt.get_cmap("viridis_r").with_extremes(bad="white", under=plt.get_cmap("viridis_r")(0.0))
    image = None
    for ax, (caption, gains, rows, labels) in zip(axes.flat, panels):
        share = gains / gains.sum(1, keepdim=True).clamp(min=1e-30)
        n_rows = len(rows)
        image = ax.imshow(np.ma.masked_equal(share.numpy(), 0.0), cmap=cmap, norm=LogNorm(1e-3, 1.0),
                          aspect="auto", interpolation="nearest")
        later = np.array([[c > r and r < n_rows - 1 for c in range(len(labels))] for r in range(n_rows)])
        ax.imshow(np.ma.masked_where(~later, np.ones_like(later, float)), cmap="Greys", vmin=0, vmax=5,
                  aspect="auto", interpolation="nearest")
        ax.set_title(caption, fontsize=9)
        step = 1 if len(labels) <= 14 else 2
        ax.set_xticks(range(0, len(labels), step), labels[::step], fontsize=7, rotation=90 if len(labels) > 8 else 0)
        ax.set_yticks(range(0, n_rows, step), rows[::step], fontsize=7)
        ax.axhline(n_rows - 1.5, color="0.5", linewidth=0.6)  # the head's row below the blocks'
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.supxlabel("reads: the embedding, or block j's output (attnres: a = attention, m = MLP sublayer)", fontsize=9)
    fig.supylabel("block l (attnres: sublayer), then the head", fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.5, label="share of the row's direct reads")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def draw_wiring(args):
    """--wiring: the panels, one summary per panel printed, and the figure."""
    plt = pyplot_for(args.plot)
    first = next((e for e in args.wiring if e != "init"), None)
    path = args.plot_path or os.path.join(run_folder(first) if first else ".", "wiring.png")
    if plt is not None and not args.plot_path:
        check_output("--wiring", path, "file")
    panels = wiring_panels(args)
    for caption, gains, rows, cols in panels:
        if args.json:
            print(to_json({"wiring": caption, "rows": rows, "columns": cols, "gains": gains.tolist()}))
        else:
            print(caption)
            print("\n".join(reads(gains, rows, cols)))
    say = sys.stderr if args.json else sys.stdout
    if plt is not None:
        plot_wiring(plt, panels, path)
        print(f"wiring figure: {path}", file=say)
    elif args.plot == "auto":
        print("note: PNG skipped, matplotlib is not installed (pip install matplotlib)", file=say)


def parse_args(argv):
    argv = list(argv)
    for i, a in enumerate(argv):  # a bare --wiring (nothing after it, or another option): the models at init
        if a == "--wiring" and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
            argv.insert(i + 1, "init")
    return parse_simple(EvalConfig, argv, __doc__)


# the analyses a command may ask for; those of ALONE read no checkpoint's evaluation and take no other
ANALYSES = ("logit_lens", "depth_map", "mc", "lm_eval", "curves", "wiring")
ALONE = {"curves": "reads only the runs' logs", "wiring": "draws the models' connections"}


def main(argv):
    args = parse_args(argv)
    for mode, what in ALONE.items():
        others = [f"--{k}" for k in ANALYSES if k != mode and getattr(args, mode) and getattr(args, k)]
        if others:
            raise ConfigError(f"--{mode} {what}; run {' '.join(others)} in a command of its own")
    if args.curves:
        return curves(args)
    if args.wiring:
        return draw_wiring(args)
    if args.lm_eval:
        import_lm_eval()  # fail before any work when it is missing, or a task file is bad
        for f in [t.strip() for t in args.lm_eval.split(",") if t.strip().endswith((".yaml", ".yml"))]:
            read_task_file(f)
    mc_items = read_mc(args.mc) if args.mc else None
    plt = pyplot_for(args.plot) if args.logit_lens or args.depth_map else None
    figures = [os.path.join(run_folder(d), "depth_map.png") for d in args.out_dir if args.depth_map]
    if args.logit_lens and not args.plot_path:
        figures.append(os.path.join(run_folder(args.out_dir[0]), "logit_lens.png"))
    for path in figures if plt is not None else ():  # before any checkpoint is evaluated
        check_output("--out_dir", path, "file")
    device = resolve_device(args.device)
    ctx = autocast(device, resolve_dtype(args.dtype, device))
    results = []
    for out_dir in args.out_dir:
        result, model = evaluate_checkpoint(out_dir, args, mc_items, device, ctx, plt)
        report(result, model, args)
        results.append(result)
        del model
    say = sys.stderr if args.json else sys.stdout  # keep stdout JSON only
    if args.logit_lens and plt is not None:
        path = args.plot_path or os.path.join(run_folder(args.out_dir[0]), "logit_lens.png")
        plot_logit_lens(plt, results, path)
        print(f"logit lens figure: {path}", file=say)
    if (args.logit_lens or args.depth_map) and plt is None and args.plot == "auto":
        print("note: PNGs skipped, matplotlib is not installed (pip install matplotlib)", file=say)


if __name__ == "__main__":
    main_boundary(main)
