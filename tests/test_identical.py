"""Components a method does not change keep model_vanilla.py's text exactly, so that
`diff model_vanilla.py model_X.py` shows the method and nothing else."""
import ast
import os

import pytest

from conftest import ROOT, model_names


def components(name):
    """Top-level classes and functions of model_<name>.py -> their source text; and its MODIFIED tuple."""
    source = open(os.path.join(ROOT, f"model_{name}.py")).read()
    tree = ast.parse(source)
    parts = {n.name: ast.get_source_segment(source, n) for n in tree.body
             if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
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


@pytest.mark.parametrize("name", model_names())
def test_model_files_import_only_torch_and_the_standard_library(name):
    _, _, imports = components(name)
    for line in imports:
        module = line.split()[1].split(".")[0]
        assert module in {"torch", "math", "dataclasses", "typing", "functools", "itertools"}, line
