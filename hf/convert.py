"""
Hugging Face model folders in and out: pretrained Llama and Qwen3 weights for any model file, a vanilla run
written back as a Llama or Qwen3 folder, and a run of any other model file as a transformers custom-code folder
(hf_model.py beside the model file; export_custom, read_custom), which comes back whole.

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
config.json gives the architecture: hidden_size -> n_embd, num_hidden_layers -> n_layer, num_attention_heads ->
n_head, num_key_value_heads -> n_kv_head, head_dim, intermediate_size -> ffn_hidden, rope_theta, rms_norm_eps ->
norm_eps, tie_word_embeddings, attention_bias (with mlp_bias: our one bias flag), vocab_size. What these models
can do and ours cannot is refused in one line: RoPE scaling (Llama 3.1's "llama3"), sliding windows, another
activation, biases on attention but not on the MLP. A parameter of a model file that has no Hugging Face name
(AttnRes's pseudo-queries, skip-middle's gates and extra norms, ...) keeps its initialisation.

Every mistake is an HFError, a ConfigError with a one-line message that the scripts end in.
"""
import hashlib
import os
import re
import shlex
import shutil
import sys

import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("hf/convert.py is a library module: Hugging Face folders in (train.py --init_from) and out; run "
             "`python -m hf.export --help` or `python train.py --help`")

from common import hf_tokenizer, need
from plumbing.checkpoints import separate, split_fused, weights_for
from plumbing.config import make_config
from plumbing.errors import ConfigError, note
from plumbing.files import read_object as read_json_object, to_json
from plumbing.models import build_model, model_names

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


class HFError(ConfigError):
    """A folder, a checkpoint or an option that does not fit; the message is one line that names the fix."""


# ----------------------------------------------------------------------------------------------------------
# names, both ways

def to_hf_name(name):
    """Our parameter name -> the Hugging Face one, or None for a parameter of the method only."""
    if m := re.fullmatch(r"blocks\.(\d+)\.(.+)\.(weight|bias)", name):
        return f"model.layers.{m[1]}.{LAYER_NAMES[m[2]]}.{m[3]}" if m[2] in LAYER_NAMES else None
    if m := re.fullmatch(r"(\w+)\.(weight|bias)", name):
        return f"{TOP_NAMES[m[1]]}.{m[2]}" if m[1] in TOP_NAMES else None
    return None


# ----------------------------------------------------------------------------------------------------------
# config.json -> our model options

def read_object(path):
    """The JSON object in the file at path (a folder's config.json); HFError if it is not one."""
    try:
        return read_json_object(path, "the model's", "save the model again with save_pretrained")
    except ConfigError as e:
        raise HFError(str(e))


def read_config(folder):
    """The shared model options (architecture, not block_size or dropout) of the Llama or Qwen3 model in folder,
    from its config.json."""
    path = os.path.join(folder, "config.json")
    if not os.path.isdir(folder):
        raise HFError(f"--init_from {folder} is not a folder; pass a Hugging Face model folder (config.json and "
                      "model.safetensors, as save_pretrained writes them)")
    if not os.path.isfile(path):
        raise HFError(f"{folder} has no config.json; pass a Hugging Face model folder as save_pretrained writes it")
    c = read_object(path)
    kind, archs = c.get("model_type"), c.get("architectures") or []
    if kind not in ARCHITECTURES or any(a != ARCHITECTURES[kind] for a in archs):
        what = f"a {kind} model" + (f" ({', '.join(map(str, archs))})" if archs else "")
        raise HFError(f"{path} describes {what}; --init_from reads Llama and Qwen3 language models "
                      "(LlamaForCausalLM, Qwen3ForCausalLM)")
    need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    if missing := [k for k in need if not isinstance(c.get(k), int)]:
        raise HFError(f"{path} lacks {', '.join(missing)} (or they are not integers); save the model again")
    if c.get("hidden_act", "silu") != "silu":
        raise HFError(f"{path}: hidden_act {c['hidden_act']!r} is not supported; the MLP here is SwiGLU (silu)")
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}  # transformers 5 / 4 spell it differently
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise HFError(f"{path}: RoPE scaling {rope.get('rope_type', rope.get('type'))!r} is not supported; only "
                      "plain RoPE (rope_type default) is")
    if c.get("use_sliding_window") or any(t != "full_attention" for t in c.get("layer_types") or []):
        raise HFError(f"{path}: sliding-window attention is not supported; only full causal attention is")
    attention_bias = bool(c.get("attention_bias", False))
    if attention_bias != bool(c.get("mlp_bias", False)):
        raise HFError(f"{path}: attention_bias {attention_bias} with mlp_bias {bool(c.get('mlp_bias', False))} is "
                      "not supported; the bias option here puts biases on every linear layer or on none")
    if c.get("pretraining_tp", 1) != 1:
        raise HFError(f"{path}: pretraining_tp {c['pretraining_tp']} is not supported; set it to 1")
    n_embd, n_head = c["hidden_size"], c["num_attention_heads"]
    n_kv_head = c.get("num_key_value_heads") or n_head  # absent: multi-head attention
    head_dim = c.get("head_dim") or n_embd // n_head
    if min(c[k] for k in need) < 1 or n_head % n_kv_head or head_dim < 1 or head_dim % 2:
        raise HFError(f"{path}: the sizes do not fit (each must be 1 or more, num_key_value_heads must divide "
                      "num_attention_heads, and the head size must be even)")
    return {
        "vocab_size": c["vocab_size"], "n_layer": c["num_hidden_layers"], "n_head": n_head,
        "n_kv_head": n_kv_head, "n_embd": n_embd,
        "ffn_hidden": c["intermediate_size"],
        "head_dim": 0 if head_dim * n_head == n_embd else head_dim,  # 0: the default n_embd // n_head
        "qk_norm": kind == "qwen3",
        "rope_theta": float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
        "norm_eps": float(c.get("rms_norm_eps", 1e-6)),
        "bias": attention_bias, "tie_embeddings": bool(c.get("tie_word_embeddings", False)),
    }


# ----------------------------------------------------------------------------------------------------------
# safetensors files

def safetensors():
    try:
        import safetensors.torch
    except ImportError:
        raise HFError("reading and writing Hugging Face weights needs the safetensors package: "
                      "pip install safetensors")
    return safetensors


def weight_files(folder):
    """{Hugging Face tensor name: path of the .safetensors file holding it}: one file, or sharded with an index."""
    single, index = os.path.join(folder, "model.safetensors"), os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        weight_map = read_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise HFError(f"{index} has no weight_map; save the model again with save_pretrained")
        files = {name: os.path.join(folder, f) for name, f in weight_map.items()}
        for path in sorted(set(files.values())):
            if not os.path.isfile(path):
                raise HFError(f"{folder} lacks {os.path.basename(path)}, a shard that {os.path.basename(index)} "
                              "lists; copy the whole folder")
        return files
    if not os.path.isfile(single):
        other = [f for f in ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5")
                 if os.path.exists(os.path.join(folder, f))]
        hint = f" (it has {other[0]}: save it again with save_pretrained, which writes safetensors)" if other else ""
        raise HFError(f"{folder} has no model.safetensors nor model.safetensors.index.json{hint}")
    return {name: single for name in tensor_shapes(single)}


def tensor_shapes(path):
    """{name: shape} of a .safetensors file, read from its header only."""
    st = safetensors()
    try:
        with st.safe_open(path, framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except Exception as e:  # the reader's errors differ by damage: header, size, not a safetensors file
        raise HFError(f"cannot read {path} ({' '.join(str(e).split())[:150]}); the file is damaged or not "
                      "safetensors: copy it again")


def split_state(model):
    """model's state_dict with each wqkv as the wq, wk and wv that q_proj, k_proj and v_proj are, and each w13 as
    the w1 and w3 that gate_proj and up_proj are (views of its rows: a copy into them writes the model's tensor)."""
    return split_fused(model.state_dict(), model.config)


def shared_names(model):
    """{Hugging Face name: our name} of every parameter of model that a folder provides."""
    names = {}
    for ours in split_state(model):
        hf = to_hf_name(ours)
        if hf is not None and not (ours == "lm_head.weight" and model.config.tie_embeddings):
            names[hf] = ours
    return names


def check_weights(folder, model):
    """The folder's tensors are exactly model's shared parameters, each of model's shape (model may be on the
    meta device: only names and shapes are read)."""
    files = weight_files(folder)
    shapes = {}  # of the tensors the index (or the one file) points to, where it points
    for path in sorted(set(files.values())):
        shapes.update({name: shape for name, shape in tensor_shapes(path).items() if files.get(name) == path})
    want, ours = shared_names(model), split_state(model)
    tied_head = model.config.tie_embeddings and "lm_head.weight" in shapes  # some tied folders keep a copy
    for name, shape in shapes.items():
        if name not in want and not (tied_head and name == "lm_head.weight"):
            if name.endswith("rotary_emb.inv_freq"):
                continue  # older Llama files store RoPE's frequencies, which follow from the config
            raise HFError(f"{os.path.basename(files[name])} in {folder} holds {name}, which config.json's "
                          "architecture has no place for; the weights and config.json do not belong together")
        expected = tuple(ours[want.get(name, "tok_emb.weight")].shape)
        if shape != expected:
            raise HFError(f"{name} in {os.path.basename(files[name])} has shape {list(shape)} but {folder}/config.json "
                          f"makes it {list(expected)}; the weights and config.json do not belong together")
    if missing := [n for n in want if n not in shapes]:
        raise HFError(f"the weights in {folder} lack {missing[0]}" + (f" and {len(missing) - 1} more" if
                      len(missing) > 1 else "") + "; the weights and config.json do not belong together")
    return files


# ----------------------------------------------------------------------------------------------------------
# train.py --init_from: checks before anything is written, then the weights once the model is built

def init_args(folder, module, model_args, explicit, meta):
    """The model options of a run that starts from folder: model_args with the shared ones from config.json.
    Checks, before anything is written, that no option given on the command line contradicts config.json, that
    the tokenizer is the data's, and that every tensor has its name and shape. Returns the new model_args."""
    custom = is_custom(folder)
    if custom:  # a run exported by hf/export.py: its whole architecture (--block_size and --dropout may differ)
        hf_args = read_custom(folder, module)
        hf_args = {k: v for k, v in hf_args.items() if k not in ("block_size", "dropout") or k not in explicit}
    else:
        hf_args = read_config(folder)
    differ = [f"--{k} {model_args[k]} (config.json: {v})" for k, v in hf_args.items()
              if k in explicit and model_args[k] != v]
    if differ:
        raise HFError(f"{', '.join(differ)} contradicts {folder}/config.json, which sets the architecture of a run "
                      "started with --init_from; drop the option")
    unchecked = check_tokenizer(folder, hf_args["vocab_size"], meta)
    model_args = {**model_args, **hf_args}
    try:
        with torch.device("meta"):  # shapes only: no memory, no random numbers drawn
            model = build_model(module, model_args, f"{folder}'s config.json")
    except (AssertionError, ZeroDivisionError) as e:
        raise HFError(f"{module.__name__}.py rejects the architecture of {folder}: {e}")
    (check_custom_weights if custom else check_weights)(folder, model)
    if unchecked:  # once every check has passed: a failing run says one thing only
        note(unchecked)
    return model_args


@torch.no_grad()
def load_folder(model, folder):
    """Copy the folder's tensors into model's shared parameters (in their dtype and device); every parameter the
    folder does not name keeps its value. Returns the names loaded (ours)."""
    if is_custom(folder):  # every tensor, the method's own included (and all finite)
        st, tensors = safetensors(), {}
        for path in sorted(set(check_custom_weights(folder, model).values())):
            with st.safe_open(path, framework="pt") as f:
                tensors.update({k.removeprefix("model."): f.get_tensor(k) for k in f.keys()})
        try:
            model.load_state_dict(weights_for(model, tensors, f"{folder}/model.safetensors"))
        except ConfigError as e:
            raise HFError(str(e))
        return list(tensors)
    files = check_weights(folder, model)
    st, want, ours = safetensors(), shared_names(model), split_state(model)
    loaded = []
    for path in sorted(set(files.values())):
        with st.safe_open(path, framework="pt") as f:
            for name in f.keys():
                if name in want and files.get(name) == path:
                    tensor = f.get_tensor(name)
                    if not (tensor.is_floating_point() and torch.isfinite(tensor).all()):  # copy_ would cast it
                        what = "NaN or infinity" if tensor.is_floating_point() else f"{tensor.dtype} numbers"
                        raise HFError(f"{name} in {path} holds {what}, not finite floating-point weights; download "
                                      "the folder again")
                    ours[want[name]].copy_(tensor)
                    loaded.append(want[name])
    return loaded


# ----------------------------------------------------------------------------------------------------------
# export: a vanilla checkpoint -> config.json + model.safetensors (+ the tokenizer files of its data)

def hf_config(model_args, source=None, eot=None):
    """config.json of Qwen3ForCausalLM (qk_norm) or LlamaForCausalLM for vanilla's model_args. source: the
    config.json of the folder the run started from, for its token ids and context length."""
    a, source = model_args, source or {}
    kind = "qwen3" if a["qk_norm"] else "llama"
    if kind == "qwen3" and a["bias"]:
        raise HFError("Qwen3 has no MLP biases, so a model with both qk_norm and bias has no Hugging Face "
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
        "torch_dtype": "float32", "use_cache": True,
    }
    if kind == "llama":
        config.update(mlp_bias=a["bias"], pretraining_tp=1)
    else:
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=a["n_layer"])
    return config


def to_hf_state(state, model_args):
    """vanilla's state_dict -> {Hugging Face name: tensor}; tied embeddings are stored once, as save_pretrained
    stores them."""
    out = {}
    for ours, tensor in split_fused(state, model_args).items():
        if ours == "lm_head.weight" and model_args["tie_embeddings"]:
            continue
        hf = to_hf_name(ours)
        if hf is None:
            raise HFError(f"the checkpoint's parameter {ours} has no Hugging Face name; only model_vanilla.py's "
                          "architecture exists in transformers")
        out[hf] = tensor.detach().to("cpu").contiguous()
    return out


def export(state, model_args, to, meta=None, source_folder=None, dtype=torch.float32, tokenizer=None):
    """Write the folder `to` (which must not exist or be empty) of a vanilla run: config.json, model.safetensors
    and the tokenizer (tokenizer_files(): the run's, or that of the folder `tokenizer`)."""
    files = tokenizer_files(meta or {}, tokenizer)
    source = {}
    if source_folder and os.path.isfile(os.path.join(source_folder, "config.json")):
        source = read_object(os.path.join(source_folder, "config.json"))
    config = hf_config(model_args, source, (meta or {}).get("eot_token"))
    tensors = {k: v.to(dtype) for k, v in to_hf_state(state, model_args).items()}
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    write_folder(to, config, tensors, files)
    return config


def write_folder(to, config, tensors, files):
    """config.json, model.safetensors (tensors) and files ({name: text or bytes}), written in a temporary folder
    beside `to`, then renamed into place; every file with the mode open() gives (0666 less the umask)."""
    if os.path.exists(to) and (not os.path.isdir(to) or os.listdir(to)):
        raise HFError(f"--to {to} exists and is not an empty folder; choose another --to or remove it")
    parent = os.path.dirname(os.path.abspath(to))
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(to))}.tmp{os.getpid()}")
    try:
        os.makedirs(tmp)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            f.write(to_json(config, indent=2))
            f.write("\n")
        weights = os.path.join(tmp, "model.safetensors")
        safetensors().torch.save_file(tensors, weights, metadata={"format": "pt"})
        umask = os.umask(0o022)  # read and set back: safetensors writes through a private temporary file (0600)
        os.umask(umask)
        os.chmod(weights, 0o666 & ~umask)
        for name, content in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
        if os.path.isdir(to):
            os.rmdir(to)  # empty (checked above)
        os.replace(tmp, to)
    except OSError as e:
        raise HFError(f"cannot write {to} ({e.strerror}); choose another --to")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------
# every other model file: a transformers custom-code folder (hf_model.py), written and read back whole

CUSTOM = "layer_connections"  # config.json's model_type of such a folder
HERE = os.path.dirname(os.path.abspath(__file__))  # hf/, beside hf_model.py
ROOT = os.path.dirname(HERE)  # the repository, where the model files are


def export_custom(model_name, state, model_args, to, meta=None, dtype=torch.float32, tokenizer=None):
    """Write the folder `to` of a run of any model file: config.json (model_type layer_connections, auto_map to
    hf_model.py; the run's model name and options), model.safetensors (every tensor of the checkpoint, under
    model.), the model file as this repository ships it, hf_model.py with its import line naming that file, and
    the tokenizer (tokenizer_files(): the run's, or that of the folder `tokenizer`)."""
    files = tokenizer_files(meta or {}, tokenizer)
    config = {"architectures": ["LayersForCausalLM"], "model_type": CUSTOM,
              "auto_map": {"AutoConfig": "hf_model.LayersConfig", "AutoModelForCausalLM": "hf_model.LayersForCausalLM"},
              "model_name": model_name, "model_args": model_args, "vocab_size": model_args["vocab_size"],
              "max_position_embeddings": model_args["block_size"], "tie_word_embeddings": False,
              "eos_token_id": (meta or {}).get("eot_token"), "torch_dtype": str(dtype).removeprefix("torch.")}
    tensors = {f"model.{k}": (v.to(dtype) if v.is_floating_point() else v).detach().to("cpu").clone()
               for k, v in state.items()}  # clone: safetensors stores no shared tensors (tied embeddings)
    for name, where in ((f"model_{model_name}.py", ROOT), ("hf_model.py", HERE)):
        with open(os.path.join(where, name), encoding="utf-8") as f:
            files[name] = f.read()
    files["hf_model.py"] = files["hf_model.py"].replace(  # the one line that names the model file
        "from .model_vanilla import", f"from .model_{model_name} import", 1)
    write_folder(to, config, tensors, files)
    return config


def read_custom(folder, module):
    """The model_args of a folder export_custom() wrote for module's model file; HFError, naming the fix, for a
    folder of another model file, a missing file, a config.json that is not such a folder's."""
    path = os.path.join(folder, "config.json")
    c = read_object(path)
    name, args = c.get("model_name"), c.get("model_args")
    if not isinstance(name, str) or not isinstance(args, dict):
        raise HFError(f"{path} lacks model_name or model_args; export the run again with `python -m hf.export`")
    # the folder is checked whole before --model is suggested: a hint that leads to the next error is none
    for needed in (f"model_{name}.py", "hf_model.py"):
        if not os.path.isfile(os.path.join(folder, needed)):
            raise HFError(f"{folder} lacks {needed}, which transformers runs the model with; export the run again")
    if name not in model_names():
        raise HFError(f"{path} names model_{name}.py, which this repository does not have (its models: "
                      f"{', '.join(model_names())}); export the run with a checkout that has it")
    if f"model_{name}" != module.__name__:
        raise HFError(f"{folder} holds a model_{name}.py run, not a {module.__name__}.py one; pass --model {name}")
    try:
        make_config(module.GPTConfig, **args)
    except (ValueError, TypeError) as e:
        raise HFError(f"{path}: model_args do not fit {module.__name__}.py ({e}); export the run again")
    return args


def check_custom_weights(folder, model):
    """The folder's tensors are model.<every tensor of model's state_dict>, each of its shape (read from the file
    headers; model may be on the meta device). Returns weight_files()."""
    files = weight_files(folder)
    shapes = {}
    for path in sorted(set(files.values())):
        shapes.update(tensor_shapes(path))
    split = {k: tuple(t.shape) for k, t in split_state(model).items()}
    want = {}  # a folder exported before q, k and v (or w1 and w3) were one matmul has them apart: weights_for joins
    for name, t in model.state_dict().items():
        names, _ = separate(name, model.config)
        apart = names and f"model.{name}" not in shapes
        want.update({f"model.{n}": split[n] for n in names} if apart else {f"model.{name}": tuple(t.shape)})
    if shapes != want:
        wrong = sorted(set(shapes) ^ set(want)) or [k for k in want if shapes[k] != want[k]]
        raise HFError(f"the weights in {folder} do not fit its config.json (first: {wrong[0]}); the weights and "
                      "config.json do not belong together: export the run again")
    return files


def is_custom(folder):
    """Whether folder's config.json is that of export_custom() (its model_type)."""
    path = os.path.join(folder, "config.json")
    return os.path.isfile(path) and read_object(path).get("model_type") == CUSTOM


# ----------------------------------------------------------------------------------------------------------
# tokenizers: prepare.py --tokenizer hf:DIR, and the check that a folder's tokenizer is the data's

def same_tokenizer(a, b):
    """Whether the tokenizer.json files a and b define the same tokenizer: the same file, the same bytes, or the
    same tokenizer once parsed (copies saved by different tools differ in layout only)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    if not (os.path.isfile(a) and os.path.isfile(b)):
        return False
    digests = []
    for path in (a, b):
        with open(path, "rb") as f:
            digests.append(hashlib.sha256(f.read()).hexdigest())
    if digests[0] == digests[1]:
        return True
    try:
        from tokenizers import Tokenizer
        return Tokenizer.from_file(a).to_str() == Tokenizer.from_file(b).to_str()
    except Exception:  # no tokenizers package, or a file it cannot read: not shown to be the same
        return False


def check_tokenizer(folder, vocab_size, meta):
    """The folder's tokenizer is the one the data was prepared with: an hf: tokenizer's tokenizer.json, or the one
    hf/export.py writes for the byte or gpt2 tokenizer. A folder without tokenizer.json (or with GPT-2's when
    tiktoken's files are not at hand) passes if its vocabulary size is the data's, and the note that says so is
    returned."""
    data_tok = meta["tokenizer"]
    mine = os.path.join(folder, "tokenizer.json")
    redo = (f"prepare the data with `python prepare.py --tokenizer {shlex.quote('hf:' + folder)} ...` and pass that "
            "--dataset" if os.path.isfile(mine) else "pass a --dataset prepared with the tokenizer the folder's model "
            "was trained with (the folder has no tokenizer.json to prepare one with)")
    same = None  # None: it cannot be told
    if os.path.isfile(mine):
        Tokenizer = need("tokenizers", "--init_from with a tokenizer.json").Tokenizer
        try:  # a tokenizer.json that the tokenizers package cannot read is no tokenizer, not another one
            theirs = Tokenizer.from_file(mine).to_str()
        except Exception as e:
            raise HFError(f"cannot read {mine} ({' '.join(str(e).split())[:120]}); download the folder again")
    if os.path.isfile(mine) and data_tok.startswith("hf:"):
        same = same_tokenizer(os.path.join(data_tok[3:], "tokenizer.json"), mine)
    elif os.path.isfile(mine):
        try:
            same = Tokenizer.from_str(own_tokenizer_json(data_tok)).to_str() == theirs
        except HFError:  # GPT-2's files are not at hand offline
            pass
    if same is None:
        if vocab_size != meta["vocab_size"]:
            raise HFError(f"{folder}/config.json has vocab_size {vocab_size} but the data's {data_tok} tokenizer has "
                          f"{meta['vocab_size']}; the model's tokenizer is not the data's: {redo}")
        why = "GPT-2's files are not at hand" if os.path.isfile(mine) else "it has no tokenizer.json"
        return (f"the tokenizer of {folder} could not be checked against the data's ({data_tok}): {why}; their "
                f"vocabulary sizes agree ({vocab_size})")
    if not same:
        raise HFError(f"the tokenizer of {folder} is not the one the data was prepared with ({data_tok}); {redo}")
    if vocab_size < meta["vocab_size"]:
        raise HFError(f"{folder}/config.json has vocab_size {vocab_size}, fewer than its tokenizer's "
                      f"{meta['vocab_size']} tokens; the folder is inconsistent")
    return None


# ----------------------------------------------------------------------------------------------------------
# the tokenizer an exported folder carries: files that transformers' AutoTokenizer loads

EOT_TEXT = "<|endoftext|>"  # the end-of-text token of the byte and gpt2 tokenizers (id 256 and 50256)


def tokenizer_files(meta, given=None):
    """{file name: text or bytes} of the tokenizer of a run (meta.json's) for an exported folder: the files of the
    folder `given` (hf/export.py --tokenizer) where passed, else the run's: an hf: tokenizer's files as they are,
    the byte tokenizer and GPT-2's (from tiktoken's cache) as a tokenizer.json made here. HFError, in one line
    naming what to pass, where the run's tokenizer is not at hand."""
    name, eot = meta.get("tokenizer", ""), meta.get("eot_token")
    if given or name.startswith("hf:"):
        folder = given or name[3:]
        if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
            what = "--tokenizer" if given else "the run's tokenizer folder"
            raise HFError(f"{what} {folder} has no tokenizer.json; pass --tokenizer DIR, a folder holding the run's "
                          "tokenizer.json")
        _, decode, vocab_size, folder_eot = hf_tokenizer(folder)
        if given and (vocab_size, folder_eot) != (meta.get("vocab_size"), eot):
            raise HFError(f"--tokenizer {folder} has {vocab_size} tokens and end of text {folder_eot}, the run's "
                          f"{name} tokenizer {meta.get('vocab_size')} and {eot}; pass a folder with the run's "
                          "tokenizer")
        files = {}
        for f in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(folder, f)):
                with open(os.path.join(folder, f), "rb") as file:
                    files[f] = file.read()
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
            raise HFError("GPT-2's tokenizer is not at hand offline (tiktoken's cache does not hold its files); pass "
                          "--tokenizer DIR, a folder with GPT-2's tokenizer.json (huggingface-cli download "
                          "openai-community/gpt2 --local-dir DIR), or set TIKTOKEN_CACHE_DIR to tiktoken's cache")
        return byte_level_json(ranks, words=True)
    raise HFError(f"the run's tokenizer {name or '(none recorded)'} cannot be exported; pass --tokenizer DIR, a "
                  "folder with the run's tokenizer.json")


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
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise HFError("writing a tokenizer.json needs the tokenizers package: pip install tokenizers")
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
    tok = Tokenizer(models.BPE(vocab={text(t): r for t, r in ranks.items()}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=words)
    tok.decoder = decoders.ByteLevel()  # bytes back, then UTF-8, broken sequences as U+FFFD (errors="replace")
    tok.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
    return tok.to_str(pretty=True)

