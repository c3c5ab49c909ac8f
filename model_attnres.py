"""
Attention Residuals (AttnRes): every sublayer reads a learned softmax over depth instead of the residual sum.

Paper (Open AttnRes): "Open Attention Residuals: Replacing Additive Residuals with Learned Cross-Layer Attention"
(Cheng Luo and Zefan Cai, March 2025; code: github.com/wdlctc/open-attention-residuals), an open reproduction of
Kimi Team, "Attention Residuals" (arXiv 2603.15031). We implement the Kimi paper's definition.

Each attention and each MLP of the L blocks is a sublayer: 2L of them, in the order attn_1, mlp_1, attn_2, ...
Sublayer l computes f_l = Attn(Norm(h_l)) or MLP(Norm(h_l)) with vanilla's modules, on the depth mix
    h_l = sum_i a_{l,i} v_i,    a_{l,i} = softmax_i( w_l . RMSNorm_l(v_i) )    (per token, over the sources i)
w_l in R^d is a pseudo-query, zero at init (a uniform mix); RMSNorm_l is a key norm with its own weight g_l
(init 1). No 1/sqrt(d), no gate, and by default no recency bias (Open AttnRes, lessons 3-4); the softmax runs
in float32; the values are the raw sources.
  attn_res="full":  v_0 = the token embedding, v_i = f_i (sublayer outputs, not cumulative states);
                    sublayer l reads v_0 .. v_{l-1}.
  attn_res="block": the 2L sublayers form n_blocks blocks of consecutive sublayers (default 4). Sources: b_0 =
                    the embedding, the completed block sums b_n = sum of f over block n, and the partial sum of
                    the current block once it is non-empty. Blocks start at transformer-layer boundaries, as
                    Kimi's pseudo-code counts attention + MLP pairs: n_blocks <= L splits the L layers as evenly
                    as possible, the first blocks one layer longer (numpy.array_split's sizes: 6 layers in 4
                    blocks are 2,2,1,1 layers, i.e. 4,4,2,2 sublayers); more blocks than layers split the 2L
                    sublayers the same way (12 sublayers in 8 blocks: 2,2,2,2,1,1,1,1); 1 <= n_blocks <= 2L is
                    checked. Full mode is block mode with one sublayer per block (b_n = f_n, the partial is never
                    read), and is implemented as exactly that.
Output: one more mix with its own pseudo-query and key norm, over all block representations (full mode: all
sources), feeds the final RMSNorm and the head, as in the Kimi paper. The Open AttnRes repository differs: it keeps a
normal residual stream h = h + f and attends over snapshots of that stream (cumulative states). Here no residual
stream exists; the sources are block sums of sublayer outputs.

Implementation, in two phases as the Kimi paper computes it: RMSNorm_l(v) . w_l = (v . q_l) / rms(v) with the
folded query q_l = g_l * w_l, which does not depend on the input, and every mix after a source's completion reads
that source. So when a source completes (DepthSources.complete), its logits against all later mixes come from one
(B*T, d) x (d, n) matmul scaled by 1 / rms(v); a mix then gathers its column from each source and does the
softmax and one weighted sum (a fused multiply-add per source). Only the open block's partial sum, which changes
after every sublayer, gets its logit when it is read. No normalised key is ever stored: autograd keeps the raw
sources, which the weighted sums need anyway, and the small (B, T, n) logits. Sources are a list, each stored once
and never copied (a stacked (S, B, T, d) tensor grown by torch.cat per block would keep one copy per block alive
for backward: O(N^2) source tensors, O(L^2) in full mode). The logits are float32 also under autocast (float64 in
a float64 model); sources keep the embedding's dtype (float32 under autocast, like vanilla's stream). The mix is
per token, so causality is unchanged and generation just passes the key/value cache to attention.
tests/test_attnres.py checks this path against the direct form (stacked sources, softmax of w . RMSNorm(v)) in
float64: logits, gradients, the key/value cache and GQA.

Interpretations:
- Dropout on sublayer outputs, the pre-norm modules and the 0.02/sqrt(2L) init of attn.wo and mlp.w2 stay as in
  vanilla (no stream accumulates 2L outputs now, but keeping vanilla's init keeps the comparison clean).
- w and g are vectors and so get no weight decay (vanilla's param_groups rule) and the model's learning rate.
- depth_map(): the mean softmax weight per row (the 2L sublayers in order, then the output mix) and source over
  the last forward batch (or over idx, run first, with depth_map(idx)); column n is source n (the embedding,
  then block n's sum, or its partial sum while block n is open); zeros where a row has no such source; rows sum
  to 1. stats(): the mean over rows of the entropy of those mean weights. Both read the weights every forward
  records in a plain attribute: like a logged loss they are per rank and not saved in checkpoints (the map
  depends on the input, not only on the weights). Row 0 (the first attention) reads only the embedding, so its
  weight is always 1 and its w and g get no gradient; they are kept so that every sublayer is alike.
- Recency bias (Open AttnRes's Experiment 2, continued pretraining of Qwen3 models: "bias=0 frozen", "bias=3
  learnable"): recency_bias b is added to each mix's logit of its most recent source, the open block's partial
  sum while it is non-empty, else the newest completed source (the output mix included; for the first attention,
  whose only source is the embedding, it changes nothing). recency_bias_learnable makes b one scalar parameter
  per mix (2L + 1 in all, no weight decay) starting at recency_bias; otherwise b is a constant outside the state
  dict, and b = 0, the default, is no bias at all: Open AttnRes's best fine-tuning runs ("bias=0 frozen", zero-init
  pseudo-queries) are this file's defaults. Seed 002's repository adds the bias to the logit of its running
  residual stream (a cumulative state), so that a large b gives back the pretrained model; here the newest source
  is a sum of sublayer outputs, and a large b makes a mix read that block alone. No b gives the pretrained model
  back; b = 0 comes closest (next item).
- Step 0 from a pretrained model (train.py --init_from): function-preserving up to the norms' eps. Zero
  pseudo-queries make every mix uniform, h_l = (1/S) sum_i v_i, and the S sources (the embedding, the block sums
  and the partial sum; in full mode the sublayer outputs) add up to vanilla's residual stream x, so h_l = x / S.
  What reads h_l is always an RMSNorm (the sublayer's pre-norm, or the final norm after the output mix), which
  removes the 1/S except through its eps: rsqrt(mean(x^2) / S^2 + eps) in place of rsqrt(mean(x^2) + eps). So
  the model starts as the pretrained one, exactly as eps -> 0 (tests/test_hf.py compares the logits). Seed 002's
  repository mixes cumulative states, whose uniform average is not the stream (its authors report the "uniform-
  attention initial disruption"). A recency bias b != 0 makes the mix non-uniform and loses this.
- Logit lens: hidden[l] is the output mix over the sources available after block l (the open block's partial
  sum included): what the head would read if the network ended there. hidden[L-1] is the head's input.

Extra parameters: 2d per sublayer plus 2d for the output mix, 2d(2L + 1) in all: 13,056 at the 100m shape
(d 384, L 8), 0.023% of vanilla's 56.3M with the GPT-2 vocabulary (tests/test_attnres.py computes it); a learnable
recency bias adds 2L + 1 scalars.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

MODIFIED = ("GPTConfig", "GPTConfig.__post_init__", "Block.__init__", "Block.forward", "GPT.__init__",
            "GPT.forward", "GPT.flops_per_token")  # components that differ from model_vanilla.py
VARIANTS = {  # besides the default (block, n_blocks 4); block3 splits the contract suite's 4 layers as 2,1,1
    "full": dict(attn_res="full"),
    "block3": dict(attn_res="block", n_blocks=3),
}


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
    attn_res: str = option("block", "block: sources are block sums; full: every sublayer output is a source",
                           choices=("block", "full"))
    n_blocks: int = option(4, "block mode: the 2L sublayers form this many blocks of consecutive sublayers", min=1)
    recency_bias: float = option(0.0, "added to every mix's logit of its most recent source (the AttnRes "
                                 "fine-tuning runs)")
    recency_bias_learnable: bool = option(False, "true: one scalar parameter per mix, starting at recency_bias")

    def __post_init__(self):  # the rules across fields; each field's own are checked by the scripts
        head_size = self.head_dim or self.n_embd / self.n_head  # a fraction when n_head does not divide n_embd
        if self.n_head % self.n_kv_head or head_size % 2:
            raise ValueError(f"--n_embd {self.n_embd}, --n_head {self.n_head}, --n_kv_head {self.n_kv_head}, "
                             f"--head_dim {self.head_dim} do not fit: the head size (head_dim, or n_embd / n_head "
                             "when head_dim is 0) must be a whole even number, and n_kv_head must divide n_head")
        if self.attn_res == "block" and self.n_blocks > 2 * self.n_layer:
            raise ValueError(f"--n_blocks must be between 1 and 2 * n_layer = {2 * self.n_layer}, not {self.n_blocks}")


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
    """Keys and values of every layer for block_size positions, allocated once: generation writes into it in place
    and never reallocates, so that a decode step sees the same shapes at every position. One tensor per layer, so
    that a step's write touches only its layer's tensor (torch.compile then writes in place, copying nothing)."""

    def __init__(self, config, batch_size, device, dtype):
        head_dim = config.head_dim or config.n_embd // config.n_head
        shape = (batch_size, config.n_kv_head, config.block_size, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.pos = 0  # number of tokens already in the cache (forward() advances it; generate.py after a step)

    def reset(self):
        """Empty the cache for a new prompt (generate.py reuses it): the old entries are masked, after pos."""
        self.pos = 0

    def update(self, layer, k, v, pos=None):
        """Store k, v (B, H_kv, T, hd) of the new tokens and return the keys/values attention reads: with pos None
        (forward) at self.pos, returning those of all tokens so far (B, H_kv, self.pos + T, hd); with pos a (1,)
        tensor (decode_step, T = 1) at pos, returning the whole cache (B, H_kv, block_size, hd), the same shape
        whatever pos is (attention_mask hides the positions after pos)."""
        ck, cv = self.k[layer], self.v[layer]
        if pos is not None:  # under autocast k, v are bf16 and the cache has the weights' dtype
            ck.index_copy_(2, pos, k.to(ck.dtype))
            cv.index_copy_(2, pos, v.to(cv.dtype))
            return ck, cv
        ck[:, :, self.pos:self.pos + k.size(2)] = k
        cv[:, :, self.pos:self.pos + k.size(2)] = v
        return ck[:, :, :self.pos + k.size(2)], cv[:, :, :self.pos + k.size(2)]


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

    def forward(self, x, cos, sin, cache=None, pos=None):
        """pos: decode_step's position tensor (one token, static shapes); None: the tokens follow cache.pos."""
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)     # (B, H, T, hd)
        k = self.wk(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, H_kv, T, hd)
        v = self.wv(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, H_kv, T, hd)
        q, k = apply_rope(self.q_norm(q), cos, sin), apply_rope(self.k_norm(k), cos, sin)
        past = 0
        if cache is not None:
            past = cache.pos if pos is None else pos
            k, v = cache.update(self.layer_idx, k, v, pos)  # (B, H_kv, past + T, hd); a step: (B, H_kv, S, hd)
        is_causal, mask = attention_mask(T, k.size(2), past, x.device)
        if pos is not None:
            y = decode_attention(q, k, v, mask)                                    # (B, H, 1, hd)
        else:
            y = F.scaled_dot_product_attention(                                    # (B, H, T, hd)
                q, k, v, attn_mask=mask, is_causal=is_causal,
                dropout_p=self.dropout if self.training else 0.0, enable_gqa=self.n_kv_head != self.n_head)
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


def block_ends(config):
    """Indices of the sublayers that complete a depth block (sublayer 2i is layer i's attn, 2i + 1 its mlp)."""
    n_sub = 2 * config.n_layer
    if config.attn_res == "full":
        return set(range(n_sub))  # one sublayer per block: every output is a source
    # as even as possible, the first r blocks one unit longer; units are whole layers while there are enough
    units, per_unit = (config.n_layer, 2) if config.n_blocks <= config.n_layer else (n_sub, 1)
    q, r = divmod(units, config.n_blocks)
    return {((n + 1) * q + min(n + 1, r)) * per_unit - 1 for n in range(config.n_blocks)}


def depth_logits(v, queries, eps):
    """(v / rms(v)) . q for every row q of queries (n, d): (B, T, n), one matmul. Float32 at least, also under
    autocast: the softmax over depth reads these logits."""
    dtype = torch.promote_types(v.dtype, torch.float32)
    with torch.autocast(v.device.type, enabled=False):
        v = v.to(dtype)
        return (v @ queries.to(dtype).t()) * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)


class AttnRes(nn.Module):
    """One depth mix h = sum_i a_i v_i, a = softmax_i(w . RMSNorm(v_i)) per token, with its own w and norm."""

    def __init__(self, config):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(config.n_embd))  # w: zero, so training starts from a uniform mix
        self.key_weight = nn.Parameter(torch.ones(config.n_embd))  # g, the weight of this mix's key RMSNorm
        # the recency bias b on the most recent source's logit: a parameter, a constant, or none (b = 0, frozen)
        if config.recency_bias_learnable:
            self.recency_bias = nn.Parameter(torch.tensor(float(config.recency_bias)))
        else:
            self.recency_bias = float(config.recency_bias) or None
        self.mean_weights = None  # (S,) mean softmax weight per source over the last forward batch

    def folded_query(self):
        """g * w: (v / rms(v) * g) . w = (v / rms(v)) . (g * w), so a key needs no weight of its own."""
        return self.key_weight * self.query

    def forward(self, logits, values):
        """logits: S tensors (B, T), this mix's w . RMSNorm(v_i); values: the S raw sources (B, T, d)."""
        if self.recency_bias is not None:  # the sources come in order: the last is the most recent
            logits = logits[:-1] + [logits[-1] + self.recency_bias]
        a = torch.stack(logits, dim=-1).softmax(dim=-1)  # (B, T, S): over sources, per token
        self.mean_weights = a.detach().mean(dim=(0, 1))
        a = a.unsqueeze(-2)  # (B, T, 1, S)
        h = a[..., 0] * values[0]
        for i in range(1, len(values)):
            h = torch.addcmul(h, a[..., i], values[i])  # the weighted sum, one fused multiply-add per source
        return h.type_as(values[0])


class DepthSources:
    """What the mixes may read: the completed sources (the embedding, then block sums), each stored once with
    its logits against every later mix (phase one), and the partial sum of the open block. A list, so no mix
    copies a source."""

    def __init__(self, emb, queries, ends, eps):
        self.queries, self.ends, self.eps = queries, ends, eps  # queries (2L + 1, d): every mix's folded g * w
        self.values, self.logits, self.first = [], [], []  # per completed source: (B, T, d), (B, T, n), first reader
        self.partial, self.n_done = None, 0  # the open block's sum so far; sublayers run so far
        self.complete(emb)

    def complete(self, v):
        self.values.append(v)
        self.logits.append(depth_logits(v, self.queries[self.n_done:], self.eps))  # (B, T, 2L + 1 - n_done)
        self.first.append(self.n_done)

    def add(self, f):
        """Take in the output f of the next sublayer."""
        f = f.type_as(self.values[0])  # the embedding's dtype, as vanilla's x = x + f keeps it
        self.partial = f if self.partial is None else self.partial + f
        self.n_done += 1
        if self.n_done - 1 in self.ends:
            self.complete(self.partial)
            self.partial = None

    def read(self, mix):
        """(logits, values) of every source available now, for the mix of index `mix` (2L: the output mix)."""
        logits = [lg[..., mix - first] for lg, first in zip(self.logits, self.first)]  # (B, T) each
        if self.partial is None:
            return logits, self.values
        logits.append(depth_logits(self.partial, self.queries[mix:mix + 1], self.eps)[..., 0])
        return logits, self.values + [self.partial]


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx  # its mixes are 2 * layer_idx (attn) and 2 * layer_idx + 1 (mlp)
        self.attn_res = AttnRes(config)  # mixes the attention's input
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp_res = AttnRes(config)  # mixes the MLP's input
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, sources, cos, sin, cache=None, pos=None):
        """Each sublayer reads a depth mix of the sources; its output joins them (no residual addition)."""
        h = self.attn_res(*sources.read(2 * self.layer_idx))
        sources.add(self.drop(self.attn(self.attn_norm(h), cos, sin, cache, pos)))
        h = self.mlp_res(*sources.read(2 * self.layer_idx + 1))
        sources.add(self.drop(self.mlp(self.mlp_norm(h))))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.block_ends = block_ends(config)  # also checks attn_res and n_blocks
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.out_res = AttnRes(config)  # the output mix over all block representations
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

    def forward(self, idx, targets=None, cache=None, return_hidden=False, pos=None):
        """pos: decode_step's (1,) position tensor, for one token idx (B, 1); None: idx follows cache.pos."""
        B, T = idx.shape
        if pos is None:
            past = cache.pos if cache is not None else 0
            assert past + T <= self.config.block_size, f"{past + T} tokens exceed block_size {self.config.block_size}"
            cos, sin = self.rope_cos[past:past + T], self.rope_sin[past:past + T]
        else:
            cos, sin = self.rope_cos[pos], self.rope_sin[pos]  # (1, hd/2), gathered by a tensor: no .item()
        queries = torch.stack([m.folded_query() for m in self.mixes()])  # (2L + 1, d)
        sources = DepthSources(self.drop(self.tok_emb(idx)), queries, self.block_ends, self.config.norm_eps)
        out_mix = 2 * self.config.n_layer
        hidden = []
        for block in self.blocks:
            block(sources, cos, sin, cache, pos)
            if return_hidden:  # what the head would read if the model ended here
                hidden.append(self.out_res(*sources.read(out_mix)))
        if cache is not None and pos is None:
            cache.pos += T
        x = self.out_res(*sources.read(out_mix))  # every block is complete: the mix over all block representations
        logits = self.lm_head(self.norm(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        if return_hidden:
            return logits, loss, hidden  # hidden[l]: the output mix after block l, read by the logit lens
        return logits, loss

    def mixes(self):
        """The 2L + 1 depth mixes in order: attn and mlp of each block, then the output mix."""
        return [m for block in self.blocks for m in (block.attn_res, block.mlp_res)] + [self.out_res]

    @torch.no_grad()
    def depth_map(self, idx=None):
        """(2L + 1, sources) mean softmax weights of the last forward batch (of idx, if given, run now). Rows: the
        sublayers in order, then the output mix; column n: the embedding (n = 0), else block n's (partial) sum."""
        if idx is not None:
            self(idx)
        rows = [m.mean_weights for m in self.mixes()]
        if any(r is None for r in rows):
            raise RuntimeError("depth_map() reads the weights of the last forward: run the model or pass idx")
        out = torch.zeros(len(rows), len(rows[-1]), device=rows[-1].device)  # the output mix reads every source
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return out.cpu()

    def stats(self):
        """Mean entropy (nats) of the depth map's rows, logged by train.py."""
        if self.out_res.mean_weights is None:
            return {}
        return {"attnres_entropy": torch.special.entr(self.depth_map()).sum(-1).mean().item()}

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
        n_read, done, partial = 0, 1, False  # sources read by all 2L + 1 mixes
        for i in range(2 * c.n_layer):
            n_read += done + partial
            partial = i not in self.block_ends
            done += not partial
        mixing = 2 * c.n_embd * (n_read + done)  # a d-dot product (logit) and a d-weighted sum per source read
        return 3 * 2 * (linear + attention + mixing)
