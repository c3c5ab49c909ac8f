"""Vertical Attention (model_vertical.py, the Vertical Attention paper): the paper's own properties, besides the contract suite."""
import math
import os

import numpy as np
import pytest
import torch

import model_vanilla
import model_vertical
from generate import generate
from plumbing.config import make_config

SMALL = dict(vocab_size=257, block_size=64, n_layer=6, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64)


def build(module, seed=0, **overrides):
    torch.manual_seed(seed)
    return module.GPT(module.GPTConfig(**{**SMALL, **overrides}))


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def set_scores(model, fn):
    """va_scores[k] = fn(l, i) for the k-th flat score, which is s_{l,i} (1-indexed layer l, source i)."""
    values = [fn(l, i) for l in range(1, model.config.n_layer + 1) for i in range(1, l + 1)]
    with torch.no_grad():
        model.va_scores.copy_(torch.tensor(values))


def reference_mix(sources, scores, eps):
    """Eqs. 2-4 in float64: alpha = softmax(s); alpha~_i = (alpha_i / ||h^i||) / sum_j alpha_j / ||h^j||, per token;
    v = sum_i alpha~_i h^i. ||h|| = sqrt(sum h^2 + eps) with the model's eps (which only guards against zero)."""
    s = scores.double()
    alpha = s.exp() / s.exp().sum()
    h = torch.stack([x.double() for x in sources])  # (l, B, T, d)
    norms = (h.pow(2).sum(-1, keepdim=True) + eps).sqrt()  # (l, B, T, 1)
    w = alpha.view(-1, 1, 1, 1) / norms
    return (w / w.sum(0) * h).sum(0)


# ---- parameters ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_layer", [1, 6, 8, 12])
@pytest.mark.parametrize("va_map", ["learned", "unet", "inet"])
def test_parameter_count_is_vanilla_plus_L_L_plus_1_over_2(n_layer, va_map):
    vertical = build(model_vertical, n_layer=n_layer, va_map=va_map)
    vanilla = build(model_vanilla, n_layer=n_layer)
    extra = n_layer * (n_layer + 1) // 2 if va_map == "learned" else 0  # eq. 7; the fixed maps are buffers
    assert n_params(vertical) == n_params(vanilla) + extra
    if va_map == "learned" and n_layer > 1:
        # Table 2 prints 21, 28, 78; 28 for the 8-layer model is a typo (eq. 7 gives 36; Table 6 has 8 rows)
        assert extra == {6: 21, 8: 36, 12: 78}[n_layer]
    if va_map != "learned":
        assert vertical.va_scores is None and "va_fixed" in dict(vertical.named_buffers())


def test_param_groups_give_the_scores_their_own_lr_and_weight_decay():
    model = build(model_vertical, va_lr=0.02, va_weight_decay=0.03)
    groups = model.param_groups(0.1)
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())  # every parameter exactly once
    va = [g for g in groups if any(p is model.va_scores for p in g["params"])]
    assert len(va) == 1 and len(va[0]["params"]) == 1
    assert va[0]["lr"] == 0.02 and va[0]["weight_decay"] == 0.03
    assert all("lr" not in g for g in groups if g is not va[0])  # the rest use the trainer's lr
    fixed = build(model_vertical, va_map="unet").param_groups(0.1)
    assert all("lr" not in g for g in fixed)


def test_bad_map_or_init_is_a_clear_error():
    with pytest.raises(ValueError, match="va_map"):
        make_config(model_vertical.GPTConfig, **SMALL, va_map="dense")
    with pytest.raises(ValueError, match="va_init"):
        make_config(model_vertical.GPTConfig, **SMALL, va_init="identity")


# ---- the mixing function (eqs. 2-4) ---------------------------------------------------------------------

@pytest.mark.parametrize("n_sources", [1, 2, 5, 12])
def test_mix_equals_float64_equations(n_sources):
    g = torch.Generator().manual_seed(n_sources)
    B, T, d = 3, 7, 48
    # norms from ~0.01 to ~1e5: each source has its own scale, and every token another one on top
    sources = [torch.randn(B, T, d, generator=g) * 10 ** (4 * i / max(1, n_sources - 1) - 2)
               * 10 ** torch.empty(B, T, 1).uniform_(-1, 1, generator=g) for i in range(n_sources)]
    scores = 3 * torch.randn(n_sources, generator=g)
    eps = model_vertical.GPTConfig().va_eps
    inv_norms = [model_vertical.inv_norm(h, eps) for h in sources]
    v = model_vertical.vertical_mix(sources, inv_norms, scores.softmax(-1))
    ref = reference_mix(sources, scores, eps)
    assert v.dtype == torch.float32 and v.shape == (B, T, d)
    # float32 against float64, relative to each token's vector (single channels may cancel to ~0)
    err = (v.double() - ref).norm(dim=-1) / ref.norm(dim=-1)
    assert err.max() < 1e-6, err.max()
    # the norm re-weighting matters: without it the small sources would vanish from the mix
    if n_sources > 1:
        plain = sum(a * h.double() for a, h in zip(scores.double().softmax(-1), sources))
        assert not torch.allclose(plain, ref, rtol=1e-2)


def test_the_backward_keeps_each_source_once_not_a_stack_per_layer():
    """Block l's mix reads its l sources where they are (a multiply-add per source): what autograd keeps beyond
    vanilla's grows by about one source per layer, not by l (L(L+1)/2 = 78 source copies at 12 layers, which a
    (B, T, l, d) stack made and kept per layer for one batched product would add)."""
    idx = torch.randint(0, SMALL["vocab_size"], (2, 32))

    def saved_bytes(model):
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(idx, idx)[1]
        loss.backward()
        return sum(seen.values())

    L, source = 12, idx.numel() * SMALL["n_embd"] * 4  # one (B, T, d) float32 tensor
    extra = saved_bytes(build(model_vertical, n_layer=L)) - saved_bytes(build(model_vanilla, n_layer=L))
    assert 0 < extra <= 2 * L * source, extra / source


@pytest.mark.parametrize("va_map", ["learned", "unet", "inet"])
def test_each_block_reads_the_mix_of_its_sources(va_map):
    """Wiring: block l receives eqs. 2-4 over (embedding, outputs of blocks 1..l-1), and the head reads block L."""
    model = build(model_vertical, va_map=va_map).eval()
    if va_map == "learned":
        set_scores(model, lambda l, i: math.sin(3 * l + i) * 4)  # a map far from uniform
    inputs, emb = [], []
    hooks = [b.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for b in model.blocks]
    hooks.append(model.tok_emb.register_forward_hook(lambda m, args, out: emb.append(out)))
    idx = torch.randint(0, 257, (2, 20))
    with torch.no_grad():
        logits, _, hidden = model(idx, return_hidden=True)
    for h in hooks:
        h.remove()
    sources = [emb[0]] + hidden[:-1]
    alpha = model.depth_map().double()
    for l in range(model.config.n_layer):
        ref = reference_mix(sources[:l + 1], alpha[l, :l + 1].log(), model.config.va_eps)  # log: softmax(log a) = a
        torch.testing.assert_close(inputs[l].double(), ref, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(logits, model.lm_head(model.norm(hidden[-1])), rtol=0, atol=0)


# ---- the method contains the baseline -------------------------------------------------------------------

@pytest.mark.parametrize("fill", [float("-inf"), -1e4])
def test_newest_source_map_reproduces_vanilla_exactly(fill):
    vanilla = build(model_vanilla, seed=3).eval()
    vertical = build(model_vertical, seed=4).eval()  # another seed: every weight must come from vanilla
    missing, unexpected = vertical.load_state_dict(vanilla.state_dict(), strict=False)
    assert missing == ["va_scores"] and unexpected == []
    set_scores(vertical, lambda l, i: 0.0 if i == l else fill)  # alpha = one-hot on the newest source
    assert torch.equal(vertical.depth_map(), torch.eye(SMALL["n_layer"]))
    idx = torch.randint(0, 257, (3, 40))
    with torch.no_grad():
        a, loss_a, hidden_a = vanilla(idx, targets=idx, return_hidden=True)
        b, loss_b, hidden_b = vertical(idx, targets=idx, return_hidden=True)
    assert torch.equal(a, b) and torch.equal(loss_a, loss_b)
    assert all(torch.equal(x, y) for x, y in zip(hidden_a, hidden_b))
    prompt = idx[:, :5]  # and generation with the cache
    assert torch.equal(generate(vanilla, prompt, 20, temperature=0), generate(vertical, prompt, 20, temperature=0))


def test_same_seed_gives_vanilla_weights():
    """The scores are initialised without drawing random numbers: a seed gives vanilla's weights."""
    vanilla, vertical = build(model_vanilla, seed=5), build(model_vertical, seed=5)
    theirs = vertical.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in vanilla.state_dict().items())


# ---- maps ------------------------------------------------------------------------------------------------

# our reading of Figure 2: inet = sources 1, 2 and the newest; unet = the newest and, in the second half, source L+2-l
EXPECTED = {
    ("inet", 6): {1: [1], 2: [1, 2], 3: [1, 2, 3], 4: [1, 2, 4], 5: [1, 2, 5], 6: [1, 2, 6]},
    ("unet", 6): {1: [1], 2: [2], 3: [3], 4: [4], 5: [3, 5], 6: [2, 6]},
    ("inet", 12): {1: [1], 2: [1, 2], 3: [1, 2, 3], 4: [1, 2, 4], 5: [1, 2, 5], 6: [1, 2, 6], 7: [1, 2, 7],
                   8: [1, 2, 8], 9: [1, 2, 9], 10: [1, 2, 10], 11: [1, 2, 11], 12: [1, 2, 12]},
    ("unet", 12): {1: [1], 2: [2], 3: [3], 4: [4], 5: [5], 6: [6], 7: [7], 8: [6, 8], 9: [5, 9], 10: [4, 10],
                   11: [3, 11], 12: [2, 12]},
}


@pytest.mark.parametrize("kind,n_layer", list(EXPECTED))
def test_fixed_maps_put_equal_weight_exactly_where_methods_says(kind, n_layer):
    model = build(model_vertical, n_layer=n_layer, va_map=kind)
    m = model.depth_map()
    assert m.shape == (n_layer, n_layer)
    torch.testing.assert_close(m.sum(-1), torch.ones(n_layer), rtol=0, atol=1e-6)
    for l, picks in EXPECTED[kind, n_layer].items():
        row = m[l - 1]
        assert [i + 1 for i in row.nonzero().flatten().tolist()] == picks, (l, row)
        torch.testing.assert_close(row[[i - 1 for i in picks]], torch.full((len(picks),), 1 / len(picks)))
    assert model.stats()["va_entropy"] == pytest.approx(
        np.mean([math.log(len(p)) for p in EXPECTED[kind, n_layer].values()]), abs=1e-6)


@pytest.mark.parametrize("va_init", ["uniform", "recent"])
def test_learned_map_shape_init_and_entropy(va_init):
    L = 8
    model = build(model_vertical, n_layer=L, va_init=va_init)
    m = model.depth_map()
    assert torch.equal(m.triu(1), torch.zeros(L, L))  # no weight on sources a layer cannot see
    assert [int((row > 0).sum()) for row in m] == list(range(1, L + 1))  # row l has l entries
    torch.testing.assert_close(m.sum(-1), torch.ones(L))
    if va_init == "uniform":
        torch.testing.assert_close(m, torch.ones(L, L).tril() / torch.arange(1, L + 1).view(-1, 1))
        assert model.stats()["va_entropy"] == pytest.approx(np.mean([math.log(l) for l in range(1, L + 1)]))
    else:  # 0.9 on the newest source, 0.1 shared by the others
        torch.testing.assert_close(m.diagonal()[1:], torch.full((L - 1,), 0.9))
        for l in range(2, L + 1):
            torch.testing.assert_close(m[l - 1, :l - 1], torch.full((l - 1,), 0.1 / (l - 1)))


@pytest.mark.parametrize("va_map", ["learned", "unet", "inet"])
def test_greedy_generation_with_cache_equals_without(va_map):
    model = build(model_vertical, va_map=va_map).eval()
    if va_map == "learned":
        set_scores(model, lambda l, i: math.cos(2 * l + 3 * i) * 3)
    prompt = torch.randint(0, 257, (2, 6))
    assert torch.equal(generate(model, prompt, 30, temperature=0, use_cache=True),
                       generate(model, prompt, 30, temperature=0, use_cache=False))


@pytest.mark.parametrize("va_map", ["learned", "unet", "inet"])
def test_float64_default_dtype(va_map):
    """Under torch.set_default_dtype(torch.float64) the map is built, read and trained like in float32."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = build(model_vertical, va_map=va_map)
        m = model.depth_map()
        logits, loss = model(torch.randint(0, 257, (2, 8)), torch.randint(0, 257, (2, 8)))
        loss.backward()
    finally:
        torch.set_default_dtype(default)
    assert m.dtype == torch.float32 and logits.dtype == torch.float64
    torch.testing.assert_close(m.sum(-1), torch.ones(SMALL["n_layer"]))
    if va_map == "learned":
        assert model.va_scores.dtype == torch.float64 and torch.isfinite(model.va_scores.grad).all()
        assert model.va_scores.grad.abs().sum() > 0


def test_bfloat16_model_runs():
    model = build(model_vertical).to(torch.bfloat16)
    logits, _ = model(torch.randint(0, 257, (2, 8)))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


# ---- learning the map: gradient, and the paper's learning-rate sensitivity ------------------------------

def short_run(data, va_lr, steps=30, T=64, batch=8):
    """The paper's recipe in miniature: AdamW, lr 1e-4 and weight decay 0.01 for the model, va_lr for the scores."""
    model = build(model_vertical, seed=0, va_lr=va_lr)
    start = model.va_scores.detach().clone()
    opt = torch.optim.AdamW(model.param_groups(0.01), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    first_grad, threads = None, torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small runs faster on one thread than on several fighting over it
    try:
        for _ in range(steps):
            offsets = torch.randint(len(data) - T - 1, (batch,), generator=g).tolist()
            x = torch.stack([torch.from_numpy(data[o:o + T].astype(np.int64)) for o in offsets])
            y = torch.stack([torch.from_numpy(data[o + 1:o + 1 + T].astype(np.int64)) for o in offsets])
            loss = model(x, y)[1]
            opt.zero_grad()
            loss.backward()
            if first_grad is None:
                first_grad = model.va_scores.grad.clone()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model, start, first_grad


def test_scores_learn_at_lr_1e_2_and_barely_move_at_1e_4(data_dir):
    data = np.memmap(os.path.join(data_dir, "shakespeare", "train.bin"), dtype=np.uint16, mode="r")
    fast, start, grad = short_run(data, va_lr=1e-2)
    # every score gets gradient except s_1,1: layer 1 has a single source, and softmax over one entry is constant
    assert grad[0] == 0 and (grad[1:] != 0).all(), grad
    slow, start_slow, _ = short_run(data, va_lr=1e-4)
    assert torch.equal(start, start_slow)
    moved_fast = (fast.va_scores.detach() - start).abs().max().item()
    moved_slow = (slow.va_scores.detach() - start).abs().max().item()
    uniform = build(model_vertical).depth_map()
    map_fast = (fast.depth_map().detach() - uniform).abs().max().item()
    map_slow = (slow.depth_map().detach() - uniform).abs().max().item()
    assert moved_fast > 0.1 and map_fast > 0.05, (moved_fast, map_fast)  # the map moves away from its init
    assert moved_slow < 0.01 and map_slow < 0.005, (moved_slow, map_slow)  # ... and is nearly frozen at 1e-4
    assert moved_fast > 10 * moved_slow and map_fast > 10 * map_slow
