"""
Skip-middle: learned middle-out layer skipping with gated attention.

Paper: "Learning to Skip the Middle Layers of Transformers", by Tim Lawson and Laurence Aitchison (University of
Bristol, 2025); their code: github.com/tim-lawson/skip-middle. model_vanilla.py with these changes (blocks
l = 1..L, h the residual stream entering block l, g_j the gate of token j):
    embedding:  x = RMSNorm(Embed(idx))                                        (the paper's input norm)
    gates:      s_l = ReLU(w_l . h + b_l),  S_l = s_1 + ... + s_l,  g_l = 1 - clamp(S_l, 0, 1)      (eqs. 1-2)
                block l > L/2 uses the gate of block L+1-l: a token skips a symmetric span of middle blocks
    block:      x = x + g * Norm(Attn(Norm(x), g));  x = x + g * Norm(MLP(Norm(x)))   (sandwich / peri-LN)
    attention:  logit(i, j) += ln(max(g_j, 1e-6)) for every KEY j                                   (eq. 3)
    loss:       CE + mean_l (alpha_l * mean(g_l) + beta_l * var(g_l)), moments over the batch's tokens (eq. 5)
    controller: after every optimiser step, c += gamma * 1[|stat - target| > delta] * (stat - target)  (eq. 6)
                for alpha (stat = mean gate) and beta (stat = gate variance), targets mu*_l from 1 at block 1
                linearly to gate_target at the middle block, mirrored, and var*_l = mu*_l (1 - mu*_l).
With zero gate parameters every gate is exactly 1 and the model is the dense sandwich model (gated=False).
Training runs every block for every token; generation skips for real (the last part of this file).
docs/skipmiddle.md has every reading of the paper, the derivations, the measurements and the controller's dynamics.
"""
import functools
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

MODIFIED = ("GPTConfig", "KVCache", "KVCache.__init__", "KVCache.update",
            "CausalSelfAttention.forward", "Block", "Block.__init__", "Block.forward", "GPT.__init__",
            "GPT.forward", "GPT.param_groups", "GPT.flops_per_token")  # components that differ from model_vanilla.py
PAPER = "Skip the Middle Layers"  # the name the tables and figures group this file's labels by
VARIANTS = {"dense": dict(gated=False)}  # the paper's dense baseline: the tables' label skipmiddle-dense
GATE_EPS = 1e-6  # lower bound on g before the log of gated attention (paper section 2.2)
GATE_C = 1.0  # gate_into_keys: the query's appended coordinate, a power of two, exact in every float format


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
    gated: bool = option(True, "False: the dense sandwich model, no gate parameters and plain causal attention")
    gate_init_std: float = option(0.02, "gate weights ~ N(0, std), biases 0; 0 starts exactly dense (every g == 1)",
                                  min=0)
    gate_target: float = option(0.5, "target mean gate of the middle block (1 at block 1, linear in between)",
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
    # q: its hd coordinates, then c, then zeros; k: its hd coordinates, then the bias, then zeros (hp in all)
    q = torch.cat((q, q.new_full((*q.shape[:-1], 1), GATE_C), q.new_zeros(*q.shape[:-1], pad - 1)), dim=-1)
    k = torch.cat((k, bias, k.new_zeros(*k.shape[:-1], pad - 1)), dim=-1)
    return q, k, F.pad(v, (0, pad))


def gate_sums(G):
    """Per gated block, the sums over tokens of g, g^2, 1[g == 0] and the token count: (n_gates, 4), from G
    (n_gates, B, T)."""
    G = G.detach().float()
    return torch.stack([G.sum((1, 2)), G.pow(2).sum((1, 2)), (G == 0).float().sum((1, 2)),
                        torch.full_like(G[:, 0, 0], G[0].numel())], dim=1)


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        L = config.n_layer
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.emb_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(L)])
        # one gate (w_l, b_l) per block l <= (L+1)/2, gates[l-1]: s_l = ReLU(w_l . h + b_l) of the stream entering it
        self.gates = nn.ModuleList([nn.Linear(config.n_embd, 1) for _ in range((L + 1) // 2 if config.gated else 0)])
        self.mirror = [min(l, L - 1 - l) for l in range(L)]  # block l+1 uses gates[mirror[l]], block mirror[l]+1's
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
        # the controller's statistics of this optimiser step's training forwards: per gated block, sums over tokens
        # of g, g^2, 1[g == 0] and the token count (n_gates, 4); after_step() reduces and clears them. A plain
        # attribute, not a buffer: DDP would overwrite the other ranks' buffers with rank 0's before every forward
        self._train_sums = None
        self.apply(self._init_weights)
        for gate in self.gates:
            nn.init.normal_(gate.weight, mean=0.0, std=config.gate_init_std)  # the bias is 0 from _init_weights

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None, cache=None, input_pos=None, return_hidden=False):
        """idx (B, T) -> (logits (B, T, vocab), loss). With a cache, input_pos (T,) holds the positions of idx's
        tokens (a prefill: 0..T-1; a decode step: one position), where their keys and values are written."""
        if isinstance(cache, SkipCache):  # a decode step of generation that really skips (the end of this file)
            return decode_step_skip(self, idx, cache, input_pos), None
        B, T = idx.shape
        cos, sin = rope_at(self.rope_cos, self.rope_sin, T, input_pos)
        x = self.drop(self.emb_norm(self.tok_emb(idx)))  # (B, T, d)
        hidden, gates, S = [], [], 0.0
        for l, block in enumerate(self.blocks):
            g, S = self.gate(l, x, gates, S)
            x = block(x, cos, sin, cache, input_pos, g)
            hidden.append(x)
        logits = self.lm_head(self.norm(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        if gates and self.training:
            G = torch.stack(gates)  # (n_gates, B, T)
            self._train_sums = gate_sums(G) + (0 if self._train_sums is None else self._train_sums)  # the controller's
            if targets is not None:
                loss = loss + self.gate_loss(G)
        if return_hidden:
            return logits, loss, hidden  # hidden[l]: output of block l+1, read by the logit lens
        return logits, loss

    def gate(self, l, x, gates, S):
        """(g, S): the gate g (B, T) of block l+1 (l its index) for the stream x (B, T, d) entering it, and the soft
        mask S after it (None, S in the dense model). A block of the first half computes its own (eqs. 1-2) and
        appends it to gates; a block of the second half uses its mirror's, gates[L-1-l] (block L-l's)."""
        if l < len(self.gates):
            s = self.gates[l](x).squeeze(-1)  # (B, T): w_l . h + b_l, bf16 under autocast
            S = S + F.relu(s.to(torch.promote_types(s.dtype, torch.float32)))  # s_l, in float32 at least; S_l = S + s_l
            gates.append(1.0 - S.clamp(0.0, 1.0))  # g_l = 1 - clamp(S_l, 0, 1)
        return (gates[self.mirror[l]] if gates else None), S

    def gate_loss(self, G):
        """The regulariser (eq. 5): mean over the L blocks of alpha_l * mean(g_l) + beta_l * var(g_l)."""
        mean, var = G.mean((1, 2))[self.mirror], G.var((1, 2), correction=0)[self.mirror]  # (L,)
        return (self.gate_alpha * mean + self.gate_beta * var).mean()

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
        self.update_coefficients(*self._summary(sums)[:2])

    @torch.no_grad()
    def update_coefficients(self, mean, var):
        """eq. 6, both sides: c += gamma * 1[|stat - target| > delta] * (stat - target); mean, var (L,)."""
        c = self.config
        for coef, stat, target in ((self.gate_alpha, mean, self.gate_mean_target),
                                   (self.gate_beta, var, self.gate_var_target)):
            dev = stat.to(coef) - target
            coef.add_(c.gate_gamma * (dev.abs() > c.gate_delta) * dev)

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

    def inference(self, skip=True):
        """generate.py's hook: skip (default) prefills with forward_skip() into a SkipCache, whose steps skip too."""
        return (functools.partial(forward_skip, self), SkipCache) if skip and self.config.gated else (self, KVCache)

    @torch.no_grad()
    def measured_gates(self, idx):
        """(mean, var, zero fraction), each (L,), of every block's gates over the tokens of idx (B, T), pooled over
        the ranks under DDP (a collective: every rank calls it with its own batch). Read off the first half's
        blocks' inputs: forward keeps nothing for this."""
        G = []
        hooks = [b.register_forward_pre_hook(lambda m, args: G.append(args[-1])) for b in self.blocks[:len(self.gates)]]
        try:
            self(idx)
        finally:
            for hook in hooks:
                hook.remove()
        sums = gate_sums(torch.stack(G))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(sums)
        return self._summary(sums)

    def stats(self, idx):
        """Per gated block, as gate{l}_* for block l+1: the mean gate and the fraction of zero gates over idx's
        tokens, alpha, beta; and est_flops_ratio (docs/skipmiddle.md). Collective under DDP (measured_gates)."""
        if not self.config.gated:
            return {}
        mean, _, zero = self.measured_gates(idx)
        out = {}
        for l in range(len(self.gates)):
            out[f"gate{l}_mean"], out[f"gate{l}_zero"] = mean[l].item(), zero[l].item()
            out[f"gate{l}_alpha"], out[f"gate{l}_beta"] = self.gate_alpha[l].item(), self.gate_beta[l].item()
        sparse, dense = self.estimated_flops(zero)
        out["est_flops_ratio"] = sparse / dense
        return out

    def depth_map(self, idx):
        """(L, 1): the mean gate of every block over idx's tokens (ones in the dense model)."""
        if not self.config.gated:
            return torch.ones(self.config.n_layer, 1)
        return self.measured_gates(idx)[0].cpu().unsqueeze(1)

    def depth_map_layout(self):
        """How eval.py --depth_map draws depth_map(): one column, the mean gate."""
        return dict(columns=["mean gate"], xlabel="", cbar="mean gate (1: the block runs, 0: skipped)")


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

    def forward(self, x, cos, sin, cache=None, input_pos=None, g=None):
        # g (B, T): this block's gate per token, None in the dense model; g == 0 leaves the token's stream as it is
        y = self.attn(self.attn_norm(x), cos, sin, cache, input_pos, g)
        x = x + self.drop(times_gate(g, self.attn_out_norm(y), y.dtype))  # x + g * Norm(Attn(Norm(x), g))
        y = self.mlp(self.mlp_norm(x))
        x = x + self.drop(times_gate(g, self.mlp_out_norm(y), y.dtype))   # x + g * Norm(MLP(Norm(x)))
        return x


def times_gate(g, out, dtype):
    """g * out for the gate g (B, T) and a block's normed output out (B, T, d), g cast to dtype, that of the
    module's output before its norm (bf16 under autocast); out itself when g is None (the dense model)."""
    return out if g is None else out * g.unsqueeze(-1).to(dtype)


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

    def forward(self, x, cos, sin, cache=None, input_pos=None, g=None):
        """g (B, T): the new tokens' gates, None in the dense model. input_pos: their positions, (T,), or (B, T) for
        forward_skip's gathered tokens."""
        B, T, C = x.shape
        qkv = self.wqkv(x).view(B, T, -1, self.head_dim).transpose(1, 2)          # (B, H + 2 H_kv, T, hd)
        qk, v = qkv.split((self.n_head + self.n_kv_head, self.n_kv_head), 1)  # (B, H + H_kv, T, hd), (B, H_kv, T, hd)
        if self.qk_norm:  # Qwen3: each head's q and k normalised over hd, each by its own weight, before RoPE
            q, k = qk.split((self.n_head, self.n_kv_head), 1)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), 1)
        # RoPE rotates the q and k heads in one go, as they sit side by side in qkv
        q, k = apply_rope(qk, cos, sin).split((self.n_head, self.n_kv_head), 1)  # (B, H, T, hd), (B, H_kv, T, hd)
        if cache is None:  # training: the gate bias rides inside the keys, so plain causal SDPA adds it
            if g is not None:
                q, k, v = gate_into_keys(q, k, v, g)  # (B, H, T, hp), (B, H_kv, T, hp): hp = hd padded
            y = F.scaled_dot_product_attention(                                    # (B, H, T, hp)
                q, k, v, is_causal=True, scale=self.head_dim ** -0.5, dropout_p=self.dropout if self.training else 0.0,
                enable_gqa=self.n_kv_head != self.n_head)[..., :self.head_dim]     # (B, H, T, hd)
        else:  # generation: a mask is needed anyway, so the gate bias rides in it (no padded head size)
            k, v = cache.update(self.layer_idx, input_pos, k, v)                   # (B, H_kv, S, hd)
            if g is None:
                mask = attention_mask(input_pos, k.size(2))                        # (T, S)
            else:  # every cached key keeps its gate
                mask = cache.key_mask(input_pos, cache.update_gates(self.layer_idx, input_pos, g), q.dtype)
            y = cached_attention(q, k, v, mask)                                    # (B, H, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)                          # (B, T, H hd)
        return self.wo(y)


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

    def update(self, layer, input_pos, k, v):
        """Write k, v (B, H_kv, T, hd) at input_pos: (T,), the same positions in every row, or (B, T), each row's own
        (forward_skip's gathered tokens); return the whole cache, (B, H_kv, S, hd) each."""
        ck, cv = self.k[layer], self.v[layer]
        k, v = k.to(ck.dtype), v.to(cv.dtype)  # under autocast k, v are bf16 and the cache has the weights' dtype
        if input_pos.dim() == 1:  # index_copy_ compiles to an in-place write
            return ck.index_copy_(2, input_pos, k), cv.index_copy_(2, input_pos, v)
        index = input_pos[:, None, :, None].expand_as(k)
        return ck.scatter_(2, index, k), cv.scatter_(2, index, v)

    def update_gates(self, layer, input_pos, g):
        """Write the gates g (B, T) where update() wrote their keys; return the layer's gates (B, S)."""
        cg, g = self.g[layer], g.to(self.g[layer].dtype)
        return cg.index_copy_(1, input_pos, g) if input_pos.dim() == 1 else cg.scatter_(1, input_pos, g)

    def key_mask(self, input_pos, g, dtype):
        """SDPA's float mask (B, 1, T, S) over the whole cache for queries at input_pos, (T,) or (B, T), given the
        layer's cached gates g (B, S): ln(max(g_j, eps)) on every key j (eq. 3), -inf after the query."""
        visible = torch.arange(g.size(1), device=g.device) <= input_pos[..., None]  # (T, S) or (B, T, S)
        bias = torch.log(g.clamp(min=GATE_EPS))[:, None, :]                         # (B, 1, S)
        return torch.where(visible, bias, float("-inf")).unsqueeze(1).to(dtype)    # (B, 1, T, S)


# ---- model_vanilla.py's components below, unchanged in every model file (tests/test_identical.py) ----

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


# ---- generation that really skips: the inference() hook's forward and cache (generate.py) ----

@torch.no_grad()
def forward_skip(model, idx, cache=None, input_pos=None):
    """The prefill of generation that really skips, (logits (B, T, vocab), None): at every block only the tokens
    whose gate is > 0 run it (gathered per row, padded to the row with the most, scattered back); a token with
    g == 0 keeps its stream, as forward()'s multiply by 0 gives, and leaves no visible key (SkipCache). A block no
    token runs is not computed. input_pos (T,): the positions of idx's tokens (default 0..T-1). The cache keeps
    where the last token's gates closed in every row, where decode_step_skip looks first."""
    B, T = idx.shape
    cache = cache if cache is not None else SkipCache(model.config, B, idx.device, model.lm_head.weight.dtype)
    input_pos = input_pos if input_pos is not None else torch.arange(T, device=idx.device)
    cache.forget(input_pos)
    first_chunk = bool(input_pos[0] == 0)  # no older key: a block every token runs takes plain causal attention
    x = model.emb_norm(model.tok_emb(idx))  # (B, T, d)
    gates, S, closed_until = [], 0.0, -1
    cache.closed = len(model.gates)
    for l, block in enumerate(model.blocks):
        if l <= closed_until:
            continue  # a block before it closed for every token: gates only close further, up to its mirror
        g, S = model.gate(l, x, gates, S)  # every token's gate, as in forward(): the skipped ones' too
        if l < cache.closed and not bool((g[:, -1] > 0).any()):
            cache.closed = l  # the last token's gate closed in every row
        run = g > 0                                                          # (B, T)
        count = run.sum(1)                                                   # (B,)
        N = int(count.max())
        if N == 0:  # no row runs this block
            closed_until = model.config.n_layer - 1 - l
            continue
        if first_chunk and bool(run.all()):
            cos, sin = rope_at(model.rope_cos, model.rope_sin, T, input_pos)
            x = block(x, cos, sin, cache, input_pos, g)
            continue
        # per row, the tokens that run the block first, in order; rows with fewer are padded with skipped ones
        order = torch.argsort((~run).to(torch.uint8), dim=1, stable=True)[:, :N]  # (B, N)
        valid = torch.arange(N, device=idx.device) < count[:, None]             # (B, N)
        pos = input_pos[order]                                                   # (B, N)
        index = order[..., None].expand(-1, -1, x.size(-1))                      # (B, N, d)
        xs = x.gather(1, index)                                                  # (B, N, d)
        cos, sin = model.rope_cos[pos][:, None], model.rope_sin[pos][:, None]    # (B, 1, N, hd)
        out = block(xs, cos, sin, cache, pos, g.gather(1, order))                # (B, N, d)
        x = x.scatter(1, index, torch.where(valid[..., None], out, xs))          # padding writes back xs
    return model.lm_head(model.norm(x)), None  # (B, T, vocab)


@torch.no_grad()
def decode_step_skip(model, idx, cache, input_pos):
    """A decode step with a SkipCache that skips for real, logits (B, 1, vocab). Gates only close with depth, so a
    step runs blocks 1..k and their mirrors, k the index of the first gate that is 0 in every row, block k+1's
    (batch > 1 skips what every row skips). It runs in parts whose shapes are fixed for a given k, chosen on the
    host: skip_first runs the first k blocks, k the last step's (cache.closed: tokens in a row tend to close alike),
    and finds where every row's gate closed; that number is read on the host, the step's one synchronisation; then
    skip_last runs the last k blocks (every row closed by block k+1: the middle is skipped) or skip_rest every block
    after the first k (some row is still open at block k+1). A block that runs with every row's gate at 0 is a
    no-op: the rows keep their stream and write a gate of 0, which hides their key, as skipping it does.
    cache.part(fn, k) gives each part at k: itself, or compiled into one graph per part and k
    (generate.compile_decode_step)."""
    k = cache.closed
    x, S, gates, closed = cache.part(skip_first, k)(model, idx, cache, input_pos)
    if int(closed) <= k:  # int(): the host reads where every row's gate closed
        logits = cache.part(skip_last, k)(model, x, gates, cache, input_pos)
    else:
        logits, closed = cache.part(skip_rest, k)(model, x, S, gates, cache, input_pos)
    cache.closed = min(int(closed), len(model.gates))
    return logits


def skip_first(model, idx, cache, input_pos, k):
    """The embedding, blocks 1..k with their gates, and the gate of block k+1: (x, S, gates, closed), closed the
    index l of the first gate that is 0 in every row (block l+1's), or the number of gates computed if none is."""
    cos, sin = model.rope_cos[input_pos], model.rope_sin[input_pos]  # (1, hd)
    x = model.emb_norm(model.tok_emb(idx))  # (B, 1, d)
    gates, S = [], 0.0
    for l in range(k):
        g, S = model.gate(l, x, gates, S)
        x = run_block(model.blocks[l], x, g, cos, sin, cache, input_pos)
    if k < len(model.gates):
        _, S = model.gate(k, x, gates, S)
    return x, S, gates, first_closed(gates)


def skip_last(model, x, gates, cache, input_pos, k):
    """Every row's gate closed by block k+1: the last k blocks with their mirrors' gates (from block k+1 on where L
    is odd and k = (L + 1) / 2: the middle block, block k, is its own mirror), and the head."""
    cos, sin = model.rope_cos[input_pos], model.rope_sin[input_pos]
    L = len(model.blocks)
    for l in range(max(k, L - k), L):
        x = run_block(model.blocks[l], x, gates[model.mirror[l]], cos, sin, cache, input_pos)
    return model.lm_head(model.norm(x))  # (B, 1, vocab)


def skip_rest(model, x, S, gates, cache, input_pos, k):
    """Some row's gate is open at block k+1: blocks k+1..L with their gates (block k+1's from skip_first), and the
    head; (logits, closed), closed as skip_first finds it, over every gate."""
    cos, sin = model.rope_cos[input_pos], model.rope_sin[input_pos]
    gates = list(gates)  # skip_first's, which this part extends (its own list: the caller's stays as it was)
    for l in range(k, len(model.blocks)):
        g, S = (gates[k], S) if l == k else model.gate(l, x, gates, S)
        x = run_block(model.blocks[l], x, g, cos, sin, cache, input_pos)
    return model.lm_head(model.norm(x)), first_closed(gates)


def run_block(block, x, g, cos, sin, cache, input_pos):
    """block on the stream x (B, 1, d), g (B, 1) its gates: a row whose gate is 0 keeps its stream (torch.where: the
    block's output there may be NaN), and its key, written with its gate of 0, stays hidden."""
    return torch.where((g > 0)[..., None], block(x, cos, sin, cache, input_pos, g), x)


def first_closed(gates):
    """The first index l whose gate gates[l] (B, 1), block l+1's, is 0 in every row, else len(gates): a 0-dim tensor."""
    still_open = torch.stack([(g > 0).any() for g in gates])  # (len(gates),)
    return still_open.long().cumprod(0).sum()


class SkipCache(KVCache):
    """KVCache for generation that really skips: a gate of 0 means that the token did not run that layer and left
    no key there, which the mask hides (weight exactly 0, not the eps floor's). It also keeps where the last decode
    step's gates closed (closed: where the next step looks first) and how a part of the step runs (part)."""

    def __init__(self, config, batch_size, device, dtype):
        super().__init__(config, batch_size, device, dtype)
        self.closed = (config.n_layer + 1) // 2  # at first, the whole first half: the step finds where it closes

    @staticmethod
    def part(fn, k):
        """A part of decode_step_skip at k, as it is (generate.compile_decode_step gives each a graph of its own)."""
        return functools.partial(fn, k=k)

    def forget(self, input_pos):
        """A prefill at input_pos starts a sequence: no layer has run its positions or any later one yet, so their
        gates are 0 (a reused cache's stale keys hidden), and a layer no token runs needs no write."""
        stale = torch.arange(self.g[0].size(1), device=input_pos.device) >= input_pos[0]  # (S,): no host sync
        for g in self.g:
            g.masked_fill_(stale, 0.0)

    def key_mask(self, input_pos, g, dtype):
        return super().key_mask(input_pos, g, dtype).masked_fill((g == 0)[:, None, None, :], float("-inf"))


if __name__ == "__main__":  # a model file, not a script: say so, and which script to run
    raise SystemExit("model_skipmiddle.py is a model file, not a script: train it with `python train.py --model skipmiddle`, "
                     "and sample a run of it with `python sample.py --out_dir RUN`")
