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
- The bias rides inside the keys (gate_into_keys): plain causal GQA attention, flash-eligible; hd padded to 8k.
- The bias is differentiable: the gate also learns through attention (eq. 3 as written).
- The gate reads the raw residual stream entering its block (as the reference does), not a normalised copy.
- Odd L: the middle block has a gate of its own and is its own mirror.
- Regulariser: the mean over all L blocks (eq. 5), population variance; training mode with targets only.
- Controller: statistics of the optimiser step's global batch (all micro-steps and ranks); symmetric rule.
- Coefficients start at 0 and are saved in checkpoints; the targets follow from the config (L <= 2: target 1).
- Init: normal(0, 0.02) without 1/sqrt(2L) (the post-norms rescale); gates N(0, gate_init_std), biases 0.
- Gate statistics live in plain attributes (DDP broadcasts buffers) and every after_step() clears them.
- stats(): per gated block mean gate, zero fraction, alpha, beta; est_flops_ratio as the paper's Fig. 2.
- depth_map(): (L, 1), the mean gate of every block, from the same statistics as stats().
- Training runs every block for every token (a skipped token's output times 0); inference skips for real.
- Skipping (forward_skip, generate(skip=True)): a skipped key gets weight 0, not the eps floor's exp(s) * 1e-6.
- Step 0 from a pretrained model (train.py --init_from): not function-preserving: the embedding norm, the norms
  after each module and the random gates are new (tests/test_hf.py).
Extra parameters: (d+1) * ceil(L/2) gate parameters with gated=True (0 with gated=False), 2 d per block for the
output norms, d for the embedding norm. MODIFIED names the components that differ from model_vanilla.py.
"""
import math
from dataclasses import dataclass, field, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

MODIFIED = ("GPTConfig", "KVCache", "CausalSelfAttention", "Block", "GPT")  # differ from model_vanilla.py
SKIPS = True  # generate(skip=...) and forward_skip(): tokens whose gate is 0 skip their blocks for real
VARIANTS = {"dense": dict(gated=False)}  # configurations the contract suite also tests
GATE_EPS = 1e-6  # lower bound on g before the log of gated attention (paper section 2.2)


def option(default, doc, **rules):
    """A config field with its --help text and its constraints, which check_config() applies: min / max
    (inclusive), above / below (exclusive), choices; a float must also be finite, an int fit in 64 bits."""
    return field(default=default, metadata=dict(doc=doc, **rules))


def check_config(config):
    """ValueError naming the first field of a config dataclass that breaks its type or its declared constraints."""
    for f in fields(config):
        value, rule, name = getattr(config, f.name), f.metadata, f"--{f.name}"
        if value is None and f.default is None:
            continue  # a None default means "not given"
        kind = f.type
        if type(value) is not kind and not (kind is float and type(value) is int):  # an int is a fine float
            raise ValueError(f"{name} must be {kind.__name__}, not {value!r}")
        if type(value) is float and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, not {value}")
        if type(value) is int and not -2**63 <= value < 2**63:
            raise ValueError(f"{name} must fit in 64 bits, not {value}")
        low, high, above, below = (rule.get(k) for k in ("min", "max", "above", "below"))
        if "choices" in rule and value not in rule["choices"]:
            raise ValueError(f"{name} {value} is not one of: {', '.join(map(str, rule['choices']))}")
        if low is not None and high is not None and not low <= value <= high:
            raise ValueError(f"{name} must be between {low} and {high}, not {value}")
        if low is not None and below is not None and not low <= value < below:
            raise ValueError(f"{name} must be at least {low} and below {below}, not {value}")
        if above is not None and below is not None and not above < value < below:
            raise ValueError(f"{name} must be between {above} and {below}, both excluded, not {value}")
        if low is not None and value < low:
            raise ValueError(f"{name} must be {low} or more, not {value}")
        if high is not None and value > high:
            raise ValueError(f"{name} must be {high} or less, not {value}")
        if above is not None and not value > above:
            raise ValueError(f"{name} must be above {above}, not {value}")
        if below is not None and not value < below:
            raise ValueError(f"{name} must be below {below}, not {value}")


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

    def __post_init__(self):
        check_config(self)
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
    """Keys, values and gates of every layer for the tokens seen so far, for generation."""

    def __init__(self, config, batch_size, device, dtype):
        head_dim = config.head_dim or config.n_embd // config.n_head
        shape = (config.n_layer, batch_size, config.n_kv_head, config.block_size, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        gate_dtype = torch.promote_types(dtype, torch.float32)  # gates never below float32
        self.g = torch.ones(config.n_layer, batch_size, config.block_size, device=device, dtype=gate_dtype)
        self.pos = 0  # number of tokens already in the cache

    def update(self, layer, k, v):
        """Store k, v (B, H_kv, T, hd) of the new tokens; return the keys/values of all tokens so far."""
        T = k.size(2)
        self.k[layer, :, :, self.pos:self.pos + T] = k
        self.v[layer, :, :, self.pos:self.pos + T] = v
        return self.k[layer, :, :, :self.pos + T], self.v[layer, :, :, :self.pos + T]

    def update_gates(self, layer, g):
        """Store the gates g (B, T) of the new tokens; return the gates of all tokens so far (B, pos + T)."""
        self.g[layer, :, self.pos:self.pos + g.size(1)] = g
        return self.g[layer, :, :self.pos + g.size(1)]


def attention_mask(T, Tk, past, device):
    """(is_causal, mask) for T new queries against Tk keys, of which `past` were cached before."""
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

    def forward(self, x, cos, sin, cache=None, g=None):
        """g (B, T): the gates of the new tokens (keys), None for plain causal attention."""
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)     # (B, H, T, hd)
        k = self.wk(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, H_kv, T, hd)
        v = self.wv(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, H_kv, T, hd)
        q, k = apply_rope(self.q_norm(q), cos, sin), apply_rope(self.k_norm(k), cos, sin)
        past = 0
        if cache is not None:
            past = cache.pos
            k, v = cache.update(self.layer_idx, k, v)  # (B, H_kv, past + T, hd)
            if g is not None:
                g = cache.update_gates(self.layer_idx, g)  # (B, past + T): cached keys keep their gates
        if g is not None:
            q, k, v = gate_into_keys(q, k, v, g)  # (B, H, T, hp), (B, H_kv, past + T, hp): hp = hd padded
        if isinstance(cache, SkipCache):
            is_causal, mask = cache.attention_mask(T, k.size(2))  # only the keys of tokens that ran this layer
        else:
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

    def forward(self, x, cos, sin, cache=None, g=None):
        # g (B, T): this block's gate per token, None in the dense model; g == 0 leaves the token's stream as it is
        x = x + self.drop(gated_norm(self.attn_out_norm, self.attn(self.attn_norm(x), cos, sin, cache, g), g))
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

    def forward(self, idx, targets=None, cache=None, return_hidden=False):
        B, T = idx.shape
        past = cache.pos if cache is not None else 0
        assert past + T <= self.config.block_size, f"{past + T} tokens exceed block_size {self.config.block_size}"
        cos, sin = self.rope_cos[past:past + T], self.rope_sin[past:past + T]
        x = self.drop(self.emb_norm(self.tok_emb(idx)))  # (B, T, d)
        hidden, gates, S = [], [], 0.0
        for l, block in enumerate(self.blocks):
            if l < len(self.gates):  # first half: accumulate the soft mask S (eq. 1), gate g = 1 - clamp(S) (eq. 2)
                S = S + F.relu(self.gates[l](x).float().squeeze(-1))  # (B, T)
                gates.append(1.0 - S.clamp(0.0, 1.0))
            x = block(x, cos, sin, cache, gates[self.mirror[l]] if gates else None)
            hidden.append(x)
        if cache is not None:
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
        if self._eval_sums is not None:
            sums = self._eval_sums
            if consume:
                self._eval_sums = None
            return self._summary(sums)
        return self._last_step

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
        """(L, 1): the mean gate of every block over the recorded forwards (see the docstring)."""
        if not self.config.gated:
            return torch.ones(self.config.n_layer, 1)
        summary = self._gate_summary(consume=False)
        if summary is None:
            raise RuntimeError("depth_map() reports measured gates: run forward passes (e.g. validation) first")
        return summary[0].detach().cpu().unsqueeze(1)

    def estimated_flops(self, zero, seq_len=None, head_size=None):
        """Forward FLOPs per token (sparse, dense) if a token cost nothing in a block where its gate is 0 (paper
        Fig. 2): block matmuls times the fraction of tokens not skipped, plus head and gates; zero (L,). The
        attention matmuls at seq_len (default block_size) and head_size (default hd: the paper's dense model)."""
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

    @torch.no_grad()
    def forward_skip(self, idx, targets=None, cache=None):
        """Inference that really skips: at every block only the tokens whose gate is > 0 run it (gathered per row,
        padded to the row with the most, scattered back); a token with g == 0 keeps its stream, as the multiply
        by 0 of forward() gives, and leaves no key or value (see SkipCache). A block no token runs is not
        computed at all. Returns (logits, loss) like forward(); a fresh cache is used if none is given."""
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
            if bool(run.all()):  # every token runs the block: nothing to gather
                cache.select(l, positions.expand(B, T), run)
                x = block(x, self.rope_cos[past:past + T], self.rope_sin[past:past + T], cache, g)
                continue
            # per row, the tokens that run the block first, in order; rows with fewer are padded with skipped ones
            order = torch.argsort((~run).to(torch.uint8), dim=1, stable=True)[:, :N]  # (B, N)
            valid = torch.arange(N, device=idx.device) < count[:, None]             # (B, N)
            pos = positions[order]                                                   # (B, N)
            cache.select(l, pos, valid)
            index = order[..., None].expand(-1, -1, x.size(-1))                      # (B, N, d)
            xs = x.gather(1, index)                                                  # (B, N, d)
            cos, sin = self.rope_cos[pos][:, None], self.rope_sin[pos][:, None]      # (B, 1, N, hd/2)
            out = block(xs, cos, sin, cache, g.gather(1, order))                     # (B, N, d)
            x = x.scatter(1, index, torch.where(valid[..., None], out, xs))          # padding writes back xs
        cache.pos += T
        logits = self.lm_head(self.norm(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True, skip=True):
        """Continue idx (B, T) by max_new_tokens tokens. temperature 0 is greedy decoding. skip: tokens whose gate
        is 0 skip their blocks for real (forward_skip, SkipCache); False computes every block as forward() does."""
        skip = skip and self.config.gated
        forward, Cache = (self.forward_skip, SkipCache) if skip else (self, KVCache)
        cache, n_seen = None, 0
        for _ in range(max_new_tokens):
            if not use_cache:
                logits, _ = forward(idx[:, -self.config.block_size:])
            else:
                if cache is None or cache.pos >= self.config.block_size:
                    # (re)fill the cache; past the context length, restart it from the last half context
                    keep = self.config.block_size if cache is None else self.config.block_size // 2
                    cache = Cache(self.config, idx.size(0), idx.device, self.lm_head.weight.dtype)
                    n_seen = max(0, idx.size(1) - keep)
                logits, _ = forward(idx[:, n_seen:], cache=cache)
                n_seen = idx.size(1)
            idx = torch.cat((idx, sample_next(logits[:, -1, :], temperature, top_k, top_p)), dim=1)
        return idx


class SkipCache:
    """The cache of forward_skip() (inference that really skips, continued): per layer and row, the keys, values
    and gates of only the tokens that ran that layer (g > 0), packed in order, with their positions; a skipped
    token takes no slot, so no later query can attend to it. forward_skip() calls select() before each block."""

    def __init__(self, config, batch_size, device, dtype):
        head_dim = config.head_dim or config.n_embd // config.n_head
        n = config.block_size + 1  # slot block_size is scratch: the padding of rows with fewer tokens goes there
        self.k = torch.zeros(config.n_layer, batch_size, config.n_kv_head, n, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.g = torch.ones(config.n_layer, batch_size, n, device=device,
                            dtype=torch.promote_types(dtype, torch.float32))
        self.key_pos = torch.zeros(config.n_layer, batch_size, n, dtype=torch.long, device=device)
        self.n = torch.zeros(config.n_layer, batch_size, dtype=torch.long, device=device)  # slots in use
        self.pos = 0  # number of tokens already seen (run or skipped)

    def select(self, layer, query_pos, valid):
        """The tokens about to run `layer`: positions query_pos (B, N), valid (B, N) False for row padding."""
        n = self.n[layer]
        self.layer, self.query_pos, self.past_n = layer, query_pos, n.clone()
        slots = n[:, None] + torch.arange(query_pos.size(1), device=n.device)  # (B, N)
        self.slots = torch.where(valid, slots, self.k.size(3) - 1)
        self.n[layer] = n + valid.sum(1)
        self.key_pos[layer].scatter_(1, self.slots, query_pos)

    def update(self, layer, k, v):
        """Store k, v (B, H_kv, N, hd) of the selected tokens; return the keys/values of the layer's slots."""
        index = self.slots[:, None, :, None].expand_as(k)
        self.k[layer].scatter_(2, index, k.to(self.k.dtype))  # under autocast k, v are bf16, the cache the weights'
        self.v[layer].scatter_(2, index, v.to(self.v.dtype))
        Tk = int(self.n[layer].max())
        return self.k[layer, :, :, :Tk], self.v[layer, :, :, :Tk]

    def update_gates(self, layer, g):
        """Store the gates g (B, N) of the selected tokens; return those of the layer's slots (B, Tk)."""
        self.g[layer].scatter_(1, self.slots, g.to(self.g.dtype))
        return self.g[layer, :, :int(self.n[layer].max())]

    def attention_mask(self, T, Tk):
        """(is_causal, mask) for the selected tokens against the layer's Tk slots: a slot is visible if it is
        in use in that row and its token does not come after the query."""
        n, past_n = self.n[self.layer], self.past_n
        if bool((n == Tk).all()):  # no row padding among the keys
            if T == 1:
                return False, None  # a single new token sees every stored key
            if bool((past_n == 0).all()):
                return True, None  # the keys are exactly the queries, in order: plain causal attention
        used = torch.arange(Tk, device=n.device) < n[:, None]                              # (B, Tk)
        earlier = self.key_pos[self.layer, :, None, :Tk] <= self.query_pos[:, :, None]    # (B, T, Tk)
        return False, (used[:, None, :] & earlier)[:, None]                              # (B, 1, T, Tk)


def sample_next(logits, temperature, top_k, top_p):
    """One token per row of logits (B, vocab): greedy, or sampled after temperature, top-k and top-p."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) > top_p  # keep the smallest set whose mass reaches top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    return torch.multinomial(logits.softmax(-1), num_samples=1)
