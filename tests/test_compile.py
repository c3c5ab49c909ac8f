"""Every model file and each of its VARIANTS traces to one graph under torch.compile (no graph breaks), checked
with torch._dynamo.explain on the training forward (with targets: the loss and any auxiliary loss included)."""
import importlib

import pytest
import torch

from conftest import model_cases

pytestmark = pytest.mark.slow  # dynamo traces every model and variant: about 15 s

TINY = dict(vocab_size=64, block_size=16, n_layer=4, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64)
CASES = model_cases()
IDS = [f"{name}-{variant}" for name, variant, _ in CASES]


@pytest.mark.parametrize("name,variant,overrides", CASES, ids=IDS)
def test_training_forward_is_one_graph(name, variant, overrides):
    module = importlib.import_module(f"model_{name}")
    torch.manual_seed(0)
    model = module.GPT(module.GPTConfig(**{**TINY, **overrides})).train()
    idx = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]))
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(idx, idx)  # traces only (no kernels compiled): about 1 s a case
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
