"""
A run of this repository as a transformers model, for the Hugging Face ecosystem: export.py writes a folder with
config.json, model.safetensors, the run's model file as this repository ships it, and this file, whose one
import line below it points at that model file. transformers runs code from a folder only when asked to:

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    model.generate(input_ids, max_new_tokens=50, do_sample=False)

forward(input_ids) gives the logits of every position, as transformers' models do (with labels, also the mean
next-token loss). generate() runs the model file's own key/value cache with the window rule of generate.py: the
prompt's last block_size tokens are prefilled, every further token is one decode step, and when the window is
full it restarts from its last block_size // 2 tokens; so greedy tokens are those of sample.py. The model file's
inference() hook, where it has one, is used as sample.py uses it by default (skipmiddle: tokens whose gate is 0
skip their blocks). No padding: every row of a batch is a whole sequence.
"""
import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .model_vanilla import GPT, GPTConfig, KVCache  # export.py names the run's model file here


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
        self.generation = None  # the cache of the sequences generate() is continuing: see forward()
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

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids, "use_cache": True}  # every token so far: forward() knows its cache

    def forward(self, input_ids, labels=None, use_cache=None, **kwargs):
        if use_cache and labels is None:
            logits = self.next_logits(input_ids)  # (B, 1, vocab)
        else:
            logits, _ = self.model(input_ids)  # (B, T, vocab)
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs, shifted here
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    @torch.no_grad()
    def next_logits(self, idx):
        """Logits (B, 1, vocab) after idx (B, T): a decode step when idx is the sequence of the last call with one
        more token, else a new prompt (prefilled); the window rule as in generate.py."""
        S, g = self.model.config.block_size, self.generation
        if g is None or g["ids"].shape != (idx.size(0), idx.size(1) - 1) or not torch.equal(g["ids"], idx[:, :-1]):
            forward, cache_class = self.model.inference() if hasattr(self.model, "inference") else (self.model, KVCache)
            g = self.generation = {"forward": forward, "cache_class": cache_class, "start": max(0, idx.size(1) - S),
                                   "cache": None}
        elif idx.size(1) - g["start"] > S:  # the window is full: restart it from the last half context
            g["start"], g["cache"] = idx.size(1) - S // 2, None
        if g["cache"] is None:  # prefill the window at positions 0..T-1
            g["cache"] = g["cache_class"](self.model.config, idx.size(0), idx.device, self.model.lm_head.weight.dtype)
            g["pos"] = torch.arange(idx.size(1) - g["start"], device=idx.device)
            logits = g["forward"](idx[:, g["start"]:], cache=g["cache"], input_pos=g["pos"])[0][:, -1:]
        else:  # one decode step: the newest token at the position after the last
            logits = self.model(idx[:, -1:], cache=g["cache"], input_pos=g["pos"])[0]
        g["pos"] = g["pos"][-1:] + 1
        g["ids"] = idx
        return logits
