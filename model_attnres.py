"""
Attention Residuals (AttnRes): every sublayer reads a learned softmax over depth instead of the residual sum.

Paper: Kimi Team, "Attention Residuals" (arXiv 2603.15031), as read through its open reproduction, "Open Attention
Residuals: Replacing Additive Residuals with Learned Cross-Layer Attention" (Cheng Luo and Zefan Cai, 2026).
Each attention and each MLP of the L blocks is a sublayer: 2L of them, in the order attn_1, mlp_1, attn_2, ...
Sublayer l computes f_l = Attn(Norm(h_l)) or MLP(Norm(h_l)) with vanilla's modules, on the depth mix
    h_l = sum_i a_{l,i} v_i,    a_{l,i} = softmax_i( w_l . RMSNorm_l(v_i) )    (per token, over the sources i)
w_l in R^d is a pseudo-query, zero at init (a uniform mix); RMSNorm_l is a key norm with its own weight g_l (init 1).
No 1/sqrt(d), no gate, no recency bias by default; the softmax runs in float32; the values are the raw sources.
  attn_res="full":  v_0 = the token embedding, v_i = f_i; sublayer l reads v_0 .. v_{l-1}.
  attn_res="block": the sublayers form n_blocks blocks (default 4, split at layer boundaries); the sources are the
                    embedding, each completed block's sum of f, and the open block's partial sum once non-empty.
An output mix with its own w and g over all sources feeds the final RMSNorm and the head. Extra parameters:
2d(2L + 1). docs/attnres.md has the block split, how the mix shares work, the readings of the papers (the recency
bias, step 0 from a pretrained model, the logit lens) and the parameter counts.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

MODIFIED = ("GPTConfig", "GPTConfig.__post_init__", "Block.__init__", "Block.forward", "GPT.__init__",
            "GPT.forward", "GPT.flops_per_token")  # components that differ from model_vanilla.py
PAPER = "Attention Residuals"  # the name the tables and figures group this file's labels by
VARIANTS = {"full": dict(attn_res="full")}  # the paper's comparison, besides the default (block, n_blocks 4)
TESTED = {"block3": dict(attn_res="block", n_blocks=3)}  # the contract suite's 4 layers as 2,1,1


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


def block_ends(config):
    """Indices of the sublayers that complete a depth block (index 2i is layer i+1's attn, 2i + 1 its mlp)."""
    n_sub = 2 * config.n_layer
    if config.attn_res == "full":
        return set(range(n_sub))  # one sublayer per block: every output is a source
    # as even as possible, the first r blocks one unit longer; units are whole layers while there are enough
    units, per_unit = (config.n_layer, 2) if config.n_blocks <= config.n_layer else (n_sub, 1)
    q, r = divmod(units, config.n_blocks)
    return {((n + 1) * q + min(n + 1, r)) * per_unit - 1 for n in range(config.n_blocks)}


def inv_rms(v, eps):
    """1 / rms(v) over the channels: (B, T, d) -> (B, T, 1), in float32 at least. RMSNorm(v) = g * v * inv_rms(v)."""
    v = v.to(torch.promote_types(v.dtype, torch.float32))
    return torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)


def softmax_over(logits):
    """softmax_i over a list of same-shaped tensors, element by element: the softmax of their stack along a new last
    axis, unstacked, in float32 at least (also under autocast)."""
    dtype = torch.promote_types(logits[0].dtype, torch.float32)
    return torch.stack(logits, -1).softmax(-1, dtype=dtype).unbind(-1)


class AttnRes(nn.Module):
    """One depth mix h = sum_i a_i v_i, a = softmax_i(w . RMSNorm(v_i)) per token, with its own w and norm weight g."""

    def __init__(self, config):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(config.n_embd))  # w: zero, so training starts from a uniform mix
        self.key_weight = nn.Parameter(torch.ones(config.n_embd))  # g, the weight of this mix's key RMSNorm
        # the recency bias b on the most recent source's logit: a parameter, a constant, or none (b = 0, frozen)
        if config.recency_bias_learnable:
            self.recency_bias = nn.Parameter(torch.tensor(float(config.recency_bias)))
        else:
            self.recency_bias = float(config.recency_bias) or None

    def forward(self, values, scales):
        """values: the S sources v_i (B, T, d), oldest first; scales: their inv_rms(v_i), (B, T, 1) each.
        Returns the mix h (B, T, d) and its weights a (B, T, S)."""
        # w . RMSNorm(v) = w . (g * v / rms(v)) = ((g * w) . v) / rms(v): one dot product per source and a scale
        # per token, so no normalised copy of a source is made (each source is read once for its logit)
        gw = (self.key_weight * self.query).to(scales[0].dtype)
        logits = [torch.linalg.vecdot(v.to(gw.dtype), gw).unsqueeze(-1) * s for v, s in zip(values, scales)]
        if self.recency_bias is not None:  # the sources come in order: the last is the most recent
            logits[-1] = logits[-1] + self.recency_bias
        weights = softmax_over(logits)  # S tensors (B, T, 1), float32 at least: a_i, over sources, per token
        h = weights[0] * values[0]
        for i in range(1, len(values)):
            h = torch.addcmul(h, weights[i], values[i])  # the weighted sum, one fused multiply-add per source
        return h.type_as(values[0]), torch.cat(weights, dim=-1)  # the mix (B, T, d), its weights a (B, T, S)


class DepthSources:
    """What the mixes may read, oldest first: the completed sources (the embedding, then block sums) and, once the
    open block has an output, its partial sum; with each source's inv_rms, computed once for every mix that reads
    it. A list, so no mix copies a source."""

    def __init__(self, emb, ends, eps):
        self.ends, self.eps = ends, eps  # ends: the sublayers that complete a block (block_ends)
        self.values, self.scales = [emb], [inv_rms(emb, eps)]
        self.partial, self.n_done = None, 0  # the open block's sum so far; sublayers run so far

    def add(self, f):
        """Take in the output f of the next sublayer."""
        f = f.type_as(self.values[0])  # the embedding's dtype, as vanilla's x = x + f keeps it
        self.partial = f if self.partial is None else self.partial + f
        if self.n_done in self.ends:  # the block is complete: its sum becomes a source
            self.values.append(self.partial)
            self.scales.append(inv_rms(self.partial, self.eps))
            self.partial = None
        self.n_done += 1

    def read(self):
        """(values, scales) of every source a mix may read now."""
        if self.partial is None:
            return self.values, self.scales
        return self.values + [self.partial], self.scales + [inv_rms(self.partial, self.eps)]


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

    def forward(self, idx, targets=None, cache=None, input_pos=None, return_hidden=False):
        """idx (B, T) -> (logits (B, T, vocab), loss). With a cache, input_pos (T,) holds the positions of idx's
        tokens (a prefill: 0..T-1; a decode step: one position), where their keys and values are written."""
        B, T = idx.shape
        cos, sin = rope_at(self.rope_cos, self.rope_sin, T, input_pos)
        sources = DepthSources(self.drop(self.tok_emb(idx)), self.block_ends, self.config.norm_eps)
        hidden = []
        for block in self.blocks:
            block(sources, cos, sin, cache, input_pos)
            if return_hidden:  # what the head would read if the model ended here
                hidden.append(self.out_res(*sources.read())[0])
        x, _ = self.out_res(*sources.read())  # every block is complete: the mix over all block representations
        logits = self.lm_head(self.norm(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        if return_hidden:
            return logits, loss, hidden  # hidden[l]: the output mix after block l+1, read by the logit lens
        return logits, loss

    def mixes(self):
        """The 2L + 1 depth mixes in order: attn and mlp of each block, then the output mix."""
        return [m for block in self.blocks for m in (block.attn_res, block.mlp_res)] + [self.out_res]

    def sources_per_mix(self):
        """How many sources each of the 2L + 1 mixes reads, in order (the length of its depth_map() row)."""
        counts, done, open_block = [], 1, False
        for l in range(2 * self.config.n_layer):
            counts.append(done + open_block)
            open_block = l not in self.block_ends
            done += not open_block
        return counts + [done]

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
        mixing = 2 * c.n_embd * sum(self.sources_per_mix())  # a d-dot product (logit) and a d-weighted sum per source
        return 3 * 2 * (linear + attention + mixing)

    @torch.no_grad()
    def depth_map(self, idx):
        """(2L + 1, sources) mean softmax weights over idx's tokens. Rows: the sublayers in order, then the output mix;
        column n: the embedding (n = 0), else block n's (partial) sum; zeros where a row has no such source."""
        weights = {}
        hooks = [m.register_forward_hook(lambda m, args, out, r=r: weights.__setitem__(r, out[1]))
                 for r, m in enumerate(self.mixes())]
        try:
            self(idx)  # forward keeps nothing: the mixes' weights are read off their outputs
        finally:
            for hook in hooks:
                hook.remove()
        out = torch.zeros(len(weights), weights[len(weights) - 1].size(-1))  # the output mix reads every source
        for r, a in weights.items():
            out[r, :a.size(-1)] = a.float().mean(dim=(0, 1)).cpu()
        return out

    def wiring_points(self):
        """eval.py --wiring's sources: every attention and MLP is a sublayer whose output is a source, whole (the
        mixes add no identity to what they return): (modules, their labels, False)."""
        return ([m for block in self.blocks for m in (block.attn, block.mlp)],
                [f"{kind}{l + 1}" for l in range(self.config.n_layer) for kind in ("a", "m")], False)

    def depth_map_layout(self):
        """How eval.py --depth_map draws depth_map(): row r reads its first sources_per_mix()[r] sources; zero
        pseudo-queries start every mix uniform."""
        counts = self.sources_per_mix()
        valid = torch.arange(counts[-1])[None, :] < torch.tensor(counts)[:, None]
        full = self.config.attn_res == "full"
        return dict(columns=["emb", *map(str, range(1, counts[-1]))], valid=valid,
                    start_text="uniform start (every row equal over its sources)",
                    xlabel="source: the embedding (emb), then " + ("sublayer n's output (n)" if full else
                                                                    "block n's sum (n; partial while open)"),
                    cbar="mean softmax weight (over tokens)", start=valid / valid.sum(1, keepdim=True))

    def stats(self, idx):
        """Mean entropy (nats) of the rows of depth_map(idx), logged by train.py."""
        rows = self.depth_map(idx)
        return {"attnres_entropy": -torch.xlogy(rows, rows).sum(-1).mean().item()}  # -sum p log p (0 log 0 = 0)


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn_res = AttnRes(config)  # mixes the attention's input
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp_res = AttnRes(config)  # mixes the MLP's input
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, sources, cos, sin, cache=None, input_pos=None):
        """Each sublayer reads a depth mix of the sources; its output joins them (no residual addition)."""
        h, _ = self.attn_res(*sources.read())
        sources.add(self.drop(self.attn(self.attn_norm(h), cos, sin, cache, input_pos)))
        h, _ = self.mlp_res(*sources.read())
        sources.add(self.drop(self.mlp(self.mlp_norm(h))))


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
    raise SystemExit("model_attnres.py is a model file, not a script: train it with `python train.py --model attnres`, "
                     "and sample a run of it with `python sample.py --out_dir RUN`")
