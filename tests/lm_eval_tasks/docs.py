"""The documents of the local lm-evaluation-harness tasks next to this file, read without the Hugging Face hub, and
shakespeare_gen's score."""
import json
import os

import datasets

HERE = os.path.dirname(os.path.abspath(__file__))


def read(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return {"test": datasets.Dataset.from_list([json.loads(line) for line in f if line.strip()])}


def shakespeare_mc(**metadata):
    return read("shakespeare_mc.jsonl")


def shakespeare_text(**metadata):
    return read("shakespeare_text.jsonl")


def prefix_chars(doc, results):
    """shakespeare_gen's score of a continuation: how many characters of the right choice (after the space that
    follows the context) it gets right from its start, and whether it is the whole choice."""
    want, got = " " + doc["choices"][doc["label"]], results[0]
    n = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    return {"prefix_chars": n, "exact_match": float(got.strip() == want.strip())}
