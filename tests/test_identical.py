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


LEAD = {"option", "GPTConfig", "GPT"}  # every file leads with its config and its model, model_vanilla.py too
BANNER = "# ---- model_vanilla.py's components below, unchanged in every model file (tests/test_identical.py) ----"


def layout_problems(name, source):
    """What keeps a reader of model_<name>.py (or of source) from meeting the method first: a docstring over 20
    lines (the rest belongs in docs/), a method that starts after line 150 or after the banner, a changed component
    under the banner or an unchanged one outside it (the banner's section ends at the next "# ---- " banner)."""
    tree, lines = ast.parse(source), source.splitlines()
    problems = []
    if len(ast.get_docstring(tree, clean=False).strip("\n").splitlines()) > 20:
        problems.append("docstring over 20 lines")
    if lines.count(BANNER) != 1:
        return problems + ["not one banner"]
    start = lines.index(BANNER) + 1
    end = next((i + 1 for i in range(start, len(lines)) if lines[i].startswith("# ---- ")), len(lines) + 1)
    parts, modified, _ = components(name, source)
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    for node in defs:
        changed = node.name not in VANILLA or any(m == node.name or m.startswith(node.name + ".") for m in modified)
        if (start < node.lineno < end) != (not changed and node.name not in LEAD):
            problems.append(f"{node.name} (line {node.lineno}) is on the wrong side of the banner")
    config = next(i for i, n in enumerate(defs) if n.name == "GPTConfig")
    if name != "vanilla" and not defs[config + 1].lineno <= min(150, start):
        problems.append(f"the method starts at line {defs[config + 1].lineno}")
    return problems


@pytest.mark.parametrize("name", model_names())
def test_a_reader_meets_the_method_first_and_sees_where_vanilla_starts(name):
    assert layout_problems(name, open(os.path.join(ROOT, f"model_{name}.py")).read()) == []


def test_the_layout_check_can_fail():
    """An unchanged component moved above the banner, a long docstring and a late method are each seen."""
    source = open(os.path.join(ROOT, "model_vertical.py")).read()
    tree = ast.parse(source)
    rms = next(n for n in tree.body if getattr(n, "name", None) == "RMSNorm")
    lines = source.splitlines()
    text = "\n".join(lines[rms.lineno - 1:rms.end_lineno])
    moved = source.replace(text + "\n", "").replace("\n\ndef inv_norm", "\n\n" + text + "\n\n\ndef inv_norm")
    line = next(n for n in ast.parse(moved).body if getattr(n, "name", None) == "RMSNorm").lineno
    assert layout_problems("vertical", moved) == [f"RMSNorm (line {line}) is on the wrong side of the banner"]
    long_doc = source.replace('"""\nimport math', "a note\n" * 20 + '"""\nimport math', 1)
    assert layout_problems("vertical", long_doc)[0] == "docstring over 20 lines"
    late = source.replace("\n\ndef inv_norm", "\n" * 100 + "def inv_norm")
    assert any(p.startswith("the method starts at line") for p in layout_problems("vertical", late))
