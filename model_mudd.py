"""
MUDDFormer: after each block, dense mixes of every earlier output, with weights computed per token, one per stream.

"MUDDFormer: Breaking Residual Bottlenecks in Transformers via Multiway Dynamic Dense Connections", Xiao, Meng, Li,
Yuan (ICML 2025, arXiv 2502.12170); code: Caiyun-AI/MUDDFormer at fc067b2 (its PyTorch module's forward, its JAX
training code's start). X_0 = the embedding, X_i = block i's output. After block i, for each stream c of q, k, v, r:
    A_i = W2_i GELU(W1_i RMSNorm(X_i)) + a_i      (B, T, C, i + 1): per token; RMSNorm without a weight
    X^c = sum_{j=0..i} A_i[c, j] X_j
Block i + 1 reads them: attention projects its queries from norm_q(X^q), its keys from norm_k(X^k), its values from
norm_v(X^v), and adds its output to X^r; the MLP then runs as in vanilla. Block 1 reads X_0 in every stream. The last
mix keeps r alone (C = 1), which the final norm and the head read. W1_i is C (i + 1) wide, x4 in the last mix, then
(h // 64 + 1) 64 (the code's round64). Start (the training code): W1 ~ N(0, 1/d), W2 = 0, a_i 1 on X_i and 0
elsewhere, so the model starts as vanilla. Variants: static (A_i = a_i for every token), oneway (the r stream only;
q, k and v read it through their norms). The code's pre/post-norms and depth-scaled MLP widths are left out.
docs/mudd.md: the sources, where the paper and the code differ, the counts, the parameter names, the relations.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

MODIFIED = ("GPTConfig", "GPT.__init__", "GPT.forward", "GPT.flops_per_token", "Block.__init__", "Block.forward",
            "CausalSelfAttention.forward")  # differ from model_vanilla.py
PAPER = "MUDDFormer"  # the name the tables and figures group this file's labels by
VARIANTS = {"static": dict(mudd_dynamic=False), "oneway": dict(mudd_ways="r")}  # mudd-static, mudd-oneway


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
    mudd_ways: str = option("qkvr", "the streams each mix makes: qkvr (queries, keys, values, residual) or r (the "
                            "residual alone, which q, k and v then read)", choices=("qkvr", "r"))
    mudd_dynamic: bool = option(True, "weights computed per token from the newest output; false: the static a_i alone")

    def __post_init__(self):  # the rules across fields; each field's own are checked by the scripts
        head_size = self.head_dim or self.n_embd / self.n_head  # a fraction when n_head does not divide n_embd
        if self.n_head % self.n_kv_head or head_size % 2:
            raise ValueError(f"--n_embd {self.n_embd}, --n_head {self.n_head}, --n_kv_head {self.n_kv_head}, "
                             f"--head_dim {self.head_dim} do not fit: the head size (head_dim, or n_embd / n_head "
                             "when head_dim is 0) must be a whole even number, and n_kv_head must divide n_head")


class DynamicDense(nn.Module):
    """The mix weights after block i + 1 (i counted from 0), as the authors' MultiwayDynamicDenseBlock computes them:
    W2 GELU(W1 RMSNorm(x)) + a, (B, T, C, i + 2) over the sources X_0 .. X_{i+1}, C streams."""

    def __init__(self, config, i, C, last):
        super().__init__()
        hidden = C * (i + 2) * (4 if last else 1)  # the last mix's W1 four times as wide (the code's expand_last)
        hidden = (hidden // 64 + 1) * 64  # the code's round64, which adds 64 even to a multiple of 64
        self.w1 = nn.Linear(config.n_embd, hidden, bias=False) if config.mudd_dynamic else None
        self.w2 = nn.Linear(hidden, C * (i + 2), bias=False) if config.mudd_dynamic else None
        self.C, self.eps = C, config.norm_eps

    def forward(self, x, a):
        """x: the newest output X_{i+1} (B, T, d); a: the static term (C, i + 2). Returns A (B, T, C, i + 2)."""
        if self.w1 is None:  # static: the same weights for every token
            return a.expand(*x.shape[:-1], *a.shape)
        xf = F.rms_norm(x.to(torch.promote_types(x.dtype, torch.float32)), (x.size(-1),), eps=self.eps).type_as(x)
        dw = self.w2(F.gelu(self.w1(xf)))  # (B, T, C (i + 2)): stream c's weights, then the next stream's
        return dw.view(*x.shape[:-1], self.C, -1) + a  # (B, T, C, i + 2)


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
        """x: the normed streams (x_q, x_k, x_v), (B, T, d) each: the queries, keys and values are each projected
        from their own, by the rows of wqkv that project them."""
        (B, T, C), hd = x[0].shape, self.head_dim
        rows = (self.n_head * hd, self.n_kv_head * hd, self.n_kv_head * hd)
        biases = self.wqkv.bias.split(rows) if self.wqkv.bias is not None else (None,) * 3
        q, k, v = (F.linear(s, w, b).view(B, T, -1, hd).transpose(1, 2)          # (B, heads, T, hd) each
                   for s, w, b in zip(x, self.wqkv.weight.split(rows), biases))
        if self.qk_norm:  # Qwen3: each head's q and k normalised over hd, each by its own weight, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)                   # (B, H, T, hd), (B, H_kv, T, hd)
        if cache is None:  # training: plain causal attention, the flash kernel on CUDA
            y = F.scaled_dot_product_attention(                                    # (B, H, T, hd)
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
                enable_gqa=self.n_kv_head != self.n_head)
        else:  # generation: write the new keys and values at input_pos, attend over the whole cache
            k, v = cache.update(self.layer_idx, input_pos, k, v)                   # (B, H_kv, S, hd)
            y = cached_attention(q, k, v, attention_mask(input_pos, k.size(2)))    # (B, H, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)                          # (B, T, H hd)
        return self.wo(y)


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        # a norm per stream the attention reads, in every block (the authors' training code): attn_norm the queries'
        # (vanilla's name: a pretrained model's norm loads there), these two the keys' and the values'
        self.attn_norm_k = RMSNorm(config.n_embd, config.norm_eps)
        self.attn_norm_v = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, streams, cos, sin, cache=None, input_pos=None):
        """streams: (X^q, X^k, X^v, X^r), (B, T, d) each. The attention's output is added to X^r."""
        xq, xk, xv, x = streams
        normed = (self.attn_norm(xq), self.attn_norm_k(xk), self.attn_norm_v(xv))
        x = x + self.drop(self.attn(normed, cos, sin, cache, input_pos))
        x = x + self.drop(self.mlp(self.mlp_norm(x)))
        return x


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
        # the mixes after each block (made after vanilla's init, so that a seed draws vanilla's weights first): C
        # streams, the last mix r alone; the authors' names, dense_bs (a_i) and dynamic_dense (W1, W2)
        L, C = config.n_layer, len(config.mudd_ways)
        ways = [C] * (L - 1) + [1]
        self.dense_bs = nn.ParameterList(nn.Parameter(F.one_hot(torch.tensor([i + 1] * c), i + 2).float())
                                         for i, c in enumerate(ways))  # a_i: 1 on X_i, 0 elsewhere
        self.dynamic_dense = nn.ModuleList(DynamicDense(config, i, c, i == L - 1) for i, c in enumerate(ways))
        for mix in self.dynamic_dense:
            if mix.w1 is not None:  # the training code's start: W1 ~ N(0, 1/d) (fan-in), W2 = 0
                nn.init.normal_(mix.w1.weight, mean=0.0, std=config.n_embd ** -0.5)
                nn.init.zeros_(mix.w2.weight)

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
        outputs, hidden, streams = [x], [], (x,) * 4  # outputs[j] = X_j; block 1 reads X_0 in every stream
        for block, mix, a in zip(self.blocks, self.dynamic_dense, self.dense_bs):
            x = block(streams, cos, sin, cache, input_pos)  # X_i
            outputs.append(x)
            hidden.append(x)
            A = mix(x, a)  # (B, T, C, i + 1)
            # X^c = sum_j A[c, j] X_j, each stream c; one-way: the residual stream, which q, k and v read too
            streams = [sum(A[..., c, j, None] * X for j, X in enumerate(outputs)) for c in range(A.size(-2))]
            streams = streams * 4 if len(streams) == 1 else streams
        logits = self.lm_head(self.norm(streams[-1]))  # (B, T, vocab): the last mix, r alone
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        if return_hidden:
            return logits, loss, hidden  # hidden[l]: output of block l+1, read by the logit lens
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
        for mix, a in zip(self.dynamic_dense, self.dense_bs):  # W1 and W2, then the mixes: C (i + 1) d per block
            linear += (mix.w1.weight.numel() + mix.w2.weight.numel() if mix.w1 is not None else 0) + a.numel() * c.n_embd
        attention = c.n_layer * 2 * c.n_head * hd * (seq_len + 1) / 2  # q.k and p.v over the causal half
        return 3 * 2 * (linear + attention)

    @torch.no_grad()
    def depth_map(self, idx):
        """(C (L - 1) + 1, L + 1): each stream's weights A_i[c, j], the mean over idx's tokens, a row per stream that
        block i + 1 reads (q, k, v, r; one-way: r), the head's last; 0 on the outputs after X_i."""
        weights = []  # each mix's A (B, T, C, i + 1), read off the forward on idx
        hooks = [mix.register_forward_hook(lambda m, args, A: weights.append(A.float().mean((0, 1))))
                 for mix in self.dynamic_dense]
        try:
            self(idx)
        finally:
            for hook in hooks:
                hook.remove()
        return torch.cat([F.pad(A, (0, self.config.n_layer + 1 - A.size(-1))) for A in weights]).cpu()

    def depth_map_layout(self):
        """How eval.py --depth_map draws depth_map(): the row of stream c after block i reads X_0 .. X_i, from its
        start a_i, 1 on X_i (signed weights: A is not normalised)."""
        L, ways = self.config.n_layer, self.config.mudd_ways
        after = [i for i in range(1, L) for _ in ways] + [L]  # the block each row's mix follows
        return dict(rows=[f"{c} of block {i + 1}" for i in range(1, L) for c in ways] + ["head"],
                    columns=["emb", *map(str, range(1, L + 1))], signed=True,
                    valid=torch.arange(L + 1) <= torch.tensor(after)[:, None], start=torch.eye(L + 1)[after],
                    xlabel="source: the embedding (X_0, emb), then block j's output (X_j)",
                    cbar="A, the mean over tokens (signed)", start_text="start a_i, 1 on the newest output X_i")

    def wiring_points(self):
        """eval.py --wiring's sources: the blocks; each one's output is read whole (its input is a mix of streams)."""
        return list(self.blocks), [str(l + 1) for l in range(self.config.n_layer)], False


# ---- model_vanilla.py's components below, unchanged in every model file (tests/test_identical.py) ----

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
    raise SystemExit("model_mudd.py is a model file, not a script: train it with `python train.py --model mudd`, "
                     "and sample a run of it with `python sample.py --out_dir RUN`")
