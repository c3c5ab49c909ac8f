"""
Evaluate checkpoints: python eval.py --out_dir out [out2 ...] [--tokens N] [analyses] [--json]

Loss and perplexity over the whole validation split (or its first --tokens tokens), read as consecutive
windows of the model's context so that every token is predicted exactly once. The analyses (each but the logit lens
a module of analysis/):
--logit_lens  for every layer, the loss and the mean probability of the correct next token when the final norm
              and the head read that layer's output (the Vertical Attention paper's Figure 9); one curve per
              --out_dir in one plot.
--depth_map   the model's cross-layer weights, depth_map(), as a blocks x sources table (its Tables 5-7)
              and a heat map, read after one forward pass over --batch_size validation windows (the maps of
              attnres and aila depend on the input; skipmiddle's mean gates are measured on it).
--mc FILE     few-shot multiple choice (its Table 4, as lm-evaluation-harness scores it): every choice is
              scored by the log-likelihood of its continuation after --k_shot solved examples; acc, and
              acc_norm with the log-likelihood per character of the choice.
--lm_eval T   the tasks T (comma-separated names or .yaml files) through lm-evaluation-harness itself
              (pip install -r requirements-eval.txt).
--curves R..  the training and validation loss of your own runs side by side, from their log.jsonl (a PNG), with a
              zoom on the last 40% of training, where the runs' final losses can be told apart.
--wiring [R..] which earlier representations each block (attnres: each sublayer) reads directly, and how much of
              what it computes comes from each, measured with autograd on the model files: every model and the
              variants its paper compares at initialisation (bare --wiring, or `init`), or your runs (a PNG).

    python eval.py --out_dir out/vanilla out/vertical --logit_lens --depth_map
    python eval.py --curves out/vanilla out/vertical
    python eval.py --wiring --plot_path docs/wiring.png
    python eval.py --out_dir out/vertical --loss=false --mc hellaswag_val.jsonl --k_shot 4
"""
import json
import math
import os
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from analysis.curves import curves
from analysis.depth_map import (at_start, depth_map_layout, first_windows, format_depth_map, plot_depth_map,
                                read_depth_map, start_note)
from analysis.figures import DEPTH_MAP_AND_WIRING, FIGURE_FIX, pyplot_for, run_folder, save_png
from analysis.scoring import import_lm_eval, multiple_choice, read_mc, read_task_file, run_lm_eval
from analysis.wiring import draw_wiring
from common import DTYPES, autocast, describe_run, get_tokenizer, model_from_checkpoint, resolve_device, resolve_dtype
from plumbing.config import option
from plumbing.errors import ConfigError, main_boundary
from plumbing.files import open_split, read_meta, to_json
from plumbing.options import check_output, parse_simple


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
    device: str = option("auto", "auto (cuda, else mps, else cpu), cpu, cuda, cuda:N, mps")
    dtype: str = option("auto", "auto = bfloat16 autocast on a GPU that has it, else float32", choices=DTYPES)


# ----------------------------------------------------------------------------------------------------------
# loss, perplexity and the logit lens

@torch.no_grad()
def evaluate_split(model, data, block_size, batch_size, device, ctx, logit_lens=False, progress=True, skip=False):
    """Mean next-token loss over data, read in consecutive windows; with logit_lens also per layer; skip: through
    the forward of the model's inference(skip=True) hook (skipmiddle: tokens whose gate is 0 skip their blocks for
    real)."""
    n_windows = math.ceil((len(data) - 1) / block_size)
    n_layers = model.config.n_layer
    nll = torch.zeros(n_layers + 1, dtype=torch.float64)  # per layer (logit lens) and the model's own output
    prob = torch.zeros(n_layers + 1, dtype=torch.float64)
    count = 0
    forward = model.inference(skip=True)[0] if skip else None  # (forward, cache class): generate.py's hook
    # a bar on a terminal only (disable=None): a captured log gets no carriage returns
    for start in tqdm(range(0, n_windows, batch_size), disable=None if progress else True, desc="eval", unit="batch"):
        chunks = [torch.from_numpy(data[w * block_size:(w + 1) * block_size + 1].astype(np.int64))
                  for w in range(start, min(start + batch_size, n_windows))]
        # the last window may be short: pad, and ignore the padding in the loss (-1)
        x = torch.nn.utils.rnn.pad_sequence([c[:-1] for c in chunks], batch_first=True).to(device)
        y = torch.nn.utils.rnn.pad_sequence([c[1:] for c in chunks], batch_first=True, padding_value=-1).to(device)
        with ctx:
            if skip:
                (logits, _), hidden = forward(x), []
            else:
                logits, _, hidden = model(x, return_hidden=True)
            outputs = [model.lm_head(model.norm(h)) for h in hidden] if logit_lens else []
        mask = y >= 0
        for i, out in enumerate(outputs + [logits]):
            slot = i if logit_lens else n_layers
            logp = F.log_softmax(out.float(), dim=-1).gather(-1, y.clamp(min=0)[..., None])[..., 0][mask].cpu()
            nll[slot] += -logp.double().sum().item()  # summed in float64 on the CPU: MPS has no float64
            prob[slot] += logp.exp().double().sum().item()
        count += mask.sum().item()
    return nll / count, prob / count, count


def plot_logit_lens(plt, results, path):
    """The Vertical Attention paper's Figure 9: loss and p(correct) of every layer's logit lens, one curve per
    checkpoint (each layer a point), the legend giving each checkpoint's step where they differ. Returns the (closed)
    figure."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps = {r["step"] for r in results}
    for r in results:
        layers = [row["layer"] for row in r["logit_lens"]]
        folder = os.path.basename(os.path.abspath(run_folder(r["out_dir"])))
        label = folder if r["model"] in folder else f"{r['model']} ({folder})"
        label += f", step {r['step']:,}" if len(steps) > 1 and r["step"] is not None else ""
        for ax, key in zip(axes, ("loss", "p_correct")):
            ax.plot(layers, [row[key] for row in r["logit_lens"]], marker="o", label=label)
    for ax, ylabel in zip(axes, ("loss (nats)", "p(correct next token)")):
        ax.set(xlabel="layer", ylabel=ylabel, title=f"logit lens: {ylabel}")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return fig


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
    name, block_size = ckpt["model_name"], model.config.block_size
    result = {"out_dir": out_dir, "model": name, "step": ckpt.get("iter_num"), "tokens_seen": ckpt.get("tokens_seen"),
              "run": describe_run(ckpt)}
    if args.loss or args.logit_lens or args.depth_map:
        data_dir, dataset = trained_on(args, ckpt, out_dir)
        meta = read_meta(data_dir, dataset)
        if meta["tokenizer"] != ckpt["meta"]["tokenizer"]:
            raise ConfigError(f"data set {dataset} uses the {meta['tokenizer']} tokenizer but the model was trained "
                              f"with {ckpt['meta']['tokenizer']}; choose a data set prepared with that tokenizer")
        data = open_split(data_dir, dataset, args.split, meta, model.config.vocab_size)
        if args.tokens:
            data = data[:args.tokens + 1]
        if len(data) < 2:
            raise ConfigError(f"the {args.split} split of {dataset} holds {len(data)} token(s); it needs 2 or more")
        result.update(dataset=dataset, split=args.split)
    if args.depth_map and not hasattr(model, "depth_map") and len(args.out_dir) > 1:
        print(f"note: model_{name}.py has no depth_map(); {out_dir} is compared without one",
              file=sys.stderr if args.json else sys.stdout)
    elif args.depth_map:  # before the loss pass: measured gates average the forwards since the model was loaded
        m = read_depth_map(model, name, data, block_size, args.batch_size, device, ctx)
        result["depth_map"] = m.tolist()
        layout = depth_map_layout(model, m)
        if at_start(m, layout):  # the model file's layout says where its map starts
            result["depth_map_start"] = layout["start_text"]
        if plt is not None:
            result["depth_map_png"] = os.path.join(run_folder(out_dir), "depth_map.png")
            title = (f"{os.path.normpath(run_folder(out_dir))}, step {ckpt.get('iter_num', '?')}: "
                     f"model_{name}.py depth map")
            plot_depth_map(plt, m, model.config.n_layer, layout, title, result["depth_map_png"])
    if args.loss or args.logit_lens:
        loss, prob, count = evaluate_split(model, data, block_size, args.batch_size, device, ctx,
                                           logit_lens=args.logit_lens, progress=not args.json)
        result.update(tokens=count, loss=loss[-1].item(), perplexity=math.exp(loss[-1].item()))
        if args.loss and getattr(model.config, "gated", False) and hasattr(model, "inference"):
            loss_skip = evaluate_split(model, data, block_size, args.batch_size, device, ctx, progress=not args.json,
                                       skip=True)[0]
            result["loss_skip"] = loss_skip[-1].item()  # the same loss with the skipped blocks really skipped
        if args.logit_lens:
            result["logit_lens"] = [{"layer": l + 1, "loss": loss[l].item(), "p_correct": prob[l].item()}
                                    for l in range(len(loss) - 1)]
        if args.loss and hasattr(model, "stats"):  # the numbers train.py logs, on the first validation windows
            with torch.no_grad(), ctx:
                result["stats"] = model.stats(first_windows(data, block_size, args.batch_size, device))
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
        if result.get("depth_map_start"):
            print(start_note(result, result["depth_map_start"]), file=sys.stderr)
        if to_json(result) != json.dumps(result):  # a number that is not finite, which to_json writes as null
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
    if result.get("stats"):
        print(f"  stats (model_{result['model']}.py's stats(), as train.py logs them): "
              + " | ".join(f"{k} {number(v, '.4g')}" for k, v in result["stats"].items()))
    for row in result.get("logit_lens", []):
        print(f"  layer {row['layer']:>2}: loss {number(row['loss'], '.4f')} | "
              f"p(correct) {number(row['p_correct'], '.4f')}")
    if "depth_map" in result:
        m = torch.tensor(result["depth_map"])
        layout = depth_map_layout(model, m)
        print(f"  depth map: a row per block; columns: {layout['xlabel'] or 'one'}; a cell: {layout['cbar']}")
        print(textwrap.indent(textwrap.fill(DEPTH_MAP_AND_WIRING, 110), "  "))
        for line in format_depth_map(m, model.config.n_layer, layout):
            print("  " + line)
        if "depth_map_png" in result:
            print(f"  heat map: {result['depth_map_png']}")
        if result.get("depth_map_start"):
            print(textwrap.indent(textwrap.fill(start_note(result, result["depth_map_start"]), 110), "  "))
    if "mc" in result:
        mc = result["mc"]
        print(f"  multiple choice, {mc['k_shot']}-shot, {mc['questions']} questions from {mc['file']}: "
              f"acc {mc['acc']:.4f} | acc_norm {mc['acc_norm']:.4f} | chance {mc['chance']:.4f}")
    for task, metrics in result.get("lm_eval", {}).items():
        print(f"  lm_eval {task}: " + " | ".join(f"{k} {number(v, '.4f')}" for k, v in metrics.items()))

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
    lens_png = args.plot_path or os.path.join(run_folder(args.out_dir[0]), "logit_lens.png")
    figures = [os.path.join(run_folder(d), "depth_map.png") for d in args.out_dir if args.depth_map]
    if args.logit_lens and not args.plot_path:
        figures.append(lens_png)
    for path in figures if plt is not None else ():  # before any checkpoint is evaluated
        lens = path == lens_png  # the one whose path --plot_path chooses; a depth map goes beside its checkpoint
        check_output("--plot_path" if lens else "--depth_map", path, "file",
                     FIGURE_FIX if lens else "pass --plot false")
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
        plot_logit_lens(plt, results, lens_png)
        print(f"logit lens figure: {lens_png}", file=say)
    if (args.logit_lens or args.depth_map) and plt is None and args.plot == "auto":
        print("note: PNGs skipped, matplotlib is not installed (pip install matplotlib)", file=say)


if __name__ == "__main__":
    main_boundary(main)
