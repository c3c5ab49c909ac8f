"""
Value residuals and value embeddings: later blocks' attention values take in block 1's values, or a token table.

"Value Residual Learning For Alleviating Attention Concentration In Transformers", Zhou et al. (arXiv 2410.17897;
ResFormer), as its authors' code computes it (Zcchill/Value-Residual-Learning at 95652f6). model_vanilla.py with one
change, in the values of the attention, after the value projection and before attention, per key/value head:
    resformer (default):  V'_n = lambda_1 V_1 + lambda_2 V_n   (blocks n = 2..L; fixed, 0.5 and 0.5)
    learned:              V'_n = (1 - lambda_n) V_n + lambda_n V_1   (modded-nanogpt's record of 2024-11-06;
                          lambda_n learned per block, 0.5 at the start)
    embed:                V'_n = V_n + 3 sigmoid(W_n x[:12]) E_n[idx]   (nanochat's value embeddings, gpt.py at
                          92d63d4: a token table E_n (vocab, H_kv hd) in alternate blocks, the last included; W_n
                          (H_kv, 12) gates each key/value head from the first 12 channels of the block's normed input)
V_1 is block 1's own values; V' is what attention reads and what the cache keeps. Block 1 is vanilla's; so is
every block without a table. Inits: E_n uniform with std 1/sqrt(d), W_n uniform(0, 0.02) (gates near 1.5): nanochat's.
No model starts as vanilla. docs/value.md: the sources, where they differ, the parameter counts, the relations.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

MODIFIED = ("GPTConfig", "GPTConfig.__post_init__", "GPT.__init__", "GPT.forward", "GPT.flops_per_token",
            "Block.forward", "CausalSelfAttention.__init__", "CausalSelfAttention.forward")  # differ from vanilla
PAPER = "Value residuals"  # the name the tables and figures group this file's labels by
VARIANTS = {"learned": dict(value_mode="learned"), "embed": dict(value_mode="embed")}  # value-learned, value-embed


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
    value_mode: str = option("resformer", "how a block's values take in more: resformer (ResFormer's fixed mix with block "
                             "1's values), learned (modded-nanogpt's learned mix), embed (nanochat's value embeddings)",
                             choices=("resformer", "learned", "embed"))
    value_lambda1: float = option(0.5, "resformer: lambda_1, the weight of block 1's values (the authors' code: 0.5)")
    value_lambda2: float = option(0.5, "resformer: lambda_2, the weight of the block's own values (0.5)")
    ve_gate_channels: int = option(12, "embed: the channels of the block's normed input its gates read (nanochat: 12)",
                                   min=1)

    def __post_init__(self):  # the rules across fields; each field's own are checked by the scripts
        head_size = self.head_dim or self.n_embd / self.n_head  # a fraction when n_head does not divide n_embd
        if self.n_head % self.n_kv_head or head_size % 2:
            raise ValueError(f"--n_embd {self.n_embd}, --n_head {self.n_head}, --n_kv_head {self.n_kv_head}, "
                             f"--head_dim {self.head_dim} do not fit: the head size (head_dim, or n_embd / n_head "
                             "when head_dim is 0) must be a whole even number, and n_kv_head must divide n_head")
        if self.value_mode == "embed" and self.ve_gate_channels > self.n_embd:
            raise ValueError(f"--ve_gate_channels {self.ve_gate_channels} is more than the --n_embd {self.n_embd} "
                             "channels a gate can read; choose at most n_embd")


def has_ve(layer_idx, n_layer):
    """nanochat's placement: a value embedding in alternate blocks, counted down from the last (which has one)."""
    return layer_idx % 2 == (n_layer - 1) % 2


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
        # the method: what this block's values take in (block 1 keeps its own, V_1, which later blocks read)
        self.mode, self.lambdas = config.value_mode, (config.value_lambda1, config.value_lambda2)
        if config.value_mode == "learned" and layer_idx > 0:
            self.lamb = nn.Parameter(torch.tensor(0.5))  # modded-nanogpt's name and start
        if config.value_mode == "embed" and has_ve(layer_idx, config.n_layer):
            self.ve_gate = nn.Linear(config.ve_gate_channels, config.n_kv_head, bias=False)  # nanochat's name

    def forward(self, x, cos, sin, cache=None, input_pos=None, values=None, ve=None):
        """values: a list that block 1 fills with its values V_1 (B, H_kv, T, hd), for the later blocks; ve: this
        block's rows of its token table (B, T, H_kv hd), or None."""
        B, T, C = x.shape
        qkv = self.wqkv(x).view(B, T, -1, self.head_dim).transpose(1, 2)          # (B, H + 2 H_kv, T, hd)
        qk, v = qkv.split((self.n_head + self.n_kv_head, self.n_kv_head), 1)  # (B, H + H_kv, T, hd), (B, H_kv, T, hd)
        if self.layer_idx == 0:  # block 1: its own values are V_1, which the later blocks take in
            values.append(v)
        elif self.mode == "resformer":  # V'_n = lambda_1 V_1 + lambda_2 V_n
            v = self.lambdas[0] * values[0] + self.lambdas[1] * v                  # (B, H_kv, T, hd)
        elif self.mode == "learned":  # V'_n = (1 - lambda_n) V_n + lambda_n V_1
            v = (1 - self.lamb) * v + self.lamb * values[0]                        # (B, H_kv, T, hd)
        if ve is not None:  # V'_n = V_n + g E_n[idx], g = 3 sigmoid(W_n x[:12]) per token and key/value head
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., :self.ve_gate.in_features]))  # (B, T, H_kv)
            v = v + gate.transpose(1, 2)[..., None] * ve.view(B, T, self.n_kv_head, -1).transpose(1, 2)
        if self.qk_norm:  # Qwen3: each head's q and k normalised over hd, each by its own weight, before RoPE
            q, k = qk.split((self.n_head, self.n_kv_head), 1)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), 1)
        # RoPE rotates the q and k heads in one go, as they sit side by side in qkv
        q, k = apply_rope(qk, cos, sin).split((self.n_head, self.n_kv_head), 1)  # (B, H, T, hd), (B, H_kv, T, hd)
        if cache is None:  # training: plain causal attention, the flash kernel on CUDA
            y = F.scaled_dot_product_attention(                                    # (B, H, T, hd)
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
                enable_gqa=self.n_kv_head != self.n_head)
        else:  # generation: write the new keys and mixed values at input_pos, attend over the whole cache
            k, v = cache.update(self.layer_idx, input_pos, k, v)                   # (B, H_kv, S, hd)
            y = cached_attention(q, k, v, attention_mask(input_pos, k.size(2)))    # (B, H, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)                          # (B, T, H hd)
        return self.wo(y)


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
        head_dim = config.head_dim or config.n_embd // config.n_head
        if config.value_mode == "embed":  # nanochat's value embeddings: a token table per chosen block
            self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(config.vocab_size, config.n_kv_head * head_dim)
                                               for i in range(config.n_layer) if has_ve(i, config.n_layer)})
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("attn.wo.weight") or name.endswith("mlp.w2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
            if name.startswith("value_embeds."):  # nanochat: uniform with the std of its value projection, 1/sqrt(d)
                nn.init.uniform_(p, -math.sqrt(3 / config.n_embd), math.sqrt(3 / config.n_embd))
            if name.endswith("ve_gate.weight"):  # nanochat: small and positive, so the gates start near 3 / 2
                nn.init.uniform_(p, 0.0, 0.02)

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
        hidden, values = [], []  # values: block 1's values V_1, which the later blocks take in
        for i, block in enumerate(self.blocks):
            ve = self.value_embeds[str(i)](idx) if str(i) in getattr(self, "value_embeds", {}) else None
            x = block(x, cos, sin, cache, input_pos, values, ve)
            hidden.append(x)
        logits = self.lm_head(self.norm(x))  # (B, T, vocab)
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
        if c.value_mode == "embed":  # the gates (the tables are lookups; the mixes elementwise, as resformer's)
            linear += sum(has_ve(i, c.n_layer) for i in range(c.n_layer)) * c.ve_gate_channels * c.n_kv_head
        attention = c.n_layer * 2 * c.n_head * hd * (seq_len + 1) / 2  # q.k and p.v over the causal half
        return 3 * 2 * (linear + attention)

    @torch.no_grad()
    def depth_map(self, idx):
        """(L, 2): each block's weight on its own values, then on block 1's (resformer, learned: fixed or learned
        scalars; idx is not read) or on its table, its gates' mean over idx's tokens and key/value heads (embed)."""
        m = torch.zeros(self.config.n_layer, 2)
        m[:, 0] = 1.0
        if self.config.value_mode == "embed":
            for i, gate in self.gate_means(idx).items():
                m[i, 1] = gate
        for i, block in enumerate(self.blocks[1:], start=1):
            if self.config.value_mode == "resformer":
                m[i] = torch.tensor([self.config.value_lambda2, self.config.value_lambda1])
            elif self.config.value_mode == "learned":
                m[i] = torch.stack([1 - block.attn.lamb, block.attn.lamb]).float().cpu()
        return m

    def depth_map_layout(self):
        """How eval.py --depth_map draws depth_map(): block 1 reads its own values alone (embed: the blocks without a
        table too); a learned map's start, the gates' as if W_n were 0."""
        c, embed = self.config, self.config.value_mode == "embed"
        valid = torch.ones(c.n_layer, 2, dtype=torch.bool)
        valid[:, 1] = torch.tensor([has_ve(i, c.n_layer) if embed else i > 0 for i in range(c.n_layer)])
        start = torch.tensor([[1.0, 0.0] if not valid[i, 1] else [1.0, 1.5] if embed else [0.5, 0.5]
                              for i in range(c.n_layer)])
        layout = dict(columns=["own", "table" if embed else "V_1"], valid=valid, cbar="weight (gate: mean over tokens)",
                      xlabel="the block's own values, then " + ("its token table's" if embed else "block 1's"))
        if c.value_mode != "resformer":  # resformer's weights are fixed: nothing to learn
            layout.update(start=start, start_text="gates' start as if W_n were 0, 3 sigmoid(0) = 1.5" if embed else
                          "start of modded-nanogpt's lambda, 0.5")
        return layout

    @torch.no_grad()
    def stats(self, idx):
        """What the method learns, logged by train.py: the mean lambda (learned) or gate over idx's tokens (embed)."""
        if self.config.value_mode == "learned":
            return {"value_lambda": torch.stack([b.attn.lamb for b in self.blocks[1:]]).mean().item()}
        if self.config.value_mode == "embed":
            return {"ve_gate": sum(self.gate_means(idx).values()) / len(self.value_embeds)}
        return {}

    def gate_means(self, idx):
        """{block index: the mean of 3 sigmoid(W_n x[:12]) over idx's tokens and key/value heads} of a forward on idx."""
        means, hooks = {}, []
        for i, block in enumerate(self.blocks):
            if hasattr(block.attn, "ve_gate"):
                hooks.append(block.attn.ve_gate.register_forward_hook(
                    lambda m, args, out, i=i: means.__setitem__(i, (3 * torch.sigmoid(out.float())).mean().item())))
        try:
            self(idx)
        finally:
            for hook in hooks:
                hook.remove()
        return means


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, cos, sin, cache=None, input_pos=None, values=None, ve=None):
        x = x + self.drop(self.attn(self.attn_norm(x), cos, sin, cache, input_pos, values, ve))
        x = x + self.drop(self.mlp(self.mlp_norm(x)))
        return x


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
    raise SystemExit("model_value.py is a model file, not a script: train it with `python train.py --model value`, "
                     "and sample a run of it with `python sample.py --out_dir RUN`")
