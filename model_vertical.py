"""
Vertical Attention: a learned softmax over depth feeds every block a mix of all earlier layers' outputs.

Paper: "Vertical Attention: Automatic Exploration of Inter-Layer Connections in Transformer-Based Language
Models", by anonymous authors (under double-blind review; no public code), sections 3-4.
The model is model_vanilla.py with one change in GPT.forward: block l (1-indexed) no longer reads the previous
block's output but a per-token weighted average v^l of its sources
    h^1 = the embedding output,  h^i = the output of block i-1  (i = 2..l)
    alpha_l     = softmax(s_l),  s_l in R^l learned                                     (eqs. 1-2)
    alpha~_l,i  = (alpha_l,i / ||h^i||) / sum_j (alpha_l,j / ||h^j||),  per token       (eq. 3)
    v^l         = sum_i alpha~_l,i h^i                                                  (eq. 4)
    h^(l+1)     = Block_l(v^l),  the unchanged pre-norm block                           (eqs. 5-6)
and the final RMSNorm and head read h^(L+1), as in vanilla. Extra parameters: the L(L+1)/2 scores (eq. 7), in an
AdamW group of their own (va_lr, va_weight_decay: the paper's 0.01 and 0.01). va_map="unet" / "inet": the paper's
fixed maps instead of learned scores. docs/vertical.md has every reading of the paper (the norm, the init, the
fixed maps, the entropy), the parameter counts and the Hugging Face notes.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

MODIFIED = ("GPTConfig", "GPT.__init__", "GPT.forward", "GPT.param_groups")  # differ from model_vanilla.py
PAPER = "Vertical Attention"  # the name the tables and figures group this file's labels by
VARIANTS = {"unet": dict(va_map="unet"), "inet": dict(va_map="inet")}  # the paper's comparisons: the tables' labels
TESTED = {"recent": dict(va_init="recent")}  # configurations the contract suite also tests


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
    va_map: str = option("learned", "the vertical map: learned scores, or the paper's fixed unet / inet maps",
                         choices=("learned", "unet", "inet"))
    va_init: str = option("uniform", "learned scores start uniform (zeros) or recent (alpha 0.9 on the newest source)",
                          choices=("uniform", "recent"))
    va_lr: float = option(0.01, "AdamW lr of the scores (paper; the model's 1e-4 leaves the map frozen)", min=0)
    va_weight_decay: float = option(0.01, "AdamW weight decay of the scores (paper)", min=0)
    va_eps: float = option(1e-6, "inside each source's L2 norm: sqrt(sum h^2 + eps)", above=0)

    def __post_init__(self):  # the rules across fields; each field's own are checked by the scripts
        head_size = self.head_dim or self.n_embd / self.n_head  # a fraction when n_head does not divide n_embd
        if self.n_head % self.n_kv_head or head_size % 2:
            raise ValueError(f"--n_embd {self.n_embd}, --n_head {self.n_head}, --n_kv_head {self.n_kv_head}, "
                             f"--head_dim {self.head_dim} do not fit: the head size (head_dim, or n_embd / n_head "
                             "when head_dim is 0) must be a whole even number, and n_kv_head must divide n_head")


def inv_norm(h, eps):
    """1 / ||h||_2 over the channels of every token, ||h|| = sqrt(sum h^2 + eps): (B, T, d) -> (B, T, 1), in float32
    at least."""
    h = h.to(torch.promote_types(h.dtype, torch.float32))
    return torch.rsqrt(h.pow(2).sum(-1, keepdim=True) + eps)


def vertical_mix(sources, inv_norms, alpha):
    """Eqs. 3-4: v = sum_i alpha~_i h^i, alpha~_i = (alpha_i / ||h^i||) / sum_j (alpha_j / ||h^j||) per token.
    sources: l tensors (B, T, d); inv_norms: their 1 / ||h^i|| (inv_norm), l tensors (B, T, 1); alpha: (l,), the
    map's row."""
    if len(sources) == 1:  # block 1 reads h^1 alone, and a mix of one source is that source (alpha~ = w / w = 1)
        return sources[0]
    w = alpha * torch.cat(inv_norms, dim=-1)  # alpha_i / ||h^i||: (B, T, l)
    w = (w / w.sum(-1, keepdim=True)).split(1, dim=-1)  # alpha~ (eq. 3): l views (B, T, 1)
    v = sources[0] * w[0]
    for i in range(1, len(sources)):  # sum_i alpha~_i h^i, a loop over the sources, never over tokens
        v = torch.addcmul(v, sources[i], w[i])
    return v.type_as(sources[-1])


def fixed_map(kind, n_layer):
    """The paper's hand-crafted L x L maps (our reading of the missing Figure 2); rows sum to 1.
    inet: layer l reads h^1, h^2 and h^l equally. unet: layer l reads h^l and its mirror h^(L+2-l) (block L+1-l's
    output) when that is an earlier source (the second half of the stack, as in a U-Net). Fewer distinct sources:
    the row renormalises."""
    m = torch.zeros(n_layer, n_layer)
    for l in range(1, n_layer + 1):  # 1-indexed layer l reads h^1..h^l
        for i in ({1, 2, l} if kind == "inet" else {l, n_layer + 2 - l}):
            if i <= l:
                m[l - 1, i - 1] = 1.0
    return m / m.sum(-1, keepdim=True)


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
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
        L = config.n_layer
        rows, cols = torch.tril_indices(L, L)  # where the flat scores [s_1; s_2; ...; s_L] sit in the L x L map
        self.register_buffer("va_rows", rows, persistent=False)
        self.register_buffer("va_cols", cols, persistent=False)
        if config.va_map == "learned":
            scores = torch.zeros(L * (L + 1) // 2)  # "uniform": alpha_l = 1/l
            if config.va_init == "recent":
                for l in range(2, L + 1):  # e^s / (e^s + l - 1) = 0.9 on the newest source of row l
                    scores[l * (l + 1) // 2 - 1] = math.log(9 * (l - 1))
            self.va_scores = nn.Parameter(scores)
        else:
            self.register_parameter("va_scores", None)
            self.register_buffer("va_fixed", fixed_map(config.va_map, L), persistent=False)

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
        x = self.drop(self.tok_emb(idx))  # (B, T, d): h^1
        alpha = self.depth_map().unbind(0)  # L rows (L,): row l, block l+1's, holds alpha of h^1..h^(l+1)
        sources, inv_norms, hidden = [], [], []
        for l, block in enumerate(self.blocks):
            sources.append(x)  # h^(l+1): the embedding, then each block's output
            inv_norms.append(inv_norm(x, self.config.va_eps))  # once per source, read by every later block
            x = block(vertical_mix(sources, inv_norms, alpha[l][:l + 1]), cos, sin, cache, input_pos)
            hidden.append(x)
        logits = self.lm_head(self.norm(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        if return_hidden:
            return logits, loss, hidden  # hidden[l]: output of block l+1, read by the logit lens
        return logits, loss

    def param_groups(self, weight_decay):
        """AdamW groups: weight decay on matrices and embeddings only, never on norms or biases; the vertical
        attention scores in a group of their own with lr va_lr and weight decay va_weight_decay (the paper's)."""
        params = [p for n, p in self.named_parameters() if p.requires_grad and n != "va_scores"]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        if self.va_scores is not None:
            groups.append({"params": [self.va_scores], "lr": self.config.va_lr,
                           "weight_decay": self.config.va_weight_decay})
        return groups

    def flops_per_token(self, seq_len):
        """Training FLOPs per token (forward + backward = 3x forward) from the matmuls this model does."""
        c = self.config
        hd = c.head_dim or c.n_embd // c.n_head
        linear = c.n_layer * (c.n_embd * hd * (2 * c.n_head + 2 * c.n_kv_head) + 3 * c.n_embd * c.ffn_hidden)
        linear += c.n_embd * c.vocab_size  # the head; the embedding is a lookup, not a matmul
        attention = c.n_layer * 2 * c.n_head * hd * (seq_len + 1) / 2  # q.k and p.v over the causal half
        return 3 * 2 * (linear + attention)

    def depth_map(self, idx=None):
        """The L x L map alpha (eq. 2): layer l's row holds softmax(s_l) over h^1..h^l, zeros above the diagonal (and a
        fixed map as it is). This is alpha, not the per-token alpha~ of eq. 3 (which also depends on each token's
        source norms), so it needs no batch: idx, which the models whose map depends on the input read, is not used."""
        if self.va_scores is None:
            return self.va_fixed.float()
        L = self.config.n_layer
        # float32 whatever the default dtype, like the scores it receives and the fixed maps above
        s = torch.full((L, L), float("-inf"), dtype=torch.float32, device=self.va_scores.device)
        return s.index_put((self.va_rows, self.va_cols), self.va_scores.float()).softmax(-1)

    def depth_map_layout(self):
        """How eval.py --depth_map draws depth_map(): row l reads the embedding and blocks 1..l-1; a learned map
        starts uniform (its --va_lr sets how fast it leaves the start)."""
        L = self.config.n_layer
        valid = torch.ones(L, L, dtype=torch.bool).tril()
        return dict(columns=["emb", *map(str, range(1, L))], valid=valid, cbar="alpha (softmax weight of the source)",
                    xlabel="source: the embedding (emb), then block j's output (j)",
                    start=valid / valid.sum(1, keepdim=True) if self.va_scores is not None else None,
                    start_text="uniform start (every row equal over its sources)")

    @torch.no_grad()
    def stats(self, idx=None):
        """Mean row entropy of the map (eq. 8, on alpha: see depth_map), logged by train.py; idx is not used."""
        rows = self.depth_map()
        return {"va_entropy": -torch.xlogy(rows, rows).sum(-1).mean().item()}  # -sum p log p (0 log 0 = 0)


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
    raise SystemExit("model_vertical.py is a model file, not a script: train it with `python train.py --model vertical`, "
                     "and sample a run of it with `python sample.py --out_dir RUN`")
