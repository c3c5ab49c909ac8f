"""DenseFormer's depth-weighted average (model_dwa.py): the method's own properties, besides the contract suite."""
import copy
import math
import types

import pytest
import torch

import model_dwa
import model_vanilla
import model_vertical
import train
from generate import generate
from plumbing.config import make_config

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(vocab_size=257, block_size=64, n_layer=6, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64)
# the three maps, and DenseFormer's k x p models (dilation k, period p): 2 x 1, 1 x 2, 2 x 2, 3 x 2, and a period
# that does not divide L (4 with 6 layers: one DWA, after block 4; blocks 5 and 6 chain as in vanilla)
MAPS = {"dense": {}, "x0": dict(dwa_map="x0"), "unet": dict(dwa_map="unet"), "2x1": dict(dwa_dilation=2),
        "1x2": dict(dwa_period=2), "2x2": dict(dwa_dilation=2, dwa_period=2),
        "3x2": dict(dwa_dilation=3, dwa_period=2), "1x4": dict(dwa_period=4)}


def build(module, seed=0, **overrides):
    torch.manual_seed(seed)
    return module.GPT(module.GPTConfig(**{**SMALL, **overrides}))


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def tokens(B=2, T=24, seed=1):
    return torch.randint(0, SMALL["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def expected_sources(L, dwa_map="dense", k=1, p=1):
    """The j of each row's alpha_{i,j} (i = 1..L), from the definitions (model docstring, docs/dwa.md), written out
    here on their own: dense: every j <= i with i - j divisible by k, in the rows i divisible by p (none elsewhere);
    x0: j = 0 and i; unet: i, and L - i in the rows L/2 < i < L."""
    if dwa_map == "x0":
        return [[0, i] for i in range(1, L + 1)]
    if dwa_map == "unet":
        return [sorted({i, L - i}) if 2 * i > L and i < L else [i] for i in range(1, L + 1)]
    return [[j for j in range(0, i + 1) if (i - j) % k == 0] if i % p == 0 else [] for i in range(1, L + 1)]


def randomise(model, seed=0):
    """Every alpha away from the identity: signed, unnormalised, the newest output's weight near 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for row in model.dwa_alpha:
            row.copy_(0.4 * torch.randn(row.shape, generator=g))
            row[0, -1] += 1.0
    return model


def alpha_matrix(model):
    """alpha as an L x (L+1) float64 matrix from the parameters and expected_sources (rows without a DWA: 0)."""
    c = model.config
    A = torch.zeros(c.n_layer, c.n_layer + 1, dtype=torch.float64)
    rows = iter(model.dwa_alpha)
    for i, src in enumerate(expected_sources(c.n_layer, c.dwa_map, c.dwa_dilation, c.dwa_period), start=1):
        if src:
            A[i - 1, src] = next(rows).detach().double()[0]
    assert next(rows, None) is None  # one parameter row per DWA, no more
    return A


def reference(model, idx):
    """The equation in float64, the blocks run here one by one on a float64 copy: X_0 = the embedding,
    X_i = Block_i(Y_{i-1}), Y_i = sum_j alpha_{i,j} X_j (Y_i = X_i where no DWA follows block i), head on Y_L."""
    m64 = copy.deepcopy(model).double().eval()
    c, A = model.config, alpha_matrix(model)
    sources = expected_sources(c.n_layer, c.dwa_map, c.dwa_dilation, c.dwa_period)
    T = idx.size(1)
    cos, sin = m64.rope_cos[:T], m64.rope_sin[:T]
    X = [m64.tok_emb(idx)]
    y, ys = X[0], []
    with torch.no_grad():
        for i, block in enumerate(m64.blocks, start=1):
            X.append(block(y, cos, sin))
            if sources[i - 1]:
                y = sum(A[i - 1, j] * X[j] for j in range(i + 1))
            else:
                y = X[i]
            ys.append(y)
        logits = m64.lm_head(m64.norm(y))
    return logits, ys


# ---- the equation --------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", MAPS)
def test_forward_equals_the_equation_in_float64(variant):
    model = randomise(build(model_dwa, **MAPS[variant])).eval()
    idx = tokens()
    want_logits, want_hidden = reference(model, idx)
    with torch.no_grad():
        logits, _, hidden = model(idx, return_hidden=True)
        logits64, _, hidden64 = copy.deepcopy(model).double()(idx, return_hidden=True)
    assert len(hidden) == model.config.n_layer
    # the model in float64 computes the same sums in the same order: equal to rounding
    torch.testing.assert_close(logits64, want_logits, rtol=1e-12, atol=1e-12)
    for got, want in zip(hidden64, want_hidden):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # the model in float32 against float64, relative to each token's vector
    for got, want in zip([*hidden, logits], [*want_hidden, want_logits]):
        err = (got.double() - want).norm(dim=-1) / want.norm(dim=-1)
        assert err.max() < 1e-5, err.max()
    # the test has power: the alpha moved far enough that the model is not vanilla's chain
    vanilla = build(model_vanilla).eval()
    vanilla.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        assert (vanilla(idx)[0] - logits).abs().max() > 1e-2


@pytest.mark.parametrize("variant", MAPS)
def test_depth_map_puts_alpha_where_the_equation_does(variant):
    model = randomise(build(model_dwa, **MAPS[variant]))
    c, A = model.config, alpha_matrix(model)
    L = c.n_layer
    for i, src in enumerate(expected_sources(L, c.dwa_map, c.dwa_dilation, c.dwa_period), start=1):
        if not src:  # no DWA after block i: Y_i = X_i
            A[i - 1, i] = 1.0
    torch.testing.assert_close(model.depth_map().double(), A, rtol=0, atol=0)
    assert model.depth_map(tokens()).shape == (L, L + 1)  # idx is accepted and not needed


# ---- the method contains the baseline -------------------------------------------------------------------

@pytest.mark.parametrize("variant", MAPS)
def test_identity_init_reproduces_vanilla_exactly(variant):
    vanilla = build(model_vanilla, seed=3).eval()
    dwa = build(model_dwa, seed=4, **MAPS[variant]).eval()  # another seed: every weight must come from vanilla
    missing, unexpected = dwa.load_state_dict(vanilla.state_dict(), strict=False)
    assert unexpected == [] and missing and all(k.startswith("dwa_alpha.") for k in missing)
    for row in dwa.dwa_alpha:  # alpha_{i,i} = 1, the rest 0 (the newest output is each row's last)
        assert torch.equal(row, torch.eye(row.size(1))[-1:])
    idx = tokens(B=3, T=40)
    with torch.no_grad():
        a, loss_a, hidden_a = vanilla(idx, targets=idx, return_hidden=True)
        b, loss_b, hidden_b = dwa(idx, targets=idx, return_hidden=True)
    assert torch.equal(a, b) and torch.equal(loss_a, loss_b)
    assert all(torch.equal(x, y) for x, y in zip(hidden_a, hidden_b))
    prompt = idx[:, :5]  # and generation with the cache
    assert torch.equal(generate(vanilla, prompt, 20, temperature=0), generate(dwa, prompt, 20, temperature=0))
    assert dwa.stats() == {"dwa_self": 1.0, "dwa_older": 0.0}


def test_same_seed_gives_vanilla_weights():
    """alpha is initialised without drawing random numbers: a seed gives vanilla's weights."""
    vanilla, dwa = build(model_vanilla, seed=5), build(model_dwa, seed=5)
    theirs = dwa.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in vanilla.state_dict().items())


@pytest.mark.parametrize("variant", MAPS)
def test_every_alpha_gets_a_gradient_at_the_identity(variant):
    """At step 0 the model is vanilla, and yet every alpha_{i,j} learns: dloss/dalpha_{i,j} = <dloss/dY_i, X_j>."""
    model = build(model_dwa, **MAPS[variant])
    idx = tokens()
    model(idx, targets=torch.roll(idx, -1, 1))[1].backward()
    for row in model.dwa_alpha:
        assert row.grad is not None and torch.isfinite(row.grad).all() and (row.grad != 0).all(), row.grad
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=1e-2)
    before = [row.detach().clone() for row in model.dwa_alpha]
    opt.step()
    assert all((row != b).all() for row, b in zip(model.dwa_alpha, before))


@pytest.mark.parametrize("variant", MAPS)
def test_greedy_generation_with_cache_equals_without_away_from_the_identity(variant):
    """The contract suite checks the cache at init, where the model is vanilla; here alpha is random."""
    model = randomise(build(model_dwa, **MAPS[variant])).eval()
    prompt = tokens(T=6)
    assert torch.equal(generate(model, prompt, 30, temperature=0, use_cache=True),
                       generate(model, prompt, 30, temperature=0, use_cache=False))


@pytest.mark.parametrize("variant", ["dense", "x0", "unet", "2x2"])
def test_causal_away_from_the_identity(variant):
    """The contract suite checks causality at init, where the model is vanilla; the mix is per token, so a later
    token changes no earlier position's logits for any alpha."""
    model = randomise(build(model_dwa, **MAPS[variant])).eval()
    idx = tokens(T=32)
    changed = idx.clone()
    changed[:, 20:] = tokens(T=12, seed=2)
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :20], b[:, :20], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, 20:], b[:, 20:])


@pytest.mark.slow  # inductor compiles the decode step: about a minute
def test_compiled_decode_step_equals_recomputation_away_from_the_identity():
    """tests/test_decode.py compiles every model's step (as sample.py --compile does) at init, where alpha is the
    identity; here alpha is random, past block_size where the window restarts."""
    from generate import compile_decode_step
    torch._dynamo.reset()
    model = randomise(build(model_dwa, block_size=16, n_layer=4)).eval()
    step = compile_decode_step(model, torch.device("cpu"))
    prompt = tokens(T=5)
    assert torch.equal(generate(model, prompt, 40, temperature=0, step=step),
                       generate(model, prompt, 40, temperature=0, use_cache=False))


# ---- parameters, and DenseFormer's code ------------------------------------------------------------------

@pytest.mark.parametrize("n_layer", [1, 2, 3, 6, 7, 12])
@pytest.mark.parametrize("dwa_map", ["dense", "x0", "unet"])
def test_parameter_count(n_layer, dwa_map):
    L = n_layer
    extra = n_params(build(model_dwa, n_layer=L, dwa_map=dwa_map)) - n_params(build(model_vanilla, n_layer=L))
    assert extra == {"dense": L * (L + 3) // 2, "x0": 2 * L, "unet": L + math.ceil(L / 2) - 1}[dwa_map]
    if dwa_map == "dense":
        assert extra == {1: 2, 2: 5, 3: 9, 6: 27, 7: 35, 12: 90}[L]


def dwamodules_rows(L, k, p):
    """denseformer/denseformer.py's DWAModules (epfml/DenseFormer): after block index i (0-based), where
    (i + 1) % p == 0, a Linear((i + 1 + k) // k, 1); None elsewhere."""
    return [(i + 1 + k) // k if (i + 1) % p == 0 else 0 for i in range(L)]


def experiments_rows(L, k, p):
    """experiments/models/denseformer.py: n_repeat = L // p groups of p blocks (increase_T_every = p), after group
    i (0-based) a Linear((i + 2 + k - 1) // k, 1)."""
    return [(i + 2 + k - 1) // k for i in range(L // p)]


def accumulator_sources(L, k, p, every_block):
    """The outputs a DWA reads in DenseFormer's code, from its accumulators: k tensors, group g holding the outputs
    numbered n with n % k == g at index n // k ((L' + 1) // k entries, one more for g < (L' + 1) % k); the output
    numbered n is written there and the DWA after it reads group n % k's entries [:n // k + 1]. every_block=True:
    DWAModules, which numbers every block's output (n = i) and reads only where p divides i; False: the experiments
    model, which numbers the outputs of its groups of p blocks (n = i / p, X_i with i = n p). Returns the j of X_j
    per row i = 1..L ([] where no DWA follows block i)."""
    n_out = L if every_block else L // p
    sizes = [(n_out + 1) // k + (g < (n_out + 1) % k) for g in range(k)]
    acc = [[None] * size for size in sizes]
    acc[0][0] = 0  # X_0, the embedding
    rows = [[] for _ in range(L)]
    for n in range(1, n_out + 1):
        i = n if every_block else n * p  # the block whose output this is
        acc[n % k][n // k] = i
        if i % p == 0:
            rows[i - 1] = acc[n % k][:n // k + 1]
    return rows


KP = [(k, p) for k in (1, 2, 3, 4) for p in (1, 2, 3, 4)]


@pytest.mark.parametrize("n_layer", [4, 6, 8, 12])
@pytest.mark.parametrize("k,p", KP, ids=[f"{k}x{p}" for k, p in KP])
def test_k_x_p_rows_follow_denseformers_code(n_layer, k, p):
    """The rows and sources of the k x p models against DenseFormer's code, re-implemented above. Its two versions
    agree for p = 1; for p > 1 the experiments model reads only the outputs of groups of p blocks, every k-th of
    them, where DWAModules (and the paper's definition) reads every k-th block output: model_dwa.py follows the
    second."""
    L = n_layer
    model = build(model_dwa, n_layer=L, dwa_dilation=k, dwa_period=p)
    sizes = [len(s) for s in model.dwa_sources]
    assert [row.numel() for row in model.dwa_alpha] == [n for n in sizes if n]
    assert n_params(model) - n_params(build(model_vanilla, n_layer=L)) == sum(sizes)
    assert model.dwa_sources == expected_sources(L, "dense", k, p)
    assert sizes == dwamodules_rows(L, k, p)
    assert model.dwa_sources == accumulator_sources(L, k, p, every_block=True)
    if L % p == 0:  # the experiments model (it asserts that p divides L): the same rows, a subset of the sources
        experiments = accumulator_sources(L, k, p, every_block=False)
        assert [len(s) for s in experiments if s] == experiments_rows(L, k, p)
        assert [bool(s) for s in model.dwa_sources] == [bool(s) for s in experiments]
        assert all(set(theirs) <= set(ours) for ours, theirs in zip(model.dwa_sources, experiments))
        assert (experiments == model.dwa_sources) == (p == 1)


def test_the_reimplementations_of_denseformers_code_can_fail():
    """The re-implementations are not the model's rule restated: they differ from it where the code does."""
    assert accumulator_sources(6, 2, 2, every_block=True)[3] == [0, 2, 4]  # DWAModules: every 2nd output
    assert accumulator_sources(6, 2, 2, every_block=False)[3] == [0, 4]  # experiments: every 2nd group output
    assert accumulator_sources(6, 2, 1, every_block=True)[4] == [1, 3, 5]
    assert dwamodules_rows(6, 2, 2) == [0, 2, 0, 3, 0, 4] and experiments_rows(6, 2, 2) == [1, 2, 2]


@pytest.mark.parametrize("n_layer", [2, 3, 4, 5, 6, 7, 8, 12])
def test_unet_pairs_are_model_verticals_unet_map(n_layer):
    """Row i here (the DWA after block i, which block i + 1 reads) is model_vertical.py's layer i + 1, whose source
    s is X_{s-1}: the same pairs for rows 1..L-1 (row L feeds the head, which vertical does not mix)."""
    L = n_layer
    dwa = build(model_dwa, n_layer=L, dwa_map="unet")
    vertical = model_vertical.fixed_map("unet", L)
    for i in range(1, L):
        assert dwa.dwa_sources[i - 1] == [s for s in range(L) if vertical[i, s] > 0], i  # layer i+1, sources X_s
    assert dwa.dwa_sources[L - 1] == [L]
    assert sum(len(s) == 2 for s in dwa.dwa_sources) == math.ceil(L / 2) - 1


# ---- the optimiser and the rules -------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["dense", "x0", "unet", "2x2"])
def test_alpha_is_weight_decayed_at_the_models_learning_rate(variant):
    """As in DenseFormer's experiments code: each row a Linear weight, in the decayed group, at the model's lr."""
    model = build(model_dwa, **MAPS[variant])
    cfg = types.SimpleNamespace(weight_decay=0.1, learning_rate=3e-3, beta1=0.9, beta2=0.95, adam_eps=1e-8)
    opt = train.make_optimizer(model, cfg, torch.device("cpu"))
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())  # every parameter exactly once
    alpha = {id(row) for row in model.dwa_alpha}
    assert alpha and all(row.dim() == 2 and row.size(0) == 1 for row in model.dwa_alpha)
    for g in opt.param_groups:
        if alpha & {id(p) for p in g["params"]}:
            assert alpha <= {id(p) for p in g["params"]}
            assert g["weight_decay"] == 0.1 and g["lr"] == 3e-3
    assert all(g["lr"] == 3e-3 for g in opt.param_groups)  # no group brings its own lr


@pytest.mark.parametrize("dwa_map", ["x0", "unet"])
@pytest.mark.parametrize("rule", [dict(dwa_dilation=2), dict(dwa_period=2), dict(dwa_dilation=3, dwa_period=2)])
def test_dilation_and_period_thin_only_the_dense_map(dwa_map, rule):
    with pytest.raises(ValueError, match="--dwa_map " + dwa_map):
        model_dwa.GPTConfig(**SMALL, dwa_map=dwa_map, **rule)
    model_dwa.GPTConfig(**SMALL, **rule)  # dense takes them


def test_a_period_past_the_depth_is_refused():
    """A period longer than the stack leaves no DWA at all (a vanilla model whose stats() would have no alpha)."""
    model_dwa.GPTConfig(**SMALL, dwa_period=6)  # one DWA, after the last block
    with pytest.raises(ValueError, match="--dwa_period 7 leaves the 6 blocks without a DWA"):
        model_dwa.GPTConfig(**SMALL, dwa_period=7)


@pytest.mark.parametrize("bad", [dict(dwa_map="full"), dict(dwa_dilation=0), dict(dwa_period=0)])
def test_bad_option_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        make_config(model_dwa.GPTConfig, **SMALL, **bad)
