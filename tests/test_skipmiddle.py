"""model_skipmiddle.py: gates, gated attention, the sparsity controller and its state, generation that skips."""
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import model_skipmiddle as sm
from conftest import ROOT
from generate import decode_step, generate

TINY = dict(vocab_size=257, block_size=64, n_layer=4, n_head=4, n_kv_head=2, n_embd=64, ffn_hidden=128)


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    return sm.GPT(sm.GPTConfig(**{**TINY, **overrides}))


def run_capturing(model, idx, **kwargs):
    """Forward idx; return (logits, loss, inputs, gates): per block the stream entering it and its gate (B, T)."""
    inputs, gates = [], []

    def hook(block, args):  # Block.forward(x, cos, sin, cache, input_pos, g)
        inputs.append(args[0].detach())
        gates.append(args[5].detach() if args[5] is not None else None)

    handles = [b.register_forward_pre_hook(hook) for b in model.blocks]
    try:
        logits, loss = model(idx, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return logits, loss, inputs, gates


def skip_tokens(model, tokens):
    """Make the given token ids skip every block (S >= 1 at gate 0) and leave every other token's gates at 1:
    coordinate 0 of the embedding is nonzero only for those tokens, and gate 0 reads only that coordinate."""
    with torch.no_grad():
        model.tok_emb.weight[:, 0] = 0.0
        model.tok_emb.weight[tokens, 0] = 1.0
        for gate in model.gates:
            gate.weight.zero_()
            gate.bias.zero_()
        model.gates[0].weight[0, 0] = 100.0


# ---- gates ------------------------------------------------------------------------------------------------

def test_gate_parameters_are_d_plus_1_per_first_half_block():
    for L in (4, 5):
        gated, dense = build(n_layer=L), build(n_layer=L, gated=False)
        extra = sum(p.numel() for p in gated.parameters()) - sum(p.numel() for p in dense.parameters())
        assert extra == (TINY["n_embd"] + 1) * math.ceil(L / 2)
    assert not any("gate" in k for k in build(gated=False).state_dict())


def test_zero_gate_parameters_give_gates_of_one_and_the_dense_model():
    gated = build(gate_init_std=0.0).double()
    dense = build(gated=False).double()
    dense.load_state_dict({k: v for k, v in gated.state_dict().items() if "gate" not in k})
    idx = torch.randint(0, TINY["vocab_size"], (3, 40))
    logits, _, _, gates = run_capturing(gated, idx)
    assert len(gates) == TINY["n_layer"] and all(torch.equal(g, torch.ones_like(g)) for g in gates)
    # equal up to float64's last bits: the gated attention's head carries one more (zero) coordinate, which moves
    # SDPA's sums by an ulp
    torch.testing.assert_close(logits, dense(idx)[0], rtol=0, atol=1e-13)
    gated.train(), dense.train()
    # the regulariser adds 0 (in float64, to the float32 loss of the dense model)
    torch.testing.assert_close(gated(idx, idx)[1], dense(idx, idx)[1], rtol=0, atol=1e-13, check_dtype=False)
    assert torch.equal(generate(gated, idx[:, :5], 20, temperature=0), generate(dense, idx[:, :5], 20, temperature=0))


@pytest.mark.parametrize("L", [4, 5, 6])
def test_gates_follow_eqs_1_2_mirrored_and_monotone(L):
    model = build(n_layer=L, gate_init_std=0.3)  # large weights: gates spread over [0, 1]
    with torch.no_grad():
        for gate in model.gates:
            gate.bias.fill_(0.1)
    idx = torch.randint(0, TINY["vocab_size"], (2, 48))
    _, _, inputs, gates = run_capturing(model, idx)
    H = math.ceil(L / 2)
    S = torch.zeros(2, 48)
    for l in range(H):  # eqs. 1-2 recomputed from the stream entering each first-half block
        S = S + F.relu(inputs[l] @ model.gates[l].weight[0] + model.gates[l].bias[0])
        torch.testing.assert_close(gates[l], 1 - S.clamp(0, 1))
    for l in range(L):
        assert torch.equal(gates[l], gates[L - 1 - l])
    for l in range(H - 1):
        assert (gates[l + 1] <= gates[l]).all()
    assert 0 < (torch.stack(gates) == 0).float().mean() < 1 and (gates[H - 1] < 1).any()


def test_all_gates_zero_skip_every_block():
    model = build()
    with torch.no_grad():
        model.gates[0].bias.fill_(1.0)
        model.gates[0].weight.zero_()
    model.eval()
    idx = torch.randint(0, TINY["vocab_size"], (2, 16))
    logits, _ = model(idx)
    expected = model.lm_head(model.norm(model.emb_norm(model.tok_emb(idx))))
    torch.testing.assert_close(logits, expected)
    stats = model.stats(idx)
    assert stats["gate0_zero"] == stats["gate1_zero"] == 1.0 and stats["gate1_mean"] == 0.0
    c = model.config
    head = c.n_embd * c.vocab_size
    block = c.n_embd * 16 * (2 * 4 + 2 * 2) + 3 * c.n_embd * c.ffn_hidden + c.n_embd * (c.block_size + 1)
    assert stats["est_flops_ratio"] == pytest.approx((head + 2 * c.n_embd) / (head + c.n_layer * block))


# ---- gated attention --------------------------------------------------------------------------------------

def project(attn, x):
    """q (B, H, T, hd), k and v (B, H_kv, T, hd) of CausalSelfAttention `attn` on x: the rows of its wqkv."""
    B, T, _ = x.shape
    qkv = attn.wqkv(x).view(B, T, -1, attn.head_dim).transpose(1, 2)
    return qkv.split((attn.n_head, attn.n_kv_head, attn.n_kv_head), 1)


def attention_probs(attn, x, cos, sin, mask):
    """Softmax probabilities (B, H, T, T) of CausalSelfAttention `attn` on x with an additive float mask."""
    q, k, _ = project(attn, x)
    q, k = sm.apply_rope(q, cos, sin), sm.apply_rope(k, cos, sin)
    k = k.repeat_interleave(attn.n_head // attn.n_kv_head, dim=1)
    return (q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim) + mask).softmax(-1)


def direct_mask(g, T, past):
    """The direct form of eq. 3: a float mask (B, 1, T, past + T), -inf above the causal diagonal, else
    ln(max(g_j, eps)) of the KEY j."""
    causal = torch.ones(T, g.size(1), dtype=torch.bool).tril(diagonal=past)
    return torch.where(causal, torch.log(g.clamp(min=sm.GATE_EPS))[:, None, None, :], float("-inf"))


def direct_attention(attn, x, cos, sin, cache=None, input_pos=None, g=None):
    """CausalSelfAttention.forward written directly: expanded K, V and the explicit mask, no cache."""
    assert cache is None and input_pos is None
    B, T, _ = x.shape
    if g is None:
        g = torch.ones(B, T, dtype=x.dtype)
    v = project(attn, x)[2]
    v = v.repeat_interleave(attn.n_head // attn.n_kv_head, dim=1)
    probs = attention_probs(attn, x, cos, sin, direct_mask(g.to(x.dtype), T, 0))
    return attn.wo((probs @ v).transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize("n_kv_head", [2, 4])
def test_gate_carried_in_the_keys_equals_the_direct_masked_form_in_float64(n_kv_head):
    """One attention layer, GQA and not: outputs and the gradients of x, g and every weight; then the KV cache."""
    torch.manual_seed(0)
    attn = build(n_kv_head=n_kv_head).double().blocks[1].attn
    T = 24
    cos, sin = sm.rope_tables(attn.head_dim, T, 10000.0, None)
    x = torch.randn(2, T, TINY["n_embd"], dtype=torch.float64, requires_grad=True)
    g = torch.rand(2, T, dtype=torch.float64)
    g[:, [3, 11]] = 0.0  # skipped keys: the eps floor
    g[1, 5] = 1.0
    g.requires_grad_(True)
    dy = torch.randn(2, T, TINY["n_embd"], dtype=torch.float64)

    def output_and_grads(forward):
        inputs = [x, g, *attn.parameters()]
        y = forward(attn, x, cos, sin, g=g)
        return y.detach(), torch.autograd.grad(y, inputs, dy)

    y, grads = output_and_grads(sm.CausalSelfAttention.forward)
    ref_y, ref_grads = output_and_grads(direct_attention)
    torch.testing.assert_close(y, ref_y, rtol=1e-12, atol=1e-12)
    assert grads[1].abs().sum() > 0  # the gate learns through the bias
    for grad, ref in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref, rtol=1e-10, atol=1e-12)
    # the cache: a prefill of 9, a chunk of 6 (a boolean causal mask then), then token by token
    cache = sm.KVCache(attn_config(attn), 2, "cpu", torch.float64)
    parts = []
    with torch.no_grad():
        for a, b in [(0, 9), (9, 15)] + [(t, t + 1) for t in range(15, T)]:
            parts.append(attn(x[:, a:b], cos[a:b], sin[a:b], cache, torch.arange(a, b), g[:, a:b]))
    torch.testing.assert_close(torch.cat(parts, dim=1), ref_y, rtol=1e-12, atol=1e-12)


def test_in_bfloat16_the_gate_in_the_keys_loses_no_more_than_the_direct_mask():
    """Both paths in bfloat16 against a float64 reference from the same bf16-rounded q, k, v: the bias of a
    skipped key (ln 1e-6 = -13.8) rides in a bf16 key coordinate, rounded once like the direct bf16 mask."""
    torch.manual_seed(0)
    B, H, H_kv, T, hd = 2, 4, 2, 64, 20  # hd 20: padded to 24
    q, k, v = (torch.randn(B, h, T, hd, dtype=torch.float64).to(torch.bfloat16) for h in (H, H_kv, H_kv))
    g = torch.rand(B, T, dtype=torch.float64)
    g[g < 0.3] = 0.0

    def direct(dtype):
        mask = direct_mask(g, T, 0).to(dtype)
        return F.scaled_dot_product_attention(q.to(dtype), k.to(dtype).repeat_interleave(2, 1),
                                              v.to(dtype).repeat_interleave(2, 1), attn_mask=mask).double()

    qa, ka, va = sm.gate_into_keys(q, k, v, g.float())
    assert qa.size(-1) == ka.size(-1) == va.size(-1) == 24 and ka.dtype == torch.bfloat16
    new = F.scaled_dot_product_attention(qa, ka, va, is_causal=True, scale=hd ** -0.5, enable_gqa=True)
    ref = direct(torch.float64)
    err_new, err_direct = (new[..., :hd].double() - ref).abs(), (direct(torch.bfloat16) - ref).abs()
    assert err_new.max() < 1e-2 and err_new.pow(2).mean().sqrt() < 1.2 * err_direct.pow(2).mean().sqrt()


def attn_config(attn):
    return sm.GPTConfig(**{**TINY, "n_layer": attn.layer_idx + 1, "n_kv_head": attn.n_kv_head})


def test_the_model_with_the_gate_in_the_keys_equals_the_direct_form(monkeypatch):
    """The whole model in float64, logits and every gradient; the model itself rounds RoPE and the gates to
    float32 (vanilla's apply_rope, the gate's .float()), so the paths agree to float32 precision here."""
    model = build(gate_init_std=0.3).double()
    idx = torch.randint(0, TINY["vocab_size"], (2, 40))
    _, _, _, gates = run_capturing(model, idx)
    assert any((g == 0).any() and (g > 0).any() and (g < 1).any() for g in gates)  # a real mix of gates

    def logits_and_grads():
        model.zero_grad()
        logits, loss = model(idx, idx)
        loss.backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    logits, grads = logits_and_grads()
    with monkeypatch.context() as m:
        m.setattr(sm.CausalSelfAttention, "forward", direct_attention)
        ref_logits, ref_grads = logits_and_grads()
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def per_query_mask(g, T):
    """The reference code's form: ln g of the QUERY row added to every logit of that row."""
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.where(causal, torch.log(g.clamp(min=sm.GATE_EPS))[:, None, :, None], float("-inf"))


def test_a_key_whose_gate_is_zero_gets_no_attention_and_the_per_query_form_would_not_mask_it():
    torch.manual_seed(0)
    model = build()
    attn, T, j = model.blocks[1].attn, 12, 4
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]
    x = torch.randn(2, T, TINY["n_embd"])
    g = torch.rand(2, T) * 0.5 + 0.5
    g[:, j] = 0.0
    with torch.no_grad():
        probs = attention_probs(attn, x, cos, sin, direct_mask(g, T, 0))
        # the module really attends with these probabilities
        v = project(attn, x)[2]
        v = v.repeat_interleave(attn.n_head // attn.n_kv_head, dim=1)
        expected = attn.wo((probs @ v).transpose(1, 2).reshape(2, T, -1))
        torch.testing.assert_close(attn(x, cos, sin, g=g), expected, rtol=1e-5, atol=1e-6)
        assert probs[:, :, j:, j].max() < 1e-4  # every later query (and j itself) ignores key j
        # black box: changing token j's input (its key and value) leaves every later output unchanged
        x2 = x.clone()
        x2[:, j] = torch.randn(2, TINY["n_embd"]) * 3
        torch.testing.assert_close(attn(x2, cos, sin, g=g)[:, j + 1:], attn(x, cos, sin, g=g)[:, j + 1:],
                                   rtol=0, atol=1e-5)
        ones = torch.ones_like(g)  # control: with its gate at 1 the change shows
        assert (attn(x2, cos, sin, g=ones)[:, j + 1:] - attn(x, cos, sin, g=ones)[:, j + 1:]).abs().max() > 1e-2
        # the per-query form: softmax cancels a bias shared by a whole row, so nothing is masked
        causal = torch.zeros(T, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        per_query = attention_probs(attn, x, cos, sin, per_query_mask(g, T))
        torch.testing.assert_close(per_query, attention_probs(attn, x, cos, sin, causal))
        assert per_query[:, :, j + 1:, j].max() > 1e-2


def test_a_skipped_token_is_invisible_to_later_tokens_in_the_model_and_with_the_cache():
    torch.manual_seed(0)
    model = build(gate_init_std=0.0).eval()
    skip_tokens(model, [7, 9])  # tokens 7 and 9 skip every block; all other gates are exactly 1
    idx = torch.randint(10, TINY["vocab_size"], (2, 24))
    idx[:, 5] = 7
    other = idx.clone()
    other[:, 5] = 9
    logits, _, _, gates = run_capturing(model, idx)
    assert all((g[:, 5] == 0).all() and (g[:, torch.arange(24) != 5] == 1).all() for g in gates)
    torch.testing.assert_close(model(other)[0][:, 6:], logits[:, 6:], rtol=0, atol=1e-4)
    # control: without the gated attention (every gate 1) token 5 is seen
    dense = build(gated=False).eval()
    dense.load_state_dict({k: v for k, v in model.state_dict().items() if "gate" not in k})
    assert (dense(other)[0][:, 6:] - dense(idx)[0][:, 6:]).abs().max() > 1e-2
    # with the key/value cache, token by token: cached keys keep their gates
    cache = sm.KVCache(model.config, 2, "cpu", torch.float32)
    steps = torch.cat([model(idx[:, t:t + 1], cache=cache, input_pos=torch.tensor([t]))[0] for t in range(24)], dim=1)
    torch.testing.assert_close(steps, logits, rtol=1e-4, atol=1e-5)
    g = torch.stack(cache.g)  # (L, B, block_size): every layer's cached gates
    assert (g[:, :, 5] == 0).all() and (g[:, :, :24].sum() == 4 * 2 * 23)
    for layer_gates in cache.g:  # a cache that forgot the gates would let token 5 be seen
        layer_gates.fill_(1.0)
    assert (model(idx[:, 23:], cache=cache, input_pos=torch.tensor([23]))[0][:, 0] - logits[:, 23]).abs().max() > 1e-3


def test_gate_gradient_flows_through_the_attention_bias():
    model = build(gate_init_std=0.3)
    idx = torch.randint(0, TINY["vocab_size"], (2, 32))
    loss = model(idx, idx)[1]
    loss.backward()
    assert all(g.weight.grad is not None and g.weight.grad.abs().sum() > 0 for g in model.gates)


def test_a_block_adds_the_gate_times_each_output_norm_in_float64():
    """The sandwich block, the gate applied after each output norm (a norm after it would undo it):
    h = x + g * Norm(Attn(Norm(x), g)), then h + g * Norm(MLP(Norm(h))), Norm written out as v / sqrt(mean(v^2) +
    eps) * w; values and the gate's gradient, with some gates exactly 0 (the token's stream unchanged)."""
    torch.manual_seed(0)
    model = build().double()
    block, T = model.blocks[1], 12
    for m in block.modules():
        if isinstance(m, sm.RMSNorm):
            torch.nn.init.normal_(m.weight, 1.0, 0.5)
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]
    x = torch.randn(2, T, TINY["n_embd"], dtype=torch.float64)
    g = torch.rand(2, T, dtype=torch.float64).masked_fill(torch.rand(2, T) < 0.3, 0.0).requires_grad_()
    up = torch.randn(2, T, TINY["n_embd"], dtype=torch.float64)

    def norm(m, v):
        return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + m.eps) * m.weight

    h = x + g.unsqueeze(-1) * norm(block.attn_out_norm, block.attn(norm(block.attn_norm, x), cos, sin, g=g))
    want = h + g.unsqueeze(-1) * norm(block.mlp_out_norm, block.mlp(norm(block.mlp_norm, h)))
    got = block(x, cos, sin, g=g)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert (g == 0).any() and torch.equal(got[g == 0], x[g == 0])
    grad, = torch.autograd.grad((got * up).sum(), g)
    torch.testing.assert_close(grad, torch.autograd.grad((want * up).sum(), g)[0], rtol=1e-10, atol=1e-12)


# ---- regulariser and controller ---------------------------------------------------------------------------

def test_regulariser_is_added_in_training_only():
    model = build(gate_init_std=0.3)
    with torch.no_grad():
        model.gate_alpha.copy_(torch.tensor([0.5, -0.2, -0.2, 0.5]))
        model.gate_beta.copy_(torch.tensor([0.1, 0.3, 0.3, 0.1]))
    idx = torch.randint(0, TINY["vocab_size"], (2, 32))
    logits, loss, _, gates = run_capturing(model.train(), idx, targets=idx)
    ce = F.cross_entropy(logits.view(-1, logits.size(-1)), idx.view(-1))
    G = torch.stack(gates)  # (L, B, T)
    reg = (model.gate_alpha * G.mean((1, 2)) + model.gate_beta * G.var((1, 2), correction=0)).mean()
    torch.testing.assert_close(loss, ce + reg)
    torch.testing.assert_close(model.eval()(idx, idx)[1], ce)


def test_targets_are_linear_to_the_middle_and_mirrored():
    m4, m5 = build(gate_target=0.25), build(n_layer=5, gate_target=0.5)
    torch.testing.assert_close(m4.gate_mean_target, torch.tensor([1.0, 0.25, 0.25, 1.0]))
    torch.testing.assert_close(m4.gate_var_target, torch.tensor([0.0, 0.1875, 0.1875, 0.0]))
    torch.testing.assert_close(m5.gate_mean_target, torch.tensor([1.0, 0.75, 0.5, 0.75, 1.0]))


def test_one_controller_update_on_hand_made_statistics():
    model = build(gate_target=0.5)  # targets: mean (1, .5, .5, 1), var (0, .25, .25, 0); gamma 1e-3, delta 1e-2
    with torch.no_grad():
        model.gate_alpha.copy_(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    mean = torch.tensor([0.995, 0.7, 0.3, 0.95])  # inside the band, above, below, below
    var = torch.tensor([0.005, 0.245, 0.1, 0.3])  # inside, inside, below, above
    model.update_coefficients(mean, var)
    torch.testing.assert_close(model.gate_alpha, torch.tensor([0.1, 0.2 + 1e-3 * 0.2, 0.3 - 1e-3 * 0.2,
                                                               0.4 - 1e-3 * 0.05]))
    torch.testing.assert_close(model.gate_beta, torch.tensor([0.0, 0.0, -1e-3 * 0.15, 1e-3 * 0.3]))


def test_after_step_uses_the_gates_of_every_micro_step_then_resets():
    model = build(gate_init_std=0.3)
    batches = [torch.randint(0, TINY["vocab_size"], (2, 32)) for _ in range(2)]
    gates = []
    for idx in batches:  # two micro-steps of one optimiser step
        gates.append(torch.stack(run_capturing(model, idx, targets=idx)[3]))
    model.eval()(batches[0])  # an eval forward does not count
    model.train()
    G = torch.cat(gates, dim=1)  # (L, 2B, T): the pooled batch
    mean, var = G.mean((1, 2)), G.var((1, 2), correction=0)
    dev_m, dev_v = mean - model.gate_mean_target, var - model.gate_var_target
    model.after_step()
    torch.testing.assert_close(model.gate_alpha, 1e-3 * dev_m * (dev_m.abs() > 1e-2))
    torch.testing.assert_close(model.gate_beta, 1e-3 * dev_v * (dev_v.abs() > 1e-2))
    assert model.gate_alpha.abs().sum() > 0 and model._train_sums is None
    before = model.gate_alpha.clone()
    model.after_step()  # no forward since: nothing to update
    assert torch.equal(model.gate_alpha, before)


def test_coefficients_survive_a_checkpoint_round_trip(tmp_path):
    model = build()
    with torch.no_grad():
        model.gate_alpha.copy_(torch.tensor([0.1, -0.2, -0.2, 0.1]))
        model.gate_beta.copy_(torch.tensor([0.01, 0.02, 0.02, 0.01]))
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt")
    assert "gate_alpha" in state and "gate_mean_target" not in state
    loaded = build(seed=1)
    loaded.load_state_dict(state)
    assert torch.equal(loaded.gate_alpha, model.gate_alpha) and torch.equal(loaded.gate_beta, model.gate_beta)


def test_stats_and_depth_map_measure_the_batch_they_are_given():
    model = build(gate_init_std=0.3).eval()
    idx = torch.randint(0, TINY["vocab_size"], (2, 32))
    gates = torch.stack(run_capturing(model, idx)[3])
    with torch.no_grad():
        model.gate_alpha.fill_(0.25)
    stats = model.stats(idx)
    assert set(stats) == {f"gate{l}_{k}" for l in range(2) for k in ("mean", "zero", "alpha", "beta")} | {
        "est_flops_ratio"}
    assert stats["gate1_mean"] == pytest.approx(gates[1].mean().item(), abs=1e-6)
    assert stats["gate1_zero"] == pytest.approx((gates[1] == 0).float().mean().item())
    assert stats["gate0_alpha"] == 0.25
    assert 0 < stats["est_flops_ratio"] < 1.01
    torch.testing.assert_close(model.depth_map(idx), gates.mean((1, 2)).unsqueeze(1))
    torch.testing.assert_close(model.depth_map(idx[:, :8])[:, 0], gates[:, :, :8].mean((1, 2)))  # causal: a prefix
    # forward keeps nothing: a training forward feeds only the controller, and the hooks are gone afterwards
    assert model._train_sums is None and all(not b._forward_pre_hooks for b in model.blocks)
    assert build(gated=False).stats(idx) == {} and build(gated=False).depth_map(idx).shape == (4, 1)


@pytest.mark.parametrize("gated", [True, False])
def test_gates_get_no_weight_decay_whatever_weight_decay_is(gated):
    """The gates have a group of their own with weight decay 0 (as in the reference); other matrices decay."""
    model = build(gated=gated, gate_init_std=0.3)
    groups = model.param_groups(0.1)
    grouped = [p for g in groups for p in g["params"]]
    assert len(grouped) == len({id(p) for p in grouped}) == len(list(model.parameters()))
    gate_ids = {id(p) for p in model.gates.parameters()}
    assert len(gate_ids) == (4 if gated else 0)  # w and b of the 2 first-half blocks
    for g in groups:
        if any(id(p) in gate_ids for p in g["params"]):
            assert g["weight_decay"] == 0.0 and all(id(p) in gate_ids for p in g["params"])
    # one AdamW step with zero gradients moves nothing but the decay: the gates keep their values
    opt = torch.optim.AdamW(groups, lr=0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        decayed = not torch.equal(p, before[n])
        assert decayed == (p.dim() >= 2 and not n.startswith("gates.")), n


# ---- DDP: two processes end with identical coefficients, equal to one process over the pooled batch ---------

DDP_SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    sys.path.insert(0, sys.argv[1])
    import model_skipmiddle as sm
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = sm.GPTConfig(vocab_size=64, block_size=32, n_layer=4, n_head=2, n_kv_head=1, n_embd=32, ffn_hidden=64,
                       gate_init_std=0.3, gate_gamma=0.1)

    def make():
        torch.manual_seed(0)
        return sm.GPT(cfg)

    def batch(step, micro, r):
        return torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(1000 * step + 10 * micro + r))

    model = make()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        for micro in range(2):
            x = batch(step, micro, rank)
            ctx = ddp.no_sync() if micro == 0 else torch.enable_grad()
            with ctx:
                (ddp(x, x)[1] / 2).backward()
        opt.step()
        opt.zero_grad()
        model.after_step()
    coefs = torch.cat([model.gate_alpha, model.gate_beta])
    gathered = [torch.zeros_like(coefs) for _ in range(world)]
    dist.all_gather(gathered, coefs)
    # stats() on every rank, each with its own batch (of a different size), as train.py gives them
    val = [torch.randint(0, 64, (2 + 3 * r, 32), generator=torch.Generator().manual_seed(7 + r)) for r in range(world)]
    model.eval()
    stats = [None] * world
    dist.all_gather_object(stats, model.stats(val[rank]))
    dist.destroy_process_group()  # before the reference run: after_step() all-reduces while a group exists
    if rank == 0:
        pooled = model.stats(torch.cat(val))  # the same weights in one process, over every rank's windows
        ref = make()  # one process, the whole global batch in each step (same gradients up to rounding)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(3):
            for micro in range(2):
                for r in range(world):
                    x = batch(step, micro, r)
                    (ref(x, x)[1] / (2 * world)).backward()
            ropt.step()
            ropt.zero_grad()
            ref.after_step()
        torch.save({"ranks": gathered, "single": torch.cat([ref.gate_alpha, ref.gate_beta]), "stats": stats,
                    "pooled": pooled}, sys.argv[2])
""")


@pytest.mark.slow  # torchrun, two processes
def test_ddp_two_processes_keep_identical_coefficients(tmp_path):
    script, out = tmp_path / "ddp_skipmiddle.py", tmp_path / "coefs.pt"
    script.write_text(DDP_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           ROOT, str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = torch.load(out)
    a, b = result["ranks"]
    assert torch.equal(a, b) and a.abs().sum() > 0  # identical on both ranks, and the controller did move
    torch.testing.assert_close(a, result["single"], rtol=1e-4, atol=1e-6)
    # stats() describes every rank's batch: the same on both ranks, and equal to one process that read them all
    s0, s1 = result["stats"]
    assert s0 == s1 and s0.keys() == result["pooled"].keys()
    for k, v in result["pooled"].items():
        assert s0[k] == pytest.approx(v, rel=1e-6, abs=1e-9), k


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gated_attention_runs_in_cudas_flash_kernel():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    model = build(gate_init_std=0.3).cuda()
    idx = torch.randint(0, TINY["vocab_size"], (2, 64), device="cuda")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(idx, idx)[1]  # raises if the flash kernel cannot take the gated attention
    loss.backward()
    assert all(g.weight.grad.abs().sum() > 0 for g in model.gates)


# ---- skipping for real: forward_skip, SkipCache, generate(skip=True) -------------------------------------

def count_block_calls(model):
    calls = [0] * len(model.blocks)
    for l, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda m, args, l=l: calls.__setitem__(l, calls[l] + 1))
    return calls


def eps_tolerance(model, T):
    """How far the dense forward (a skipped key keeps the weight eps * e^s of the eps floor) can be from
    skipping (weight exactly 0): per layer at most T skipped keys, each with a weight below eps * e^(s - s')
    against any key that runs, |s - s'| < 2 for these small random weights; the post-norms keep the scale."""
    return model.config.n_layer * T * sm.GATE_EPS * math.exp(2)


def test_closed_middle_gates_skip_the_middle_blocks_and_generation_is_unchanged():
    model = build(gate_init_std=0.0).eval()
    with torch.no_grad():
        model.gates[1].bias.fill_(2.0)  # S >= 1 at gate 1 for every token: blocks 1 and 2 are closed
    idx = torch.randint(0, TINY["vocab_size"], (2, 9))
    calls = count_block_calls(model)
    skip = generate(model, idx, 20, temperature=0)  # skip=True is the default
    assert calls == [20, 0, 0, 20]  # one prefill + 19 decoding steps; the closed blocks never run
    dense = generate(model, idx, 20, temperature=0, skip=False)
    assert torch.equal(skip, dense) and calls[1] == 20
    torch.testing.assert_close(sm.forward_skip(model, dense)[0], model(dense)[0], rtol=0, atol=eps_tolerance(model, 29))


def test_generation_with_skipping_runs_under_bf16_autocast():
    """Under autocast the keys and values are bf16 while the cache holds the weights' float32."""
    model = build(gate_init_std=0.0).eval()
    with torch.no_grad():
        model.gates[1].bias.fill_(2.0)
    idx = torch.randint(0, TINY["vocab_size"], (2, 9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = generate(model, idx, 8, temperature=0)
    assert out.shape == (2, 17) and torch.equal(out[:, :9], idx)


def test_a_mix_of_open_and_closed_tokens_per_row(monkeypatch):
    model = build(gate_init_std=0.0).eval()
    skip_tokens(model, [7])
    with torch.no_grad():  # token 7: gate 0.3 at blocks 0 and 3, 0 at blocks 1 and 2; the others 1, then 0.5
        model.gates[0].weight[0, 0] *= 0.7 / (100 * model.emb_norm(model.tok_emb.weight[7])[0])
        model.gates[1].bias.fill_(0.5)
    idx = torch.randint(10, TINY["vocab_size"], (3, 30))
    idx[0, [2, 5, 6, 20]] = 7
    idx[1, 3] = 7  # row 2 has none: it runs every block while the others skip some tokens
    logits, _, _, gates = run_capturing(model, idx)
    assert (gates[0][idx >= 10] == 1).all() and (gates[0][idx == 7] - 0.3).abs().max() < 1e-5
    assert (gates[1][idx == 7] == 0).all() and (gates[1][idx >= 10] == 0.5).all()
    torch.testing.assert_close(sm.forward_skip(model, idx)[0], logits, rtol=0, atol=eps_tolerance(model, 30))
    # the cache: per layer every token's gate at its position, 0 (its key hidden) where it did not run the layer
    cache = sm.SkipCache(model.config, 3, "cpu", torch.float32)
    steps = [sm.forward_skip(model, idx[:, :12], cache=cache)[0]]
    steps += [sm.forward_skip(model, idx[:, t:t + 1], cache, torch.tensor([t]))[0] for t in range(12, 30)]
    torch.testing.assert_close(torch.cat(steps, dim=1), logits, rtol=0, atol=eps_tolerance(model, 30))
    for l in range(4):
        g = gates[model.mirror[l]]
        assert torch.equal(cache.g[l][:, :30] > 0, g > 0)
        torch.testing.assert_close(cache.g[l][:, :30], g)
    assert (cache.g[1] > 0).sum(1).tolist() == [26, 29, 30] and (cache.g[0] > 0).sum(1).tolist() == [30] * 3
    # the eps floor is what separates the two: with a floor of 1e-2 the difference exceeds the tolerance
    tolerance = eps_tolerance(model, 30)
    monkeypatch.setattr(sm, "GATE_EPS", 1e-2)
    assert (sm.forward_skip(model, idx)[0] - model(idx)[0]).abs().max() > tolerance


def test_skipped_tokens_entries_get_no_weight():
    """Steps attend over the whole static cache: the entries of a token that skipped a layer (gate 0) and the
    positions not filled yet are read but get weight exactly 0, so garbage there changes nothing."""
    model = build(gate_init_std=0.0).eval()
    skip_tokens(model, [7])
    idx = torch.randint(10, TINY["vocab_size"], (1, 20))
    idx[0, [4, 11]] = 7
    cache = sm.SkipCache(model.config, 1, "cpu", torch.float32)
    first = sm.forward_skip(model, idx[:, :15], cache=cache)[0]
    assert all((g[0] > 0).sum() == 13 for g in cache.g)  # tokens 4 and 11 left no visible key in any layer
    for k, v in zip(cache.k, cache.v):
        for t in ([4, 11], slice(15, None)):
            k[:, :, t], v[:, :, t] = 1e4, -1e4
    rest = [sm.forward_skip(model, idx[:, 15:16], cache, torch.tensor([15]))[0][:, 0]]  # a chunk of one, then decode steps
    rest += [decode_step(model, idx[:, t:t + 1], torch.tensor(t), cache) for t in range(16, 20)]
    full = sm.forward_skip(model, idx)[0]
    assert torch.isfinite(torch.stack(rest)).all()
    torch.testing.assert_close(torch.cat([first, torch.stack(rest, dim=1)], dim=1), full, rtol=1e-5, atol=1e-5)


def test_generate_with_skip_false_is_the_dense_forward():
    model = build(gate_init_std=0.3).eval()
    idx = torch.randint(0, TINY["vocab_size"], (2, 8))
    out = generate(model, idx, 6, temperature=0, skip=False, use_cache=False)
    for t in range(8, 14):  # each token the argmax of forward() on the text so far, bit for bit
        assert torch.equal(out[:, t], model(out[:, :t])[0][:, -1].argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gates_compute_in_float32_at_least(dtype):
    """The gates follow the file's rule for what it computes in float32 at least: a float64 model's gates are
    float64 (a cast to float32 would round them), a float32 model's float32."""
    model = build(gate_init_std=0.3).to(dtype).eval()
    gates = []
    hooks = [b.register_forward_pre_hook(lambda m, args: gates.append(args[-1])) for b in model.blocks]
    try:
        model(torch.randint(0, TINY["vocab_size"], (2, 8)))
    finally:
        for hook in hooks:
            hook.remove()
    assert len(gates) == TINY["n_layer"] and all(g.dtype == dtype for g in gates)
    assert any((g < 1).any() for g in gates)  # the gates do read the stream here, not only their init's 1
