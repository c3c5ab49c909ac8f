"""Attention Residuals (model_attnres.py, the Open AttnRes paper): the paper's own properties, besides the contract suite."""
import os

import pytest
import torch

import model_attnres as attnres
import model_vanilla as vanilla
from conftest import ROOT
from generate import generate
from plumbing.config import make_config

DOCS = open(os.path.join(ROOT, "docs", "attnres.md")).read()
TINY = dict(vocab_size=64, block_size=32, n_layer=4, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64)
# blocks of layers (block: 1,1,1,1; block3: 2,1,1), of sublayers (block6: 2,2,1,1,1,1 of the 8), one per sublayer
MODES = {"block": {}, "block3": dict(n_blocks=3), "block6": dict(n_blocks=6), "full": dict(attn_res="full")}


def make(seed=0, randomise=False, **kw):
    torch.manual_seed(seed)
    model = attnres.GPT(attnres.GPTConfig(**{**TINY, **kw})).eval()
    if randomise:  # pseudo-queries and key norms away from their init, so that the softmax is not uniform
        with torch.no_grad():
            for mix in model.mixes():
                mix.query.normal_(0, 1.0)
                mix.key_weight.uniform_(0.5, 1.5)
    return model


def tokens(seed=1, B=2, T=12):
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def trace(model, idx):
    """Run the model; record the embedding, every sublayer's input h_l and output f_l, and the final norm's input."""
    rec = {"in": [], "out": []}
    hooks = [model.tok_emb.register_forward_hook(lambda m, i, o: rec.__setitem__("emb", o))]
    for block in model.blocks:
        for norm, sub in ((block.attn_norm, block.attn), (block.mlp_norm, block.mlp)):
            hooks.append(norm.register_forward_pre_hook(lambda m, i: rec["in"].append(i[0])))
            hooks.append(sub.register_forward_hook(lambda m, i, o: rec["out"].append(o)))
    hooks.append(model.norm.register_forward_pre_hook(lambda m, i: rec.__setitem__("final", i[0])))
    with torch.no_grad():
        rec["logits"] = model(idx)[0]
    for h in hooks:
        h.remove()
    return rec


def mix64(sources, query, key_weight, eps, normalise_keys=True, bias=0.0):
    """The definition in float64: h = sum_i a_i v_i, a = softmax_i(w . RMSNorm(v_i) + b [i newest]), raw values v_i."""
    v = torch.stack([s.double() for s in sources])  # (S, B, T, d)
    k = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) if normalise_keys else v
    logits = (k * key_weight.double()) @ query.double()  # (S, B, T)
    logits[-1] += float(bias)  # the recency bias on the most recent source
    a = logits.softmax(0)  # (S, B, T)
    return (a.unsqueeze(-1) * v).sum(0)


def block_ends64(c):
    """The last sublayer of each block, by the definition: numpy.array_split's blocks of whole layers, or of
    sublayers when there are more blocks than layers; full mode: every sublayer."""
    n_sub = 2 * c.n_layer
    if c.attn_res == "full":
        return set(range(n_sub))
    if c.n_blocks <= c.n_layer:
        return {2 * int(b[-1]) + 1 for b in torch.tensor_split(torch.arange(c.n_layer), c.n_blocks)}
    return {int(b[-1]) for b in torch.tensor_split(torch.arange(n_sub), c.n_blocks)}


def reference(model, rec, **mix_kw):  # mix_kw: normalise_keys, bias
    """Each sublayer's input and the head's input, recomputed in float64 from the recorded sublayer outputs."""
    c, mixes = model.config, model.mixes()
    n_sub = 2 * c.n_layer
    ends = block_ends64(c)
    completed, partial, inputs = [rec["emb"]], None, []
    for l in range(n_sub):
        sources = completed + ([partial] if partial is not None else [])
        inputs.append(mix64(sources, mixes[l].query, mixes[l].key_weight, c.norm_eps, **mix_kw))
        f = rec["out"][l].double()
        partial = f if partial is None else partial + f
        if l in ends:
            completed.append(partial)
            partial = None
    return inputs, mix64(completed, model.out_res.query, model.out_res.key_weight, c.norm_eps, **mix_kw)


@pytest.mark.parametrize("mode", MODES)
def test_uniform_weights_at_init(mode):
    model = make(**MODES[mode])
    rec = trace(model, tokens())
    # per token: every sublayer's input (and the head's) is the plain mean of its sources
    zero = torch.zeros(model.config.n_embd)
    inputs, final = reference(model, rec)
    for mix in model.mixes():
        assert torch.equal(mix.query, zero)
    for got, want in zip(rec["in"] + [rec["final"]], inputs + [final]):
        assert torch.allclose(got.double(), want, atol=1e-6, rtol=1e-5)
    # the map: row r is uniform over its n_r sources and zero beyond
    dm = model.depth_map(tokens())
    n_sources = model.sources_per_mix()
    assert n_sources[0] == 1 and n_sources[-1] == dm.size(1)
    assert n_sources == sorted(n_sources)
    for row, n in zip(dm, n_sources):
        assert torch.allclose(row[:n], torch.full((n,), 1.0 / n), atol=1e-7) and not row[n:].any()


@pytest.mark.parametrize("mode", MODES)
def test_sublayer_inputs_match_float64_definition(mode):
    """RMSNorm'd keys, raw values: a float64 re-computation of every sublayer's input from its sources agrees,
    with sources of very different norms (the embedding scaled up 30x)."""
    model = make(randomise=True, **MODES[mode])
    with torch.no_grad():
        model.tok_emb.weight.mul_(30.0)
    rec = trace(model, tokens())
    inputs, final = reference(model, rec)
    norms = [s.norm(dim=-1).mean().item() for s in [rec["emb"]] + rec["out"]]
    assert max(norms) > 20 * min(norms)
    for got, want in zip(rec["in"] + [rec["final"]], inputs + [final]):
        assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-4)
    # the test has power: keys without the RMSNorm would give clearly different inputs
    wrong, _ = reference(model, rec, normalise_keys=False)
    assert max((g.double() - w).abs().max().item() for g, w in zip(rec["in"][1:], wrong[1:])) > 1e-2


def test_one_sublayer_per_block_equals_full_mode():
    full = make(randomise=True, attn_res="full")
    block = make(seed=5, attn_res="block", n_blocks=2 * TINY["n_layer"])
    block.load_state_dict(full.state_dict())
    idx = tokens()
    assert torch.equal(block(idx)[0], full(idx)[0])
    assert torch.equal(block.depth_map(idx), full.depth_map(idx))
    assert block.depth_map(idx).shape == (2 * TINY["n_layer"] + 1, 2 * TINY["n_layer"] + 1)


def test_extra_parameters_at_100m_shape():
    shape = dict(vocab_size=50304, block_size=4096, n_layer=8, n_head=6, n_kv_head=3, n_embd=384, ffn_hidden=1536)
    with torch.device("meta"):  # shapes only: no memory, no init time
        n_attnres = sum(p.numel() for p in attnres.GPT(attnres.GPTConfig(**shape)).parameters())
        n_vanilla = sum(p.numel() for p in vanilla.GPT(vanilla.GPTConfig(**shape)).parameters())
    extra = n_attnres - n_vanilla
    d, L = shape["n_embd"], shape["n_layer"]
    assert extra == 2 * d * (2 * L + 1) == 13056  # the formula: w and g per sublayer, plus the output mix
    fraction = extra / n_vanilla
    print(f"\nattnres extra parameters at 100m: {extra} of vanilla's {n_vanilla} = {100 * fraction:.4f}%")
    assert fraction < 1e-3 and f"{100 * fraction:.3f}%" == "0.023%"  # the figure in docs/attnres.md
    assert "13,056" in DOCS and "0.023%" in DOCS


def test_block_split_and_validation():
    def sizes(n_layer, n_blocks):  # in sublayers
        ends = sorted(attnres.block_ends(attnres.GPTConfig(n_layer=n_layer, n_blocks=n_blocks)))
        return [b - a for a, b in zip([-1] + ends, ends)]
    # n_blocks <= n_layer: whole layers (attn + mlp pairs), as even as possible, longer blocks first
    assert sizes(6, 4) == [4, 4, 2, 2] and sizes(4, 4) == [2, 2, 2, 2] and sizes(6, 6) == [2] * 6
    assert sizes(6, 5) == [4, 2, 2, 2, 2] and sizes(4, 3) == [4, 2, 2] and sizes(4, 1) == [8]
    # more blocks than layers: sublayers
    assert sizes(6, 8) == [2, 2, 2, 2, 1, 1, 1, 1] and sizes(4, 6) == [2, 2, 1, 1, 1, 1] and sizes(4, 8) == [1] * 8
    for n_layer in range(1, 9):
        for n_blocks in range(1, 2 * n_layer + 1):
            s = sizes(n_layer, n_blocks)
            assert len(s) == n_blocks and sum(s) == 2 * n_layer and s == sorted(s, reverse=True)
            if n_blocks <= n_layer:  # every block ends with an MLP: a block never splits a layer
                assert all(n % 2 == 0 for n in s) and max(s) - min(s) <= 2
            else:
                assert max(s) - min(s) <= 1
    for bad in (dict(n_blocks=0), dict(n_blocks=9), dict(attn_res="dense")):
        with pytest.raises(ValueError):  # the declared constraints (n_blocks=0, dense) or the rule across fields
            attnres.GPT(make_config(attnres.GPTConfig, **{**TINY, **bad}))
    for name, kw in attnres.VARIANTS.items():  # every variant is valid at the contract suite's tiny shape
        attnres.GPT(attnres.GPTConfig(**{**TINY, **kw}))


@pytest.mark.parametrize("mode", MODES)
def test_causal_and_cached_generation(mode):
    model = make(randomise=True, **MODES[mode])
    idx = tokens(T=16)
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % TINY["vocab_size"]
    with torch.no_grad():
        assert torch.allclose(model(idx)[0][:, :10], model(changed)[0][:, :10], atol=1e-6)
    prompt = idx[:, :4]
    with_cache = generate(model, prompt, 28, temperature=0)  # up to block_size: one cache, one token a step
    assert torch.equal(with_cache, generate(model, prompt, 28, temperature=0, use_cache=False))


def test_logit_lens_hidden_states():
    model = make(randomise=True)
    idx = tokens()
    with torch.no_grad():
        logits, _, hidden = model(idx, return_hidden=True)
    assert len(hidden) == TINY["n_layer"] and all(h.shape == (2, 12, TINY["n_embd"]) for h in hidden)
    assert torch.equal(model.lm_head(model.norm(hidden[-1])), logits)  # the last one is the head's input
    assert model.sources_per_mix()[-1] == model.depth_map(idx).size(1)  # the map still holds the final mix


def test_training_moves_the_map_and_stats():
    model = make(**MODES["block"]).train()
    opt = torch.optim.AdamW(model.param_groups(0.01), lr=1e-2)
    idx = tokens(B=4, T=32)
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    for step in range(5):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        if step == 0:  # at init the queries get gradient (mixes over >= 2 sources), the key weights none yet
            assert all(m.query.grad.abs().sum() > 0 for m in model.mixes()[1:])
        opt.step()
    dm = model.depth_map(idx)
    assert torch.allclose(dm.sum(1), torch.ones(dm.size(0)))
    uniform = torch.tensor([[1.0 / n] for n in model.sources_per_mix()])
    assert (dm[1:, :2] - uniform[1:]).abs().max() > 1e-3
    entropy = model.stats(idx)["attnres_entropy"]
    assert 0 < entropy < torch.log(torch.tensor(float(dm.size(1)))).item()


def test_low_precision():
    model = make(randomise=True).train()
    idx = tokens()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # train.py's mixed precision (bf16 autocast)
        _, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())
    model = model.eval().to(torch.bfloat16)  # a model cast to bf16, e.g. for sampling
    out = generate(model, idx[:, :3], 5, temperature=0)
    assert torch.isfinite(model(idx)[0].float()).all() and out.shape == (2, 8)


@pytest.mark.parametrize("n_kv_head", [2, 4])  # grouped-query and plain multi-head attention
@pytest.mark.parametrize("mode", MODES)
def test_cached_chunks_and_gradients_float64(mode, n_kv_head):
    """In float64, with sources of very different norms: every parameter that reads a choice gets gradient, and a
    prompt, one token, then a chunk through the key/value cache give the logits of one forward over them all."""
    model = make(randomise=True, n_kv_head=n_kv_head, **MODES[mode]).double()
    with torch.no_grad():
        model.tok_emb.weight.mul_(30.0)
    idx, targets = tokens(T=16), tokens(seed=2, T=16)
    logits, loss = model(idx, targets)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad.abs().max() > 0 or name.startswith("blocks.0.attn_res."), name  # row 0 reads one source only
    cache = attnres.KVCache(model.config, 2, "cpu", torch.float64)
    with torch.no_grad():
        for lo, hi in ((0, 9), (9, 10), (10, 16)):
            got = model(idx[:, lo:hi], cache=cache, input_pos=torch.arange(lo, hi))[0]
            assert (got - logits[:, lo:hi]).abs().max() <= 1e-12 * logits.abs().max()


@pytest.mark.parametrize("learnable", [False, True])
@pytest.mark.parametrize("mode", ["block", "full"])
def test_recency_bias(mode, learnable):
    """The Open AttnRes runs' recency bias b on each mix's logit of its most recent source: frozen, a constant outside the state
    dict; learnable, one scalar parameter per mix starting at b. b = 0 frozen is the default model, and a learnable
    b = 0 computes it too."""
    default = make(randomise=True, **MODES[mode])
    zero = make(randomise=True, recency_bias_learnable=learnable, **MODES[mode])
    assert torch.equal(zero(tokens())[0], default(tokens())[0])
    model = make(randomise=True, recency_bias=3.0, recency_bias_learnable=learnable, **MODES[mode])
    extra = set(model.state_dict()) - set(default.state_dict())
    names = {n for n, _ in model.named_parameters() if n.endswith("recency_bias")}
    assert extra == names and len(names) == (len(model.mixes()) if learnable else 0)
    assert all(m.recency_bias == 3.0 for m in model.mixes())
    rec = trace(model, tokens())
    inputs, final = reference(model, rec, bias=3.0)
    for got, want in zip(rec["in"] + [rec["final"]], inputs + [final]):
        assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-4)
    # the bias moves weight onto the newest source of every mix that has two or more
    biased, plain = model.depth_map(tokens()), default.depth_map(tokens())
    for r, n in enumerate(model.sources_per_mix()[1:], start=1):
        assert biased[r, n - 1] > plain[r, n - 1]
    if learnable:  # the bias trains, without weight decay
        model.train()
        model(tokens(), tokens(seed=2))[1].backward()
        assert all(m.recency_bias.grad.abs() > 0 for m in model.mixes()[1:])
        no_decay = [p for g in model.param_groups(0.1) if g["weight_decay"] == 0 for p in g["params"]]
        assert all(any(m.recency_bias is p for p in no_decay) for m in model.mixes())


@pytest.mark.parametrize("module", ["model_attnres", "model_aila"])
def test_softmax_over_is_the_softmax_of_the_stack(module):
    """softmax_over (attnres's mixes and aila's layer attention) is torch's softmax over the stacked logits,
    unstacked: for one to five sources, logits far apart (no overflow at 1e4, a weight of exactly 0 at -inf), in
    float32 at least (bf16 logits, as aila's scores are under autocast, give float32 weights) and float64 kept."""
    softmax_over = __import__(module).softmax_over
    g = torch.Generator().manual_seed(0)
    for S in range(1, 6):
        for scale in (1.0, 100.0, 1e4):
            logits = [torch.randn(2, 3, 1, generator=g) * scale for _ in range(S)]
            want = torch.stack(logits, -1).softmax(-1).unbind(-1)
            got = softmax_over(logits)
            assert len(got) == S and all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(got, want))
    logits = [torch.tensor([[0.5]]), torch.tensor([[float("-inf")]]), torch.tensor([[-0.5]])]
    got = softmax_over(logits)
    assert got[1].item() == 0.0 and abs(sum(w.item() for w in got) - 1) < 1e-6
    low = [torch.randn(4, 2, generator=g).bfloat16() for _ in range(3)]
    got = softmax_over(low)
    want = torch.stack([x.float() for x in low], -1).softmax(-1).unbind(-1)
    assert all(w.dtype == torch.float32 and torch.allclose(w, v, atol=1e-6) for w, v in zip(got, want))
    double = [torch.randn(3, dtype=torch.float64, generator=g) for _ in range(2)]
    assert all(w.dtype == torch.float64 for w in softmax_over(double))
    # the gradient too, ties included
    for logits in ([torch.randn(2, 3, generator=g, dtype=torch.float64) * 5 for _ in range(4)],
                   [torch.ones(2, 3, dtype=torch.float64) for _ in range(3)]):
        logits = [x.requires_grad_() for x in logits]
        upstream = [torch.randn(2, 3, generator=g, dtype=torch.float64) for _ in logits]
        got = torch.autograd.grad(sum((w * u).sum() for w, u in zip(softmax_over(logits), upstream)), logits)
        stacked = torch.stack(logits, -1).softmax(-1).unbind(-1)
        want = torch.autograd.grad(sum((w * u).sum() for w, u in zip(stacked, upstream)), logits)
        assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(got, want))
