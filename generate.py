"""
Generation for every model file: prefill, the one-token decode step, the loop with its window rule, sampling.

A model file holds what a cached forward pass needs (gpt-fast's split of model.py and generate.py): its KVCache
(what it stores and how a step writes it), the masks its attention reads, and forward(idx, cache=..., input_pos=...),
where input_pos holds the positions of idx's tokens. This module owns the position and drives it:
    prefill      forward(window, cache=cache, input_pos=arange(T)) writes the keys and values of the whole window;
    decode step  forward(token, cache=cache, input_pos=pos) with pos a (1,) tensor: one token against the whole
                 preallocated cache under a mask of the positions up to pos. The shapes are the same at every
                 position (no .item(), no Python branch on pos), so torch.compile traces it once, and on CUDA a
                 kernel that plans per sequence length (cuDNN) plans once;
    the window   the model reads the last block_size tokens; when the window is full it restarts from the last
                 block_size // 2 tokens (one new prefill per block_size // 2 tokens, not one per token). The rule
                 is the same without the cache, so greedy tokens are the same either way;
    the cache    allocated once per model, cache class and batch size, and reused by every prompt and every
                 restart of the window: nothing is allocated per prompt, and a step recorded as a CUDA graph
                 replays on the same addresses;
    sampling     without a host synchronisation per token (gpt-fast's exponential race, sample_next).
The hook: a model whose generation is its method defines inference(**options) -> (forward, cache class), which
the loop runs instead of its forward and KVCache (skipmiddle: forward_skip and SkipCache, so that tokens whose
gate is 0 skip their blocks for real, in the prefill and in every decode step; the option is skip).
"""
import functools
import sys
import types
import weakref

import torch

_caches = weakref.WeakKeyDictionary()  # model -> {(cache class, batch size): cache}; freed with the model


def inference(model, **options):
    """(forward, cache class) that generation runs: the model file's forward and KVCache, or its hook's."""
    if hasattr(model, "inference"):
        return model.inference(**options)
    if options:
        raise TypeError(f"{type(model).__module__}.GPT takes no generation options: {', '.join(options)}")
    return model, sys.modules[type(model).__module__].KVCache


def cache_for(model, cache_class, batch_size, device):
    """model's cache of cache_class for batch_size rows: made on first use, then the same tensors (a new prompt
    needs no emptying: the mask hides every position after the query's)."""
    caches = _caches.setdefault(model, {})
    dtype, cache = model.lm_head.weight.dtype, caches.get((cache_class, batch_size))
    if cache is None or (cache.k[0].device, cache.k[0].dtype) != (device, dtype):
        cache = caches[cache_class, batch_size] = cache_class(model.config, batch_size, device, dtype)
    return cache


def decode_step(model, idx, input_pos, cache):
    """Logits (B, vocab) of one new token per row, idx (B, 1), at position input_pos (a long tensor of one element),
    whose keys and values the model writes into cache there."""
    with torch.no_grad():
        logits, _ = model(idx, cache=cache, input_pos=input_pos.reshape(1))
    return logits[:, -1]


def compile_decode_step(model, device):
    """decode_step() of model as one compiled graph: inductor, and on CUDA mode reduce-overhead, which records
    the step as a CUDA graph and replays it (one launch per token instead of one per kernel). A CUDA graph
    replays on fixed addresses and writes the cache in place, so every cache the step is given is marked static
    first; cache_for() hands the same cache to every call, and a new one (another batch size) compiles anew.
    Each model compiles its own copy of decode_step's code: dynamo keeps its graphs per code object, and one
    shared by every model would reach its recompile limit in a process that compiles many (tools/bench.py --decode).
    A step that the host chooses between parts of fixed shapes (a cache with part(fn, k): skipmiddle's skipping
    step) compiles each part at each k into a graph of its own, a copy of the part's code with k as its default."""
    mode = "reduce-overhead" if device.type == "cuda" else None
    own = types.FunctionType(decode_step.__code__.replace(), decode_step.__globals__, "decode_step")
    compiled = torch.compile(own, mode=mode, fullgraph=True)
    marked, parts = weakref.WeakSet(), {}

    def part(fn, k):
        if (fn, k) not in parts:
            at_k = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, (k,))
            parts[fn, k] = torch.compile(at_k, mode=mode, fullgraph=True)
        return parts[fn, k]

    def step(idx, input_pos, cache):
        if cache not in marked:  # every tensor the cache holds (keys, values, and gates where it has them)
            for tensors in vars(cache).values():
                for t in tensors if isinstance(tensors, list) else ():
                    torch._dynamo.mark_static_address(t, guard=True)  # another tensor there: compile anew
            marked.add(cache)
        if hasattr(cache, "part"):  # the step in parts, each compiled: the step itself runs in Python
            cache.part = part
            try:
                return decode_step(model, idx, input_pos, cache)
            finally:
                del cache.part  # the cache's own again: an eager step that reuses the cache runs eager parts
        return compiled(model, idx, input_pos, cache)
    return step


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True, step=None,
             on_token=None, **options):
    """Continue idx (B, T) by max_new_tokens tokens; temperature 0 is greedy decoding. With the cache, the
    window is prefilled and every further token is one step(idx, input_pos, cache) (default decode_step; a script
    passes compile_decode_step()'s); use_cache=False recomputes the whole window for every token. on_token, if
    given, is called with every new token (B, 1) as it comes (sample.py prints it). options go to the model's
    inference() hook (skipmiddle: skip)."""
    forward, cache_class = inference(model, **options)
    step = step or functools.partial(decode_step, model)
    S = model.config.block_size
    start, cache = max(0, idx.size(1) - S), None
    for _ in range(max_new_tokens):
        if idx.size(1) - start > S:  # the window is full: restart it from the last half context
            start, cache = idx.size(1) - S // 2, None
        if not use_cache:
            logits = forward(idx[:, start:])[0][:, -1]
        elif cache is None:  # prefill the window at positions 0..T-1
            cache = cache_for(model, cache_class, idx.size(0), idx.device)
            input_pos = torch.arange(idx.size(1) - start, device=idx.device)
            logits = forward(idx[:, start:], cache=cache, input_pos=input_pos)[0][:, -1]
            input_pos = input_pos[-1:] + 1  # the next token's position, (1,)
        else:
            logits = step(nxt, input_pos, cache)
            input_pos += 1  # in place: no new tensor (on CUDA no copy from the host) per token
        nxt = sample_next(logits, temperature, top_k, top_p)  # (B, 1), contiguous: the step's input
        idx = torch.cat((idx, nxt), dim=1)
        if on_token is not None:
            on_token(nxt)
    return idx


def sample_next(logits, temperature, top_k, top_p):
    """One token per row of logits (B, vocab): greedy, or sampled from sampling_probs()."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    probs = sampling_probs(logits, temperature, top_k, top_p)
    # a sample of probs without torch.multinomial's host synchronisation: argmax of p_i / E_i with E_i exponential
    # (the index of the first of independent exponential clocks of rates p_i to ring)
    return (probs / torch.empty_like(probs).exponential_(1)).argmax(dim=-1, keepdim=True)


def sampling_probs(logits, temperature, top_k=None, top_p=None):
    """The distribution a token is sampled from, per row of logits (B, vocab), in this order: softmax(logits /
    temperature); then only the top_k most likely tokens (None or 0: all); then only the smallest set of the most
    likely tokens whose probability reaches top_p (None or 1: all); renormalised after each cut. A temperature so
    small that logits / temperature overflows (a row whose largest value is inf or NaN) is the limit it tends to:
    greedy, all the probability on the row's most likely token."""
    scaled = logits.float() / temperature
    greedy = torch.full_like(scaled, float("-inf")).scatter(-1, logits.argmax(-1, keepdim=True), 0.0)
    logits = torch.where(scaled.amax(-1, keepdim=True).isfinite(), scaled, greedy)  # no host synchronisation
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)  # the mass of the likelier tokens
        drop = before > top_p  # a token whose likelier tokens already reach top_p is not in the smallest set
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    return logits.softmax(-1)


if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("generate.py is a library module: the generation loop of sample.py, tools/bench.py and "
             "hf/hf_model.py; to generate text, run `python sample.py --help`")
