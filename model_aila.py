"""
AILA: Adaptive Integrated Layered Attention, Architectures 1 and 2, adapted to a causal language model.

Paper: "Adaptive Integrated Layered Attention (AILA)", by William Claster, Suhas K M and Dhairya Gundechia
(Northeastern University; no public code). A "layer" j = 1..L is one unchanged pre-norm block of model_vanilla.py,
h~_j = Block_j(h_{j-1}) with h_0 the embedding output; layer j forms a_j from its sources h_0..h_{j-1}, per token
(so causality and the key/value cache are vanilla's), and merges it into its output h_j:
    arch 2 (default; eqs. 4-5), per head:  q = W_Q h~_j,  k_i = W_K h_i,  v_i = W_V h_i   (aila_dk wide)
        alpha_i = softmax_i(q . k_i / sqrt(d_k)),   a_j = W_O [sum_i alpha_i v_i]_(heads concatenated)
    arch 1 (eqs. 1-2): candidates c_i = W_{j,i} h_i (i < j) and c_j = h~_j, scored per head k,
        alpha_c^(k) = softmax_c(<c^(k), w_{j,c}^(k)>),   a_j = (1/H) sum_k sum_c alpha_c^(k) c
    merge (eqs. 3 / 6):  h_j = LayerNorm(ReLU(h~_j + a_j))   (aila_merge="residual": h_j = h~_j + a_j)
The final RMSNorm and head read h_L. Arch 2 runs by linearity, q . W_K h_i = (W_K^T q) . h_i and
sum_i alpha_i W_V h_i = W_V sum_i alpha_i h_i: one key and one value product per layer, not one per source.
docs/aila.md has the readings of the paper, the parameter counts, the costs and the Hugging Face notes.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

MODIFIED = ("GPTConfig", "GPTConfig.__post_init__", "GPT.__init__", "GPT.forward",
            "GPT.flops_per_token")  # components that differ from model_vanilla.py
PAPER = "AILA"  # the name the tables and figures group this file's labels by
VARIANTS = {"arch1": dict(aila_arch=1), "residual": dict(aila_merge="residual")}  # the tables' labels, aila-arch1, ...
TESTED = {"arch1_rank": dict(aila_arch=1, aila_rank=8)}  # the contract suite also tests it (n_embd 64, n_head 4)


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
    aila_arch: int = option(2, "2: attention over earlier layers (the paper's Architecture 2); 1: linear "
                            "(Architecture 1)", choices=(1, 2))
    aila_heads: int = option(1, "heads of the cross-layer mixing (paper: 1); must divide n_embd", min=1)
    aila_dk: int = option(64, "arch 2: query/key/value width per head (paper: 64)", min=1)
    aila_rank: int = option(0, "arch 1: 0 = full d x d projection per (layer, source); r > 0 = rank-r U V^T", min=0)
    aila_merge: str = option("relu_layernorm", "relu_layernorm: LayerNorm(ReLU(h~ + a)) (paper); residual: h~ + a",
                             choices=("relu_layernorm", "residual"))

    def __post_init__(self):  # the rules across fields; each field's own are checked by the scripts
        head_size = self.head_dim or self.n_embd / self.n_head  # a fraction when n_head does not divide n_embd
        if self.n_head % self.n_kv_head or head_size % 2:
            raise ValueError(f"--n_embd {self.n_embd}, --n_head {self.n_head}, --n_kv_head {self.n_kv_head}, "
                             f"--head_dim {self.head_dim} do not fit: the head size (head_dim, or n_embd / n_head "
                             "when head_dim is 0) must be a whole even number, and n_kv_head must divide n_head")
        if self.n_embd % self.aila_heads:
            raise ValueError(f"--aila_heads {self.aila_heads} must divide --n_embd {self.n_embd}")


def softmax_over(logits):
    """softmax_i over a list of same-shaped tensors, element by element: the softmax of their stack along a new last
    axis, unstacked, in float32 at least (also under autocast)."""
    dtype = torch.promote_types(logits[0].dtype, torch.float32)
    return torch.stack(logits, -1).softmax(-1, dtype=dtype).unbind(-1)


class LayerAttention(nn.Module):
    """Architecture 2 for one layer: scaled dot-product attention of h~_j over the sources h_0..h_{j-1}."""

    def __init__(self, config):
        super().__init__()
        self.n_head, self.dk = config.aila_heads, config.aila_dk
        self.wq = nn.Linear(config.n_embd, self.n_head * self.dk, bias=config.bias)
        self.wk = nn.Linear(config.n_embd, self.n_head * self.dk, bias=False)  # a key bias cancels in the softmax
        self.wv = nn.Linear(config.n_embd, self.n_head * self.dk, bias=config.bias)
        self.wo = nn.Linear(self.n_head * self.dk, config.n_embd, bias=config.bias)

    def forward(self, h, sources):
        """h (B, T, d): h~_j; sources: h_0 .. h_{j-1}, j tensors (B, T, d) as they were made (no stacked copy: each
        is read where it lies, once for the scores and once for the mix)."""
        B, T, C = h.shape
        H, dk = self.n_head, self.dk
        q = self.wq(h).view(B, T, H, dk)                                                   # (B, T, H, dk)
        # q . (W_K h_i) = (W_K^T q) . h_i: one product with W_K per layer, not one per source
        qk = torch.einsum("bthk,hkd->bthd", q, self.wk.weight.view(H, dk, C)) / math.sqrt(dk)  # (B, T, H, d)
        e = [torch.linalg.vecdot(qk, s.unsqueeze(2)).unsqueeze(-1) for s in sources]       # j x (B, T, H, 1)
        a = softmax_over(e)                                                                # j x (B, T, H, 1)
        mix = a[0] * sources[0].unsqueeze(2)
        for i in range(1, len(sources)):
            mix = torch.addcmul(mix, a[i], sources[i].unsqueeze(2))                         # (B, T, H, d)
        # sum_i alpha_i (W_V h_i + b) = W_V (sum_i alpha_i h_i) + b, since the alphas sum to 1
        v = torch.einsum("bthd,hkd->bthk", mix, self.wv.weight.view(H, dk, C)).reshape(B, T, H * dk)
        if self.wv.bias is not None:
            v = v + self.wv.bias
        return self.wo(v), torch.cat(a, dim=-1)                                           # (B, T, d), alpha


class LayerLinear(nn.Module):
    """Architecture 1 for one layer: projected sources and h~_j scored by per-head linear scorers."""

    def __init__(self, config, n_sources):
        super().__init__()
        d, r = config.n_embd, config.aila_rank
        self.n_head = config.aila_heads
        self.proj = nn.ModuleList([  # W_{j,i}: full d x d, or rank r as V^T (d -> r) then U (r -> d)
            nn.Linear(d, d, bias=config.bias) if r == 0 else
            nn.Sequential(nn.Linear(d, r, bias=False), nn.Linear(r, d, bias=config.bias))
            for _ in range(n_sources)])
        self.score = nn.Parameter(torch.randn(n_sources + 1, d) * 0.02)  # w_{j,c}: one scorer per candidate

    def forward(self, h, sources):
        """h (B, T, d): h~_j; sources: h_0 .. h_{j-1}, j tensors (B, T, d), each with its own projection."""
        B, T, C = h.shape
        H = self.n_head
        cand = torch.stack([p(s) for p, s in zip(self.proj, sources)] + [h], dim=2)  # (B, T, j+1, d)
        e = torch.einsum("btchk,chk->btch", cand.view(B, T, -1, H, C // H),
                         self.score.view(-1, H, C // H))                                   # (B, T, j+1, H)
        alpha = e.softmax(dim=2).transpose(2, 3)                                           # (B, T, H, j+1)
        a = torch.einsum("btc,btcd->btd", alpha.mean(2), cand)  # = mean over heads of each head's weighted sum
        return a, alpha                                                                    # (B, T, d), alpha


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.mix = nn.ModuleList([LayerAttention(config) if config.aila_arch == 2 else LayerLinear(config, j + 1)
                                  for j in range(config.n_layer)])  # layer j+1 (1-indexed) reads j+1 sources
        if config.aila_merge == "relu_layernorm":
            self.merge_norm = nn.ModuleList([nn.LayerNorm(config.n_embd, eps=config.norm_eps)
                                             for _ in range(config.n_layer)])
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
        sources, hidden = [], []
        for j, (block, mix) in enumerate(zip(self.blocks, self.mix)):
            sources.append(x)  # h_0 .. h_j
            h = block(x, cos, sin, cache, input_pos)  # h~_{j+1}: index j is layer j+1
            a, _ = mix(h, sources)  # (B, T, d); the weights alpha are for depth_map() and stats()
            x = h + a if self.config.aila_merge == "residual" else self.merge_norm[j](F.relu(h + a))
            hidden.append(x)
        logits = self.lm_head(self.norm(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        if return_hidden:
            return logits, loss, hidden  # hidden[l]: output of layer l+1 (after the merge), read by the logit lens
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
        pairs = c.n_layer * (c.n_layer + 1) // 2  # (layer, source) pairs
        if c.aila_arch == 2:  # W_Q, W_K^T q, W_V, W_O per layer; scores and mixing per source and head
            linear += 4 * c.n_layer * c.n_embd * c.aila_heads * c.aila_dk + 2 * pairs * c.aila_heads * c.n_embd
        else:  # per-source projections; scores and mixing per candidate (sources + h~_j)
            proj = c.n_embd * c.n_embd if c.aila_rank == 0 else 2 * c.aila_rank * c.n_embd
            linear += pairs * proj + 2 * (pairs + c.n_layer) * c.n_embd
        attention = c.n_layer * 2 * c.n_head * hd * (seq_len + 1) / 2  # q.k and p.v over the causal half
        return 3 * 2 * (linear + attention)

    @torch.no_grad()
    def mix_weights(self, idx):
        """alpha (B, T, H, candidates) of every layer's mix in a forward over idx (B, T), read off the mixes'
        outputs: forward itself keeps nothing."""
        weights = []
        hooks = [m.register_forward_hook(lambda m, args, out: weights.append(out[1].float())) for m in self.mix]
        try:
            self(idx)
        finally:
            for hook in hooks:
                hook.remove()
        return weights

    def depth_map(self, idx, weights=None):
        """Mean alpha per layer over idx's tokens and the heads: (L, L); arch 1 (L, L+1), h~_j in column j."""
        c = self.config
        m = torch.zeros(c.n_layer, c.n_layer + (c.aila_arch == 1))
        for j, alpha in enumerate(weights or self.mix_weights(idx)):
            m[j, :alpha.size(-1)] = alpha.mean(dim=(0, 1, 2)).cpu()
        return m

    def wiring_points(self):
        """eval.py --wiring's sources: layer j's output h_j is its merge norm's, whole: (modules, their labels,
        False); None with the residual merge, whose h~_j + a_j no module returns."""
        if self.config.aila_merge == "residual":
            return None
        return list(self.merge_norm), [str(l + 1) for l in range(self.config.n_layer)], False

    def depth_map_layout(self):
        """How eval.py --depth_map draws depth_map(): layer j reads h_0..h_(j-1), arch 1 also h~_j in column j; the
        mixes start uniform."""
        L, arch1 = self.config.n_layer, self.config.aila_arch == 1
        valid = torch.ones(L, L + arch1, dtype=torch.bool).tril(int(arch1))
        return dict(columns=["emb", *map(str, range(1, L + arch1))], valid=valid,
                    start_text="uniform start (every row equal over its sources)",
                    xlabel="source: the embedding (emb), then block j's output (j)"
                    + ("; row j's column j: its own block output" if arch1 else ""),
                    cbar="mean alpha (over tokens and heads)", start=valid / valid.sum(1, keepdim=True))

    def stats(self, idx):
        """Over idx: the mean row entropy of depth_map(idx) and the mean per-token entropy of alpha (nats); a layer
        whose tokens each pick one source sharply can still average to a flat row."""
        weights = self.mix_weights(idx)
        token_entropy = torch.stack([-torch.xlogy(a, a).sum(-1).mean() for a in weights]).mean()  # -sum p log p
        rows = self.depth_map(idx, weights)
        return {"aila_map_entropy": -torch.xlogy(rows, rows).sum(-1).mean().item(),
                "aila_token_entropy": token_entropy.item()}


# ---- model_vanilla.py's components below, unchanged in every model file (tests/test_identical.py) ----

class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, cos, sin, cache=None, input_pos=None):
        x = x + self.drop(self.attn(self.attn_norm(x), cos, sin, cache, input_pos))
        x = x + self.drop(self.mlp(self.mlp_norm(x)))
        return x


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
    raise SystemExit("model_aila.py is a model file, not a script: train it with `python train.py --model aila`, "
                     "and sample a run of it with `python sample.py --out_dir RUN`")
