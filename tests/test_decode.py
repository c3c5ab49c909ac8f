"""decode_step: generation prefills with forward() and then takes one-token steps with static shapes (the whole
preallocated cache, a mask of the filled positions, the position as a tensor). Greedy tokens equal full
recomputation (use_cache=False) in float32 and float64, eager and under torch.compile (inductor), also past
block_size where the window restarts; compiled, the step is one graph that does not recompile from token to token."""
import functools
import importlib

import pytest
import torch

from conftest import model_cases, model_names
from generate import compile_decode_step, decode_step, generate

# block_size 16: 40 new tokens after a prompt of 5 restart the window four times (at 17, 26, 35 and 44 tokens)
# from its last 8 tokens
TINY = dict(vocab_size=257, block_size=16, n_layer=4, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64)
CASES = model_cases()
IDS = [f"{name}-{variant}" for name, variant, _ in CASES]
pytestmark = pytest.mark.usefixtures("one_thread")


def build(name, overrides, dtype=torch.float32, **extra):
    module = importlib.import_module(f"model_{name}")
    torch.manual_seed(0)
    return module.GPT(module.GPTConfig(**{**TINY, **overrides, **extra})).to(dtype).eval()


def prompt(batch=2, length=5):
    return torch.randint(0, TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(1))


def skip_modes(model):
    """generate()'s keyword sets: skipmiddle with and without skipping for real, the others none."""
    return [dict(skip=False), dict(skip=True)] if getattr(model.config, "gated", False) else [{}]


def eager(model):
    return functools.partial(decode_step, model)


def spy_positions(step):
    """(positions seen, a step that records the position of every call and then takes step, compiled or not)."""
    seen = []

    def spy(idx, input_pos, cache):
        seen.append(int(input_pos))
        return step(idx, input_pos, cache)
    return seen, spy


def check_positions(seen, steps, restarts):
    """Each step one position after the last, except after a restart of the window: the cache was full (the
    last step wrote block_size - 1) and the next step follows a prefill of block_size // 2 tokens."""
    S = TINY["block_size"]
    pairs = list(zip(seen, seen[1:]))
    assert len(seen) == steps and all(b == a + 1 or (a, b) == (S - 1, S // 2) for a, b in pairs), seen
    assert pairs.count((S - 1, S // 2)) == restarts, seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name,variant,overrides", CASES, ids=IDS)
def test_static_steps_equal_recomputation_through_the_rollover(name, variant, overrides, dtype):
    model = build(name, overrides, dtype)
    seen, spy = spy_positions(eager(model))
    for kw in skip_modes(model):
        seen.clear()
        steps = generate(model, prompt(), 40, temperature=0, step=spy, **kw)
        assert steps.shape == (2, 45)
        assert torch.equal(steps, generate(model, prompt(), 40, temperature=0, use_cache=False, **kw))
        check_positions(seen, steps=35, restarts=3)  # and 5 prefills: the prompt, 4 restarts (the last at the end)


def gates_that_skip(model):
    """skipmiddle with gates N(0, 0.3): some tokens skip some blocks, some blocks no row runs (checked below)."""
    with torch.no_grad():
        for gate in model.gates:
            gate.weight.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(2))
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_skipmiddle_steps_skip_for_real_and_equal_recomputation(dtype):
    model = gates_that_skip(build("skipmiddle", {}, dtype))
    calls = [0]
    for block in model.blocks:
        block.register_forward_pre_hook(lambda m, args: calls.__setitem__(0, calls[0] + 1))
    step, block_calls, ran, looks = eager(model), [], [], []

    def spy(idx, input_pos, cache):  # per step: the blocks called, and per (layer, row) whether it ran (gate > 0)
        looks.append((int(input_pos), getattr(cache, "closed", None)))  # where a skipping step looks first
        before = calls[0]
        out = step(idx, input_pos, cache)
        block_calls.append(calls[0] - before)
        ran.append(torch.stack([g[:, int(input_pos)] > 0 for g in cache.g]))  # (L, B): the cache holds its gate
        return out
    for skip in (False, True):
        block_calls.clear()
        ran.clear()
        looks.clear()
        out = generate(model, prompt(), 40, temperature=0, skip=skip, step=spy)
        assert torch.equal(out, generate(model, prompt(), 40, temperature=0, use_cache=False, skip=skip))
        r = torch.stack(ran)  # (steps, L, B)
        assert (~r.any(2)).any() and (r.any(2) & ~r.all(2)).any()  # blocks no row ran; rows that differed
        L, n_gates = TINY["n_layer"], len(model.gates)
        if not skip:  # dense: every block
            assert block_calls == [L] * len(ran)
            continue
        # skipping: a step calls every block that some row runs, and never the middle blocks that every row's gates
        # closed (decode_step_skip): it runs the first k blocks, k where the last token's gates closed in every row
        # (the last step's, or the prefill's last token), then the last k where every row's gate closed by block k,
        # else all the others
        assert all(calls >= n for calls, n in zip(block_calls, r.any(2).sum(1).tolist()))
        want = []
        for t in range(len(ran)):
            closed = int(r[t, :n_gates].any(1).long().cumprod(0).sum())  # the first gate closed in every row
            k = looks[t][1]
            want.append(k + L - max(k, L - k) if closed <= k else L)
            if t + 1 < len(ran) and looks[t + 1][0] == looks[t][0] + 1:  # no prefill in between
                assert looks[t + 1][1] == closed
        assert block_calls == want and sum(want) < L * len(ran)


def compiled(model):
    """(model's decode step compiled as the scripts do (generate.compile_decode_step), fresh dynamo state; the
    graph counter)."""
    from torch._dynamo.utils import counters  # dynamo where a test compiles: not at collection (2 s)
    torch._dynamo.reset()
    counters.clear()
    return compile_decode_step(model, torch.device("cpu")), lambda: counters["stats"]["unique_graphs"]


# compile time dominates (inductor builds C++ kernels): float32, two layers, one case per model (skipmiddle with
# gates that skip, both modes); slow tier, run by CI under every torch version (tests/test_versions.py)
@pytest.mark.slow
@pytest.mark.versions
@pytest.mark.parametrize("name", model_names())
def test_compiled_step_is_one_graph_and_equals_recomputation(name):
    """Version-sensitive: CI runs it under each torch version of tests/test_versions.py. Every model file's step
    compiled as sample.py --compile does, one graph (fullgraph: a graph break fails); skipmiddle's skipping step in
    its parts, one graph per part and k (at n_layer 2: k is 0 or 1, three parts), chosen on the host."""
    model = build(name, {}, n_layer=2)
    if name == "skipmiddle":
        gates_that_skip(model)
    step, graphs = compiled(model)
    seen, spy = spy_positions(step)
    for kw in skip_modes(model):
        per_cache = 3 * 2 if kw.get("skip") else 1  # the graphs a cache may need: a step, or its parts at every k
        before = graphs()
        out = generate(model, prompt(), 100, temperature=0, step=spy, **kw)
        check_positions(seen, steps=89, restarts=10)  # and 11 prefills: the prompt and 10 restarts
        # compiled, and at most one recompile over those 100 tokens (none is expected): the graphs do not grow with
        # the tokens
        assert 1 <= graphs() - before <= per_cache + 1, graphs() - before
        seen.clear()
        assert torch.equal(out[:, :45], generate(model, prompt(), 40, temperature=0, use_cache=False, **kw))
        # another prompt reuses the model's cache (generate.cache_for): no new graph (skipping: unless it reaches a
        # part at a k the first did not), and nothing of the last prompt leaks into it (skipping: the gates of layers
        # no token ran are reset); another batch size (a new cache): right, with at most the graphs of one cache
        before, other = graphs(), prompt().flip(0)
        assert torch.equal(generate(model, other, 20, temperature=0, step=step, **kw),
                           generate(model, other, 20, temperature=0, use_cache=False, **kw))
        assert graphs() - before <= (per_cache - 1 if kw.get("skip") else 0)
        before = graphs()
        assert torch.equal(generate(model, prompt(batch=3), 8, temperature=0, step=step, **kw),
                           generate(model, prompt(batch=3), 8, temperature=0, use_cache=False, **kw))
        assert graphs() <= before + per_cache
        seen.clear()


@pytest.mark.slow  # inductor compiles each part at each k: about a minute
@pytest.mark.versions
@pytest.mark.parametrize("batch, std, bias", [(1, 0.3, 0.0), (8, 0.05, 1.3)])
def test_compiled_skipping_step_equals_the_eager_one_greedy_and_sampled(batch, std, bias):
    """Version-sensitive: CI runs it under each torch version of tests/test_versions.py. skipmiddle's skipping decode
    step compiled in its parts (each one graph, fullgraph: a graph
    break fails; on CUDA each a CUDA graph) gives the eager step's tokens, greedy and sampled, at batch 1 and 8,
    with gates (weights N(0, std), gate 1's bias) that close the middle blocks for every row at some tokens and not
    at others."""
    model = build("skipmiddle", {}, n_layer=4)
    with torch.no_grad():
        for gate in model.gates:
            gate.weight.normal_(0.0, std, generator=torch.Generator().manual_seed(2))
        model.gates[1].bias.fill_(bias)
    step, graphs = compiled(model)
    looks = []

    def spy(idx, input_pos, cache):
        looks.append(cache.closed)
        return step(idx, input_pos, cache)
    for temperature in (0.0, 1.0):
        outs = []
        for this_step in (None, spy):  # eager, then compiled
            torch.manual_seed(3)
            outs.append(generate(model, prompt(batch=batch), 30, temperature=temperature, top_k=None,
                                 step=this_step))
        assert torch.equal(*outs)
    assert min(looks) < len(model.gates) <= max(looks)  # steps that skipped blocks and steps that ran them all
    assert graphs() <= 3 * (len(model.gates) + 1)  # a graph per part and k, not per token


@pytest.mark.slow  # every model and variant in both dtypes: 34 cases, about 5 minutes of inductor compiling
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name,variant,overrides", CASES, ids=IDS)
def test_compiled_steps_of_every_variant_equal_recomputation(name, variant, overrides, dtype):
    model = build(name, overrides, dtype)
    if getattr(model.config, "gated", False):
        gates_that_skip(model)
    step, graphs = compiled(model)
    for kw in skip_modes(model):
        # one graph, or skipping: one per part (3) and k (0 to the number of gates); at most one recompile more
        most = 3 * (len(model.gates) + 1) if kw.get("skip") else 1
        before = graphs()
        out = generate(model, prompt(), 40, temperature=0, step=step, **kw)  # 4 restarts of the window
        assert torch.equal(out, generate(model, prompt(), 40, temperature=0, use_cache=False, **kw))
        assert 1 <= graphs() - before <= most + 1, graphs() - before


def test_the_graph_count_sees_a_step_whose_inputs_change():
    """The check above can fail: a step whose input shapes change between tokens compiles again each time (here
    the position as a 0-dim, a (1,) and a (1, 1) tensor; tracing only, no inductor, to stay fast)."""
    from torch._dynamo.utils import counters
    model = build("vanilla", {}, n_layer=2)
    module = importlib.import_module("model_vanilla")
    cache = module.KVCache(model.config, 2, "cpu", torch.float32)
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(eager(model), backend="eager", fullgraph=True)
    token = torch.zeros(2, 1, dtype=torch.long)
    for t in range(3):
        step(token, torch.tensor(t), cache)  # the same shapes: one graph
    assert counters["stats"]["unique_graphs"] == 1
    for pos in (torch.tensor([3]), torch.tensor([[4]])):
        step(token, pos, cache)
    assert counters["stats"]["unique_graphs"] == 3
