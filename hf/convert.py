"""
Hugging Face model folders in and out: pretrained Llama and Qwen3 weights for any model file, a vanilla run
written back as a Llama or Qwen3 folder, and a run of any other model file as a transformers custom-code folder
(hf_model.py beside the model file), which comes back whole.

    python train.py --model attnres --init_from ~/models/Qwen3-0.6B ...    # start from the pretrained model
    python -m hf.export --out_dir out/run --to ~/models/run-hf              # a run as a HF folder

A folder is what transformers' save_pretrained writes: config.json, model.safetensors (or shards listed in
model.safetensors.index.json) and, where the model has one, tokenizer.json with its companions. Nothing here
imports transformers: safetensors reads and writes the weights, tokenizers reads and writes tokenizer.json.

The shared components of every model file (embedding, attention, MLP, the pre-norms, final norm, head) are
model_vanilla.py's, which computes what LlamaForCausalLM and Qwen3ForCausalLM compute:
    ours                              Hugging Face
    tok_emb                           model.embed_tokens
    blocks.i.attn_norm                model.layers.i.input_layernorm
    blocks.i.attn.wqkv (q, k, v) wo   model.layers.i.self_attn.q_proj k_proj v_proj o_proj  (split_fused)
    blocks.i.attn.q_norm k_norm       model.layers.i.self_attn.q_norm k_norm            (Qwen3: qk_norm)
    blocks.i.mlp_norm                 model.layers.i.post_attention_layernorm
    blocks.i.mlp.w13 (w1, w3) w2      model.layers.i.mlp.gate_proj up_proj down_proj   (split_fused)
    norm, lm_head                     model.norm, lm_head  (no lm_head in the folder with tied embeddings)
config.json gives the architecture (read_config() maps its names to ours). What these models can do and ours
cannot is refused in one line: RoPE scaling (Llama 3.1's "llama3"), sliding windows, another activation, biases on
attention but not on the MLP. A parameter of a model file that has no Hugging Face name (AttnRes's pseudo-queries,
skip-middle's gates and extra norms, ...) keeps its initialisation. load_state_dict (strict) checks the weights'
names and shapes; what it, safetensors or the system raise is one line naming the file (plumbing.errors.handling).
"""
import os
import pathlib
import re
import shutil
import sys

import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("hf/convert.py is a library module: Hugging Face folders in (train.py --init_from) and out; run "
             "`python -m hf.export --help` or `python train.py --help`")

from safetensors import safe_open
from safetensors.torch import save_file

from common import hf_tokenizer, need
from plumbing.errors import LIMIT, ConfigError, arg, handling, note
from plumbing.files import read_json, regular_file, to_json
from plumbing.config import build_model, model_names

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}  # model_type -> class
# the files of a tokenizer that export copies along (those the folder has)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja")
# names inside a layer (blocks.i.X / model.layers.i.Y) and outside (X / Y), each + .weight or .bias
LAYER_NAMES = {"attn_norm": "input_layernorm", "attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj",
               "attn.wv": "self_attn.v_proj", "attn.wo": "self_attn.o_proj", "attn.q_norm": "self_attn.q_norm",
               "attn.k_norm": "self_attn.k_norm", "mlp_norm": "post_attention_layernorm", "mlp.w1": "mlp.gate_proj",
               "mlp.w3": "mlp.up_proj", "mlp.w2": "mlp.down_proj"}
TOP_NAMES = {"tok_emb": "model.embed_tokens", "norm": "model.norm", "lm_head": "lm_head"}
FOLDER_FIX = ("pass a Hugging Face model folder, whole, as save_pretrained writes it (config.json, and "
              "model.safetensors or the shards model.safetensors.index.json lists)")
CUSTOM = "layer_connections"  # config.json's model_type of a custom-code folder
HERE = os.path.dirname(os.path.abspath(__file__))  # hf/, beside hf_model.py
ROOT = os.path.dirname(HERE)  # the repository, where the model files are
MISMATCH = "the weights and config.json do not belong together: download or export the folder again"


# ----------------------------------------------------------------------------------------------------------
# names, both ways, and the fused projections (one matmul here, two or three in Llama)

def to_hf_name(name):
    """Our parameter name -> the Hugging Face one, or None for a parameter of the method only."""
    if m := re.fullmatch(r"blocks\.(\d+)\.(.+)\.(weight|bias)", name):
        return f"model.layers.{m[1]}.{LAYER_NAMES[m[2]]}.{m[3]}" if m[2] in LAYER_NAMES else None
    if m := re.fullmatch(r"(\w+)\.(weight|bias)", name):
        return f"{TOP_NAMES[m[1]]}.{m[2]}" if m[1] in TOP_NAMES else None
    return None


def qkv_rows(config):
    """The rows of an attention's fused wqkv that are q, k and v: H, H_kv and H_kv heads of head_dim rows."""
    a = config if isinstance(config, dict) else vars(config)  # model_args or a GPTConfig
    head_dim = a["head_dim"] or a["n_embd"] // a["n_head"]
    return a["n_head"] * head_dim, a["n_kv_head"] * head_dim, a["n_kv_head"] * head_dim


def separate(name, config):
    """(names, rows) of the projections that the fused weight or bias `name` stacks: an attention's wqkv is wq, wk
    and wv (q_proj, k_proj, v_proj), an MLP's w13 is w1 and w3 (gate_proj, up_proj); else (None, None)."""
    if not (m := re.fullmatch(r"(.*?)(attn\.wqkv|mlp\.w13)\.(weight|bias)", name)):
        return None, None
    a = config if isinstance(config, dict) else vars(config)  # model_args or a GPTConfig
    parts, rows = (("wq", "wk", "wv"), qkv_rows(a)) if m[2] == "attn.wqkv" else (("w1", "w3"), (a["ffn_hidden"],) * 2)
    return [f"{m[1]}{m[2].split('.')[0]}.{p}.{m[3]}" for p in parts], rows


def split_fused(state, config):
    """state with each fused wqkv and w13 as the separate projections Llama and Qwen3 have: views of its rows."""
    out = {}
    for name, t in state.items():
        names, rows = separate(name, config)
        out.update(zip(names, t.split(rows)) if names else [(name, t)])
    return out


def join_fused(state, model):
    """state with the separate projections of each of model's fused wqkv and w13 joined into it (one tensor)."""
    for name in model.state_dict():
        parts, _ = separate(name, model.config)
        if parts and all(p in state for p in parts):
            state[name] = torch.cat([state.pop(p) for p in parts])
    return state


# ----------------------------------------------------------------------------------------------------------
# config.json -> our model options: a Llama or Qwen3 folder's, or the whole architecture of a custom-code one

def read_config(folder):
    """The shared model options (architecture, not block_size or dropout) of the Llama or Qwen3 model in folder,
    from its config.json; their values are checked where the model is built (its GPTConfig's rules)."""
    path = os.path.join(folder, "config.json")
    c = read_json(path, "--init_from's config.json", FOLDER_FIX)
    kind, archs = c.get("model_type"), c.get("architectures") or []
    if kind not in ARCHITECTURES or any(a != ARCHITECTURES[kind] for a in archs):
        what = f"a {kind} model" + (f" ({', '.join(map(str, archs))})" if archs else "")
        raise ConfigError(f"{path} describes {what}; --init_from reads Llama and Qwen3 language models "
                          "(LlamaForCausalLM, Qwen3ForCausalLM)")
    need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    if missing := [k for k in need if type(c.get(k)) is not int or c[k] < 1]:
        raise ConfigError(f"{path} lacks {', '.join(missing)} (or not as integers of 1 or more); save it again")
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}  # transformers 5 / 4 spell it differently
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
    unsupported = [f"hidden_act {c['hidden_act']!r}" if c.get("hidden_act", "silu") != "silu" else None,
                   f"RoPE scaling {rope_type!r}" if rope_type != "default" else None,
                   "sliding-window attention" if c.get("use_sliding_window") or any(
                       t != "full_attention" for t in c.get("layer_types") or []) else None,
                   f"pretraining_tp {c['pretraining_tp']}" if c.get("pretraining_tp", 1) != 1 else None,
                   f"attention_bias {c.get('attention_bias')} with mlp_bias {c.get('mlp_bias')}"
                   if bool(c.get("attention_bias")) != bool(c.get("mlp_bias")) else None]
    if found := [u for u in unsupported if u]:
        raise ConfigError(f"{path}: {found[0]} is not supported; the model here has SwiGLU (silu), plain RoPE, full "
                          "causal attention, and biases on every linear layer or on none")
    n_embd, n_head, head_dim = c["hidden_size"], c["num_attention_heads"], c.get("head_dim")
    return {
        "vocab_size": c["vocab_size"], "n_layer": c["num_hidden_layers"], "n_head": n_head,
        "n_kv_head": c.get("num_key_value_heads") or n_head,  # absent: multi-head attention
        "n_embd": n_embd, "ffn_hidden": c["intermediate_size"],
        "head_dim": 0 if head_dim in (None, n_embd // n_head) else head_dim,  # 0: the default n_embd // n_head
        "qk_norm": kind == "qwen3", "rope_theta": rope.get("rope_theta", c.get("rope_theta", 10000.0)),
        "norm_eps": c.get("rms_norm_eps", 1e-6), "bias": bool(c.get("attention_bias")),
        "tie_embeddings": bool(c.get("tie_word_embeddings", False)),
    }


def read_custom(folder, module):
    """The model_args of a custom-code folder for module's model file (checked as the model is built); ConfigError,
    naming the fix, for a folder of another model file, a missing file, a config.json not such a folder's."""
    path = os.path.join(folder, "config.json")
    c = read_json(path, "--init_from's config.json", FOLDER_FIX)
    name, args = c.get("model_name"), c.get("model_args")
    if not isinstance(name, str) or not isinstance(args, dict):
        raise ConfigError(f"{path} lacks model_name or model_args; export the run again with `python -m hf.export`")
    # the folder is checked whole before --model is suggested: a hint that leads to the next error is none
    for needed in (f"model_{name}.py", "hf_model.py"):
        if not os.path.isfile(os.path.join(folder, needed)):
            raise ConfigError(f"{folder} lacks {needed}, which transformers runs the model with; export the run again")
    if name not in model_names():
        raise ConfigError(f"{path} names model_{name}.py, which this repository does not have (its models: "
                          f"{', '.join(model_names())}); export the run with a checkout that has it")
    if f"model_{name}" != module.__name__:
        raise ConfigError(f"{folder} holds a model_{name}.py run, not a {module.__name__}.py one; pass --model {name}")
    return args


def is_custom(folder):
    """Whether folder's config.json is that of a custom-code folder export() wrote (its model_type)."""
    return read_json(os.path.join(folder, "config.json"), "--init_from's config.json",
                       FOLDER_FIX).get("model_type") == CUSTOM


# ----------------------------------------------------------------------------------------------------------
# train.py --init_from: checks before anything is written, then the weights once the model is built

def init_args(folder, module, model_args, explicit, meta):
    """The model options of a run that starts from folder: model_args with the shared ones from config.json.
    Checks, before anything is written, that no option on the command line contradicts config.json, that the model
    builds, that the tokenizer is the data's and that the weights load (names and shapes, on the meta device)."""
    if is_custom(folder):  # exported by hf/export.py: its whole architecture (--block_size, --dropout may differ)
        hf_args = {k: v for k, v in read_custom(folder, module).items()
                   if k not in ("block_size", "dropout") or k not in explicit}
    else:
        hf_args = read_config(folder)
    differ = [f"--{k} {model_args[k]} (config.json: {v})" for k, v in hf_args.items()
              if k in explicit and model_args[k] != v]
    if differ:
        raise ConfigError(f"{', '.join(differ)} contradicts {folder}/config.json, which sets the architecture of a "
                          "run started with --init_from; drop the option")
    model_args = {**model_args, **hf_args}
    with torch.device("meta"):  # shapes only: no memory, no random numbers drawn
        model = build_model(module, model_args, f"{folder}'s config.json")
    unchecked = check_tokenizer(folder, model.config.vocab_size, meta)
    load_folder(model, folder, meta=True)
    if unchecked:  # once every check has passed: a failing run says one thing only
        note(unchecked)
    return model_args


def load_folder(model, folder, meta=False):
    """Load the folder's weights into model with load_state_dict (strict: every name and shape): a Llama or Qwen3
    folder's tensors under our names, each fused projection joined, and the method's own parameters as they are;
    an exported folder's every tensor. meta: the headers' shapes only, into a model on the meta device."""
    index = os.path.join(folder, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if os.path.exists(index):
        weight_map = read_json(index, "the index", FOLDER_FIX).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ConfigError(f"{index} has no weight_map of file names; {FOLDER_FIX}")
        files = sorted(set(weight_map.values()))
    tensors = {}
    for path in (os.path.join(folder, f) for f in files):
        with handling(regular_file(path, "the weights file", FOLDER_FIX), f"the file is damaged; {FOLDER_FIX}"):
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    t = torch.empty(f.get_slice(name).get_shape(), device="meta") if meta else f.get_tensor(name)
                    if not meta and t.is_floating_point() and not torch.isfinite(t).all():
                        raise ConfigError(f"{name} in {path} holds NaN or infinity; download the folder again")
                    tensors[name] = t
    if is_custom(folder):
        state = {name.removeprefix("model."): t for name, t in tensors.items()}
    else:
        ours = split_fused(model.state_dict(), model.config)
        names = {to_hf_name(n): n for n in ours}
        state = {n: t for n, t in ours.items() if to_hf_name(n) is None}  # the method's own: kept as they are
        state.update({names.get(k, k): t for k, t in tensors.items() if not k.endswith("rotary_emb.inv_freq")})
        if model.config.tie_embeddings and "tok_emb.weight" in state:  # stored once (a tied folder may keep a copy)
            state["lm_head.weight"] = state["tok_emb.weight"]
    with handling(index if os.path.exists(index) else path, MISMATCH), torch.no_grad():
        model.load_state_dict(join_fused(state, model))


# ----------------------------------------------------------------------------------------------------------
# export: a run -> config.json + model.safetensors (+ the model file, hf_model.py and the tokenizer's files)

def hf_config(a, source, eot):
    """config.json of Qwen3ForCausalLM (qk_norm) or LlamaForCausalLM for vanilla's model_args a. source: the
    config.json of the folder the run started from ({} if none), for its token ids and context length."""
    kind = "qwen3" if a["qk_norm"] else "llama"
    if kind == "qwen3" and a["bias"]:
        raise ConfigError("Qwen3 has no MLP biases, so a model with both qk_norm and bias has no Hugging Face "
                          "architecture to export to")
    config = {
        "architectures": [ARCHITECTURES[kind]], "model_type": kind,
        "vocab_size": a["vocab_size"], "hidden_size": a["n_embd"], "intermediate_size": a["ffn_hidden"],
        "num_hidden_layers": a["n_layer"], "num_attention_heads": a["n_head"], "num_key_value_heads": a["n_kv_head"],
        "head_dim": a["head_dim"] or a["n_embd"] // a["n_head"], "hidden_act": "silu",
        "max_position_embeddings": source.get("max_position_embeddings", a["block_size"]),
        "rms_norm_eps": a["norm_eps"], "rope_theta": a["rope_theta"], "rope_scaling": None,
        "tie_word_embeddings": a["tie_embeddings"], "attention_bias": a["bias"], "attention_dropout": 0.0,
        "bos_token_id": source.get("bos_token_id"),
        "eos_token_id": eot if source.get("eos_token_id") is None else source["eos_token_id"],
        "use_cache": True,
    }
    if kind == "llama":
        config.update(mlp_bias=a["bias"], pretraining_tp=1)
    else:
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=a["n_layer"])
    return config


def export(model_name, state, model_args, to, meta, source_folder=None, dtype=torch.float32, tokenizer=None):
    """Write the folder `to` of a run. A vanilla run: config.json (hf_config(); source_folder: the folder it started
    from) and model.safetensors under Hugging Face's names (tied embeddings stored once, as save_pretrained stores
    them). Any other: config.json (model_type layer_connections, auto_map to hf_model.py; the run's model name and
    options), model.safetensors (every tensor of the checkpoint, under model.), the model file as this repository
    ships it and hf_model.py with its import line naming that file. Both carry the tokenizer (tokenizer_files(): the
    run's, or that of the folder `tokenizer`)."""
    files, dtype_name = tokenizer_files(meta, tokenizer), str(dtype).removeprefix("torch.")
    if model_name == "vanilla":  # transformers' own Llama or Qwen3
        path = os.path.join(source_folder or "", "config.json")  # of the folder the run started from, if it is there
        source = (read_json(path, "the config.json of --init_from", "restore that folder, or move it away")
                  if source_folder and os.path.isfile(path) else {})
        config = {**hf_config(model_args, source, meta.get("eot_token")), "torch_dtype": dtype_name}
        tensors = {to_hf_name(k): t.detach().to("cpu", dtype).contiguous()
                   for k, t in split_fused(state, model_args).items()
                   if not (k == "lm_head.weight" and model_args["tie_embeddings"])}
    else:
        config = {"architectures": ["LayersForCausalLM"], "model_type": CUSTOM, "auto_map": {
                  "AutoConfig": "hf_model.LayersConfig", "AutoModelForCausalLM": "hf_model.LayersForCausalLM"},
                  "model_name": model_name, "model_args": model_args, "vocab_size": model_args["vocab_size"],
                  "max_position_embeddings": model_args["block_size"], "tie_word_embeddings": False,
                  "eos_token_id": meta.get("eot_token"), "torch_dtype": dtype_name}
        tensors = {f"model.{k}": (v.to(dtype) if v.is_floating_point() else v).detach().to("cpu").clone()
                   for k, v in state.items()}  # clone: safetensors stores no shared tensors (tied embeddings)
        for name, where in ((f"model_{model_name}.py", ROOT), ("hf_model.py", HERE)):
            files[name] = pathlib.Path(where, name).read_text(encoding="utf-8")
        files["hf_model.py"] = files["hf_model.py"].replace(  # the one line that names the model file
            "from .model_vanilla import", f"from .model_{model_name} import", 1)
    write_folder(to, config, tensors, files)
    return config


def write_folder(to, config, tensors, files):
    """config.json, model.safetensors (tensors) and files ({name: text or bytes}), written in a temporary folder
    beside `to`, then renamed into place: the folder is whole or not there. Every file gets the mode open() gives
    (0666 less the umask). A write that fails (a full disk, a file-size limit) is one line naming `to`."""
    parent, base = os.path.split(os.path.abspath(to))
    tmp = os.path.join(parent, f".{base}.tmp{os.getpid()}")
    try:
        with handling(to, f"{LIMIT}, or choose another --to"):
            os.makedirs(tmp)
            for name, content in {"config.json": to_json(config, indent=2) + "\n", **files}.items():
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(content.encode("utf-8") if isinstance(content, str) else content)
            save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
            # safetensors writes through a private temporary file (0600): the mode open() gave config.json
            os.chmod(os.path.join(tmp, "model.safetensors"), os.stat(os.path.join(tmp, "config.json")).st_mode & 0o777)
            if os.path.isdir(to):
                os.rmdir(to)  # empty: hf/export.py refuses any other
            os.replace(tmp, to)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------
# tokenizers: prepare.py --tokenizer hf:DIR, and the check that a folder's tokenizer is the data's

def check_tokenizer(folder, vocab_size, meta):
    """The folder's tokenizer is the one the data was prepared with: an hf: tokenizer's tokenizer.json, or the one
    hf/export.py writes for the byte or gpt2 tokenizer. A folder without tokenizer.json (or with GPT-2's when
    tiktoken's files are not at hand) passes if its vocabulary size is the data's, and the note that says so is
    returned."""
    data_tok, mine = meta["tokenizer"], os.path.join(folder, "tokenizer.json")
    redo = (f"prepare the data with `python prepare.py {arg('tokenizer', 'hf:' + folder)} ...` and pass that "
            "--dataset" if os.path.isfile(mine) else "pass a --dataset prepared with the tokenizer the folder's model "
            "was trained with (the folder has no tokenizer.json to prepare one with)")
    same = None  # None: it cannot be told
    if os.path.isfile(mine):
        Tokenizer = need("tokenizers", "--init_from with a tokenizer.json").Tokenizer
        try:  # a tokenizer.json that the tokenizers package cannot read is no tokenizer, not another one
            theirs = Tokenizer.from_file(mine).to_str()
        except Exception as e:
            raise ConfigError(f"cannot read {mine} ({' '.join(str(e).split())[:120]}); download the folder again")
        try:  # parsed: copies saved by different tools differ in layout only
            same = (Tokenizer.from_file(os.path.join(data_tok[3:], "tokenizer.json")) if data_tok.startswith("hf:")
                    else Tokenizer.from_str(own_tokenizer_json(data_tok))).to_str() == theirs
        except ConfigError:  # GPT-2's files are not at hand offline
            pass
        except Exception:  # the data's tokenizer.json is gone or unreadable: not shown to be the same
            same = False
    if same is None:
        if vocab_size != meta["vocab_size"]:
            raise ConfigError(f"{folder}/config.json has vocab_size {vocab_size} but the data's {data_tok} tokenizer "
                              f"has {meta['vocab_size']}; the model's tokenizer is not the data's: {redo}")
        why = "GPT-2's files are not at hand" if os.path.isfile(mine) else "it has no tokenizer.json"
        return (f"the tokenizer of {folder} could not be checked against the data's ({data_tok}): {why}; their "
                f"vocabulary sizes agree ({vocab_size})")
    if not same:
        raise ConfigError(f"the tokenizer of {folder} is not the one the data was prepared with ({data_tok}); {redo}")
    return None


# ----------------------------------------------------------------------------------------------------------
# the tokenizer an exported folder carries: files that transformers' AutoTokenizer loads

EOT_TEXT = "<|endoftext|>"  # the end-of-text token of the byte and gpt2 tokenizers (id 256 and 50256)


def tokenizer_files(meta, given=None):
    """{file name: text or bytes} of the tokenizer of a run (meta.json's) for an exported folder: the files of the
    folder `given` (hf/export.py --tokenizer) where passed, else the run's: an hf: tokenizer's files as they are,
    the byte tokenizer and GPT-2's (from tiktoken's cache) as a tokenizer.json made here. ConfigError, in one line
    naming what to pass, where the run's tokenizer is not at hand."""
    name, eot = meta.get("tokenizer", ""), meta.get("eot_token")
    if given or name.startswith("hf:"):
        folder = given or name[3:]
        if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
            what = "--tokenizer" if given else "the run's tokenizer folder"
            raise ConfigError(f"{what} {folder} has no tokenizer.json; pass --tokenizer DIR, a folder holding the "
                              "run's tokenizer.json")
        _, decode, vocab_size, folder_eot = hf_tokenizer(folder)
        if given and (vocab_size, folder_eot) != (meta.get("vocab_size"), eot):
            raise ConfigError(f"--tokenizer {folder} has {vocab_size} tokens and end of text {folder_eot}, the "
                              f"run's {name} tokenizer {meta.get('vocab_size')} and {eot}; pass a folder with the "
                              "run's tokenizer")
        files = {f: pathlib.Path(folder, f).read_bytes() for f in TOKENIZER_FILES
                 if os.path.isfile(os.path.join(folder, f))}
        if "tokenizer_config.json" not in files:  # without it transformers knows no end-of-text token
            files["tokenizer_config.json"] = to_json({
                "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": decode([eot]), "pad_token": decode([eot]),
                "split_special_tokens": True}, indent=2) + "\n"  # special tokens in a text are text, as in prepare.py
        return files
    return {"tokenizer.json": own_tokenizer_json(name), "tokenizer_config.json": to_json({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT_TEXT, "eos_token": EOT_TEXT,
        "pad_token": EOT_TEXT,  # every document starts after one; pads are masked, so any token would do
        "clean_up_tokenization_spaces": False,  # the text decoded as it is
        "split_special_tokens": True,  # "<|endoftext|>" in a text is its bytes, as prepare.py encodes it
    }, indent=2) + "\n"}


def own_tokenizer_json(name):
    """tokenizer.json (text) of prepare.py's byte or gpt2 tokenizer: the byte tokenizer's 256 bytes at their byte
    values; GPT-2's tokens from tiktoken's files (its cache), which tiktoken downloads where there is internet."""
    if name == "byte":
        return byte_level_json({bytes([b]): b for b in range(256)}, words=False)
    if name == "gpt2":
        try:
            from tiktoken_ext.openai_public import ENCODING_CONSTRUCTORS
            ranks = ENCODING_CONSTRUCTORS["gpt2"]()["mergeable_ranks"]
        except Exception:  # no tiktoken, or its download failed (no internet)
            raise ConfigError("GPT-2's tokenizer is not at hand offline (tiktoken's cache does not hold its files); "
                              "pass --tokenizer DIR, a folder with GPT-2's tokenizer.json (huggingface-cli download "
                              "openai-community/gpt2 --local-dir DIR), or set TIKTOKEN_CACHE_DIR to tiktoken's cache")
        return byte_level_json(ranks, words=True)
    raise ConfigError(f"the run's tokenizer {name or '(none recorded)'} cannot be exported; pass --tokenizer DIR, "
                      "a folder with the run's tokenizer.json")


def bytes_to_unicode():
    """GPT-2's map of the 256 bytes to printable characters, in which byte-level BPE files write their tokens."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def byte_level_json(ranks, words):
    """tokenizer.json (text, the tokenizers package) of tiktoken's byte-level BPE ranks {token bytes: id}, plus
    "<|endoftext|>" at the next id. tiktoken merges, in a text, the pair of parts whose merged token ranks lowest;
    the merges here are each token's last merge when its own bytes are encoded so, in the order of the tokens'
    ranks, which encode as tiktoken does. words: split the text into GPT-2's words first (its regex)."""
    tk = need("tokenizers", "writing a tokenizer.json")
    chars = bytes_to_unicode()

    def text(token):
        return "".join(chars[b] for b in token)

    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:  # tiktoken's encoding of the token, with the tokens ranked below it
            best, i = min((ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1))
            if best >= rank:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append((text(parts[0]), text(parts[1])))
    tok = tk.Tokenizer(tk.models.BPE(vocab={text(t): r for t, r in ranks.items()}, merges=merges))
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=words)
    tok.decoder = tk.decoders.ByteLevel()  # bytes back, then UTF-8, broken sequences as U+FFFD (errors="replace")
    tok.add_special_tokens([tk.AddedToken(EOT_TEXT, special=True)])
    return tok.to_str(pretty=True)

