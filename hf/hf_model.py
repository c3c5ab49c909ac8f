"""
A run of this repository as a transformers model, for the Hugging Face ecosystem: hf/export.py writes a folder with
config.json, model.safetensors, the tokenizer, the run's model file as this repository ships it, and this file,
whose one import line below it points at that model file. transformers runs code from a folder only when asked to:

    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    batch = tokenizer(["ROMEO:", "JULIET:\\nO"], return_tensors="pt", padding=True, padding_side="left")
    model.generate(**batch, max_new_tokens=50, do_sample=False)

forward() takes what transformers passes: input_ids, attention_mask, labels (then also the mean next-token loss),
output_hidden_states (the token embeddings and every block's output, before the final norm), return_dict,
logits_to_keep and use_cache. Without logits_to_keep=1 it gives the logits of every position, as transformers'
models do.

Padding. The model files' forward and caches take one position for the whole batch, so padding is handled here,
and only here: each row's real tokens (attention_mask 1, pads on either side) are taken out of the padded batch
and run alone, at positions 0, 1, ... of their own, and the outputs are put back in the padded layout. A padded
row so computes exactly what it computes alone, and no pad ever reaches attention or a method's cross-layer mix.
A pad position gets the outputs of the row's last real token before it (zeros where there is none, at left
padding), so that the last position of a right-padded row predicts the row's next token; a row of pads only has
no token to continue, and gets zeros (every next token alike) until it has one. A batch without pads runs as one
batch.

Generation. generate() calls forward with logits_to_keep=1 and every token so far (prepare_inputs_for_generation);
each row then runs alone with its own state, kept between calls and found again by the row's real tokens before
its newest one, so that it follows the sequence wherever transformers moves it (beam search reorders and repeats
rows between steps): a row that continues a known sequence by one token is one decode step of the model file's
own cache, any other row is prefilled. generate.py's window rule applies per row: the last block_size tokens are
prefilled, and when the window is full it restarts from its last block_size // 2 tokens; so greedy tokens are
sample.py's. With use_cache=False each step recomputes the row's window. The model file's inference() hook, where
it has one, is used as sample.py uses it by default (skipmiddle: tokens whose gate is 0 skip their blocks). Exact,
not fast: every row is a call of its own at every step, so a batch generates no faster than its rows one by one.
With output_hidden_states, each step also gives the hidden states of each row's window, the tokens the step read
(zeros before it, as at pads), so that a generation past the context has them too.
"""
import copy

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

if __name__ == "__main__":  # a file of an exported folder, not a script: say so, and what to run
    raise SystemExit("hf_model.py runs inside transformers, from a folder `python -m hf.export` writes, which "
                     "AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True) loads; run "
                     "`python -m hf.export --help`")

from .model_vanilla import GPT, GPTConfig, KVCache  # hf/export.py names the run's model file here

UNSUPPORTED = ("position_ids", "inputs_embeds", "past_key_values", "cache", "output_attentions")


class LayersConfig(PretrainedConfig):
    """model_name and model_args: the run's model file and its GPTConfig options, as in its checkpoint."""
    model_type = "layer_connections"

    def __init__(self, model_name="vanilla", model_args=None, **kwargs):
        self.model_name, self.model_args = model_name, dict(model_args or {})
        super().__init__(**kwargs)


class LayersForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = LayersConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        self.model = GPT(GPTConfig(**config.model_args))  # the weights are model.<the checkpoint's names>
        self.rows = {}  # generation: a row's real tokens -> (its window's start, its cache); see next_logits()
        self.post_init()

    def _init_weights(self, module):
        """transformers builds the model without memory and loads the saved weights into it; the buffers that are
        not saved (rotary tables, the controller's targets) are made here, as the model file makes them."""
        if isinstance(module, GPT):
            with torch.device("cpu"):
                fresh = GPT(module.config)
            for name, buf in fresh.named_buffers():
                owner, _, leaf = name.rpartition(".")
                target = module.get_submodule(owner)
                if leaf in target._non_persistent_buffers_set:
                    target.register_buffer(leaf, buf, persistent=False)

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # the model keeps its own cache: transformers makes none

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, use_cache=True, output_hidden_states=None,
                                      **kwargs):
        # every token so far, at every step: forward() finds each row's cache by its tokens
        return {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": use_cache,
                "output_hidden_states": output_hidden_states, "logits_to_keep": 1}

    def forward(self, input_ids, attention_mask=None, labels=None, use_cache=None, output_hidden_states=None,
                return_dict=None, logits_to_keep=0, **kwargs):
        if given := [k for k in UNSUPPORTED if kwargs.get(k) is not None and kwargs.get(k) is not False]:
            raise ValueError(f"{given[0]} is not supported here: positions follow from attention_mask, and the model "
                             "keeps its own cache")
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must have input_ids' shape "
                             f"{tuple(input_ids.shape)}: 1 for a token, 0 for a pad")
        mask = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()
        hidden = None
        if logits_to_keep == 1 and labels is None:  # generation: each row's window, as sample.py reads it
            logits, starts = self.next_logits(input_ids, mask, use_cache is not False)  # (B, 1, vocab)
            if output_hidden_states:  # of the windows next_logits() read
                _, *hidden = self.every_position(input_ids, mask, True, starts)
        else:
            logits, *hidden = self.every_position(input_ids, mask, output_hidden_states)  # (B, T, vocab)
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs, shifted here
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        out = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=tuple(hidden) if hidden else None)
        return out if (self.config.return_dict if return_dict is None else return_dict) else out.to_tuple()

    def every_position(self, idx, mask, hidden, starts=None):
        """[logits (B, T, vocab)] of idx (B, T), and with hidden the embeddings and every block's output (B, T, d):
        the whole batch at once without pads, else each row's real tokens alone, put back in the padded layout.
        starts: each row's first real token to run (generation's window), where not 0; the positions before it get
        zeros, as pads do."""
        if mask is None and starts is None:
            return self.run(idx, hidden)
        mask = torch.ones_like(idx, dtype=torch.bool) if mask is None else mask
        rows = []
        for row, keep, start in zip(idx, mask, starts or [0] * len(idx)):
            real = row[keep][start:]
            outs = self.run(real[None] if real.numel() else row[None, :1], hidden)  # a row of pads: zeros
            src = keep.cumsum(0) - 1 - start  # (T,) for each position, the last real token run at or before it
            rows.append([torch.where((src >= 0)[:, None], out[0, src.clamp(min=0)], 0.0) for out in outs])
        return [torch.stack(out) for out in zip(*rows)]

    def run(self, idx, hidden):
        if idx.size(1) > self.model.config.block_size:
            raise ValueError(f"a sequence of {idx.size(1)} tokens is longer than the model's context "
                             f"({self.model.config.block_size}); pass at most that many, or generate(), which keeps "
                             "a window")
        if not hidden:
            return [self.model(idx)[0]]
        logits, _, blocks = self.model(idx, return_hidden=True)
        return [logits, self.model.tok_emb(idx), *blocks]

    @torch.no_grad()
    def next_logits(self, idx, mask, use_cache):
        """Logits (B, 1, vocab) of the token after each row's real tokens, each row alone with the window rule and
        its own cache (the module's docstring): a decode step where the row continues a sequence of the last call
        by one token, else a prefill. With them, the first token of each row's window (0 for a row of pads)."""
        S, known, self.rows = self.model.config.block_size, self.rows, {}
        forward, cache_class = self.model.inference() if hasattr(self.model, "inference") else (self.model, KVCache)
        rows, taken = [], set()
        for b in range(idx.size(0)):
            real = idx[b] if mask is None else idx[b][mask[b]]
            start, cache = known.get(tuple(real[:-1].tolist()), (max(0, real.numel() - S), None))
            if cache is not None and id(cache) in taken:  # a second row continues the same sequence (beam search)
                cache = copy.deepcopy(cache)
            taken.add(id(cache))
            rows.append((real, start, cache))
        logits, starts = [], []
        for real, start, cache in rows:  # after every row has found its cache: a step changes the cache it takes
            n = real.numel()
            if n == 0:  # a row of pads only: nothing to continue, every next token alike
                logits.append(torch.zeros(1, 1, self.model.config.vocab_size, device=idx.device))
                starts.append(0)
                continue
            if n - start > S:  # the window is full: restart it from the last half context
                start, cache = n - S // 2, None
            if not use_cache:
                logits.append(forward(real[None, start:])[0][:, -1:])
            elif cache is None:  # prefill the window
                cache = cache_class(self.model.config, 1, idx.device, self.model.lm_head.weight.dtype)
                logits.append(self.cached(forward, real[None, start:], cache, 0)[:, -1:])
            else:  # one decode step: the newest token after the n - 1 - start in the cache
                logits.append(self.cached(forward, real[None, -1:], cache, n - 1 - start))
            self.rows[tuple(real.tolist())] = (start, cache)
            starts.append(start)
        return torch.cat(logits), starts

    def cached(self, forward, ids, cache, past):
        """Logits (1, T, vocab) of ids (1, T) at positions past, past + 1, ... of cache: a prefill (past 0, with
        forward) or a one-token decode step. The one place that calls the model file with a cache."""
        input_pos = torch.arange(past, past + ids.size(1), device=ids.device)
        return (forward if past == 0 else self.model)(ids, cache=cache, input_pos=input_pos)[0]
