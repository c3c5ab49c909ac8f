"""docs/contract.md's tables of optional hooks and probed names against the code: every name a script asks of a
model, its class or its module (hasattr / getattr with a string literal, or a hook's keyword to forward) is in a
table, with exactly the files that read it; every hook and internal there is defined by some model file; and every
hook that a model file defines is read by some file. The sources are parsed with ast; nothing is imported."""
import ast
import os
import re

from conftest import ROOT, tracked

READERS = ["train.py", "eval.py", "sample.py", "generate.py", "common.py", "analysis/*.py", "tools/*.py", "hf/*.py",
           "plumbing/*.py", "tests/conftest.py"]
# the object of a probe that is a model, its class or its module: model, raw_model, self.model, module, module.GPT,
# model.config, build_model(...)
MODEL = re.compile(r"^(self\.)?(raw_)?(model|module)\b|^build_model\(")


def sources(patterns):
    for pattern in patterns:
        for path in tracked(pattern):
            yield os.path.relpath(path, ROOT), ast.parse(open(path).read())


def documented():
    """{table: {name: set of reading files}} from docs/contract.md's tables whose columns are (table, read by,
    what it is), the table being hook, internal or elsewhere; a hook's name is its keyword where it has one
    (`forward(..., return_hidden=True)`), else its first word."""
    tables, table = {}, None
    for line in open(os.path.join(ROOT, "docs", "contract.md")):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if cells[1:] == ["read by", "what it is"]:
            table = tables.setdefault(cells[0], {})
        elif not cells:
            table = None
        elif table is not None and cells[0].startswith("`"):
            for span in re.findall(r"`([^`]+)`", cells[0]):
                name = (re.findall(r"(\w+)=", span) or re.findall(r"^\w+", span))[0]
                table[name] = {f.strip() for f in cells[1].split(",")}
    return tables


def probes():
    """{(name, kind): set of files} of every name the readers ask of a model: hasattr/getattr(model-ish, "name"),
    kind "module" where it is asked of a module and "object" of a model, its class or its config; and forward's
    hook keywords (model(..., return_hidden=True))."""
    found = {}
    for path, tree in sources(READERS):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if (isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and MODEL.search(ast.unparse(node.args[0]))):
                kind = "module" if ast.unparse(node.args[0]) == "module" else "object"
                found.setdefault((node.args[1].value, kind), set()).add(path)
            if MODEL.search(ast.unparse(node.func)):
                for k in node.keywords:
                    if k.arg == "return_hidden":
                        found.setdefault((k.arg, "object"), set()).add(path)
    return found


def readers():
    """{name: set of files}: probes() whatever the kind."""
    out = {}
    for (name, _), files in probes().items():
        out.setdefault(name, set()).update(files)
    return out


def defined():
    """{"module": the names model files define at module level, "object": those of a model, its class or config
    (any class body's names, every self.<name> = ..., and the arguments of methods: forward's return_hidden)}."""
    names = {"module": set(), "object": set()}
    for _, tree in sources(["model_*.py"]):
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names["module"].add(node.name)
            for t in node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]:
                if isinstance(t, ast.Name):
                    names["module"].add(t.id)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, ast.FunctionDef):
                    names["object"].update([node.name] + [a.arg for a in node.args.args + node.args.kwonlyargs])
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for t in targets if isinstance(node, (ast.Assign, ast.AnnAssign)) else []:
                    names["object"].update([t.id] if isinstance(t, ast.Name) else
                                           [t.attr] if isinstance(t, ast.Attribute) else [])
    return names


def test_the_tables_are_there():
    tables = documented()
    assert set(tables) == {"hook", "internal", "elsewhere"}
    assert {"after_step", "stats", "depth_map", "inference", "return_hidden", "SIZE_DEFAULTS",
            "VARIANTS"} <= set(tables["hook"])


def test_every_probed_name_is_documented_with_its_readers():
    listed = {name: files for table in documented().values() for name, files in table.items()}
    found = readers()
    for name, files in sorted(found.items()):
        assert name in listed, f"{sorted(files)} probe a model for {name!r}: add it to docs/contract.md's tables"
        assert files == listed[name], f"{name!r} is read by {sorted(files)}; docs/contract.md says {listed[name]}"
    for name, files in listed.items():
        assert name in found, f"docs/contract.md lists {name!r} ({files}); no file probes for it"


def test_a_probed_name_is_defined_by_some_model_file():
    """A model for a method (model.depth_map), a module for a module-level name (module.SIZE_DEFAULTS)."""
    tables, names = documented(), defined()
    for (name, kind), files in sorted(probes().items()):
        assert name in tables["elsewhere"] or name in names[kind], \
            f"{sorted(files)} probe a model {kind} for {name!r}, which no model file's {kind} has"
    for table in ("hook", "internal"):
        for name in tables[table]:
            assert name in names["module"] | names["object"], f"docs/contract.md's {table} {name!r}: no model file " \
                                                               "defines it"


def test_a_hook_a_model_file_defines_is_read():
    names, read = defined(), readers()
    for hook in documented()["hook"]:
        assert hook not in names["module"] | names["object"] or read.get(hook), \
            f"a model file defines the hook {hook!r}; no file reads it"
