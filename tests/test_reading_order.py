"""GPT's methods in every model file keep model_vanilla.py's order, and the hooks that only draw or log come last,
so that `diff model_vanilla.py model_X.py` shows the method (its config, its definitions, __init__, forward) in
its first hunks and the drawing and logging helpers after them."""
import ast
import os

import pytest

from conftest import ROOT, model_names

HOOKS = {"depth_map", "depth_map_layout", "stats", "wiring_points"}  # eval.py's figures and train.py's logs


def gpt_methods(source):
    """The names of class GPT's methods in source, in order, and for each the names of the methods it calls on self."""
    gpt = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "GPT")
    methods = [m for m in gpt.body if isinstance(m, ast.FunctionDef)]
    names = [m.name for m in methods]
    uses = {m.name: {a.attr for a in ast.walk(m) if isinstance(a, ast.Attribute) and a.attr in names
                     and isinstance(a.value, ast.Name) and a.value.id == "self"} for m in methods}
    return names, uses


VANILLA = gpt_methods(open(os.path.join(ROOT, "model_vanilla.py")).read())[0]


def order_problems(source):
    """What breaks the order in a model file's source: vanilla's methods out of vanilla's order, a hook or a helper
    that only hooks use before forward, or after the first hook a method that is neither a hook nor used by one."""
    names, uses = gpt_methods(source)
    at = {name: i for i, name in enumerate(names)}
    problems = []
    shared = [n for n in names if n in VANILLA]
    if shared != [n for n in VANILLA if n in at]:
        problems.append(f"vanilla's methods in the order {shared}, not {VANILLA}")
    hooks = [n for n in names if n in HOOKS]
    helpers = set()  # the methods that only hooks (or such helpers) use
    while True:
        users = {n: {u for u in names if n in uses[u] and u != n} for n in names}
        more = {n for n in names if n not in HOOKS | helpers and users[n] and users[n] <= HOOKS | helpers}
        if not more:
            break
        helpers |= more
    problems += [f"{n} comes before forward" for n in names[:at["forward"]] if n in HOOKS | helpers]
    served = set(hooks)  # the hooks and what they use, directly or through each other
    while True:
        more = set().union(*(uses[n] for n in served)) - served
        if not more:
            break
        served |= more
    after = [n for n in names[at[hooks[0]]:] if n not in served] if hooks else []
    if after:
        problems.append(f"after the hook {hooks[0]}: {', '.join(after)}, which no hook uses")
    return problems


@pytest.mark.parametrize("name", model_names())
def test_forward_comes_before_what_only_draws_or_logs(name):
    assert order_problems(open(os.path.join(ROOT, f"model_{name}.py")).read()) == []


def method_text(source, name):
    """The text of GPT's method name in source, its decorators included, with the blank line before it."""
    gpt = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "GPT")
    method = next(m for m in gpt.body if isinstance(m, ast.FunctionDef) and m.name == name)
    lines = source.splitlines(keepends=True)
    first = (method.decorator_list[0] if method.decorator_list else method).lineno - 1
    return "".join(lines[first - 1:method.end_lineno])


def test_the_order_check_can_fail():
    """model_dwa.py's hooks moved back between __init__ and _init_weights, where they once were, and aila's
    mix_weights moved before forward, are each seen."""
    source = open(os.path.join(ROOT, "model_dwa.py")).read()
    hooks = "".join(method_text(source, h) for h in ("depth_map", "depth_map_layout", "stats"))
    init = method_text(source, "_init_weights")
    planted = source.replace(hooks, "").replace(init, hooks + init)
    assert planted != source and sorted(planted.splitlines()) == sorted(source.splitlines())
    assert order_problems(planted) == [
        "depth_map comes before forward", "depth_map_layout comes before forward", "stats comes before forward",
        "after the hook depth_map: _init_weights, forward, param_groups, flops_per_token, which no hook uses"]
    source = open(os.path.join(ROOT, "model_aila.py")).read()
    mix_weights, forward = method_text(source, "mix_weights"), method_text(source, "forward")
    planted = source.replace(mix_weights, "").replace(forward, mix_weights + forward)
    assert order_problems(planted) == ["mix_weights comes before forward"]
