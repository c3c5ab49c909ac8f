"""MUDDFormer (model_mudd.py): the method's own properties, besides the contract suite."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import model_mudd
import model_vanilla
from generate import compile_decode_step, generate

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(vocab_size=257, block_size=64, n_layer=4, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64)
FORMS = {"mudd": {}, "static": dict(mudd_dynamic=False), "oneway": dict(mudd_ways="r"),
         "mha-qknorm-bias": dict(n_kv_head=4, qk_norm=True, bias=True)}


def build(module=model_mudd, seed=0, **overrides):
    torch.manual_seed(seed)
    return module.GPT(module.GPTConfig(**{**SMALL, **overrides}))


def tokens(B=2, T=24, seed=1):
    return torch.randint(0, SMALL["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def randomise(model, seed=0):
    """The mixes away from their start: W2 and a_i random (W1 is random from the start), the norms not at 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mix in model.dynamic_dense:
            if mix.w2 is not None:
                mix.w2.weight.copy_(0.3 * torch.randn(mix.w2.weight.shape, generator=g))
        for a in model.dense_bs:
            a.add_(0.3 * torch.randn(a.shape, generator=g))
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model


def reference(m, idx, bug=None):
    """The logits of the equations, from the weights of m (a float64 copy), each step written out here:
        A_i = W2 GELU(W1 RMSNorm(X_i)) + a_i  (the static form: a_i),  X^c = sum_j A_i[c, j] X_j,
        h = X^r + attention(q from norm_q(X^q), k from norm_k(X^k), v from norm_v(X^v)),  X_{i+1} = h + MLP(norm(h)),
    W2's output read stream by stream (the authors' '(C L)'), the head on the last mix. bug plants a mistake."""
    c = m.config
    B, T = idx.shape
    H, Hkv, hd, d = c.n_head, c.n_kv_head, c.n_embd // c.n_head, c.n_embd

    def norm(x, w=None):
        x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c.norm_eps)
        return x if w is None else x * w

    angles = torch.outer(torch.arange(T, dtype=torch.float64),
                         1.0 / c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))

    def rope(x):
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return torch.cat((x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()), -1)

    def linear(x, w, b):
        return x @ w.T + (b if b is not None else 0)

    X = [m.tok_emb.weight[idx]]
    q_in = k_in = v_in = r_in = X[0]
    for i, block in enumerate(m.blocks):
        att = block.attn
        W, b = att.wqkv.weight.split((H * hd, Hkv * hd, Hkv * hd)), (
            att.wqkv.bias.split((H * hd, Hkv * hd, Hkv * hd)) if att.wqkv.bias is not None else (None,) * 3)
        if bug == "q reads the residual stream":
            q_in = r_in
        xq, xk, xv = (norm(s, n.weight) for s, n in zip((q_in, k_in, v_in),
                                                        (block.attn_norm, block.attn_norm_k, block.attn_norm_v)))
        q, k, v = (linear(s, w, bb).view(B, T, -1, hd).transpose(1, 2) for s, w, bb in zip((xq, xk, xv), W, b))
        if c.qk_norm:
            q, k = norm(q, att.q_norm.weight), norm(k, att.k_norm.weight)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~torch.ones(T, T).tril().bool(), -math.inf)
        h = r_in + linear((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd), att.wo.weight, att.wo.bias)
        gate, up = linear(norm(h, block.mlp_norm.weight), block.mlp.w13.weight, block.mlp.w13.bias).chunk(2, -1)
        x = h + linear(F.silu(gate) * up, block.mlp.w2.weight, block.mlp.w2.bias)
        X.append(x)
        a, mix = m.dense_bs[i], m.dynamic_dense[i]
        C, n = a.shape
        A = a.expand(B, T, C, n)
        if c.mudd_dynamic:
            source = r_in if bug == "the generator reads the residual stream" else x
            dw = F.gelu(norm(source) @ mix.w1.weight.T) @ mix.w2.weight.T  # (B, T, C n)
            dw = dw.view(B, T, n, C).transpose(-1, -2) if bug == "W2 source by source" else dw.view(B, T, C, n)
            A = dw + a
        if bug == "a softmax over the sources":
            A = A.softmax(-1)
        mixed = [sum(A[..., s, j, None] * X[j] for j in range(n)) for s in range(C)]
        q_in, k_in, v_in, r_in = mixed if C == 4 else mixed * 4
    return norm(r_in, m.norm.weight) @ m.lm_head.weight.T


# ---- the equations -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("form", FORMS)
def test_forward_and_gradients_equal_the_equations_in_float64(form):
    model = randomise(build(**FORMS[form]))
    idx, target = tokens(), torch.roll(tokens(), -1, 1)
    m64, ref = copy.deepcopy(model).double(), copy.deepcopy(model).double()
    logits, want = m64(idx)[0], reference(ref, idx)
    # float64, but for the rotation, which apply_rope computes in float32: to 1e-6 (a planted bug moves 1e-4 or more)
    torch.testing.assert_close(logits, want, rtol=1e-6, atol=1e-6)
    for m, out in ((m64, logits), (ref, want)):
        F.cross_entropy(out.view(-1, out.size(-1)), target.view(-1)).backward()
    for (name, p), (_, q) in zip(m64.named_parameters(), ref.named_parameters()):  # to 1e-5 of each one's largest
        assert (p.grad is None) == (q.grad is None) and (p.grad - q.grad).abs().max() <= 1e-5 * q.grad.abs().max(), name
    with torch.no_grad():  # float32 against float64, relative to each token's logits
        err = (model(idx)[0].double() - want).norm(dim=-1) / want.norm(dim=-1)
    assert err.max() < 1e-4, err.max()  # the random mixes amplify float32 rounding


@pytest.mark.parametrize("form,bug", [("mudd", "q reads the residual stream"), ("mudd", "W2 source by source"),
                                      ("mudd", "the generator reads the residual stream"),
                                      ("static", "a softmax over the sources"),
                                      ("oneway", "the generator reads the residual stream")])
def test_the_comparison_catches_a_planted_bug(form, bug):
    model = randomise(build(**FORMS[form]))
    with torch.no_grad():
        m64 = copy.deepcopy(model).double()
        assert (m64(tokens())[0] - reference(m64, tokens(), bug)).abs().max() > 1e-4


# ---- the start: vanilla, exactly --------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["mudd", "static", "oneway"])
def test_the_start_is_vanilla_exactly(form):
    """W2 = 0 and a_i one on X_i: every stream is X_i, every norm at 1, so a seed's model is vanilla's to the bit
    (the mixes are made after vanilla's weights, which the same seed draws)."""
    vanilla, model = build(model_vanilla, seed=3).eval(), build(seed=3, **FORMS[form]).eval()
    ours = model.state_dict()
    assert all(torch.equal(v, ours[k]) for k, v in vanilla.state_dict().items() if k in ours)
    for a in model.dense_bs:
        assert torch.equal(a, torch.eye(a.size(1))[-1:].expand(a.size(0), -1))
    for mix in model.dynamic_dense:
        if mix.w1 is not None:
            assert not mix.w2.weight.any() and abs(mix.w1.weight.std().item() * math.sqrt(SMALL["n_embd"]) - 1) < 0.1
    idx = tokens(B=3, T=40)
    with torch.no_grad():
        a, loss_a, hidden_a = vanilla(idx, targets=idx, return_hidden=True)
        b, loss_b, hidden_b = model(idx, targets=idx, return_hidden=True)
    assert torch.equal(a, b) and torch.equal(loss_a, loss_b)
    assert all(torch.equal(x, y) for x, y in zip(hidden_a, hidden_b))
    prompt = idx[:, :5]
    assert torch.equal(generate(vanilla, prompt, 20, temperature=0), generate(model, prompt, 20, temperature=0))
    m = model.depth_map(idx)
    assert torch.equal(m, model.depth_map_layout()["start"])  # the map starts at its start


def test_every_mix_learns_from_the_first_step():
    """At the start W2 = 0, yet W2 and a_i get gradients at once (W1 from the second step, through W2)."""
    model = build()
    idx = tokens()
    model(idx, targets=torch.roll(idx, -1, 1))[1].backward()
    for mix, a in zip(model.dynamic_dense, model.dense_bs):
        assert mix.w2.weight.grad.abs().sum() > 0 and a.grad.abs().sum() > 0
        assert not mix.w1.weight.grad.any()


# ---- counts ---------------------------------------------------------------------------------------------

def extra(L, d, C, dynamic):
    """The authors' count, per mix after block i + 1 (i from 0): n = C_i (i + 2) weights, W1 H = (n e // 64 + 1) 64
    wide (e = 4 in the last mix), d H + H n + n parameters (a_i's n alone when static); 2 d per block for the two
    extra attention norms; and the forward multiply-adds per token, the generator's and the mix's n d."""
    params, macs = 2 * d * L, 0
    for i in range(L):
        last = i == L - 1
        n = (1 if last else C) * (i + 2)
        hidden = (n * (4 if last else 1) // 64 + 1) * 64
        params += (d * hidden + hidden * n if dynamic else 0) + n
        macs += (d * hidden + hidden * n if dynamic else 0) + n * d
    return params, macs


@pytest.mark.parametrize("form", ["mudd", "static", "oneway"])
@pytest.mark.parametrize("L,d", [(4, 32), (6, 128), (12, 128), (24, 64)])
def test_parameter_and_flop_counts(form, L, d):
    shape = dict(n_layer=L, n_embd=d, n_head=4, ffn_hidden=4 * d)
    with torch.device("meta"):
        vanilla, model = build(model_vanilla, **shape), build(**shape, **FORMS[form])
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    params, macs = extra(L, d, len(model.config.mudd_ways), model.config.mudd_dynamic)
    assert count(model) - count(vanilla) == params
    assert model.flops_per_token(128) - vanilla.flops_per_token(128) == 6 * macs


def test_generator_widths_follow_round64():
    """(h // 64 + 1) 64: 64 for h < 64, and 128 for h = 64 (a multiple of 64 gains a block)."""
    model = build(n_layer=15, n_embd=32)
    widths = [mix.w1.weight.size(0) for mix in model.dynamic_dense]
    weights = [4 * (i + 2) for i in range(14)] + [4 * 16]  # the last mix: 16 weights, W1 four times as wide
    assert widths == [(h // 64 + 1) * 64 for h in weights] and widths[14] == 128 and 64 in widths and 128 in widths
    assert widths[13] == 64 and widths[14] == 128  # 4 x 15 = 60 -> 64; the last, 4 x 16 = 64 -> 128


# ---- the depth map and generation -------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["mudd", "static", "oneway"])
def test_depth_map_is_each_streams_mean_weight(form):
    model = randomise(build(**FORMS[form]))
    idx = tokens()
    L, ways = model.config.n_layer, model.config.mudd_ways
    m = model.depth_map(idx)
    layout = model.depth_map_layout()
    assert m.shape == (len(ways) * (L - 1) + 1, L + 1) and len(layout["rows"]) == m.size(0)
    assert layout["rows"][0] == f"{ways[0]} of block 2" and layout["rows"][-1] == "head"
    with torch.no_grad():
        X = [model.tok_emb(idx), *model(idx, return_hidden=True)[2]]
        rows = []
        for i, (mix, a) in enumerate(zip(model.dynamic_dense, model.dense_bs)):
            A = a if mix.w1 is None else (mix.w2(F.gelu(mix.w1(F.rms_norm(X[i + 1], (L * 0 + X[0].size(-1),),
                                                                          eps=model.config.norm_eps))))
                                          .view(*idx.shape, *a.shape) + a).mean((0, 1))
            rows += [F.pad(A, (0, L - i - 1))]
    torch.testing.assert_close(m, torch.cat(rows), rtol=1e-5, atol=1e-6)
    assert not m[~layout["valid"]].any()


@pytest.mark.parametrize("form", FORMS)
def test_greedy_generation_with_cache_equals_without(form):
    """A decode step mixes the new token's own outputs: the cache holds keys and values alone; past block_size the
    window restarts."""
    model = randomise(build(block_size=16, **FORMS[form])).eval()
    prompt = tokens(T=6)
    assert torch.equal(generate(model, prompt, 30, temperature=0, use_cache=True),
                       generate(model, prompt, 30, temperature=0, use_cache=False))


def test_causal_away_from_the_start():
    model = randomise(build()).eval()
    idx = tokens(T=32)
    changed = idx.clone()
    changed[:, 20:] = tokens(T=12, seed=2)
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :20], b[:, :20], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, 20:], b[:, 20:])


@pytest.mark.slow  # inductor compiles the decode step: about a minute
def test_compiled_decode_step_equals_recomputation_away_from_the_start():
    """tests/test_decode.py compiles every model's step at init, where MUDD is vanilla; here the mixes are random."""
    model = randomise(build(block_size=16)).eval()
    prompt = tokens(T=6)
    step = compile_decode_step(model, torch.device("cpu"))
    assert torch.equal(generate(model, prompt, 24, temperature=0, step=step),
                       generate(model, prompt, 24, temperature=0, use_cache=False))
