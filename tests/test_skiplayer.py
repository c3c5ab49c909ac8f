"""Tests of model_skiplayer.py beyond the shared contract suite.

Expected head-to-layer maps are written here from the papers' rules in 1-indexed arithmetic, independently of
GPTConfig.head_sources, so that the model is checked against the rule and not against itself.
"""
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model_skiplayer as sla  # noqa: E402
import model_vanilla as vanilla  # noqa: E402
from hf.convert import qkv_rows  # noqa: E402
from plumbing.config import make_config  # noqa: E402
from generate import generate  # noqa: E402

SHAPE = dict(vocab_size=64, block_size=32, n_layer=4, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64)
T = 12  # tokens per test sequence

# (name, overrides): GQA with skip heads cutting through a group (n_h=3 of 2-head groups), GQA with whole groups
# skipping (n_h=2), MQA, MHA, and ALA(-) with every head of the last layer on a different layer (K=1) or with
# heads falling back to their own layer (K=2: sources 4, 2, then below layer 1 twice)
CASES = [
    ("gqa", dict(skip_layers=2, skip_heads=3)),
    ("gqa_whole_groups", dict(skip_layers=2, skip_heads=2)),
    ("mqa", dict(n_kv_head=1, skip_layers=1, skip_heads=3)),
    ("mha", dict(n_kv_head=4, skip_layers=3, skip_heads=1)),
    ("ala_1", dict(ala_every=1)),
    ("ala_2", dict(ala_every=2)),
]


def make(module, seed=0, **overrides):
    torch.manual_seed(seed)
    model = module.GPT(module.GPTConfig(**{**SHAPE, **overrides}))
    return model.eval()


def tokens(seed=1, batch=2, length=T):
    return torch.randint(0, SHAPE["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def expected_source(cfg, l, h):
    """1-indexed layer that query head h (0-indexed) of layer l (1-indexed) reads, from the papers' rules."""
    L, H = cfg.n_layer, cfg.n_head
    if cfg.ala_every > 0:  # the Vertical Attention paper's ALA(-): head i of the last layer reads layer L - K*i, else its own
        return L - cfg.ala_every * h if l == L and L - cfg.ala_every * h >= 1 else l
    n_l, n_h = cfg.skip_setting()
    return l - n_l if l > n_l and h >= H - n_h else l  # the SLA paper's equation: the last n_h heads skip


def run_capturing(model, idx, pinned=None):
    """Forward idx; return (inputs, heads): each layer's attention input (B, T, d) and per-head attention output
    before wo (B, T, H, hd). With pinned inputs, every attention layer reads the given input instead of its own."""
    inputs, heads, handles = [], [], []
    H = model.config.n_head
    for l, block in enumerate(model.blocks):
        def pre_attn(module, args, l=l):
            if pinned is not None:
                args = (pinned[l],) + args[1:]
            inputs.append(args[0])
            return args

        def pre_wo(module, args):
            B, Tq, _ = args[0].shape
            heads.append(args[0].view(B, Tq, H, -1).clone())

        handles += [block.attn.register_forward_pre_hook(pre_attn), block.attn.wo.register_forward_pre_hook(pre_wo)]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for handle in handles:
            handle.remove()
    return inputs, heads


def test_defaults_are_the_papers_recommendation():
    def setting(**kw):
        return sla.GPTConfig(**kw).skip_setting()
    assert setting(n_layer=12, n_head=12, n_kv_head=4, n_embd=768) == (9, 9)  # 3/4 of layers and heads (the SLA paper, 5.1-5.2)
    assert setting(n_layer=8, n_head=6, n_kv_head=3, n_embd=384) == (6, 4)  # round(4.5) = 4 (halves to even)
    assert setting(n_layer=6, n_head=3, n_kv_head=1, n_embd=192) == (4, 2)
    assert setting(n_layer=12, n_head=12, n_kv_head=4, n_embd=768, skip_layers=9, skip_heads=6) == (9, 6)  # explicit kept
    for bad in (dict(skip_heads=5), dict(skip_layers=-2), dict(skip_heads=-3), dict(ala_every=-1)):
        with pytest.raises(ValueError):
            make_config(sla.GPTConfig, **{**SHAPE, **bad})


@pytest.mark.parametrize("overrides", [dict(), dict(ala_every=2), dict(n_kv_head=4)])
def test_no_new_parameters(overrides):
    ours = make(sla, **overrides).state_dict()
    theirs = make(vanilla, **{k: v for k, v in overrides.items() if k != "ala_every"}).state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}


@pytest.mark.parametrize("n_kv_head", [1, 2, 4])
@pytest.mark.parametrize("off", [dict(skip_heads=0), dict(skip_heads=4, skip_layers=0)])
def test_without_skip_heads_it_is_vanilla(n_kv_head, off):
    """skip_heads=0 (or distance 0) loads model_vanilla.py's state dict and gives bit-identical logits."""
    base = make(vanilla, seed=3, n_kv_head=n_kv_head)
    ours = make(sla, seed=4, n_kv_head=n_kv_head, **off)
    ours.load_state_dict(base.state_dict())  # strict: same keys and shapes
    idx = tokens()
    with torch.no_grad():
        assert torch.equal(ours(idx)[0], base(idx)[0])


@pytest.mark.parametrize("n_kv_head", [1, 2, 4])
def test_layers_up_to_n_l_are_vanilla(n_kv_head):
    """Same weights as a vanilla model: blocks 1..n_l give identical outputs, block n_l + 1 does not."""
    base = make(vanilla, n_kv_head=n_kv_head)
    ours = make(sla, n_kv_head=n_kv_head, skip_layers=2, skip_heads=2)
    ours.load_state_dict(base.state_dict())
    idx = tokens()
    with torch.no_grad():
        _, _, h_ours = ours(idx, return_hidden=True)
        _, _, h_base = base(idx, return_hidden=True)
    for l in range(2):
        assert torch.equal(h_ours[l], h_base[l])
    assert not torch.allclose(h_ours[2], h_base[2], atol=1e-4)


@pytest.mark.parametrize("name,overrides", CASES, ids=[c[0] for c in CASES])
def test_perturbing_a_key_projection_changes_exactly_the_heads_that_read_it(name, overrides):
    """Perturb layer j's wk while every layer's attention input is pinned to the unperturbed run's: a head's
    output then changes iff it attends to layer j's keys, i.e. layer j's own heads and the skip heads of layer
    j + n_l (ALA: the last layer's heads mapped to j). Every other head, in every layer, is bit-identical:
    non-skip heads of the reading layer and all layers <= n_l other than j itself."""
    model = make(sla, **overrides)
    cfg, idx = model.config, tokens()
    pinned, clean = run_capturing(model, idx)
    for j in range(cfg.n_layer):
        q_rows, k_rows, _ = qkv_rows(cfg)
        wk = model.blocks[j].attn.wqkv.weight.detach()[q_rows:q_rows + k_rows]  # the rows of wqkv that are wk
        saved = wk.detach().clone()
        with torch.no_grad():
            wk.add_(0.5 * torch.randn_like(wk))
        _, heads = run_capturing(model, idx, pinned)
        with torch.no_grad():
            wk.copy_(saved)
        for l in range(cfg.n_layer):
            for h in range(cfg.n_head):
                reads_j = expected_source(cfg, l + 1, h) == j + 1
                diff = (heads[l][:, :, h] - clean[l][:, :, h]).abs().max().item()
                assert (diff > 1e-4) if reads_j else (diff == 0.0), (name, j + 1, l + 1, h, diff)


@pytest.mark.parametrize("name,overrides", CASES, ids=[c[0] for c in CASES])
def test_skip_heads_attend_over_the_source_layer_at_every_position(name, overrides):
    """Head axis, not sequence axis: every head's output at EVERY position equals a float64 causal attention of
    its query over all keys/values of its source layer. (The paper's appendix listing slices the sequence axis
    of k, so that some positions would read the current layer.) A skip head also differs at every position
    from attention over its own layer, so the check could not pass with the own layer's keys."""
    model = make(sla, **overrides)
    cfg, idx = model.config, tokens()
    inputs, heads = run_capturing(model, idx)
    H, H_kv = cfg.n_head, cfg.n_kv_head
    hd, g = cfg.n_embd // H, H // H_kv
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)  # (T, hd/2), from the formula
    cos, sin = angles.cos(), angles.sin()

    def rope(x):  # (B, T, n, hd) -> rotated, as RoPE on (x1, x2) halves
        x1, x2 = x.chunk(2, dim=-1)
        c, s = cos[:, None], sin[:, None]
        return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)

    def project(l, which, n):  # layer l's q, k or v (0, 1, 2) of its attention input: (B, T, n, hd) in float64
        weight = model.blocks[l].attn.wqkv.weight.split(qkv_rows(cfg))[which]
        return (inputs[l].double() @ weight.double().T).view(2, T, n, hd)

    q = [rope(project(l, 0, H)) for l in range(cfg.n_layer)]
    k = [rope(project(l, 1, H_kv)) for l in range(cfg.n_layer)]
    v = [project(l, 2, H_kv) for l in range(cfg.n_layer)]
    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def attend(l, h, src):  # (B, T, hd): query head h of layer l over kv head h // g of layer src
        scores = torch.einsum("btd,bsd->bts", q[l][:, :, h], k[src][:, :, h // g]) / math.sqrt(hd)
        return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v[src][:, :, h // g]

    n_skip = 0
    for l in range(cfg.n_layer):
        for h in range(H):
            src = expected_source(cfg, l + 1, h) - 1
            torch.testing.assert_close(heads[l][:, :, h].double(), attend(l, h, src), atol=1e-5, rtol=1e-4)
            if src != l:
                n_skip += 1
                per_position = (heads[l][:, :, h].double() - attend(l, h, l)).abs().amax(dim=(0, 2))  # (T,)
                assert (per_position > 1e-4).all(), (l + 1, h, per_position)
    assert n_skip > 0


def test_ala_head_to_layer_mapping():
    """The Vertical Attention paper's ALA(-) with K=2: only the last layer changes; its head i reads layer L - 2i
    (1-indexed), heads whose source would be below layer 1 read their own layer; the SLA skip is off."""
    cfg = sla.GPTConfig(n_layer=12, n_head=12, n_kv_head=4, n_embd=96, ala_every=2, skip_heads=6, skip_layers=9)
    sources = cfg.head_sources()
    assert sources[:-1] == [[l] * 12 for l in range(11)]
    assert [s + 1 for s in sources[-1]] == [12, 10, 8, 6, 4, 2] + [12] * 6
    cfg = sla.GPTConfig(n_layer=6, n_head=3, n_kv_head=1, n_embd=48, ala_every=2)  # the 50m ALA(-) shape
    assert [s + 1 for s in cfg.head_sources()[-1]] == [6, 4, 2]
    depth = sla.GPT(sla.GPTConfig(**{**SHAPE, "ala_every": 1})).depth_map()
    torch.testing.assert_close(depth[-1], torch.full((4,), 0.25))  # heads read layers 4, 3, 2, 1
    torch.testing.assert_close(depth[:-1], torch.eye(4)[:-1])


def test_depth_map():
    for overrides in (dict(skip_layers=2, skip_heads=3), dict(n_kv_head=4, skip_layers=1, skip_heads=1)):
        model = make(sla, **overrides)
        cfg = model.config
        expected = torch.zeros(cfg.n_layer, cfg.n_layer)
        for l in range(cfg.n_layer):
            for h in range(cfg.n_head):
                expected[l, expected_source(cfg, l + 1, h) - 1] += 1 / cfg.n_head
        depth = model.depth_map()
        torch.testing.assert_close(depth, expected)
        torch.testing.assert_close(depth.sum(1), torch.ones(cfg.n_layer))
    cfg = sla.GPTConfig(n_layer=12, n_head=12, n_kv_head=4, n_embd=96, skip_layers=9, skip_heads=6)  # 300m SLA
    rows = torch.tensor(cfg.head_sources())
    assert (rows[:9] == torch.arange(9)[:, None]).all()
    assert (rows[9:, :6] == torch.arange(9, 12)[:, None]).all() and (rows[9:, 6:] == torch.arange(3)[:, None]).all()


@pytest.mark.parametrize("overrides,skip_kv_heads", [(dict(skip_layers=2, skip_heads=3), 4),
                                                     (dict(skip_layers=2, skip_heads=2), 2)])
def test_one_causal_sdpa_call_per_layer(monkeypatch, overrides, skip_kv_heads):
    """Still one flash-eligible SDPA call (is_causal, no mask) per layer; K,V are expanded to query heads only
    when the skip heads cut through a GQA group, otherwise they stay at H_kv heads."""
    calls, sdpa = [], F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((kw.get("is_causal"), kw.get("attn_mask"), k.size(1), kw.get("enable_gqa")))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model = make(sla, **overrides)
    with torch.no_grad():
        model(tokens())
    assert [c[:2] for c in calls] == [(True, None)] * 4
    assert [c[2] for c in calls] == [2, 2, skip_kv_heads, skip_kv_heads]
    assert [c[3] for c in calls] == [True, True, skip_kv_heads == 2, skip_kv_heads == 2]


@pytest.mark.parametrize("overrides", [dict(skip_layers=2, skip_heads=3), dict(n_kv_head=4), dict(ala_every=1)])
def test_cache_reads_the_source_layers_cache(overrides):
    """Prefill, a chunk after a non-empty cache, then single tokens: the logits equal one full forward, so skip
    heads read layer l - n_l's cached keys; greedy generation with the cache equals recomputation."""
    model = make(sla, **overrides)
    idx = tokens(length=20)
    with torch.no_grad():
        full, _ = model(idx)
        cache = sla.KVCache(model.config, 2, idx.device, torch.float32)
        parts = [model(idx[:, a:b], cache=cache, input_pos=torch.arange(a, b))[0]
                 for a, b in ((0, 9), (9, 15), (15, 16), (16, 17), (17, 20))]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)
    prompt = tokens(length=6)
    assert torch.equal(generate(model, prompt, 20, temperature=0),
                       generate(model, prompt, 20, temperature=0, use_cache=False))
