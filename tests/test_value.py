"""Value residuals and value embeddings (model_value.py): the method's own properties, besides the contract suite."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import model_value
import model_vanilla
from generate import generate

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(vocab_size=257, block_size=64, n_layer=5, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64)
# the three forms, with lambdas that tell lambda_1 from lambda_2, and each form under plain multi-head attention
MODES = {"resformer": dict(value_lambda1=0.3, value_lambda2=0.9), "learned": dict(value_mode="learned"),
         "embed": dict(value_mode="embed"), "resformer-mha": dict(value_lambda1=0.3, value_lambda2=0.9, n_kv_head=4),
         "embed-mha": dict(value_mode="embed", n_kv_head=4), "embed-6": dict(value_mode="embed", n_layer=6)}


def build(module=model_value, seed=0, **overrides):
    torch.manual_seed(seed)
    return module.GPT(module.GPTConfig(**{**SMALL, **overrides}))


def tokens(B=2, T=24, seed=1):
    return torch.randint(0, SMALL["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def randomise(model, seed=0):
    """The learned lambdas and the gates away from their start (the tables are random from the start)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in model.blocks:
            if hasattr(block.attn, "lamb"):
                block.attn.lamb.copy_(torch.rand((), generator=g) * 1.5 - 0.25)
            if hasattr(block.attn, "ve_gate"):
                block.attn.ve_gate.weight.copy_(torch.randn(block.attn.ve_gate.weight.shape, generator=g))
    return model


def nanochat_blocks(n_layer):
    """The blocks (counted from 0) that nanochat's gpt.py gives a value embedding: every other one, counted down
    from the last, which always has one (its has_ve: layer_idx % 2 == (n_layer - 1) % 2), written out."""
    return list(range(n_layer - 1, -1, -2))[::-1]


def reference(m, idx, bug=None):
    """The logits of the equations, from the weights of m (a float64 copy), each step written out here: pre-norm
    blocks whose values are mixed per key/value head before attention,
        resformer: V'_n = lambda_1 V_1 + lambda_2 V_n;  learned: (1 - lambda_n) V_n + lambda_n V_1;
        embed:     V'_n = V_n + 3 sigmoid(W_n x[:12]) E_n[idx] in nanochat's blocks,
    then attention over softmax(q k^T / sqrt(hd)) with a causal mask, each KV head shared by H / H_kv query heads.
    bug plants a mistake, so that the test shows the comparison can fail."""
    c = m.config
    B, T = idx.shape
    H, Hkv, hd = c.n_head, c.n_kv_head, c.n_embd // c.n_head

    def norm(x, w):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c.norm_eps) * w

    angles = torch.outer(torch.arange(T, dtype=torch.float64),
                         1.0 / c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))

    def rope(x):  # the pairs (i, i + hd/2) turned by their position's angle
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return torch.cat((x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()), -1)

    def heads(t, n):
        return t.view(B, T, n, hd).transpose(1, 2)

    x, V1 = m.tok_emb.weight[idx], None
    embedded = nanochat_blocks(c.n_layer)
    for n, block in enumerate(m.blocks):
        h = norm(x, block.attn_norm.weight)
        Wq, Wk, Wv = block.attn.wqkv.weight.split((H * hd, Hkv * hd, Hkv * hd))
        q, k, v = heads(h @ Wq.T, H), heads(h @ Wk.T, Hkv), heads(h @ Wv.T, Hkv)
        if n == 0 or (bug == "V_1 from block 2" and n == 1):
            V1 = v
        elif c.value_mode == "resformer":
            l1, l2 = (c.value_lambda2, c.value_lambda1) if bug == "lambdas swapped" else (c.value_lambda1,
                                                                                         c.value_lambda2)
            v = l1 * V1 + l2 * v
        elif c.value_mode == "learned":
            lam = block.attn.lamb
            v = (1 - lam) * v + lam * V1
        if c.value_mode == "embed" and n in embedded:
            gate = 3 * torch.sigmoid(h[..., :c.ve_gate_channels] @ block.attn.ve_gate.weight.T)  # (B, T, H_kv)
            if bug == "no gate":
                gate = torch.ones_like(gate)
            v = v + gate.transpose(1, 2)[..., None] * heads(m.value_embeds[str(n)].weight[idx], Hkv)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~torch.ones(T, T).tril().bool(), -math.inf)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + y @ block.attn.wo.weight.T
        gate_, up = (norm(x, block.mlp_norm.weight) @ block.mlp.w13.weight.T).chunk(2, -1)
        x = x + (F.silu(gate_) * up) @ block.mlp.w2.weight.T
    return norm(x, m.norm.weight) @ m.lm_head.weight.T


# ---- the equations ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_forward_and_gradients_equal_the_equations_in_float64(mode):
    model = randomise(build(**MODES[mode]))
    idx, target = tokens(), torch.roll(tokens(), -1, 1)
    m64, ref = copy.deepcopy(model).double(), copy.deepcopy(model).double()
    logits, want = m64(idx)[0], reference(ref, idx)
    # float64, but for the rotation, which apply_rope computes in float32: to 1e-6 (a planted bug moves 1e-4 or more)
    torch.testing.assert_close(logits, want, rtol=1e-6, atol=1e-6)
    # the gradients too: block 1's value projection learns through every later block (V_1 is not detached)
    for m, out in ((m64, logits), (ref, want)):
        F.cross_entropy(out.view(-1, out.size(-1)), target.view(-1)).backward()
    for (name, p), (_, q) in zip(m64.named_parameters(), ref.named_parameters()):  # to 1e-5 of each one's largest
        assert (p.grad is None) == (q.grad is None), name
        assert p.grad is None or (p.grad - q.grad).abs().max() <= 1e-5 * q.grad.abs().max(), name
    with torch.no_grad():  # float32 against float64, relative to each token's logits
        err = (model(idx)[0].double() - want).norm(dim=-1) / want.norm(dim=-1)
    assert err.max() < 1e-5, err.max()


@pytest.mark.parametrize("mode,bug", [("resformer", "lambdas swapped"), ("resformer", "V_1 from block 2"),
                                      ("learned", "V_1 from block 2"), ("embed", "no gate")])
def test_the_comparison_catches_a_planted_bug(mode, bug):
    model = randomise(build(**MODES[mode]))
    idx = tokens()
    with torch.no_grad():
        m64 = copy.deepcopy(model).double()
        assert (m64(idx)[0] - reference(m64, idx, bug)).abs().max() > 1e-4


def test_the_mix_reaches_the_logits():
    """The method changes the model: each form differs from vanilla with the same weights."""
    idx = tokens()
    vanilla = build(model_vanilla).eval()
    for mode in ("resformer", "learned", "embed"):
        model = build(**MODES[mode]).eval()
        vanilla.load_state_dict(model.state_dict(), strict=False)
        with torch.no_grad():
            assert (vanilla(idx)[0] - model(idx)[0]).abs().max() > 1e-3, mode


# ---- the forms contain the baseline, and start where their sources start them ------------------------------

@pytest.mark.parametrize("overrides,zeroed", [(dict(value_lambda1=0.0, value_lambda2=1.0), None),
                                              (dict(value_mode="learned"), "lamb"),
                                              (dict(value_mode="embed"), "value_embeds.")])
def test_each_form_reduces_to_vanilla_exactly(overrides, zeroed):
    """lambda_1 = 0 and lambda_2 = 1 (resformer), lambda = 0 (learned), zero tables (embed): vanilla, to the bit."""
    vanilla = build(model_vanilla, seed=3).eval()
    model = build(seed=4, **overrides).eval()
    missing, unexpected = model.load_state_dict(vanilla.state_dict(), strict=False)
    assert unexpected == [] and all(zeroed and zeroed in k or k.endswith("ve_gate.weight") for k in missing)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if zeroed and zeroed in name:
                p.zero_()
    idx = tokens(B=3, T=40)
    with torch.no_grad():
        assert torch.equal(vanilla(idx)[0], model(idx)[0])
    prompt = idx[:, :5]
    assert torch.equal(generate(vanilla, prompt, 12, temperature=0), generate(model, prompt, 12, temperature=0))


def test_parameter_counts():
    vanilla = sum(p.numel() for p in build(model_vanilla).parameters())
    count = {m: sum(p.numel() for p in build(value_mode=m).parameters()) for m in ("resformer", "learned", "embed")}
    L, V, kv, hd = SMALL["n_layer"], SMALL["vocab_size"], SMALL["n_kv_head"], SMALL["n_embd"] // SMALL["n_head"]
    assert count["resformer"] == vanilla  # fixed lambdas: no parameter
    assert count["learned"] == vanilla + (L - 1)  # a lambda per block after the first
    assert count["embed"] == vanilla + len(nanochat_blocks(L)) * (V * kv * hd + 12 * kv)  # a table and a gate each


def test_nanochat_placement_and_inits():
    assert nanochat_blocks(12) == [1, 3, 5, 7, 9, 11] and nanochat_blocks(7) == [0, 2, 4, 6]
    for L in (1, 2, 5, 6, 12):
        model = build(value_mode="embed", n_layer=L)
        assert sorted(map(int, model.value_embeds)) == nanochat_blocks(L)
        assert [n for n, b in enumerate(model.blocks) if hasattr(b.attn, "ve_gate")] == nanochat_blocks(L)
    model = build(value_mode="embed", n_embd=256, n_head=4, vocab_size=4000)
    bound = math.sqrt(3 / 256)  # uniform(-s, s) with s = sqrt(3 / d): the std of nanochat's c_v, 1 / sqrt(d)
    for table in model.value_embeds.values():
        w = table.weight
        assert w.shape == (4000, 2 * 64) and w.abs().max() <= bound and w.abs().max() > 0.99 * bound
        assert abs(w.std().item() - 1 / math.sqrt(256)) < 0.002
    for block in model.blocks:
        if hasattr(block.attn, "ve_gate"):
            w = block.attn.ve_gate.weight
            assert w.shape == (2, 12) and (w >= 0).all() and (w <= 0.02).all() and w.std() > 0
    lambdas = [b.attn.lamb.item() for b in build(value_mode="learned").blocks[1:]]
    assert lambdas == [0.5] * (SMALL["n_layer"] - 1) and not hasattr(build(value_mode="learned").blocks[0].attn, "lamb")


def test_depth_map_and_stats_read_the_weights():
    idx = tokens()
    for mode in ("learned", "embed"):  # a learned map starts at its layout's start (the gates within rounding)
        model = build(value_mode=mode)
        layout = model.depth_map_layout()
        assert (model.depth_map(idx) - layout["start"]).abs().max() < (0.05 if mode == "embed" else 1e-6), mode
    assert "start" not in build().depth_map_layout()  # resformer's weights are fixed
    assert build().depth_map(idx)[1:].tolist() == [[0.5, 0.5]] * (SMALL["n_layer"] - 1)
    learned = randomise(build(value_mode="learned"))
    lam = torch.tensor([b.attn.lamb.item() for b in learned.blocks[1:]])
    torch.testing.assert_close(learned.depth_map(idx)[1:], torch.stack([1 - lam, lam], 1))
    assert learned.stats(idx)["value_lambda"] == pytest.approx(lam.mean().item())
    embed = randomise(build(value_mode="embed"))
    with torch.no_grad():  # each gate's mean, from its block's normed input: the embedding, then block outputs
        inputs = [embed.tok_emb(idx), *embed(idx, return_hidden=True)[2]]
        gates = {n: (3 * torch.sigmoid(embed.blocks[n].attn_norm(inputs[n])[..., :12]
                                       @ embed.blocks[n].attn.ve_gate.weight.T)).mean().item()
                 for n in nanochat_blocks(SMALL["n_layer"])}
    m = embed.depth_map(idx)
    assert m[:, 0].tolist() == [1.0] * SMALL["n_layer"]
    assert m[:, 1].tolist() == pytest.approx([gates.get(n, 0.0) for n in range(SMALL["n_layer"])], abs=1e-6)
    assert embed.stats(idx)["ve_gate"] == pytest.approx(sum(gates.values()) / len(gates), abs=1e-6)


# ---- generation ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_greedy_generation_with_cache_equals_without(mode):
    """The cache keeps each block's mixed values V', made when the new tokens' V_1 (and table rows) are at hand; past
    block_size the window restarts."""
    model = randomise(build(**MODES[mode], block_size=16)).eval()
    prompt = tokens(T=6)
    assert torch.equal(generate(model, prompt, 30, temperature=0, use_cache=True),
                       generate(model, prompt, 30, temperature=0, use_cache=False))
