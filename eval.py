"""
Evaluate a checkpoint: python eval.py --out_dir out [--tokens N] [--logit_lens] [--json]

Loss and perplexity over the whole validation split (or its first --tokens tokens), read as consecutive
windows of the model's context so that every token is predicted exactly once.
--logit_lens: for every layer, the loss and the mean probability of the correct next token when the final
norm and the head read that layer's output (seed 000 Figure 9).
"""
import argparse
import json
import math
import os
import sys
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from train import ArgumentParser, ConfigError, fail, load_checkpoint, read_meta, str2bool


def parse_args(argv):
    p = ArgumentParser(description=__doc__.strip().splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out_dir", default="out", help="run folder holding ckpt.pt (or a path to a .pt file)")
    p.add_argument("--data_dir", default="", help="folder of prepared data sets; '' = the one the run trained on")
    p.add_argument("--dataset", default="", help="'' = the data set the run trained on")
    p.add_argument("--split", default="val", choices=["val", "train"])
    p.add_argument("--tokens", type=int, default=0, help="evaluate the first N tokens of the split; 0 = all")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--logit_lens", type=str2bool, nargs="?", const=True, default=False,
                   help="per-layer loss and mean probability of the correct next token")
    p.add_argument("--json", type=str2bool, nargs="?", const=True, default=False,
                   help="print the results as one JSON object")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA where supported), float32, bfloat16")
    return p.parse_args(argv)


@torch.no_grad()
def evaluate_split(model, data, block_size, batch_size, device, ctx, logit_lens=False, progress=True):
    """Mean next-token loss over data, read in consecutive windows; with logit_lens also per layer."""
    n_windows = math.ceil((len(data) - 1) / block_size)
    n_layers = model.config.n_layer
    nll = torch.zeros(n_layers + 1, dtype=torch.float64)  # per layer (logit lens) and the model's own output
    prob = torch.zeros(n_layers + 1, dtype=torch.float64)
    count = 0
    for start in tqdm(range(0, n_windows, batch_size), disable=not progress, desc="eval", unit="batch"):
        xs, ys = [], []
        for w in range(start, min(start + batch_size, n_windows)):
            chunk = torch.from_numpy(data[w * block_size:(w + 1) * block_size + 1].astype(np.int64))
            xs.append(chunk[:-1])
            ys.append(chunk[1:])
        # the last window may be short: pad, and ignore the padding in the loss (-1)
        x = torch.nn.utils.rnn.pad_sequence(xs, batch_first=True).to(device)
        y = torch.nn.utils.rnn.pad_sequence(ys, batch_first=True, padding_value=-1).to(device)
        with ctx:
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


def main(argv):
    args = parse_args(argv)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    use_bf16 = args.dtype == "bfloat16" or (args.dtype == "auto" and device.startswith("cuda")
                                            and torch.cuda.is_bf16_supported())
    ctx = torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if use_bf16 else nullcontext()
    model, ckpt = load_checkpoint(args.out_dir, device)
    model.eval()
    data_dir = args.data_dir or ckpt["train_config"]["data_dir"]
    dataset = args.dataset or ckpt["train_config"]["dataset"]
    meta = read_meta(data_dir, dataset)
    if meta["tokenizer"] != ckpt["meta"]["tokenizer"]:
        raise ConfigError(f"data set {dataset} uses the {meta['tokenizer']} tokenizer but the model was trained "
                          f"with {ckpt['meta']['tokenizer']}; choose a data set prepared with that tokenizer")
    data = np.memmap(os.path.join(data_dir, dataset, f"{args.split}.bin"), dtype=np.dtype(meta["dtype"]), mode="r")
    if args.tokens:
        data = data[:args.tokens + 1]
    loss, prob, count = evaluate_split(model, data, ckpt["model_args"]["block_size"], args.batch_size, device,
                                       ctx, logit_lens=args.logit_lens, progress=not args.json)
    result = {"model": ckpt["model_name"], "dataset": dataset, "split": args.split, "tokens": count,
              "loss": loss[-1].item(), "perplexity": math.exp(loss[-1].item())}
    if args.logit_lens:
        result["logit_lens"] = [{"layer": l + 1, "loss": loss[l].item(), "p_correct": prob[l].item()}
                                for l in range(len(loss) - 1)]
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['model']} on {dataset}/{args.split}: {count:,} tokens | loss {result['loss']:.4f} | "
          f"perplexity {result['perplexity']:.3f}")
    for row in result.get("logit_lens", []):
        print(f"  layer {row['layer']:>2}: loss {row['loss']:.4f} | p(correct) {row['p_correct']:.4f}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as e:
        fail(str(e))
