"""DeepSeek's manifold-constrained Hyper-Connections and Zhu et al.'s Hyper-Connections (model_mhc.py): the method's own
properties, besides the contract suite. Each check of the equations is also shown to fail on a planted bug."""
import copy
import json
import sys
import types

import pytest
import torch

import model_mhc
import model_vanilla
import train
from conftest import TINY, run_script
from generate import generate

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(vocab_size=257, block_size=64, n_layer=3, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64)
KINDS = {"mhc": {}, "hc": dict(hc_kind="hc")}
# the equations at the default 20 Sinkhorn iterations, and at 2, where a Sinkhorn that starts with the rows differs
TOL = 2e-5  # float32 against float64, relative to the largest logit
CASES = {"mhc": {}, "mhc-2-iters": dict(hc_sinkhorn_iters=2), "mhc-n3": dict(hc_mult=3), "hc": dict(hc_kind="hc")}


def build(module=model_mhc, seed=0, **overrides):
    torch.manual_seed(seed)
    return module.GPT(module.GPTConfig(**{**SMALL, **overrides}))


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def tokens(B=2, T=24, seed=1):
    return torch.randint(0, SMALL["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def connections(model):
    return [c for block in model.blocks for c in (block.attn_hc, block.ffn_hc)]


def randomise(model, seed=0, spread=1.0):
    """Every parameter of the connections and the head away from its start, as training would move it: mHC's fn
    larger (per-token weights that differ from token to token), its base and scale random; HC's static matrices
    off the pre-norm start, its dynamic projections and scales non-zero, its norm's weight off 1. spread scales
    the moves: at 1, comb's logits spread over about +-1 around their mean."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "_hc." in name or name.startswith("hc_head."):
                std = 0.1 if name.endswith("fn") and model.config.hc_kind == "mhc" else 0.3
                p.add_(spread * std * torch.randn(p.shape, generator=g))
    return model


# ---- the equations, written out in float64 ---------------------------------------------------------------------

def rms(v, eps):
    """v / sqrt(mean(v^2) + eps) over the last axis: an RMSNorm without a weight."""
    return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps)


def sinkhorn64(M, iters, eps):
    """Sinkhorn-Knopp as DeepseekV4HyperConnection runs it, written out: a column normalisation, then iters - 1 rounds
    of a row normalisation and a column one, each denominator + eps."""
    M = M / (M.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        M = M / (M.sum(-1, keepdim=True) + eps)
        M = M / (M.sum(-2, keepdim=True) + eps)
    return M


def weights64(conn, x, c):
    """(pre (B, T, n), post (B, T, n), comb (B, T, n, n)) of a connection on the streams x (B, T, n, d), float64.
    mHC (docs/mhc.md): [p, q, c] = RMSNorm(flatten(x)) fn^T, pre = sigmoid(s_0 p + b_p) + eps, post = 2 sigmoid(s_1 q
    + b_q), comb = Sinkhorn(softmax(s_2 c + b_c) + eps). HC: h_i = RMSNorm(x_i) g, [pre | comb] = [A_m | A_r] + s_a
    tanh(h W_a), post = B + s_b tanh(h W_b)."""
    n, x = c.hc_mult, x.double()
    if c.hc_kind == "mhc":
        z = rms(x.flatten(2), c.norm_eps) @ conn.fn.double().T  # (B, T, (2 + n) n)
        s, b = conn.scale.double(), conn.base.double()
        pre = torch.sigmoid(s[0] * z[..., :n] + b[:n]) + c.hc_eps
        post = 2 * torch.sigmoid(s[1] * z[..., n:2 * n] + b[n:2 * n])
        logits = (s[2] * z[..., 2 * n:] + b[2 * n:]).reshape(*z.shape[:-1], n, n)  # row j: old stream j
        return pre, post, sinkhorn64(torch.softmax(logits, -1) + c.hc_eps, c.hc_sinkhorn_iters, c.hc_eps)
    h = rms(x, c.norm_eps) * conn.norm.weight.double()  # each stream on its own
    p = {k: v.double() for k, v in conn.named_parameters()}
    alpha = p["static_alpha"] + p["dynamic_alpha_scale"] * torch.tanh(h @ p["dynamic_alpha_fn"])  # (B, T, n, n + 1)
    beta = p["static_beta"] + p["dynamic_beta_scale"] * torch.tanh(h @ p["dynamic_beta_fn"])  # (B, T, n)
    return alpha[..., 0], beta, alpha[..., 1:]


def head64(head, x, c):
    """The head's pre (B, T, n), float64: mHC's sigmoid(s RMSNorm(flatten(x)) fn^T + b) + eps; HC's mean, 1/n."""
    x = x.double()
    if c.hc_kind == "hc":
        return torch.full(x.shape[:-1], 1 / c.hc_mult, dtype=torch.float64)
    z = rms(x.flatten(2), c.norm_eps) @ head.hc_fn.double().T
    return torch.sigmoid(head.hc_scale.double() * z + head.hc_base.double()) + c.hc_eps


def mix64(pre, post, comb, x, sublayer):
    """A sublayer between the streams: it reads sum_i pre_i x_i; stream k becomes post_k F + sum_j comb_jk x_j."""
    y = sublayer((pre[..., None] * x).sum(2))
    return post[..., None] * y[..., None, :] + torch.einsum("btjk,btjd->btkd", comb, x)


def reference(model, idx):
    """The logits from the equations in float64, the unchanged sublayers run on a float64 copy."""
    m64, c, T = copy.deepcopy(model).double().eval(), model.config, idx.size(1)
    cos, sin = m64.rope_cos[:T], m64.rope_sin[:T]
    x = m64.tok_emb(idx)[:, :, None, :].expand(-1, -1, c.hc_mult, -1)  # the embedding in every stream
    with torch.no_grad():
        for b in m64.blocks:
            x = mix64(*weights64(b.attn_hc, x, c), x, lambda v: b.attn(b.attn_norm(v), cos, sin))
            x = mix64(*weights64(b.ffn_hc, x, c), x, lambda v: b.mlp(b.mlp_norm(v)))
        return m64.lm_head(m64.norm((head64(m64.hc_head, x, c)[..., None] * x).sum(2)))


def error(model, idx):
    """The model's logits against the float64 equations, relative to the largest logit."""
    with torch.no_grad():
        got = model(idx)[0]
    want = reference(model, idx)
    return ((got.double() - want).abs().max() / want.abs().max()).item()


PLANTS = {  # bugs planted in model_mhc.py's text, each a slip its equations invite: (text, replacement)
    "comb not transposed": ("torch.matmul(comb.type_as(x).transpose(-1, -2), x)", "torch.matmul(comb.type_as(x), x)"),
    "post without the 2": ("2 * torch.sigmoid(q * s[1] + bq)", "torch.sigmoid(q * s[1] + bq)"),
    "Sinkhorn starting with rows": ("comb.sum(-1 if i % 2 else -2", "comb.sum(-2 if i % 2 else -1"),
    "the head's scale left out": ("F.linear(h, self.hc_fn.float()) * self.hc_scale", "F.linear(h, self.hc_fn.float())"),
    "HC's comb in its pre's place": ("return a[..., 0], b, a[..., 1:]", "return a[..., -1], b, a[..., :-1]"),
}


@pytest.fixture
def planted(monkeypatch):
    """planted(bug): model_mhc.py with that bug, as a module of its own."""
    def load(bug):
        old, new = PLANTS[bug]
        source = open(model_mhc.__file__, encoding="utf-8").read()
        assert source.count(old) == 1, bug
        module = types.ModuleType("model_mhc_planted")
        monkeypatch.setitem(sys.modules, module.__name__, module)
        exec(compile(source.replace(old, new), model_mhc.__file__, "exec"), module.__dict__)
        return module
    return load


@pytest.mark.parametrize("case", CASES)
def test_forward_equals_the_equations_in_float64(case):
    model = randomise(build(**CASES[case])).eval()
    assert error(model, tokens()) < TOL
    # the test has power: the connections moved far enough that every comb is far from the start's
    for conn in connections(model):
        comb = conn(torch.randn(2, 5, model.config.hc_mult, SMALL["n_embd"]))[2]
        assert (comb - comb.mean((0, 1))).abs().max() > 0.05 or model.config.hc_kind == "hc"


@pytest.mark.parametrize("bug", PLANTS)
def test_the_equations_see_each_planted_bug(bug, planted):
    """The float64 equations catch each slip: a transposed comb (it is not symmetric), post in (0, 1), a Sinkhorn
    that ends on the rows (2 iterations: at 20 both orders near the same doubly stochastic matrix), the head's
    scale dropped, HC's pre read from comb's last column."""
    module = planted(bug)
    case = {"HC's comb in its pre's place": "hc", "Sinkhorn starting with rows": "mhc-2-iters"}.get(bug, "mhc")
    model = randomise(build(module, **CASES[case])).eval()
    assert error(model, tokens()) > 10 * TOL, bug  # the check above fails by a margin


def test_sinkhorn_is_written_as_the_shipped_loop():
    """model_mhc.sinkhorn's one loop (columns, then rows and columns in turn) is the shipped two-step loop."""
    logits = 3 * torch.randn(4, 5, 3, 3, dtype=torch.float64)
    for iters in (1, 2, 3, 20):
        want = sinkhorn64(torch.softmax(logits, -1) + 1e-6, iters, 1e-6)
        torch.testing.assert_close(model_mhc.sinkhorn(logits, iters, 1e-6), want, rtol=0, atol=1e-15)


def comb_sums(model, x):
    """The largest distance of a row sum and of a column sum of comb from 1, over every connection and token."""
    rows = cols = 0.0
    for conn in connections(model):
        pre, post, comb = conn(x)
        assert pre.dtype == post.dtype == comb.dtype == torch.float32
        assert (comb > 0).all() and (pre > 0).all() and ((post > 0) & (post < 2)).all()
        rows = max(rows, (comb.sum(-1) - 1).abs().max().item())
        cols = max(cols, (comb.sum(-2) - 1).abs().max().item())
    return rows, cols


@pytest.mark.parametrize("overrides", [{}, dict(hc_mult=3), dict(hc_mult=2)], ids=str)
def test_comb_is_doubly_stochastic(overrides):
    """Within 1e-5 at the start and with weights moved (comb's logits over +-0.3). The columns end every iteration
    (to eps); the rows are as close as 20 iterations bring them: up to 5e-3 off at logits over +-1, where more
    iterations close the gap, and far off after 2 (docs/mhc.md)."""
    x = torch.randn(3, 7, overrides.get("hc_mult", 4), SMALL["n_embd"])
    with torch.no_grad():
        for model in (build(**overrides), randomise(build(**overrides), spread=0.3)):
            rows, cols = comb_sums(model, x)
            assert rows < 1e-5 and cols < 1e-5, (rows, cols)
        rows, cols = comb_sums(randomise(build(**overrides)), x)
        assert cols < 1e-5 and rows > 1e-5, rows  # n 4: 3e-4, n 3: 4e-4, n 2: 5e-3
        assert comb_sums(randomise(build(**overrides, hc_sinkhorn_iters=200)), x)[0] < 1e-5
        assert comb_sums(randomise(build(**overrides, hc_sinkhorn_iters=2)), x)[0] > 1e-2


def test_the_connections_compute_in_float32_under_autocast():
    """bfloat16 autocast leaves the connections, comb's mix and the streams in float32 (transformers keeps them in
    float32 too): the same streams as without autocast, to float32's rounding."""
    model = randomise(build()).eval()
    x = torch.randn(2, 6, 4, SMALL["n_embd"])
    block = model.blocks[0]
    with torch.no_grad():
        plain = [block.attn_hc(x), model.hc_head(x)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = [block.attn_hc(x), model.hc_head(x)]
            streams = model_mhc.connect(block.attn_hc(x), x, lambda h: torch.zeros_like(h, dtype=torch.bfloat16))
    for a, b in zip([*plain[0], plain[1]], [*auto[0], auto[1]]):
        assert b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert streams.dtype == torch.float32
    comb = plain[0][2]
    torch.testing.assert_close(streams, torch.einsum("btjk,btjd->btkd", comb, x), rtol=1e-5, atol=1e-6)


# ---- the shipped code: transformers' deepseek_v4 ---------------------------------------------------------------

@pytest.fixture
def deepseek_v4():
    transformers = pytest.importorskip("transformers", reason="transformers' DeepSeek-V4 code is what model_mhc.py "
                                       "follows: pip install -r requirements-eval.txt")
    try:
        from transformers.models.deepseek_v4 import modeling_deepseek_v4
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no deepseek_v4 (5.25.0 has it)")
    return modeling_deepseek_v4


def their_config(c):
    """What DeepseekV4HyperConnection and DeepseekV4HyperHead read of a DeepseekV4Config."""
    return types.SimpleNamespace(hidden_size=c.n_embd, hc_mult=c.hc_mult, hc_sinkhorn_iters=c.hc_sinkhorn_iters,
                                 hc_eps=c.hc_eps, rms_norm_eps=c.norm_eps)


def theirs(deepseek_v4, conn, c):
    """transformers' DeepseekV4HyperConnection with the weights of conn (the same names)."""
    module = deepseek_v4.DeepseekV4HyperConnection(their_config(c))
    module.load_state_dict(conn.state_dict())
    return module


@pytest.mark.extras
@pytest.mark.parametrize("case", ["mhc", "mhc-2-iters", "mhc-n3"])
def test_connection_and_head_equal_transformers(deepseek_v4, case):
    model = randomise(build(**CASES[case])).eval()
    c = model.config
    x = 0.5 * torch.randn(2, 9, c.hc_mult, c.n_embd)
    with torch.no_grad():
        for conn in connections(model):
            pre, post, comb = conn(x)
            their_post, their_comb, collapsed = theirs(deepseek_v4, conn, c)(x)
            torch.testing.assert_close(post, their_post, rtol=0, atol=1e-6)
            torch.testing.assert_close(comb, their_comb, rtol=0, atol=1e-6)
            torch.testing.assert_close(model_mhc.collapse(pre, x), collapsed, rtol=0, atol=1e-6)
        head = deepseek_v4.DeepseekV4HyperHead(their_config(c))
        head.load_state_dict(model.hc_head.state_dict())
        torch.testing.assert_close(model_mhc.collapse(model.hc_head(x), x), head(x), rtol=0, atol=1e-6)


@pytest.mark.extras
def test_block_is_transformers_decoder_layer_around_the_same_sublayers(deepseek_v4):
    """DeepseekV4DecoderLayer.forward itself, run with transformers' connections (the block's weights) around this
    block's attention, MLP and norms, gives the block's streams: comb^T x, post (x) F, in that layer's order."""
    model = randomise(build()).eval()
    c, T = model.config, 9
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]
    x = torch.randn(2, T, c.hc_mult, c.n_embd)
    with torch.no_grad():
        for block in model.blocks:
            layer = types.SimpleNamespace(
                attn_hc=theirs(deepseek_v4, block.attn_hc, c), ffn_hc=theirs(deepseek_v4, block.ffn_hc, c),
                input_layernorm=block.attn_norm, post_attention_layernorm=block.mlp_norm,
                self_attn=lambda h, **kwargs: (block.attn(h, cos, sin), None),
                mlp=lambda h, input_ids=None: block.mlp(h))
            forward = deepseek_v4.DeepseekV4DecoderLayer.forward  # its text, not the checkpointing wrapper
            want = getattr(forward, "__wrapped__", forward)(layer, x)
            got = block(x, cos, sin)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
            x = got


@pytest.mark.extras
def test_parameter_names_shapes_and_start_are_transformers(deepseek_v4):
    """The names and shapes of DeepseekV4HyperConnection and DeepseekV4HyperHead, and _init_weights' start: fn normal
    at the model's std (0.02 here, transformers' initializer_range), base 0, scale 1."""
    model = build(n_layer=6, n_embd=64)
    c = model.config
    def shapes(module):
        return {k: v.shape for k, v in module.state_dict().items()}
    for conn in connections(model):
        assert shapes(conn) == shapes(deepseek_v4.DeepseekV4HyperConnection(their_config(c)))
    assert shapes(model.hc_head) == shapes(deepseek_v4.DeepseekV4HyperHead(their_config(c)))
    assert [n for n, _ in model.blocks[0].named_children()][:1] == ["attn_hc"] and hasattr(model.blocks[0], "ffn_hc")
    fn = torch.cat([conn.fn.flatten() for conn in connections(model)] + [model.hc_head.hc_fn.flatten()])
    assert abs(fn.mean().item()) < 1e-3 and fn.std().item() == pytest.approx(0.02, rel=0.02)
    for conn in connections(model):
        assert torch.equal(conn.base, torch.zeros_like(conn.base)) and torch.equal(conn.scale, torch.ones(3))
    assert torch.equal(model.hc_head.hc_base, torch.zeros(4)) and torch.equal(model.hc_head.hc_scale, torch.ones(1))


# ---- HC contains the baseline ------------------------------------------------------------------------------------

def test_hc_starts_as_vanilla_exactly():
    """HC's static matrices start as the pre-norm residual and its dynamic parts at 0: with vanilla's weights the
    logits, the loss, every block's output (as the head reads it) and greedy generation with the cache are vanilla's,
    to the bit; and the same seed gives vanilla's weights, the connections drawing no random numbers."""
    vanilla = build(model_vanilla, seed=3).eval()
    hc = build(seed=4, hc_kind="hc").eval()
    missing, unexpected = hc.load_state_dict(vanilla.state_dict(), strict=False)
    assert unexpected == [] and missing and all("_hc." in k for k in missing)
    idx = tokens(B=3, T=40)
    with torch.no_grad():
        a, loss_a, hidden_a = vanilla(idx, targets=idx, return_hidden=True)
        b, loss_b, hidden_b = hc(idx, targets=idx, return_hidden=True)
    assert torch.equal(a, b) and torch.equal(loss_a, loss_b)
    assert all(torch.equal(x, y) for x, y in zip(hidden_a, hidden_b))
    prompt = idx[:, :5]
    assert torch.equal(generate(vanilla, prompt, 20, temperature=0), generate(hc, prompt, 20, temperature=0))
    same = build(model_vanilla, seed=5).state_dict()
    assert all(torch.equal(v, build(seed=5, hc_kind="hc").state_dict()[k]) for k, v in same.items())


def test_hc_static_start_is_the_papers():
    """[A_m | A_r] = [e_(k mod n) | I] for sublayer k + 1 (k from 0: block i's attention is 2i - 2, its MLP 2i - 1),
    B = 1, the dynamic projections 0 and their scales 0.01; stats() and the depth map start where the layout says."""
    model = build(hc_kind="hc", n_layer=3, hc_mult=4)
    eye = torch.eye(4)
    for k, conn in enumerate(connections(model)):
        assert torch.equal(conn.static_alpha, torch.cat((eye[:, k % 4, None], eye), 1))
        assert torch.equal(conn.static_beta, torch.ones(4))
        assert not conn.dynamic_alpha_fn.any() and not conn.dynamic_beta_fn.any()
        assert conn.dynamic_alpha_scale.item() == conn.dynamic_beta_scale.item() == pytest.approx(0.01)
    idx = tokens()
    assert model.stats(idx) == {"hc_gain": 1.0}
    torch.testing.assert_close(model.depth_map(idx), model.depth_map_layout()["start"], rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_every_connection_parameter_learns(kind):
    """At step 0 HC is vanilla, and yet its connections get gradients, the dynamic projections W through tanh'(0) = 1;
    all but the two scales and the norm's weight, which meet W = 0: they learn from the second step. mHC's parameters
    all learn from the first."""
    model = build(**KINDS[kind])
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=1e-2)
    idx = tokens()
    for step in range(2):
        opt.zero_grad()
        model(idx, targets=torch.roll(idx, -1, 1))[1].backward()
        for name, p in model.named_parameters():
            if "_hc." in name or name.startswith("hc_head."):
                learns = step == 1 or kind == "mhc" or not name.endswith(("_scale", "norm.weight"))
                assert p.grad is not None and torch.isfinite(p.grad).all() and (p.grad.abs().sum() > 0) == learns, name
        opt.step()


# ---- parameters and FLOPs ----------------------------------------------------------------------------------------

def extra_params(kind, L, n, d):
    """docs/mhc.md's counts. mHC: 2L connections of (2 + n) n (n d + 1) + 3, the head n (n d + 1) + 1. HC: 2L
    connections of d (n + 3) + n (n + 2) + 2 (norm weight d, W_a d (n + 1), W_b d, A_m and A_r n (n + 1), B n,
    two scales), no head."""
    if kind == "mhc":
        return 2 * L * ((2 + n) * n * (n * d + 1) + 3) + n * (n * d + 1) + 1
    return 2 * L * (d * (n + 3) + n * (n + 2) + 2)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("L,n,d", [(1, 1, 32), (2, 2, 32), (3, 4, 32), (6, 4, 128), (12, 4, 768), (4, 3, 64)])
def test_parameter_count(kind, L, n, d):
    shape = dict(n_layer=L, n_embd=d, n_head=4, n_kv_head=2, ffn_hidden=2 * d)
    ours = model_mhc.GPT(model_mhc.GPTConfig(**{**SMALL, **shape, "hc_mult": n, "hc_kind": kind}))
    vanilla = model_vanilla.GPT(model_vanilla.GPTConfig(**{**SMALL, **shape}))
    assert n_params(ours) - n_params(vanilla) == extra_params(kind, L, n, d)
    if (kind, L, n, d) == ("mhc", 12, 4, 768):  # the 12 x 768 shape: 1.4% of a GPT-2 small's 124M
        assert extra_params(kind, L, n, d) == 1_782_413
    if (kind, L, n, d) == ("hc", 12, 4, 768):
        assert extra_params(kind, L, n, d) == 129_648


@pytest.mark.parametrize("kind", KINDS)
def test_flops_count_the_connections(kind):
    """flops_per_token adds 6 x the connections' multiply-adds per token to vanilla's (docs/mhc.md)."""
    L, n, d = 6, 4, 128
    ours, vanilla = build(n_layer=L, n_embd=d, hc_kind=kind), build(model_vanilla, n_layer=L, n_embd=d)
    per = (2 + n) * n * n * d if kind == "mhc" else 2 * (n + 2) * n * d
    head = (n + 1) * n * d if kind == "mhc" else n * d
    assert ours.flops_per_token(64) - vanilla.flops_per_token(64) == 6 * (2 * L * per + head)


# ---- the Amax gain: stats() ----------------------------------------------------------------------------------------

def with_combs(combs):
    """A one-block model (n = 2) whose two connections return the given combs (B, T, 2, 2), pre and post 1."""
    model = build(n_layer=1, hc_mult=2).eval()
    for conn, comb in zip(connections(model), combs):
        conn.forward = lambda x, comb=comb: (torch.ones(x.shape[:-1]), torch.ones(x.shape[:-1]), comb)
    return model


def test_gain_on_a_hand_built_example():
    """Per token: P = comb_1 comb_2, then the larger of max_j sum_k |P_jk| and max_k sum_j |P_jk|. Token 1:
    [[2, 0], [-1, 2]] [[-1, -1], [2, 0]] = [[-2, -2], [5, 1]], rows 4 and 6, columns 7 and 3: 7 (in the reverse
    order, [[-1, -2], [4, 0]]: 5). Token 2: [[4, 4], [0, 1]] I, rows 8 and 1, columns 4 and 5: 8. The gain of the
    two tokens is 8, their max; of token 1 alone 7, on its columns."""
    one = torch.tensor([[[2., 0.], [-1., 2.]]]), torch.tensor([[[-1., -1.], [2., 0.]]])
    two = torch.tensor([[[4., 4.], [0., 1.]]]), torch.eye(2)[None]
    idx = tokens(B=1, T=2)
    assert with_combs([one[0][None], one[1][None]]).stats(idx[:, :1]) == {"hc_gain": 7.0}
    assert with_combs([two[0][None], two[1][None]]).stats(idx[:, :1]) == {"hc_gain": 8.0}
    both = [torch.cat((one[i], two[i]))[None] for i in range(2)]  # (1, 2, 2, 2): token 1, then token 2
    assert with_combs(both).stats(idx) == {"hc_gain": 8.0}


def test_gain_is_one_at_the_start_and_for_doubly_stochastic_combs():
    """mHC's every comb is doubly stochastic (to Sinkhorn's tolerance), so is their product: gain 1 at the start and
    after any change of its weights; HC's starts at 1 (the identity) and grows once A_r moves off it."""
    idx = tokens()
    assert build().stats(idx)["hc_gain"] == pytest.approx(1.0, abs=1e-4)
    assert randomise(build(), spread=0.3).stats(idx)["hc_gain"] == pytest.approx(1.0, abs=1e-4)
    assert randomise(build()).stats(idx)["hc_gain"] == pytest.approx(1.0, abs=2e-3)  # rows 3e-4 off in 6 combs
    assert build(hc_kind="hc").stats(idx) == {"hc_gain": 1.0}
    assert randomise(build(hc_kind="hc")).stats(idx)["hc_gain"] > 1.5


def test_gain_is_logged_by_train_and_printed_by_eval(data_dir, tmp_path, capsys):
    """train.py logs stats() at each evaluation; eval.py prints the same numbers under the loss (and in --json)."""
    run = tmp_path / "run"
    train.main(["--model", "mhc", "--data_dir", data_dir, "--out_dir", str(run), "--max_iters=2",
                "--eval_interval=2", *TINY])
    logged = [json.loads(line) for line in open(run / "log.jsonl")]
    gains = [r["hc_gain"] for r in logged if "val_loss" in r]
    assert gains and all(g == pytest.approx(1.0, abs=1e-3) for g in gains)
    code, out, err = run_script("eval.py", ["--out_dir", run, "--tokens=200", "--device=cpu"], capsys)
    assert code in (0, None), err
    line = next(l for l in out.splitlines() if "stats" in l)
    assert "model_mhc.py's stats()" in line
    assert float(line.split("hc_gain ")[1].split()[0]) == pytest.approx(1.0, abs=1e-3)
    code, out, err = run_script("eval.py", ["--out_dir", run, "--tokens=200", "--device=cpu", "--json"], capsys)
    assert json.loads(out)["stats"]["hc_gain"] == pytest.approx(1.0, abs=1e-3)


# ---- per token: causality and the cache, away from the start --------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_causal_away_from_the_start(kind):
    """The connections are per token: a later token changes no earlier position's logits, for any weights."""
    model = randomise(build(**KINDS[kind])).eval()
    idx = tokens(T=32)
    changed = idx.clone()
    changed[:, 20:] = tokens(T=12, seed=2)
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :20], b[:, :20], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, 20:], b[:, 20:])


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_generation_with_cache_equals_without_away_from_the_start(kind):
    """The cache is vanilla's (the attention's keys and values): past block_size too, where the window restarts."""
    model = randomise(build(**KINDS[kind], block_size=16)).eval()
    prompt = tokens(T=6)
    assert torch.equal(generate(model, prompt, 30, temperature=0, use_cache=True),
                       generate(model, prompt, 30, temperature=0, use_cache=False))


@pytest.mark.slow  # inductor compiles the decode step: about a minute
def test_compiled_decode_step_equals_recomputation_away_from_the_start():
    from generate import compile_decode_step
    torch._dynamo.reset()
    model = randomise(build(block_size=16, n_layer=2)).eval()
    step = compile_decode_step(model, torch.device("cpu"))
    prompt = tokens(T=5)
    assert torch.equal(generate(model, prompt, 40, temperature=0, step=step),
                       generate(model, prompt, 40, temperature=0, use_cache=False))


# ---- what eval.py draws --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_depth_map_is_each_connections_mean_weights(kind):
    """Row r: sublayer r's pre, post and comb (by rows), each the mean over the tokens; the head's pre last, the rest
    of its row not read. Where the layout says each starts, and the wiring's sources are the sublayers."""
    model = randomise(build(**KINDS[kind])).eval()
    c, idx = model.config, tokens()
    n, L = c.hc_mult, c.n_layer
    m = model.depth_map(idx)
    assert m.shape == (2 * L + 1, 2 * n + n * n)
    *subs, head = model.connection_weights(idx)
    for r, (pre, post, comb) in enumerate(subs):
        torch.testing.assert_close(m[r, :n], pre.mean((0, 1)))
        torch.testing.assert_close(m[r, n:2 * n], post.mean((0, 1)))
        torch.testing.assert_close(m[r, 2 * n:].view(n, n), comb.mean((0, 1)))
    torch.testing.assert_close(m[-1, :n], head.mean((0, 1)))
    layout = model.depth_map_layout()
    assert layout["start"].shape == m.shape and layout["valid"].shape == m.shape
    assert layout["valid"][:-1].all() and layout["valid"][-1].tolist() == [True] * n + [False] * (n + n * n)
    assert layout["columns"][:2] == ["pre1", "pre2"] and layout["columns"][2 * n] == "c11"
    points, labels, update = model.wiring_points()
    assert len(points) == 2 * L and labels[:3] == ["a1", "m1", "a2"] and update is False
