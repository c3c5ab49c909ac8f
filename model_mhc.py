"""
mHC: DeepSeek's manifold-constrained Hyper-Connections, the residual stream widened into n = hc_mult streams.

"mHC: Manifold-Constrained Hyper-Connections", Xie et al. (DeepSeek, arXiv 2512.24880), as transformers 5.25.0 ships
it (models/deepseek_v4/modeling_deepseek_v4.py: DeepseekV4HyperConnection, DeepseekV4HyperHead, the decoder layer,
_init_weights; their names); "Hyper-Connections", Zhu et al. (ICLR 2025, arXiv 2409.19606). model_vanilla.py with the
state x (B, T, n, d), the embedding in every stream. Each attention and MLP F (the sublayers k = 1..2L) has its own
connection, in float32, from h = RMSNorm(flatten(x)) (n d wide, no weight): [p, q, c] = h fn^T,
    pre = sigmoid(s_0 p + b_p) + eps,  post = 2 sigmoid(s_1 q + b_q),  comb = Sinkhorn-Knopp(softmax(s_2 c + b_c) + eps)
    F reads sum_i pre_i x_i through its unchanged RMSNorm;   x <- post (x) F(...) + comb^T x
The final norm reads sum_i pre_i x_i by the head's pre = sigmoid(s h fn_h^T + b) + eps; fn ~ N(0, 0.02), b 0, s 1.
hc_kind="hc" (mhc-hc): Zhu et al.'s dynamic hyper-connections; per stream h_i = RMSNorm(x_i), [pre | comb] = [A_m |
A_r] + s_a tanh(h W_a), post = B + s_b tanh(h W_b); A_m on stream (k-1) mod n + 1, A_r = I, B = 1, W = 0, s = 0.01,
and the head's mean, start it as vanilla. stats(): the mHC paper's Amax gain. docs/mhc.md: readings, counts, relations.
"""
import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

MODIFIED = ("GPTConfig", "GPT.__init__", "GPT.forward", "GPT.flops_per_token", "Block.__init__", "Block.forward")
PAPER = "Hyper-Connections (mHC)"  # the name the tables and figures group this file's labels by
VARIANTS = {"hc": dict(hc_kind="hc")}  # Zhu et al.'s hyper-connections, which mHC constrains: the label mhc-hc


def option(default, doc, **rules):
    """A config field with its --help text and its constraints (min / max, above / below, choices), which the
    scripts check (plumbing.config.check_config) before they build a model."""
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
    hc_mult: int = option(4, "n: the residual streams (DeepSeek-V4: 4)", min=1)
    hc_sinkhorn_iters: int = option(20, "Sinkhorn-Knopp iterations that make each comb doubly stochastic", min=1)
    hc_eps: float = option(1e-6, "mHC's epsilon: in pre, comb's softmax and Sinkhorn's denominators", above=0)
    hc_kind: str = option("mhc", "mhc (DeepSeek's) or hc (Zhu et al.'s, vanilla at the start)", choices=("mhc", "hc"))

    def __post_init__(self):  # the rules across fields; each field's own are checked by the scripts
        head_size = self.head_dim or self.n_embd / self.n_head  # a fraction when n_head does not divide n_embd
        if self.n_head % self.n_kv_head or head_size % 2:
            raise ValueError(f"--n_embd {self.n_embd}, --n_head {self.n_head}, --n_kv_head {self.n_kv_head}, "
                             f"--head_dim {self.head_dim} do not fit: the head size (head_dim, or n_embd / n_head "
                             "when head_dim is 0) must be a whole even number, and n_kv_head must divide n_head")


def sinkhorn(logits, iters, eps):
    """comb (..., n, n) from its logits as DeepseekV4HyperConnection makes it, each denominator + eps."""
    comb = torch.softmax(logits, -1) + eps
    for i in range(2 * iters - 1):  # columns, then rows and columns in turn: columns last (so comb^T's rows sum to 1)
        comb = comb / (comb.sum(-1 if i % 2 else -2, keepdim=True) + eps)
    return comb


def collapse(pre, x):
    """sum_i pre_i x_i: weights (B, T, n), streams (B, T, n, d) -> (B, T, d), in the streams' dtype."""
    return (pre.unsqueeze(-1) * x).sum(2).type_as(x)


def connect(weights, x, sublayer):
    """A sublayer between the streams x (B, T, n, d): it reads sum_i pre_i x_i; x <- post (x) output + comb^T x."""
    pre, post, comb = weights
    y = sublayer(collapse(pre, x))  # (B, T, d)
    with torch.autocast(x.device.type, enabled=False):  # the mix in float32: stream k <- post_k y + sum_j comb_jk x_j
        return post.type_as(x).unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.type_as(x).transpose(-1, -2), x)


class HyperConnection(nn.Module):
    """mHC's connection of a sublayer: DeepseekV4HyperConnection and its names (k, the sublayer, is for HC's start)."""

    def __init__(self, config, k):
        super().__init__()
        n, self.iters, self.eps = config.hc_mult, config.hc_sinkhorn_iters, config.hc_eps
        self.norm_eps = config.norm_eps  # the unweighted RMSNorm's (transformers: rms_norm_eps)
        # fn's rows: pre's n, post's n, comb's n^2; as transformers' _init_weights: normal at the model's std, base 0,
        self.fn = nn.Parameter(0.02 * torch.randn((2 + n) * n, n * config.n_embd))  # scale 1 (pre's, post's, comb's)
        self.base, self.scale = nn.Parameter(torch.zeros((2 + n) * n)), nn.Parameter(torch.ones(3))

    def forward(self, x):
        """x (B, T, n, d) -> pre (B, T, n), post (B, T, n), comb (B, T, n, n), in float32."""
        n = x.size(2)
        with torch.autocast(x.device.type, enabled=False):
            h = F.rms_norm(x.flatten(2).float(), (x.size(2) * x.size(3),), eps=self.norm_eps)  # (B, T, n d)
            p, q, c = F.linear(h, self.fn.float()).split((n, n, n * n), -1)
            (bp, bq, bc), s = self.base.float().split((n, n, n * n)), self.scale.float()
            return (torch.sigmoid(p * s[0] + bp) + self.eps, 2 * torch.sigmoid(q * s[1] + bq),
                    sinkhorn((c * s[2] + bc).unflatten(-1, (n, n)), self.iters, self.eps))


class DynamicHyperConnection(nn.Module):
    """HC's connection of sublayer k + 1 (Zhu et al.'s dynamic hyper-connection, their Algorithm 2's names, an RMSNorm
    for its LayerNorm): [A_m | A_r], B start as pre-norm: read stream k mod n + 1, keep every stream, add F to each."""

    def __init__(self, config, k):
        super().__init__()
        n, d, self.norm = config.hc_mult, config.n_embd, RMSNorm(config.n_embd, config.norm_eps)
        self.static_alpha = nn.Parameter(torch.cat((torch.eye(n)[:, k % n, None], torch.eye(n)), 1))  # (n, n + 1)
        self.static_beta = nn.Parameter(torch.ones(n))
        self.dynamic_alpha_fn, self.dynamic_beta_fn = nn.Parameter(torch.zeros(d, n + 1)), nn.Parameter(torch.zeros(d))
        self.dynamic_alpha_scale, self.dynamic_beta_scale = (nn.Parameter(torch.full((1,), 0.01)) for _ in "ab")

    def forward(self, x):
        """x (B, T, n, d) -> pre = A_m (B, T, n), post = B (B, T, n), comb = A_r (B, T, n, n), in float32."""
        with torch.autocast(x.device.type, enabled=False):
            h = self.norm(x.float()).float()  # (B, T, n, d): each stream normalised
            a = self.static_alpha + self.dynamic_alpha_scale * torch.tanh(h @ self.dynamic_alpha_fn.float())
            b = self.static_beta + self.dynamic_beta_scale * torch.tanh(h @ self.dynamic_beta_fn.float())
        return a[..., 0], b, a[..., 1:]  # a (B, T, n, n + 1), b (B, T, n)


class HyperHead(nn.Module):
    """The head's pre (B, T, n): mHC's (DeepseekV4HyperHead and its names), HC's the mean (docs/mhc.md)."""

    def __init__(self, config):
        super().__init__()
        n, self.eps, self.norm_eps, self.mean = config.hc_mult, config.hc_eps, config.norm_eps, config.hc_kind == "hc"
        self.hc_fn, self.hc_base, self.hc_scale = (None,) * 3 if self.mean else (nn.Parameter(t) for t in (
            0.02 * torch.randn(n, n * config.n_embd), torch.zeros(n), torch.ones(1)))

    def forward(self, x):
        if self.mean:
            return torch.full(x.shape[:-1], 1 / x.size(2), device=x.device)
        with torch.autocast(x.device.type, enabled=False):
            h = F.rms_norm(x.flatten(2).float(), (x.size(2) * x.size(3),), eps=self.norm_eps)  # (B, T, n d)
            return torch.sigmoid(F.linear(h, self.hc_fn.float()) * self.hc_scale + self.hc_base) + self.eps  # (B, T, n)


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.hc_head = HyperHead(config)
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        cos, sin = rope_tables(config.head_dim or config.n_embd // config.n_head, config.block_size,
                               config.rope_theta, None)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("attn.wo.weight") or name.endswith("mlp.w2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None, cache=None, input_pos=None, return_hidden=False):
        """idx (B, T) -> (logits (B, T, vocab), loss). With a cache, input_pos (T,) holds the positions of idx's
        tokens (a prefill: 0..T-1; a decode step: one position), where their keys and values are written."""
        B, T = idx.shape
        cos, sin = rope_at(self.rope_cos, self.rope_sin, T, input_pos)
        x = self.drop(self.tok_emb(idx))  # (B, T, d)
        x = x.unsqueeze(2).expand(-1, -1, self.config.hc_mult, -1)  # (B, T, n, d): the embedding in every stream
        hidden = []
        for block in self.blocks:
            x = block(x, cos, sin, cache, input_pos)
            hidden.append(x)
        logits = self.lm_head(self.norm(collapse(self.hc_head(x), x)))  # (B, T, vocab): the head reads the streams
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        if return_hidden:
            return logits, loss, [collapse(self.hc_head(h), h) for h in hidden]  # the head's read after block l+1
        return logits, loss

    def param_groups(self, weight_decay):
        """AdamW groups: weight decay on matrices and embeddings only, never on norms or biases."""
        params = [p for p in self.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]

    def flops_per_token(self, seq_len):
        """Training FLOPs per token (forward + backward = 3x forward) from the matmuls this model does."""
        c = self.config
        hd = c.head_dim or c.n_embd // c.n_head
        linear = c.n_layer * (c.n_embd * hd * (2 * c.n_head + 2 * c.n_kv_head) + 3 * c.n_embd * c.ffn_hidden)
        linear += c.n_embd * c.vocab_size  # the head; the embedding is a lookup, not a matmul
        attention = c.n_layer * 2 * c.n_head * hd * (seq_len + 1) / 2  # q.k and p.v over the causal half
        n, d, mhc = c.hc_mult, c.n_embd, c.hc_kind == "mhc"
        # 2L connections: a projection (mHC: (2+n)n x nd; HC: n x d x (n+2)), then pre, comb and post ((n+2) n d)
        linear += 2 * c.n_layer * ((2 + n) * n * n * d if mhc else 2 * (n + 2) * n * d) + (n + 1 if mhc else 1) * n * d
        return 3 * 2 * (linear + attention)

    def connection_weights(self, idx):
        """Each connection's weights on idx's tokens: (pre, post, comb) of attention 1, ..., MLP L; the head's pre."""
        out, modules = [], [m for block in self.blocks for m in (block.attn_hc, block.ffn_hc)] + [self.hc_head]
        hooks = [m.register_forward_hook(lambda m, args, w: out.append(w)) for m in modules]
        try:
            self(idx)
        finally:
            for hook in hooks:
                hook.remove()
        return out

    @torch.no_grad()
    def depth_map(self, idx):
        """(2L + 1, 2n + n^2): each sublayer's mean pre, post and comb over idx's tokens; the head's pre last."""
        *subs, head = self.connection_weights(idx)
        rows = [torch.cat((pre, post, comb.flatten(-2)), -1) for pre, post, comb in subs]  # (B, T, 2n + n^2) each
        return torch.stack([r.mean((0, 1)).cpu() for r in rows + [F.pad(head, (0, rows[0].size(-1) - head.size(-1)))]])

    def depth_map_layout(self):
        """How eval.py --depth_map draws depth_map(), and its start: HC's exactly; mHC's as if fn were 0."""
        n, L, mhc = self.config.hc_mult, self.config.n_layer, self.config.hc_kind == "mhc"
        start = torch.cat((torch.full((n,), 0.5), torch.ones(n), torch.full((n * n,), 1 / n))).repeat(2 * L + 1, 1)
        if not mhc:  # pre on stream k mod n + 1, comb the identity; the head's mean
            start[:-1, :n], start[:-1, 2 * n:] = torch.eye(n)[torch.arange(2 * L) % n], torch.eye(n).flatten()
        start[-1, :n], start[-1, n:] = 0.5 if mhc else 1 / n, 0  # the head's row: its pre alone
        valid = (torch.arange(2 * n + n * n) < n) | (torch.arange(2 * L + 1) < 2 * L)[:, None]
        return dict(columns=[f"{w}{i}" for w in ("pre", "post") for i in range(1, n + 1)]
                    + [f"c{j}{k}" for j in range(1, n + 1) for k in range(1, n + 1)], valid=valid, start=start,
                    xlabel="pre_i: reads stream i; post_i: writes stream i; c_jk: old stream j in new stream k",
                    cbar="mean weight over tokens", signed=not mhc, start_text=(
                        "start as if fn were 0 (pre 0.5, post 1, comb 1/n): fn's random start spreads each token's"
                        if mhc else "pre-norm start (each sublayer reads one stream, post 1, comb the identity)"))

    def wiring_points(self):
        """eval.py --wiring's sources: each attention and MLP, whose output later sublayers read through the streams."""
        return ([m for block in self.blocks for m in (block.attn, block.mlp)],
                [f"{kind}{l + 1}" for l in range(self.config.n_layer) for kind in ("a", "m")], False)

    @torch.no_grad()
    def stats(self, idx):
        """hc_gain, the mHC paper's Amax gain magnitude: per token, the larger of the largest absolute row and column
        sum of P = comb_1 ... comb_2L (P^T maps the streams from sublayer 1 to past 2L); the max over idx's tokens."""
        P = functools.reduce(torch.matmul, [comb for _, _, comb in self.connection_weights(idx)[:-1]])  # (B, T, n, n)
        return {"hc_gain": torch.maximum(P.abs().sum(-1).amax(-1), P.abs().sum(-2).amax(-1)).max().item()}


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        Connection = HyperConnection if config.hc_kind == "mhc" else DynamicHyperConnection
        self.attn_hc = Connection(config, 2 * layer_idx)  # transformers' names: attn_hc, ffn_hc
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ffn_hc = Connection(config, 2 * layer_idx + 1)
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, cos, sin, cache=None, input_pos=None):
        x = connect(self.attn_hc(x), x, lambda h: self.drop(self.attn(self.attn_norm(h), cos, sin, cache, input_pos)))
        return connect(self.ffn_hc(x), x, lambda h: self.drop(self.mlp(self.mlp_norm(h))))


# ---- model_vanilla.py's components below, unchanged in every model file (tests/test_identical.py) ----

class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        assert config.n_head % config.n_kv_head == 0 and (config.head_dim or config.n_embd % config.n_head == 0)
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.head_dim or config.n_embd // config.n_head
        # q, k and v in one matmul: its output is H query heads, then H_kv key heads and H_kv value heads
        self.wqkv = nn.Linear(config.n_embd, (config.n_head + 2 * config.n_kv_head) * self.head_dim, bias=config.bias)
        self.wo = nn.Linear(config.n_head * self.head_dim, config.n_embd, bias=config.bias)
        self.dropout, self.qk_norm = config.dropout, config.qk_norm
        # QK-norm (Qwen3): RMSNorm over each head's q and k before RoPE; off, an identity without parameters
        self.q_norm = RMSNorm(self.head_dim, config.norm_eps) if config.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim, config.norm_eps) if config.qk_norm else nn.Identity()

    def forward(self, x, cos, sin, cache=None, input_pos=None):
        B, T, C = x.shape
        qkv = self.wqkv(x).view(B, T, -1, self.head_dim).transpose(1, 2)          # (B, H + 2 H_kv, T, hd)
        qk, v = qkv.split((self.n_head + self.n_kv_head, self.n_kv_head), 1)  # (B, H + H_kv, T, hd), (B, H_kv, T, hd)
        if self.qk_norm:  # Qwen3: each head's q and k normalised over hd, each by its own weight, before RoPE
            q, k = qk.split((self.n_head, self.n_kv_head), 1)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), 1)
        # RoPE rotates the q and k heads in one go, as they sit side by side in qkv
        q, k = apply_rope(qk, cos, sin).split((self.n_head, self.n_kv_head), 1)  # (B, H, T, hd), (B, H_kv, T, hd)
        if cache is None:  # training: plain causal attention, the flash kernel on CUDA
            y = F.scaled_dot_product_attention(                                    # (B, H, T, hd)
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
                enable_gqa=self.n_kv_head != self.n_head)
        else:  # generation: write the new keys and values at input_pos, attend over the whole cache
            k, v = cache.update(self.layer_idx, input_pos, k, v)                   # (B, H_kv, S, hd)
            y = cached_attention(q, k, v, attention_mask(input_pos, k.size(2)))    # (B, H, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)                          # (B, T, H hd)
        return self.wo(y)


class KVCache:
    """Keys and values of every layer for block_size positions, allocated once: generation writes into it in place
    and never reallocates, so that a decode step sees the same shapes at every position. One tensor per layer, so
    that a step's write touches only its layer's tensor (torch.compile then writes in place, copying nothing).
    A new prompt needs no emptying: attention_mask hides every position after the query's, written or not."""

    def __init__(self, config, batch_size, device, dtype):
        head_dim = config.head_dim or config.n_embd // config.n_head
        shape = (batch_size, config.n_kv_head, config.block_size, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]

    def update(self, layer, input_pos, k, v):
        """Write k, v (B, H_kv, T, hd) of the new tokens at input_pos (T,); return the whole cache, (B, H_kv, S, hd)
        each, the same shapes whatever the positions (torch.compile traces one graph)."""
        ck, cv = self.k[layer], self.v[layer]  # under autocast k, v are bf16 and the cache has the weights' dtype
        return ck.index_copy_(2, input_pos, k.to(ck.dtype)), cv.index_copy_(2, input_pos, v.to(cv.dtype))


def attention_mask(input_pos, S):
    """(T, S) boolean: the query at position input_pos[t] sees the cached positions up to its own."""
    return torch.arange(S, device=input_pos.device) <= input_pos[:, None]


def cached_attention(q, k, v, mask):
    """Attention of the new queries q (B, H, T, hd) over the whole cache k, v (B, H_kv, S, hd) under mask (T, S) or
    (B, 1, T, S): the H / H_kv query heads of each KV head become its rows, so that SDPA needs no GQA flag beside a
    mask (docs/contract.md). Row r of a KV head is query head r // T, token r % T, hence the mask tiled."""
    B, H, T, hd = q.shape
    G = H // k.size(1)
    y = F.scaled_dot_product_attention(                                            # (B, H_kv, G T, hd)
        q.reshape(B, k.size(1), G * T, hd), k, v, attn_mask=mask.tile(G, 1))
    return y.reshape(B, H, T, hd)  # a copy only where the kernel left another layout (CUDA, float32)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        # w1 (the gate) and w3 in one matmul: its output is w1 x, then w3 x
        self.w13 = nn.Linear(config.n_embd, 2 * config.ffn_hidden, bias=config.bias)
        self.w2 = nn.Linear(config.ffn_hidden, config.n_embd, bias=config.bias)

    def forward(self, x):
        gate, up = self.w13(x).chunk(2, dim=-1)  # w1 x, w3 x: (B, T, ffn_hidden) each
        return self.w2(F.silu(gate) * up)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # x / sqrt(mean(x^2) + eps) in float32 at least: under bf16 autocast the mean of squares loses precision
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        return F.rms_norm(xf, (x.size(-1),), eps=self.eps).type_as(x) * self.weight


def rope_tables(head_dim, seq_len, theta, device):
    """cos and sin of the rotary angles at full width, each (seq_len, head_dim): channels i and i + hd/2 turn by the
    same angle, and the sin's first half is negated, so that apply_rope is two products, a roll and a sum."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)  # (seq_len, hd/2)
    return torch.cat((angles.cos(), angles.cos()), -1), torch.cat((-angles.sin(), angles.sin()), -1)


def rope_at(cos, sin, T, input_pos):
    """The rows of the rotary tables for T tokens: positions 0..T-1 (a slice) without input_pos, else gathered at
    input_pos (T,) by a tensor, so that a decode step has no .item() and no Python branch on the position."""
    if input_pos is None:
        assert T <= cos.size(0), f"{T} tokens exceed block_size {cos.size(0)}"
        return cos[:T], sin[:T]
    return cos[input_pos], sin[input_pos]  # (T, hd)


def apply_rope(x, cos, sin):
    """Rotate the pairs (x[..., i], x[..., i + hd/2]) of x (B, heads, T, hd) by the angles of their positions:
    x cos + rotate_half(x) sin, where rotate_half(x) = (-x2, x1) is x rolled by hd/2 with the sign in the sin table.
    In float32 (a no-op for a float32 x): under bf16 autocast the rotation keeps its precision."""
    xf = x.float()
    return (xf * cos + xf.roll(x.size(-1) // 2, -1) * sin).type_as(x)


if __name__ == "__main__":  # a model file, not a script: say so, and which script to run
    raise SystemExit("model_mhc.py is a model file, not a script: train it with `python train.py --model mhc`, "
                     "and sample a run of it with `python sample.py --out_dir RUN`")
