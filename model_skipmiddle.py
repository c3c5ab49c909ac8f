"""
Skip-middle: learned middle-out layer skipping with gated attention.

Paper (the skip-middle paper): "Learning to Skip the Middle Layers of Transformers" (Tim Lawson and Laurence
Aitchison, University of Bristol, 2025); their code is github.com/tim-lawson/skip-middle (MIT), "the reference"
below. docs/skipmiddle.md has the derivations, measurements and controller dynamics behind the readings below.
The model is model_vanilla.py with these changes (blocks l = 0..L-1, h the residual stream entering block l,
g_j the gate of token j):
    embedding:  x = RMSNorm(Embed(idx))                                        (the paper's input norm)
    gates:      s_l = ReLU(w_l . h + b_l),  S_l = s_0 + ... + s_l,  g_l = 1 - clamp(S_l, 0, 1)      (eqs. 1-2)
                block l >= L/2 uses the gate of block L-1-l: a token skips a symmetric span of middle blocks
    block:      x = x + g * Norm(Attn(Norm(x), g));  x = x + g * Norm(MLP(Norm(x)))   (sandwich / peri-LN)
    attention:  logit(i, j) += ln(max(g_j, 1e-6)) for every KEY j                                   (eq. 3)
    loss:       CE + mean_l (alpha_l * mean(g_l) + beta_l * var(g_l)), moments over the batch's tokens (eq. 5)
    controller: after every optimiser step, c += gamma * 1[|stat - target| > delta] * (stat - target)  (eq. 6)
                for alpha (stat = mean gate) and beta (stat = gate variance), targets mu*_l from 1 at block 0
                linearly to gate_target at the middle block, mirrored, and var*_l = mu*_l (1 - mu*_l).
With zero gate parameters every gate is exactly 1 and the model is the dense sandwich model (gated=False).

Interpretations:
- Eq. 3 biases the KEY position; the reference adds ln g per QUERY row, where the softmax cancels it (a no-op).
- The bias is differentiable: the gate also learns through attention (eq. 3 as written).
- The gate reads the raw residual stream entering its block (as the reference does), not a normalised copy.
- Odd L: the middle block has a gate of its own and is its own mirror.
- Regulariser: the mean over all L blocks (eq. 5), population variance; training mode with targets only.
- Controller: statistics of the optimiser step's global batch (all micro-steps and ranks); symmetric rule.
- Coefficients start at 0 and are saved in checkpoints; the targets follow from the config (L <= 2: target 1).
- Init: normal(0, 0.02) without 1/sqrt(2L) (the post-norms rescale); gates N(0, gate_init_std), biases 0.
- Training runs every block for every token (a skipped token's output times 0); inference skips for real, and
  there a skipped key gets weight 0, not the eps floor's exp(s) * 1e-6 (SkipCache).
- Step 0 from a pretrained model (train.py --init_from): not function-preserving: the embedding norm, the norms
  after each module and the random gates are new (tests/test_hf.py).
Extra parameters: (d+1) * ceil(L/2) gate parameters with gated=True (0 with gated=False), 2 d per block for the
output norms, d for the embedding norm. MODIFIED names the components that differ from model_vanilla.py.
"""
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

MODIFIED = ("GPTConfig", "KVCache", "KVCache.__init__", "KVCache.reset", "KVCache.update",
            "CausalSelfAttention.forward", "Block", "Block.__init__", "Block.forward", "GPT", "GPT.__init__",
            "GPT.forward", "GPT.param_groups", "GPT.flops_per_token")  # components that differ from model_vanilla.py
VARIANTS = {"dense": dict(gated=False)}  # configurations the contract suite also tests
GATE_EPS = 1e-6  # lower bound on g before the log of gated attention (paper section 2.2)


def option(default, doc, **rules):
    """A config field with its --help text and its constraints (min / max, above / below, choices), which the
    scripts check (common.check_config) before they build a model."""
    return field(default=default, metadata=dict(doc=doc, **rules))


@dataclass
class GPTConfig:
    vocab_size: int = option(256, "vocabulary size; train.py sets it from the data's meta.json", min=1)
    block_size: int = option(256, "context length in tokens", min=1)
    n_layer: int = option(6, "number of transformer blocks", min=1)
    n_head: int = option(4, "query heads", min=1)
    n_kv_head: int = option(2, "key/value heads (grouped-query attention); must divide n_head", min=1)
    n_embd: int = option(128, "model width d; n_head must divide it into an even head size", min=1)
    ffn_hidden: int = option(512, "SwiGLU hidden size", min=1)
    rope_theta: float = option(10000.0, "RoPE base: the longest rotary wavelength", above=1)
    norm_eps: float = option(1e-5, "RMSNorm epsilon", above=0, max=1)
    dropout: float = option(0.0, "dropout probability in training", min=0, below=1)
    bias: bool = option(False, "biases in the linear layers")
    tie_embeddings: bool = option(False, "the head shares the token embedding's weights")
    qk_norm: bool = option(False, "Qwen3's QK-norm: an RMSNorm over each head's q and k before RoPE")
    head_dim: int = option(0, "size of each attention head; 0 = n_embd // n_head (Qwen3-0.6B: 128 at d 1024)", min=0)
    gated: bool = option(True, "False: the dense sandwich model, no gate parameters and plain causal attention")
    gate_init_std: float = option(0.02, "gate weights ~ N(0, std), biases 0; 0 starts exactly dense (every g == 1)",
                                  min=0)
    gate_target: float = option(0.5, "target mean gate of the middle block (1 at block 0, linear in between)",
                                min=0, max=1)
    gate_gamma: float = option(1e-3, "controller step size gamma", min=0)
    gate_delta: float = option(1e-2, "controller tolerance delta: deviations within it leave a coefficient alone",
                               min=0)

    def __post_init__(self):  # the rules across fields; each field's own are checked by the scripts
        head_size = self.head_dim or self.n_embd / self.n_head  # a fraction when n_head does not divide n_embd
        if self.n_head % self.n_kv_head or head_size % 2:
            raise ValueError(f"--n_embd {self.n_embd}, --n_head {self.n_head}, --n_kv_head {self.n_kv_head}, "
                             f"--head_dim {self.head_dim} do not fit: the head size (head_dim, or n_embd / n_head "
                             "when head_dim is 0) must be a whole even number, and n_kv_head must divide n_head")


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalise in float32: under bf16 autocast the mean of squares loses too much precision
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rope_tables(head_dim, seq_len, theta, device):
    """cos and sin of the rotary angles, each (seq_len, head_dim // 2)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate pairs (x[..., :hd/2], x[..., hd/2:]) of x (B, heads, T, hd) by the angles of their positions."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.type_as(x)


class KVCache:
    """Keys, values and gates of every layer for block_size positions, allocated once, one tensor per layer (as
    model_vanilla.py's); each cached key keeps its gate, so that a skipped token stays masked during generation."""

    def __init__(self, config, batch_size, device, dtype):
        head_dim = config.head_dim or config.n_embd // config.n_head
        shape = (batch_size, config.n_kv_head, config.block_size, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        gate_dtype = torch.promote_types(dtype, torch.float32)  # gates never below float32
        self.g = [torch.zeros(batch_size, config.block_size, device=device, dtype=gate_dtype)
                  for _ in range(config.n_layer)]
        self.pos = 0  # number of tokens already in the cache (forward() advances it; generate.py after a step)

    def reset(self):
        """Empty the cache for a new prompt: old keys are masked (after pos), gates zeroed (no token ran: SkipCache)."""
        self.pos = 0
        for g in self.g:
            g.zero_()

    def update(self, layer, k, v, pos=None):
        """Store k, v (B, H_kv, T, hd) of the new tokens; return the keys/values attention reads. pos None: at
        self.pos, returning those of all tokens so far (B, H_kv, self.pos + T, hd). pos a tensor of positions, (1,)
        (decode_step) or (B, T) (forward_skip's gathered tokens): there, returning the whole cache (B, H_kv, S, hd)."""
        ck, cv = self.k[layer], self.v[layer]
        k, v = k.to(ck.dtype), v.to(cv.dtype)  # under autocast k, v are bf16 and the cache has the weights' dtype
        if pos is None:
            ck[:, :, self.pos:self.pos + k.size(2)] = k
            cv[:, :, self.pos:self.pos + k.size(2)] = v
            return ck[:, :, :self.pos + k.size(2)], cv[:, :, :self.pos + k.size(2)]
        if pos.dim() == 1:  # decode_step: one position for every row (index_copy_ compiles to an in-place write)
            return ck.index_copy_(2, pos, k), cv.index_copy_(2, pos, v)
        index = pos[:, None, :, None].expand_as(k)  # forward_skip: each row's own positions
        return ck.scatter_(2, index, k), cv.scatter_(2, index, v)

    def update_gates(self, layer, g, pos=None):
        """Store the gates g (B, T) of the new tokens where update() stored their keys; return the gates of the
        keys it returned, (B, self.pos + T) or (B, S)."""
        cg, g = self.g[layer], g.to(self.g[layer].dtype)
        if pos is None:
            cg[:, self.pos:self.pos + g.size(1)] = g
            return cg[:, :self.pos + g.size(1)]
        return cg.index_copy_(1, pos, g) if pos.dim() == 1 else cg.scatter_(1, pos, g)

    def key_mask(self, pos, g, dtype):
        """SDPA's mask over the whole cache for queries at positions pos, (1,) or (B, T), and the layer's cached gates
        g (B, S): a float (B, 1, T, S) adding ln(max(g_j, eps)) (eq. 3), -inf after the query and, in a SkipCache, at
        gates of 0. g None (no gates): a boolean (1, 1, 1, S) of the filled positions."""
        S = self.k[0].size(2)
        visible = torch.arange(S, device=pos.device) <= pos.view(pos.size(0), -1, 1)  # (1 or B, T, S)
        if g is None:
            return visible.unsqueeze(1)
        if isinstance(self, SkipCache):  # a gate of 0: the token did not run this layer and left no key
            visible = visible & (g > 0)[:, None, :]                               # (B, T, S)
        bias = torch.log(g.clamp(min=GATE_EPS))[:, None, :]                       # (B, 1, S)
        return torch.where(visible, bias, float("-inf")).unsqueeze(1).to(dtype)  # (B, 1, T, S)


def attention_mask(T, Tk, past, device):
    """(is_causal, mask) for T new queries against Tk keys, of which `past` were cached before. past a (1,)
    tensor: decode_step's one query at position past against the whole cache (Tk = block_size)."""
    if torch.is_tensor(past):
        return False, (torch.arange(Tk, device=device) <= past).view(1, Tk)  # the filled positions: static shape
    if past == 0:
        return True, None  # plain causal attention: the flash kernel applies
    if T == 1:
        return False, None  # a single new token sees every key
    # a chunk after a non-empty cache: query i sees keys up to past + i
    return False, torch.ones(T, Tk, dtype=torch.bool, device=device).tril(diagonal=past)


GATE_C = 1.0  # the query's appended coordinate: a power of two, exact in every float format


def gate_into_keys(q, k, v, g):
    """Carry the per-key gate bias ln(max(g_j, eps)) of eq. 3 inside the keys, so that plain causal SDPA adds it:
    q gets one more coordinate c, k gets ln(max(g_j, eps)) / (c * scale), scale = 1/sqrt(hd) of the UNPADDED
    head size (pass it to SDPA); then q . k * scale = (q_hd . k_hd) * scale + ln(max(g_j, eps)). q, k and v are
    zero-padded to the next multiple of 8 (flash kernels need it; v because flash needs equal head sizes).
    q (B, H, T, hd), k and v (B, H_kv, Tk, hd), g (B, Tk) -> q (B, H, T, hp), k and v (B, H_kv, Tk, hp)."""
    hd = q.size(-1)
    pad = 8 - hd % 8  # >= 1: room for the gate coordinate
    g = g.to(torch.promote_types(g.dtype, torch.float32))  # the log in float32 at least (float64 in tests)
    bias = torch.log(g.clamp(min=GATE_EPS)) * (hd ** 0.5 / GATE_C)                 # (B, Tk)
    bias = bias[:, None, :, None].expand(-1, k.size(1), -1, 1).to(k.dtype)         # (B, H_kv, Tk, 1)
    q = torch.cat((q, torch.full_like(q[..., :1], GATE_C), q.new_zeros(*q.shape[:-1], pad - 1)), dim=-1)
    k = torch.cat((k, bias, k.new_zeros(*k.shape[:-1], pad - 1)), dim=-1)
    return q, k, F.pad(v, (0, pad))


def decode_attention(q, k, v, mask):
    """A decode step's attention over the whole cache, each KV head's query heads as its rows (docs/contract.md)."""
    B, H, _, hd = q.shape
    y = F.scaled_dot_product_attention(                                            # (B, H_kv, H / H_kv, hd)
        q.view(B, k.size(1), H // k.size(1), hd), k, v, attn_mask=mask)
    return y.view(B, H, 1, hd)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        assert config.n_head % config.n_kv_head == 0 and (config.head_dim or config.n_embd % config.n_head == 0)
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.head_dim or config.n_embd // config.n_head
        self.wq = nn.Linear(config.n_embd, config.n_head * self.head_dim, bias=config.bias)
        self.wk = nn.Linear(config.n_embd, config.n_kv_head * self.head_dim, bias=config.bias)
        self.wv = nn.Linear(config.n_embd, config.n_kv_head * self.head_dim, bias=config.bias)
        self.wo = nn.Linear(config.n_head * self.head_dim, config.n_embd, bias=config.bias)
        self.dropout = config.dropout
        # QK-norm (Qwen3): RMSNorm over each head's q and k before RoPE; off, an identity without parameters
        self.q_norm = RMSNorm(self.head_dim, config.norm_eps) if config.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim, config.norm_eps) if config.qk_norm else nn.Identity()

    def forward(self, x, cos, sin, cache=None, g=None, pos=None):
        """g (B, T): the new tokens' gates, None for plain causal attention. pos: their positions as a tensor, (1,) in
        a decode step or (B, T) for forward_skip's gathered tokens (attending over the whole cache under a mask)."""
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)     # (B, H, T, hd)
        k = self.wk(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, H_kv, T, hd)
        v = self.wv(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, H_kv, T, hd)
        q, k = apply_rope(self.q_norm(q), cos, sin), apply_rope(self.k_norm(k), cos, sin)
        if pos is not None:  # a mask is needed anyway, so the gate bias rides in it: no padded head size here
            k, v = cache.update(self.layer_idx, k, v, pos)                         # (B, H_kv, S, hd)
            if g is not None:
                g = cache.update_gates(self.layer_idx, g, pos)                     # (B, S)
            mask = cache.key_mask(pos, g, q.dtype)                                 # (B or 1, 1, T, S)
            if T == 1:
                y = decode_attention(q, k, v, mask)                                # (B, H, 1, hd)
            else:
                y = F.scaled_dot_product_attention(                                # (B, H, T, hd)
                    q, k, v, attn_mask=mask, enable_gqa=self.n_kv_head != self.n_head)
            return self.wo(y.transpose(1, 2).contiguous().view(B, T, -1))
        past = 0
        if cache is not None:
            past = cache.pos
            k, v = cache.update(self.layer_idx, k, v)  # (B, H_kv, past + T, hd)
            if g is not None:
                g = cache.update_gates(self.layer_idx, g)  # (B, past + T): cached keys keep their gates
        if g is not None:
            q, k, v = gate_into_keys(q, k, v, g)  # (B, H, T, hp), (B, H_kv, past + T, hp): hp = hd padded
        is_causal, mask = attention_mask(T, k.size(2), past, x.device)
        y = F.scaled_dot_product_attention(                                        # (B, H, T, hp)
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.head_dim ** -0.5,
            dropout_p=self.dropout if self.training else 0.0, enable_gqa=self.n_kv_head != self.n_head)
        y = y[..., :self.head_dim]                                                 # (B, H, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)                          # (B, T, H hd)
        return self.wo(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w1 = nn.Linear(config.n_embd, config.ffn_hidden, bias=config.bias)
        self.w3 = nn.Linear(config.n_embd, config.ffn_hidden, bias=config.bias)
        self.w2 = nn.Linear(config.ffn_hidden, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Sandwich (peri-LN) block: a norm before AND after each module, the output scaled by the token's gate."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.attn_out_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MLP(config)
        self.mlp_out_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, cos, sin, cache=None, g=None, pos=None):
        # g (B, T): this block's gate per token, None in the dense model; g == 0 leaves the token's stream as it is
        x = x + self.drop(gated_norm(self.attn_out_norm, self.attn(self.attn_norm(x), cos, sin, cache, g, pos), g))
        x = x + self.drop(gated_norm(self.mlp_out_norm, self.mlp(self.mlp_norm(x)), g))
        return x


class GateScale(torch.autograd.Function):
    """n * w * g for the output norm's normalised input n (B, T, d), its weight w (d,) and the gate g (B, T, 1).
    Written as two multiplies, autograd would keep n for w's gradient AND n * w for g's; this keeps n only."""

    @staticmethod
    def forward(ctx, n, w, g):
        ctx.save_for_backward(n, w, g)
        return n * w * g

    @staticmethod
    def backward(ctx, grad):
        n, w, g = ctx.saved_tensors
        return grad * w * g, (grad * n * g).flatten(0, -2).sum(0), (grad * n * w).sum(-1, keepdim=True)


def gated_norm(norm, y, g):
    """g * norm(y) for the RMSNorm module `norm` (norm(y) alone when g is None), saving for the backward what
    norm(y) alone saves (see GateScale)."""
    if g is None:
        return norm(y)
    yf = y.float()
    n = (yf * torch.rsqrt(yf.pow(2).mean(-1, keepdim=True) + norm.eps)).type_as(y)  # RMSNorm without its weight
    return GateScale.apply(n, norm.weight, g.unsqueeze(-1).to(y.dtype))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        L = config.n_layer
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.emb_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(L)])
        # one gate (w_l, b_l) per block l < L/2: s_l = ReLU(w_l . h + b_l) of the stream entering block l
        self.gates = nn.ModuleList([nn.Linear(config.n_embd, 1) for _ in range((L + 1) // 2 if config.gated else 0)])
        self.mirror = [min(l, L - 1 - l) for l in range(L)]  # block l uses the gate of block mirror[l]
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        cos, sin = rope_tables(config.head_dim or config.n_embd // config.n_head, config.block_size,
                               config.rope_theta, None)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if config.gated:
            # the controller: targets follow from the config; the coefficients are state (saved in checkpoints)
            mean_target = torch.linspace(1.0, config.gate_target, len(self.gates))[self.mirror]  # (L,)
            self.register_buffer("gate_mean_target", mean_target, persistent=False)
            self.register_buffer("gate_var_target", mean_target * (1 - mean_target), persistent=False)
            self.register_buffer("gate_alpha", torch.zeros(L))  # coefficient of mean(g_l)
            self.register_buffer("gate_beta", torch.zeros(L))   # coefficient of var(g_l)
        # per gated block, sums over tokens of g, g^2, 1[g == 0] and the token count (n_gates, 4); plain
        # attributes, not buffers: DDP would overwrite the other ranks' buffers with rank 0's before every forward
        self._train_sums = None  # this optimiser step's training forwards; after_step() reduces and clears them
        self._eval_sums = None   # eval-mode forwards since the last stats() call
        self._last_step = None   # (mean, var, zero fraction), each (L,), of the last optimiser step
        self.apply(self._init_weights)
        for gate in self.gates:
            nn.init.normal_(gate.weight, mean=0.0, std=config.gate_init_std)  # the bias is 0 from _init_weights

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None, cache=None, return_hidden=False, pos=None):
        """pos: decode_step's (1,) position tensor, for one token idx (B, 1); None: idx follows cache.pos."""
        B, T = idx.shape
        if pos is None:
            past = cache.pos if cache is not None else 0
            assert past + T <= self.config.block_size, f"{past + T} tokens exceed block_size {self.config.block_size}"
            cos, sin = self.rope_cos[past:past + T], self.rope_sin[past:past + T]
        elif isinstance(cache, SkipCache):  # a decode step that really skips (below)
            return self.decode_step_skip(idx, pos, cache), None
        else:
            cos, sin = self.rope_cos[pos], self.rope_sin[pos]  # (1, hd/2), gathered by a tensor: no .item()
        x = self.drop(self.emb_norm(self.tok_emb(idx)))  # (B, T, d)
        hidden, gates, S = [], [], 0.0
        for l, block in enumerate(self.blocks):
            if l < len(self.gates):  # first half: accumulate the soft mask S (eq. 1), gate g = 1 - clamp(S) (eq. 2)
                S = S + F.relu(self.gates[l](x).float().squeeze(-1))  # (B, T)
                gates.append(1.0 - S.clamp(0.0, 1.0))
            x = block(x, cos, sin, cache, gates[self.mirror[l]] if gates else None, pos)
            hidden.append(x)
        if cache is not None and pos is None:
            cache.pos += T
        logits = self.lm_head(self.norm(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        if gates:
            G = torch.stack(gates)  # (n_gates, B, T)
            self._record(G)
            if self.training and targets is not None:
                loss = loss + self.gate_loss(G)
        if return_hidden:
            return logits, loss, hidden  # hidden[l]: output of block l, read by the logit lens
        return logits, loss

    def gate_loss(self, G):
        """The regulariser (eq. 5): mean over the L blocks of alpha_l * mean(g_l) + beta_l * var(g_l)."""
        mean, var = G.mean((1, 2))[self.mirror], G.var((1, 2), correction=0)[self.mirror]  # (L,)
        return (self.gate_alpha * mean + self.gate_beta * var).mean()

    @torch.no_grad()
    def _record(self, G):
        G = G.detach().float()
        sums = torch.stack([G.sum((1, 2)), G.pow(2).sum((1, 2)), (G == 0).float().sum((1, 2)),
                            torch.full_like(G[:, 0, 0], G[0].numel())], dim=1)  # (n_gates, 4)
        name = "_train_sums" if self.training else "_eval_sums"
        setattr(self, name, sums if getattr(self, name) is None else getattr(self, name) + sums)

    def _summary(self, sums):
        """(mean, var, zero fraction) of every block's gates, each (L,), from sums (n_gates, 4)."""
        s = sums[self.mirror]
        mean = s[:, 0] / s[:, 3]
        return mean, (s[:, 1] / s[:, 3] - mean ** 2).clamp(min=0.0), s[:, 2] / s[:, 3]

    @torch.no_grad()
    def after_step(self):
        """One controller update from the gates of the optimiser step just taken. Collective under DDP: every rank
        must call it after every optimiser step (train.py does)."""
        sums, self._train_sums = self._train_sums, None
        if sums is None:
            return
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(sums)  # sums over the global batch: the same statistics on every rank
        self._last_step = self._summary(sums)
        self.update_coefficients(*self._last_step[:2])

    @torch.no_grad()
    def update_coefficients(self, mean, var):
        """eq. 6, both sides: c += gamma * 1[|stat - target| > delta] * (stat - target); mean, var (L,)."""
        c = self.config
        for coef, stat, target in ((self.gate_alpha, mean, self.gate_mean_target),
                                   (self.gate_beta, var, self.gate_var_target)):
            dev = stat.to(coef) - target
            coef.add_(c.gate_gamma * (dev.abs() > c.gate_delta) * dev)

    def _gate_summary(self, consume):
        """(mean, var, zero fraction) of the eval forwards since the last stats(), else of the last optimiser step."""
        sums, self._eval_sums = self._eval_sums, None if consume else self._eval_sums
        return self._last_step if sums is None else self._summary(sums)

    def stats(self):
        """Per gated block l: mean gate, fraction of zero gates, alpha, beta; est_flops_ratio (docs/skipmiddle.md).
        Collective under DDP: every rank must call it (train.py does); the eval-mode gate sums of every rank are
        pooled first, so that the gates describe the same validation windows as train.py's val_loss."""
        if not self.config.gated:
            return {}
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            sums = self._eval_sums
            if sums is None:  # a rank without validation windows adds zeros
                sums = torch.zeros(len(self.gates), 4, dtype=torch.float32, device=self.gate_alpha.device)
            torch.distributed.all_reduce(sums)
            self._eval_sums = sums if sums[0, 3] > 0 else None
        summary = self._gate_summary(consume=True)
        out = {}
        for l in range(len(self.gates)):
            if summary is not None:
                out[f"gate{l}_mean"], out[f"gate{l}_zero"] = summary[0][l].item(), summary[2][l].item()
            out[f"gate{l}_alpha"], out[f"gate{l}_beta"] = self.gate_alpha[l].item(), self.gate_beta[l].item()
        if summary is not None:
            sparse, dense = self.estimated_flops(summary[2])
            out["est_flops_ratio"] = sparse / dense
        return out

    def depth_map(self):
        """(L, 1): the mean gate of every block over the recorded forwards (as stats())."""
        if not self.config.gated:
            return torch.ones(self.config.n_layer, 1)
        summary = self._gate_summary(consume=False)
        if summary is None:
            raise RuntimeError("depth_map() reports measured gates: run forward passes (e.g. validation) first")
        return summary[0].detach().cpu().unsqueeze(1)

    def estimated_flops(self, zero, seq_len=None, head_size=None):
        """Forward FLOPs per token (sparse, dense) if a token cost nothing where its gate is 0 (Fig. 2), zero (L,):
        block matmuls x the fraction not skipped, plus head and gates; attention at seq_len and head_size (or hd)."""
        c = self.config
        hd = c.head_dim or c.n_embd // c.n_head
        block = c.n_embd * hd * (2 * c.n_head + 2 * c.n_kv_head) + 3 * c.n_embd * c.ffn_hidden
        block += c.n_head * (head_size or hd) * ((seq_len or c.block_size) + 1)  # q.k and p.v over the causal half
        head = c.n_embd * c.vocab_size  # the embedding is a lookup, not a matmul
        sparse = head + len(self.gates) * c.n_embd + block * (1 - zero).sum().item()
        return 2 * sparse, 2 * (head + block * c.n_layer)

    def param_groups(self, weight_decay):
        """AdamW groups: weight decay on matrices and embeddings only, never on norms or biases, and never on the
        gates: they have a group of their own with weight decay 0 whatever weight_decay is (as in the reference)."""
        gates = [p for p in self.gates.parameters() if p.requires_grad]
        params = [p for p in self.parameters() if p.requires_grad and all(p is not g for g in gates)]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        if gates:
            groups.append({"params": gates, "weight_decay": 0.0})
        return groups

    def flops_per_token(self, seq_len):
        """Training FLOPs per token (forward + backward = 3x forward) from the matmuls this model does: every block
        for every token (training skips nothing), attention at the head size the gate coordinate pads."""
        hd = self.config.head_dim or self.config.n_embd // self.config.n_head
        hp = hd + 8 - hd % 8 if self.config.gated else hd
        return 3 * self.estimated_flops(torch.zeros(self.config.n_layer), seq_len, head_size=hp)[0]

    # --- inference that really skips ---

    def inference(self, skip=True):
        """generate.py's hook: skip (default) prefills with forward_skip() into a SkipCache, whose steps skip too."""
        return (self.forward_skip, SkipCache) if skip and self.config.gated else (self, KVCache)

    @torch.no_grad()
    def forward_skip(self, idx, cache=None):
        """Inference that really skips: at every block only the tokens whose gate is > 0 run it (gathered per row,
        padded to the row with the most, scattered back); a token with g == 0 keeps its stream, as forward()'s multiply
        by 0 gives, and leaves no visible key (SkipCache). A block no token runs is not computed. (logits, None)."""
        B, T = idx.shape
        cache = cache if cache is not None else SkipCache(self.config, B, idx.device, self.lm_head.weight.dtype)
        past = cache.pos
        assert past + T <= self.config.block_size, f"{past + T} tokens exceed block_size {self.config.block_size}"
        positions = torch.arange(past, past + T, device=idx.device)
        x = self.emb_norm(self.tok_emb(idx))  # (B, T, d)
        gates, S, closed_until = [], 0.0, -1
        for l, block in enumerate(self.blocks):
            if l <= closed_until:
                continue  # a block before it closed for every token: gates only close further, up to its mirror
            if l < len(self.gates):  # the gates of every token, as in forward(): the skipped ones' too
                S = S + F.relu(self.gates[l](x).float().squeeze(-1))  # (B, T)
                gates.append(1.0 - S.clamp(0.0, 1.0))
            g = gates[self.mirror[l]]
            run = g > 0                                                          # (B, T)
            count = run.sum(1)                                                   # (B,)
            N = int(count.max())
            if N == 0:  # no row runs this block
                closed_until = self.config.n_layer - 1 - l
                continue
            if past == 0 and bool(run.all()):  # every token runs and no key is older: plain causal attention
                x = block(x, self.rope_cos[:T], self.rope_sin[:T], cache, g)
                continue
            # per row, the tokens that run the block first, in order; rows with fewer are padded with skipped ones
            order = torch.argsort((~run).to(torch.uint8), dim=1, stable=True)[:, :N]  # (B, N)
            valid = torch.arange(N, device=idx.device) < count[:, None]             # (B, N)
            pos = positions[order]                                                   # (B, N)
            index = order[..., None].expand(-1, -1, x.size(-1))                      # (B, N, d)
            xs = x.gather(1, index)                                                  # (B, N, d)
            cos, sin = self.rope_cos[pos][:, None], self.rope_sin[pos][:, None]      # (B, 1, N, hd/2)
            out = block(xs, cos, sin, cache, g.gather(1, order), pos)                # (B, N, d)
            x = x.scatter(1, index, torch.where(valid[..., None], out, xs))          # padding writes back xs
        cache.pos += T
        return self.lm_head(self.norm(x)), None  # (B, T, vocab)

    @torch.no_grad()
    def decode_step_skip(self, idx, pos, cache):
        """A decode step with a SkipCache, logits (B, 1, vocab): a block runs only if some row's gate is > 0 (the others
        keep their stream and leave a gate of 0, hiding their key): under torch.compile a torch.cond (one graph), in
        eager mode a Python if (torch.cond outside torch.compile traces its branches at every call)."""
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]  # (1, hd/2)
        x = self.emb_norm(self.tok_emb(idx))  # (B, 1, d)
        gates, S = [], 0.0
        for l, block in enumerate(self.blocks):
            if l < len(self.gates):
                S = S + F.relu(self.gates[l](x).float().squeeze(-1))  # (B, 1)
                gates.append(1.0 - S.clamp(0.0, 1.0))
            g = gates[self.mirror[l]]
            run = g > 0                                                          # (B, 1)

            def run_block(x):  # rows that skip keep their stream: where, since their output may be NaN (no key)
                return torch.where(run[..., None], block(x, cos, sin, cache, g, pos), x)
            if torch.compiler.is_compiling():
                x = torch.cond(run.any(), run_block, torch.clone, (x,))  # outputs must not alias the input
            elif run.any():
                x = run_block(x)
        return self.lm_head(self.norm(x))  # (B, 1, vocab)


class SkipCache(KVCache):
    """KVCache for inference that really skips: a gate of 0 means that the token did not run that layer and left no
    key there, which the mask hides (weight exactly 0); gates start at 0, so such a position needs no write."""


