"""Tests of model_aila.py beyond the shared contract suite (which covers causality and cached generation for the
default and every VARIANT): the alphas, the vanilla limit, a float64 re-computation of a_j for both architectures,
the parameter overhead formula of docs/aila.md, and the hooks."""
import dataclasses
import os
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model_aila  # noqa: E402
import model_vanilla  # noqa: E402

ROOT = str(Path(__file__).resolve().parents[1])

TINY = dict(vocab_size=64, block_size=32, n_layer=4, n_head=4, n_kv_head=2, n_embd=64, ffn_hidden=128)
SETTINGS = {"arch2": {}, "arch2_heads": dict(aila_heads=2, aila_dk=16), **model_aila.VARIANTS,
            "arch1_heads": dict(aila_arch=1, aila_heads=4)}


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    return model_aila.GPT(model_aila.GPTConfig(**{**TINY, **kw})).eval()


def n_candidates(config, j):
    """Candidates of layer j (1-indexed): its j sources, plus h~_j in arch 1."""
    return j + (config.aila_arch == 1)


@pytest.mark.parametrize("name", SETTINGS)
def test_alpha_sums_to_one_per_token_and_layer(name):
    model = tiny(**SETTINGS[name])
    alphas = []
    hooks = [mix.register_forward_hook(lambda mod, inp, out: alphas.append(out[1])) for mix in model.mix]
    model(torch.randint(0, 64, (3, 20)))
    for hook in hooks:
        hook.remove()
    c = model.config
    assert len(alphas) == c.n_layer
    for j, alpha in enumerate(alphas, start=1):
        assert alpha.shape == (3, 20, c.aila_heads, n_candidates(c, j))  # (B, T, H, candidates)
        assert (alpha >= 0).all()
        torch.testing.assert_close(alpha.sum(-1), torch.ones(3, 20, c.aila_heads), atol=1e-6, rtol=0)


def test_residual_merge_with_zero_values_is_vanilla():
    model = tiny(aila_merge="residual")
    fields = {f.name for f in dataclasses.fields(model_vanilla.GPTConfig)}
    vanilla = model_vanilla.GPT(model_vanilla.GPTConfig(**{k: v for k, v in vars(model.config).items()
                                                          if k in fields})).eval()
    missing, unexpected = model.load_state_dict(vanilla.state_dict(), strict=False)
    assert not unexpected and missing and all(k.startswith("mix.") for k in missing)
    with torch.no_grad():
        for mix in model.mix:
            mix.wv.weight.zero_()  # a_j = W_O W_V (sum_i alpha_i h_i) = 0
    idx = torch.randint(0, 64, (2, 24))
    assert torch.equal(model(idx)[0], vanilla(idx)[0])


def layer_inputs(j, d, seed=1):
    """h~_j and j sources with very different scales (the embedding is small, merged outputs are O(1))."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(2, 5, d, generator=g) * 2.0
    sources = [torch.randn(2, 5, d, generator=g) * s for s in [0.02, 1.0, 3.0, 0.5, 1.5][:j]]
    return h, sources


def arch2_float64(mix, h, sources):
    """Eqs. 4-5 as written: project every source with W_K, W_V, score, softmax over sources, mix, W_O."""
    H, dk = mix.n_head, mix.dk
    W = {n: getattr(mix, n).weight.double() for n in ("wq", "wk", "wv", "wo")}
    b = {n: getattr(mix, n).bias.double() for n in ("wq", "wv", "wo")}
    h, sources = h.double(), [s.double() for s in sources]
    q = (h @ W["wq"].T + b["wq"]).unflatten(-1, (H, dk))                          # (B, T, H, dk)
    k = [(s @ W["wk"].T).unflatten(-1, (H, dk)) for s in sources]                 # j x (B, T, H, dk)
    v = [(s @ W["wv"].T + b["wv"]).unflatten(-1, (H, dk)) for s in sources]
    e = torch.stack([(q * ki).sum(-1) / math.sqrt(dk) for ki in k], dim=-1)       # (B, T, H, j)
    alpha = torch.exp(e) / torch.exp(e).sum(-1, keepdim=True)
    out = sum(alpha[..., i, None] * vi for i, vi in enumerate(v))                 # (B, T, H, dk)
    return out.flatten(-2) @ W["wo"].T + b["wo"], alpha


def arch1_float64(mix, h, sources):
    """Eqs. 1-2 as read in the docstring: c_i = W_{j,i} h_i, c_j = h~_j, per-head scorer, softmax, mean."""
    H, d = mix.n_head, h.size(-1)
    cands = []
    for p, s in zip(mix.proj, sources):
        s = s.double()
        if isinstance(p, torch.nn.Linear):
            cands.append(s @ p.weight.double().T + (p.bias.double() if p.bias is not None else 0))
        else:  # rank r: U (V^T h)
            cands.append((s @ p[0].weight.double().T) @ p[1].weight.double().T + p[1].bias.double())
    cands.append(h.double())
    w = mix.score.double()
    a, alphas = 0, []
    for k in range(H):
        sl = slice(k * d // H, (k + 1) * d // H)
        e = torch.stack([(c[..., sl] * w[i, sl]).sum(-1) for i, c in enumerate(cands)], dim=-1)  # (B, T, C)
        alpha = torch.softmax(e, dim=-1)
        a = a + sum(alpha[..., i, None] * c for i, c in enumerate(cands)) / H
        alphas.append(alpha)
    return a, torch.stack(alphas, dim=2)                                           # (B, T, d), (B, T, H, C)


@pytest.mark.parametrize("kw", [dict(), dict(aila_heads=4, aila_dk=8), dict(aila_arch=1),
                                dict(aila_arch=1, aila_heads=4), dict(aila_arch=1, aila_rank=8, aila_heads=2)],
                         ids=["arch2", "arch2_heads", "arch1", "arch1_heads", "arch1_rank"])
def test_layer_output_matches_float64_recomputation(kw):
    model = tiny(bias=True, **kw)
    j = 4
    mix = model.mix[j - 1]
    with torch.no_grad():  # non-zero biases and larger scorers, so that both matter
        for name, p in mix.named_parameters():
            p.copy_(torch.randn_like(p) * (0.1 if name.endswith("bias") or name == "score" else 0.05))
    h, sources = layer_inputs(j, model.config.n_embd)
    a, alpha = mix(h, sources)
    ref_a, ref_alpha = (arch1_float64 if model.config.aila_arch == 1 else arch2_float64)(mix, h, sources)
    assert alpha.std() > 0.01  # the check is not trivial: the weights are far from uniform
    torch.testing.assert_close(alpha.double(), ref_alpha, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a.double(), ref_a, atol=1e-5, rtol=1e-4)


SHAPES = {"50m": dict(n_embd=192, ffn_hidden=768, n_head=3, n_layer=6, n_kv_head=1),
          "300m": dict(n_embd=768, ffn_hidden=3072, n_head=12, n_layer=12, n_kv_head=4)}


def overhead_formula(c):
    """The docstring's count of extra parameters over vanilla."""
    d, L, b = c.n_embd, c.n_layer, int(c.bias)
    S = L * (L + 1) // 2
    if c.aila_arch == 2:
        extra = L * (4 * d * c.aila_heads * c.aila_dk + b * (2 * c.aila_heads * c.aila_dk + d))
    else:
        P = d * d if c.aila_rank == 0 else 2 * c.aila_rank * d
        extra = S * (P + b * d) + d * (S + L)
    return extra + (2 * d * L if c.aila_merge == "relu_layernorm" else 0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kw", [dict(), dict(aila_arch=1), dict(aila_arch=1, aila_rank=8),
                                dict(aila_merge="residual"), dict(aila_heads=2, bias=True),
                                dict(aila_arch=1, bias=True, aila_merge="residual")],
                         ids=["arch2", "arch1", "arch1_rank", "arch2_residual", "arch2_heads_bias", "arch1_bias"])
def test_parameter_overhead_matches_docstring_formula(shape, kw):
    config = model_aila.GPTConfig(**SHAPES[shape], **kw)
    fields = {f.name for f in dataclasses.fields(model_vanilla.GPTConfig)}
    with torch.device("meta"):
        aila = model_aila.GPT(config)
        vanilla = model_vanilla.GPT(model_vanilla.GPTConfig(**{k: v for k, v in vars(config).items()
                                                                if k in fields}))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(aila) - count(vanilla) == overhead_formula(config)


def test_docs_state_the_counts_the_formula_gives():
    doc = open(os.path.join(ROOT, "docs", "aila.md")).read().replace(",", "")
    for shape, kw in [("50m", {}), ("50m", dict(aila_arch=1)), ("50m", dict(aila_arch=1, aila_rank=8)),
                      ("300m", {}), ("300m", dict(aila_arch=1)), ("300m", dict(aila_arch=1, aila_rank=8))]:
        assert str(overhead_formula(model_aila.GPTConfig(**SHAPES[shape], **kw))) in doc


@pytest.mark.parametrize("name", ["arch2", "arch2_heads", "arch1", "arch1_heads"])
def test_depth_map_and_stats(name):
    model = tiny(**SETTINGS[name])
    idx = torch.randint(0, 64, (2, 16))
    c, m = model.config, model.depth_map(idx)
    assert m.shape == (c.n_layer, c.n_layer + (c.aila_arch == 1))
    torch.testing.assert_close(m.sum(-1), torch.ones(c.n_layer), atol=1e-5, rtol=0)
    for j in range(1, c.n_layer + 1):
        assert (m[j - 1, n_candidates(c, j):] == 0).all() and (m[j - 1, :n_candidates(c, j)] > 0).all()
    stats = model.stats(idx)
    max_entropy = sum(math.log(n_candidates(c, j)) for j in range(1, c.n_layer + 1)) / c.n_layer
    for key in ("aila_map_entropy", "aila_token_entropy"):
        assert 0 < stats[key] <= max_entropy + 1e-5
    assert stats["aila_token_entropy"] <= stats["aila_map_entropy"] + 1e-5  # entropy is concave


@pytest.mark.parametrize("name", SETTINGS)
def test_every_parameter_takes_part_in_backward(name):
    model = tiny(**SETTINGS[name]).train()  # DDP without find_unused_parameters needs every grad
    idx = torch.randint(0, 64, (2, 16))
    model(idx, targets=idx)[1].backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []


@pytest.mark.parametrize("kw", [dict(), dict(aila_arch=1), dict(aila_arch=1, aila_rank=8)])
def test_flops_add_the_documented_matmuls(kw):
    config = model_aila.GPTConfig(**SHAPES["50m"], **kw)
    fields = {f.name for f in dataclasses.fields(model_vanilla.GPTConfig)}
    with torch.device("meta"):
        aila = model_aila.GPT(config)
        vanilla = model_vanilla.GPT(model_vanilla.GPTConfig(**{k: v for k, v in vars(config).items()
                                                                if k in fields}))
    d, L, S = config.n_embd, config.n_layer, config.n_layer * (config.n_layer + 1) // 2
    if config.aila_arch == 2:  # docstring: 4 L d H d_k + H d L(L+1) MACs per token
        macs = 4 * L * d * config.aila_heads * config.aila_dk + config.aila_heads * d * L * (L + 1)
    else:  # projections, then scores and the weighted sum over S + L candidates
        macs = S * (d * d if config.aila_rank == 0 else 2 * config.aila_rank * d) + 2 * (S + L) * d
    assert aila.flops_per_token(256) - vanilla.flops_per_token(256) == 6 * macs
