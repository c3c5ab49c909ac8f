"""
eval.py --mc and --lm_eval: the log-likelihood of continuations, as lm-evaluation-harness scores them. Few-shot
multiple choice from a local jsonl file (acc, and acc_norm per character), and an lm_eval.api.model.LM over a
checkpoint for lm-evaluation-harness's own tasks (an optional dependency, imported only where it is used).
"""
import contextlib
import os
import random
import re
import sys

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from plumbing.errors import ConfigError
from plumbing.files import parse_json, read_text

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
    except RecursionError:
        raise ConfigError(f"the --lm_eval task file {path} is nested too deep to read; {fix}")
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
