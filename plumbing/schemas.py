"""
Plumbing a learner may skip: the declared shape of every file the scripts read, checked where the file is read and
before anything uses it: train.py's checkpoint, a data set's meta.json, log.jsonl's records and the tools' results
(tools/bench.py, tools/kernels.py, tools/sweep.py). A file that does not match ends in one line naming the file, the
field, what was expected and what to do. A schema is a plain value:
    int, str, bool, Tensor    that type (a bool is not an int)
    Num(min, max, integer)    a finite number (NaN and infinity are refused) within the bounds; integer: an int
    OneOf(a, b, ...)          one of these values
    Null(schema)              schema, or None (JSON's null: to_json writes a value that is not finite as null)
    [schema]                  a list whose every item matches schema
    Some(schema)              a list of one or more items, each matching schema
    {key: schema}             a dict with these keys; Opt(schema) may be missing; other keys are tolerated (a newer
                              file's, or a field no reader uses), and checked against the schema at key ... if any
    Map(schema)               a dict of string keys, every value matching schema
    Scalar                    a string, a bool, a finite number or null (an option's value)
    Bytes                     a tensor of bytes (uint8, one dimension: a random number generator's state)
    RngState                  the state of torch's own generator, as torch.set_rng_state takes it
    Where(schema, key, test)  schema, and then test(value) true of the whole, else key is named (a rule across keys)
    Any                       anything
"""
import dataclasses
import math
import sys

import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/schemas.py is a library module (the declared shape of every file the scripts read); run a "
             "script, e.g. `python train.py --help`")

from plumbing.errors import ConfigError


class Mismatch(Exception):
    """Where a value does not match its schema: the field (a path of keys and indices) and what was expected."""

    def __init__(self, field, expected, value=None):
        super().__init__(field, expected)
        self.field, self.expected, self.value = field, expected, value


@dataclasses.dataclass(frozen=True)
class Num:
    min: float = None
    max: float = None
    integer: bool = False

    def check(self, value, field):
        if not ((type(value) is int or not self.integer and type(value) is float and math.isfinite(value))
                and (self.min is None or value >= self.min) and (self.max is None or value <= self.max)):
            raise Mismatch(field, expected(self), value)


@dataclasses.dataclass(frozen=True)
class OneOf:
    values: tuple

    def __init__(self, *values):
        object.__setattr__(self, "values", values)

    def check(self, value, field):
        if not any(value == v and type(value) is type(v) for v in self.values):
            raise Mismatch(field, expected(self), value)


@dataclasses.dataclass(frozen=True)
class Opt:
    schema: object


@dataclasses.dataclass(frozen=True)
class Null:
    schema: object

    def check(self, value, field):
        if value is not None:
            check(value, self.schema, field)


@dataclasses.dataclass(frozen=True)
class Map:
    schema: object

    def check(self, value, field):
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise Mismatch(field, "an object", value)
        for key, item in value.items():
            check(item, self.schema, f"{field}.{key}" if field else key)


@dataclasses.dataclass(frozen=True)
class Some:
    schema: object

    def check(self, value, field):
        if not isinstance(value, (list, tuple)) or not value:
            raise Mismatch(field, expected(self), value)
        check(value, [self.schema], field)


@dataclasses.dataclass(frozen=True)
class Where:
    schema: object
    key: str
    test: object
    says: str

    def check(self, value, field):
        check(value, self.schema, field)
        if not self.test(value):
            raise Mismatch(f"{field}.{self.key}" if field else self.key, self.says, value.get(self.key))


class Rule:
    """A schema that is a test of the value: Any, Scalar, Bytes."""

    def __init__(self, test, says):
        self.test, self.says = test, says

    def check(self, value, field):
        if not self.test(value):
            raise Mismatch(field, self.says, value)


Any = Rule(lambda value: True, "a value")
Scalar = Rule(lambda value: value is None or type(value) in (str, bool, int) or type(value) is float and
              math.isfinite(value), "a string, a finite number, true, false or null")
Bytes = Rule(lambda value: isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1,
             "a tensor of bytes")
Tensor = torch.Tensor


def torch_takes(state):
    """Whether torch.set_rng_state takes state as its generator's state (tried, and the generator's own put back)."""
    if not Bytes.test(state):
        return False
    own = torch.get_rng_state()
    try:
        torch.set_rng_state(state)
        return True
    except (RuntimeError, ValueError):
        return False
    finally:
        torch.set_rng_state(own)


RngState = Rule(torch_takes, "the state of torch's random number generator")


def describe(value):
    """A value in a few words, for the line that says what a field holds instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (dict, list, tuple, torch.Tensor)) or value is None:
        return {dict: "an object", list: "a list", tuple: "a list"}.get(type(value), "null" if value is None else
                                                                          "a tensor")
    text = repr(value)
    return f"{type(value).__name__} {text[:30]}{'...' if len(text) > 30 else ''}"


def expected(schema):
    """What schema asks for, in a few words."""
    if isinstance(schema, Num):
        what = "an integer" if schema.integer else "a finite number"
        if schema.min is not None and schema.max is not None:
            return f"{what} from {schema.min} to {schema.max}"
        return what + (f" of at least {schema.min}" if schema.min is not None else "")
    if isinstance(schema, OneOf):
        return "one of " + ", ".join(map(repr, schema.values))
    if isinstance(schema, Null):
        return expected(schema.schema) + " or null"
    if isinstance(schema, Some):
        return f"a list of one or more of {expected(schema.schema)}"
    if isinstance(schema, list):
        return f"a list of {expected(schema[0])}"
    if isinstance(schema, (dict, Map)):
        return "an object"
    if isinstance(schema, Rule):
        return schema.says
    return {int: "an integer", str: "a string", bool: "true or false", Tensor: "a tensor", dict: "an object"}.get(
        schema, "a value")


def check(value, schema, field=""):
    """Raise Mismatch at the first field of value that does not match schema: a dict's keys and a list's items in
    turn, a type by isinstance (an int is not a bool), any other schema by its own check()."""
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise Mismatch(field, expected(schema), value)
        for key in value.keys() - schema.keys() if ... in schema else ():
            check(value[key], schema[...], f"{field}.{key}" if field else str(key))
        for key, sub in schema.items():
            optional = isinstance(sub, Opt)
            if key is ... or optional and key not in value:
                continue
            if key not in value:
                raise Mismatch(f"{field}.{key}" if field else key, "present")
            check(value[key], sub.schema if optional else sub, f"{field}.{key}" if field else key)
    elif isinstance(schema, list):
        if not isinstance(value, (list, tuple)):
            raise Mismatch(field, expected(schema), value)
        for i, item in enumerate(value):
            check(item, schema[0], f"{field}[{i}]")
    elif isinstance(schema, type):
        if not (isinstance(value, schema) and (schema is not int or type(value) is int)):
            raise Mismatch(field, expected(schema), value)
    else:
        schema.check(value, field)


def checked(value, schema, path, fix):
    """value, after check(): ConfigError in one line naming path (the file), the field, what it holds, what was
    expected, and fix."""
    try:
        check(value, schema)
    except Mismatch as e:
        where = f"its field {e.field}" if e.field else "it"
        held = "is missing" if e.expected == "present" else f"is {describe(e.value)}, not {e.expected}"
        raise ConfigError(f"{path}: {where} {held}; {fix}")
    return value


# ----------------------------------------------------------------------------------------------------------
# the schemas

COUNT, STEP = Num(min=1, integer=True), Num(min=0, integer=True)

# meta.json of a prepared data set (prepare.py)
META = Where({"tokenizer": str, "vocab_size": COUNT, "dtype": OneOf("uint16", "uint32"), "eot_token": Opt(STEP),
              "train_tokens": Opt(STEP), "val_tokens": Opt(STEP), "dataset": Opt(str)},
             "eot_token", lambda m: m.get("eot_token", 0) < m["vocab_size"], "a token id below vocab_size")

# train.py's ckpt.pt: the fields the scripts read; a checkpoint of an older version lacks some (a reader names the
# ones it needs), one of a newer version may hold more (tolerated). model_args and the weights are checked against the
# model file apart (plumbing/checkpoints.py's checked_model_weights), since they depend on it.
CHECKPOINT = {
    "model_name": str,
    "model_args": {name: Any for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd",
                                          "ffn_hidden")},  # every version wrote these: their defaults are not the run's
    "model": Map(Tensor),
    "train_config": Opt({"data_dir": Opt(str), "dataset": Opt(str), "init_from": Opt(str), "max_iters": Opt(STEP),
                         "lr_decay_iters": Opt(STEP), "decay_lr": Opt(bool), "warmup_iters": Opt(STEP),
                         "batch_size": Opt(COUNT), "gradient_accumulation_steps": Opt(Null(COUNT)),
                         "learning_rate": Opt(Num(min=0)), "min_lr": Opt(Num(min=0)),
                         "warmup_start": Opt(Num(min=0, max=1)), "seed": Opt(STEP), ...: Scalar}),
    "run": Opt({"world": COUNT, "gradient_accumulation_steps": COUNT, "tokens_per_step": Opt(COUNT),
                "device": Opt(str), "dtype": Opt(str)}),
    "optimizer": Opt({"state": dict, "param_groups": [{  # AdamW's groups (the state against the model: checks.py)
        "params": [int], "lr": Num(min=0), "betas": [Num(min=0, max=1)], "eps": Num(min=0), "weight_decay": Num(min=0),
        "base_lr": Opt(Num(min=0)), "amsgrad": Opt(bool), "maximize": Opt(bool), "capturable": Opt(bool),
        "differentiable": Opt(bool), "decoupled_weight_decay": Opt(bool), "foreach": Opt(Null(bool)),
        "fused": Opt(Null(bool)), ...: Scalar}]}),
    "iter_num": Opt(STEP),
    "tokens_seen": Opt(STEP),
    "best_val_loss": Opt(Num()),
    "meta": Opt(META),
    "rng": Opt({"torch": Some(RngState), "cuda": Opt(Some(Bytes))}),
}

# a record of a run's log.jsonl (train.py's Log): a step, and the numbers of that step
LOG_RECORD = {"iter": STEP, "tokens": Opt(STEP), "loss": Opt(Num()), "val_loss": Opt(Num()), "lr": Opt(Num(min=0)),
              "tok_per_s": Opt(Num(min=0)), "mfu": Opt(Null(Num(min=0)))}

# tools/kernels.py --json
KERNELS = {"shape": {"n_layer": COUNT, "n_embd": COUNT, "vocab_size": COUNT, "batch_size": COUNT, "block_size": COUNT,
                     "device": str, "torch": str, "compiled": Opt(bool), "dtype": Opt(str), "command": Opt(Null(str))},
           # a step makes one kernel at least (and vanilla's counts divide every ratio)
           "models": Map({"train": COUNT, "decode": COUNT, "train_ops": Opt(Map(STEP)), "decode_ops": Opt(Map(STEP))})}

RATIO = Opt(Num(min=0))
# tools/bench.py --json: training (results of train_speed_ratio ...) or --decode (results of decode_ratio ...)
BENCH = {"hardware": str, "dtype": str, "torch": str, "repeats": Opt(COUNT), "shape": dict,
         "results": [{"label": str, "mode": Opt(OneOf("eager", "compiled", "baseline")), "batch": Opt(COUNT),
                      "train_speed_ratio": RATIO, "train_speed_ratio_min": RATIO, "train_speed_ratio_max": RATIO,
                      "mfu": Opt(Null(Num(min=0))), "peak_mem_ratio": RATIO, "decode_ratio": RATIO, "decode_ratio_min": RATIO,
                      "decode_ratio_max": RATIO, "decode_tok_s": Opt(Num(min=0)), "prefill_tok_s": Opt(Num(min=0)),
                      "time_to_first_token_s": Opt(Num(min=0)), "compile_s": Opt(Null(Num(min=0))),
                      "skip_ratio": RATIO, "skip_ratio_min": RATIO, "skip_ratio_max": RATIO,
                      "baseline_ratio": RATIO, "baseline_ratio_min": RATIO, "baseline_ratio_max": RATIO}]}
BENCH_DECODE = {**BENCH, "prompt_tokens": COUNT, "decode_tokens": COUNT, "command": [str],
                "baseline": Opt(Null(str)),
                "results": [{**BENCH["results"][0], "mode": OneOf("eager", "compiled", "baseline"), "batch": COUNT,
                             "decode_tok_s": Num(min=0), "prefill_tok_s": Num(min=0),
                             "time_to_first_token_s": Num(min=0)}]}

# tools/sweep.py's results.json: a header (the command, the machine, the shape) and a record per trained run
SWEEP = {"runs": [{"label": str, "seed": STEP, "key": str, "options": [str], "val_loss": Num(), "val_tokens": COUNT,
                   "steps": STEP, "tokens_seen": STEP, "train_seconds": Num(min=0), "params": COUNT,
                   "stats": Map(Null(Num())), "curve": [[Num()]], "cpu_seconds": Opt(Num(min=0)),
                   "reused": Opt(bool)}],
         "command": Opt([str]), "hardware": Opt(str), "torch": Opt(str), "summary": Opt(list)}
