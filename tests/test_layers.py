"""The layout a learner relies on, read from the code itself: imports go one way (no circle, none back up), plumbing
only checks and reads (no function of it changes what it is handed), one function builds a model from its options,
and every `module.name` that a docstring, a comment or a page names exists."""
import ast
import importlib
import io
import os
import re
import tokenize

import pytest

from conftest import ROOT, tracked

# the floors, from the ground up: a file imports files of lower floors only, or of its own folder
FLOORS = [
    ("model files", ["model_*.py"]),  # stand alone: they import nothing of the repository
    ("plumbing", ["plumbing/*.py"]),
    ("ground", ["common.py", "generate.py"]),
    ("beside the scripts", ["hf/*.py", "analysis/*.py"]),
    ("scripts", ["prepare.py", "train.py", "sample.py", "eval.py"]),
    ("tools", ["tools/*.py"]),
]
# hf_model.py is copied into an exported folder, beside the run's model file, which it imports from there
APART = {"hf/hf_model.py"}


def floors():
    """{file relative to the repository: its floor}, for every .py file of the repository outside tests/."""
    out = {}
    for floor, (_, patterns) in enumerate(FLOORS):
        for pattern in patterns:
            for path in tracked(pattern):
                out[os.path.relpath(path, ROOT)] = floor
    return out


def module_file(name):
    """The repository file of an imported module name (plumbing.files -> plumbing/files.py), or None."""
    for candidate in (name.replace(".", "/") + ".py", name.replace(".", "/") + "/__init__.py"):
        if os.path.isfile(os.path.join(ROOT, candidate)):
            return candidate
    return None


def imports(path):
    """The repository files that the file at path imports, anywhere in it (a function's imports too)."""
    found = set()
    for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]  # `from hf import convert`
        else:
            continue
        found |= {f for f in map(module_file, names) if f and f != path}
    return found


def test_every_file_has_a_floor():
    known = set(floors()) | APART
    for path in tracked("**/*.py"):  # the repository's: a learner's own scripts beside them are theirs
        path = os.path.relpath(path, ROOT)
        if not path.startswith(("tests/", "config/", ".")):
            assert path in known, f"{path} is on no floor of tests/test_layers.py's FLOORS: say where it belongs"


def import_problems(graph, floor):
    """The imports of graph ({file: the files it imports}) that run back up or sideways, and its circles: a file
    imports from a lower floor, or from its own folder, and the files of a folder import each other without a
    circle (so that the whole graph has none)."""
    problems = [f"{path} ({FLOORS[floor[path]][0]}) imports {target} ({FLOORS[floor[target]][0]})"
                for path, targets in sorted(graph.items()) for target in sorted(targets)
                if not (floor[target] < floor[path] or os.path.dirname(path) == os.path.dirname(target) != "")]
    done, trail = set(), []

    def visit(node):
        if node in trail:
            problems.append("a circle: " + " -> ".join(trail[trail.index(node):] + [node]))
        elif node not in done:
            trail.append(node)
            for target in sorted(graph.get(node, ())):
                visit(target)
            trail.pop()
            done.add(node)
    for node in sorted(graph):
        visit(node)
    return problems


def test_imports_go_one_way_and_never_in_a_circle():
    floor = floors()
    graph = {path: imports(path) for path in floor if path not in APART}
    assert import_problems(graph, floor) == []


def test_the_check_sees_an_import_back_up_and_a_circle():
    floor = floors()
    assert imports("train.py") >= {"common.py", "plumbing/files.py", "hf/convert.py"}  # `from hf import convert`
    graph = {"common.py": {"train.py", "plumbing/files.py"}, "plumbing/files.py": {"plumbing/config.py"},
             "plumbing/config.py": {"plumbing/files.py"}}
    problems = import_problems(graph, floor)
    assert problems[0].startswith("common.py (ground) imports train.py (scripts)") and len(problems) == 2, problems
    assert problems[1] == "a circle: plumbing/files.py -> plumbing/config.py -> plumbing/files.py"


# ---- plumbing only checks and reads ------------------------------------------------------------------------------

# methods that change the object they are called on: containers', argparse's, and torch's (a trailing _ is in place)
MUTATING = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "add",
            "discard", "sort", "reverse", "add_argument", "add_argument_group", "set_defaults", "load_state_dict",
            "register_buffer", "register_parameter", "train", "eval", "to", "zero_grad", "step", "backward"}


def root_name(node):
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def changes_to_parameters(function):
    """(line, what) of every place where function assigns to an attribute or an item of one of its parameters, deletes
    one, or calls a method on it that changes it. A method's own object (self) is its own state; a parameter that the
    function binds anew (`state = dict(state)`) is its own copy from there on."""
    params = {a.arg for a in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs,
                              function.args.vararg, function.args.kwarg] if a} - {"self", "cls"}
    rebound = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    params -= rebound
    found = []
    for node in ast.walk(function):
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for t in targets:
            if isinstance(t, (ast.Attribute, ast.Subscript)) and root_name(t) in params:
                found.append((node.lineno, f"assigns to {ast.unparse(t)}"))
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and root_name(f.value) in params and (
                    f.attr in MUTATING or f.attr.endswith("_") and not f.attr.startswith("_")):
                found.append((node.lineno, f"calls {ast.unparse(f)}()"))
            if isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and node.args and \
                    root_name(node.args[0]) in params:
                found.append((node.lineno, f"calls {f.id}({ast.unparse(node.args[0])}, ...)"))
    return found


def test_no_function_of_plumbing_changes_what_it_is_handed():
    """plumbing/ checks and reads: its functions raise a one-line error or return what they read, and the run's
    decisions are lines of the scripts. None of them changes a parameter (assigns to its attributes or items, or
    calls a method that changes it)."""
    changes = []
    for path in tracked("plumbing/*.py"):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                changes += [f"{os.path.relpath(path, ROOT)}:{line} {node.name} {what}"
                            for line, what in changes_to_parameters(node)]
    assert not changes, "\n".join(changes)


def test_the_check_sees_a_change_to_a_parameter():
    source = '''
def decides(cfg, proc, ckpt, parser, model, values):
    cfg.lr_decay_iters = 5
    proc.accum += 1
    ckpt["tokens_seen"] = 0
    parser.add_argument("--x")
    model.weight.zero_()
    values.setdefault("a", 1)

def reads(path, state, self=None):
    state = dict(state)
    state["x"] = 1
    self.seen = path
    return state
'''
    decides, reads = ast.parse(source).body
    assert len(changes_to_parameters(decides)) == 6 and changes_to_parameters(reads) == []


# ---- one way to build a model from its options --------------------------------------------------------------------

def test_one_function_builds_a_model_from_its_options():
    """plumbing/config.py's build_model (options checked first) is the one place outside the model files and the
    tools (which also build other repositories' model files) that calls GPT(GPTConfig(...))."""
    builders = []
    for path in sorted(floors()):
        if path.startswith(("model_", "tools/")) or path in APART:
            continue
        for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) and \
                    getattr(node.func, "attr", getattr(node.func, "id", None)) == "GPT":
                builders.append(f"{path}:{node.lineno}")
    assert builders == [next(b for b in builders if b.startswith("plumbing/config.py:"))], builders


# ---- no stale names ----------------------------------------------------------------------------------------------

MODULE = r"(?:plumbing|hf|tools|analysis)\.\w+|common|generate|train|sample|eval|prepare|model_\w+"
NAMED = re.compile(rf"(?<![\w./-])({MODULE})\.([A-Za-z_]\w*)")
TEXTS = ["README.md", "docs/*.md", "*.py", "plumbing/*.py", "hf/*.py", "tools/*.py", "analysis/*.py", "config/*.py"]


def named(text):
    """The (module, name) pairs `module.name` in text, for the repository's modules (a file name, module.py, is not
    one)."""
    return {(m, n) for m, n in NAMED.findall(text) if n not in ("py", "md", "json", "jsonl", "png", "pt", "bin")
            and module_file(m)}


def prose(path):
    """What a reader reads as text: a page whole; of a .py file, its docstrings and comments (its code is run, and
    names a variable train as well as the script)."""
    source = open(path).read()
    if not path.endswith(".py"):
        return source
    tree = ast.parse(source)
    docs = [ast.get_docstring(n) or "" for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    return "\n".join(docs + comments)


def test_every_module_name_a_text_names_exists():
    """Every `module.name` that a page, a docstring or a comment of the repository names (common.get_tokenizer,
    plumbing.config.check_config) is there, so that a rename cannot leave a pointer to nothing behind."""
    stale = []
    for pattern in TEXTS:
        for path in tracked(pattern):
            for module, name in sorted(named(prose(path))):
                if not hasattr(importlib.import_module(module), name):
                    stale.append(f"{os.path.relpath(path, ROOT)}: {module}.{name}")
    assert not stale, "names that do not exist:\n" + "\n".join(stale)


def test_the_check_sees_a_stale_name():
    found = named("see common.check_config, plumbing.config.check_config and train.py (a file), not model.config")
    assert found == {("common", "check_config"), ("plumbing.config", "check_config")}
    assert not hasattr(importlib.import_module("common"), "check_config")


@pytest.mark.parametrize("script", ["train.py", "sample.py", "prepare.py", "eval.py"])
def test_a_script_imports_no_other_script(script):
    """The scripts share what lies below them, not each other."""
    others = {"prepare.py", "train.py", "sample.py", "eval.py"} - {script}
    assert not imports(script) & others, imports(script) & others
