"""Components a method does not change keep model_vanilla.py's text exactly, so that
`diff model_vanilla.py model_X.py` shows the method and nothing else. A component is a top-level function, a
class without its methods (its docstring, fields and class attributes), or a method: "GPT" and "GPT.forward"
are two components, so a method that changes GPT's forward still has vanilla's param_groups pinned."""
import ast
import os

import pytest

from conftest import ROOT, model_names


def components(name, source=None):
    """Components of model_<name>.py (or of source) -> their source text; its MODIFIED tuple; its imports."""
    source = source or open(os.path.join(ROOT, f"model_{name}.py")).read()
    tree = ast.parse(source)
    parts = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            parts[node.name] = ast.get_source_segment(source, node)
        elif isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, ast.FunctionDef)]
            lines = ast.get_source_segment(source, node).splitlines()
            for m in methods:  # the class without its methods, which are components of their own
                first = (m.decorator_list[0] if m.decorator_list else m).lineno - node.lineno
                lines[first:m.end_lineno - node.lineno + 1] = [None] * (m.end_lineno - node.lineno + 1 - first)
                parts[f"{node.name}.{m.name}"] = ast.get_source_segment(source, m)
            parts[node.name] = "\n".join(line for line in lines if line is not None).rstrip()
    modified = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", None) == "MODIFIED" for t in n.targets))
    imports = {ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    return parts, set(modified), imports


VANILLA, _, VANILLA_IMPORTS = components("vanilla")


@pytest.mark.parametrize("name", [n for n in model_names() if n != "vanilla"])
def test_unchanged_components_are_identical(name):
    parts, modified, _ = components(name)
    assert modified <= set(VANILLA), f"MODIFIED names components vanilla does not have: {modified - set(VANILLA)}"
    for component, text in VANILLA.items():
        assert component in parts, f"model_{name}.py lacks vanilla's {component}"
        if component in modified:
            assert parts[component] != text, f"{component} is listed in MODIFIED but equals vanilla's"
        else:
            assert parts[component] == text, f"{component} differs from model_vanilla.py; list it in MODIFIED"


def differing(parts):
    """The components of parts whose text differs from vanilla's."""
    return {c for c, text in VANILLA.items() if parts.get(c) != text}


def test_a_changed_method_is_seen_inside_an_unchanged_class():
    """The check above can fail on one method alone: vanilla with GPT.param_groups changed differs exactly there,
    and GPT's other methods and its class text stay pinned."""
    source = open(os.path.join(ROOT, "model_vanilla.py")).read()
    changed = source.replace("never on norms or biases.", "never on norms.")
    assert changed != source
    assert differing(components("vanilla", changed)[0]) == {"GPT.param_groups"}
    assert differing(components("vertical")[0]) == components("vertical")[1]  # what MODIFIED says, no more


@pytest.mark.parametrize("name", model_names())
def test_model_files_import_only_torch_and_the_standard_library(name):
    _, _, imports = components(name)
    for line in imports:
        module = line.split()[1].split(".")[0]
        assert module in {"torch", "math", "dataclasses", "typing", "functools", "itertools"}, line
