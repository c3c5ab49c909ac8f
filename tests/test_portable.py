"""What runs on Linux, macOS and Windows alike, read from the code and from what the platform reports: no module
outside tests/ uses a POSIX-only name outside a platform test, nor opens a text file without naming its encoding
(ast; each check is shown to fail on made-up code), and each decision that depends on the platform (the device of
--device auto, DDP's backend, compiling by default, the memory check) is made from what the platform reports, here
monkeypatched."""
import ast
import importlib.machinery
import os
import re
import sys
import types

import pytest
import torch

from conftest import ROOT, TINY, tracked

# ---- the static check ----------------------------------------------------------------------------------------

POSIX_MODULES = {"fcntl", "resource", "termios", "pty", "tty"}
POSIX_NAMES = {"os": {"sysconf", "fork", "killpg", "kill"}, "signal": {"SIGPIPE", "SIGKILL", "SIGHUP"}}
# os.kill exists on Windows, but there a signal 0 or 1 is a console's Ctrl+C or Ctrl+Break to a process group (not
# a test of a process id) and any other kills the process: a POSIX-only meaning
GUARD_CALLS = {"hasattr", "getattr"}
GUARD_NAMES = {("sys", "platform"), ("os", "name")}
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError"}


def is_platform_test(node):
    """Whether an expression asks the platform: hasattr/getattr, sys.platform, os.name, platform.system()."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in GUARD_CALLS:
            return True
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and (n.value.id, n.attr) in GUARD_NAMES:
            return True
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                and (n.func.value.id, n.func.attr) == ("platform", "system")):
            return True
    return False


def catches_import_error(handler):
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in IMPORT_ERRORS for n in names)


def guarded(node, parents):
    """Whether node sits under a platform test: an if, a conditional expression or an and/or whose test asks the
    platform, or the body of a try that catches ImportError (or AttributeError)."""
    child = node
    for parent in reversed(parents):
        if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and child is not parent.test \
                and is_platform_test(parent.test):
            return True
        if isinstance(parent, ast.BoolOp) and any(is_platform_test(v) for v in
                                                   parent.values[:parent.values.index(child)]):
            return True
        if isinstance(parent, ast.Try) and child in parent.body and any(map(catches_import_error, parent.handlers)):
            return True
        child = parent
    return False


def posix_uses(source, filename="<snippet>"):
    """[(line, what)] of every POSIX-only name source uses outside a platform test: an import of a POSIX-only
    module, os.sysconf / os.fork / os.killpg / os.kill, signal.SIGPIPE / SIGKILL / SIGHUP (also under another name,
    or imported by name), and ctypes.CDLL(None) (the process's own symbols, which Windows has no handle for)."""
    tree = ast.parse(source, filename)
    aliases = {}  # a local name -> the module it names (import os as _os)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names if "." not in a.name or a.asname})
    found = []

    def visit(node, parents):
        what = None
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] in POSIX_MODULES]
            what = f"import {', '.join(names)}" if names else None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            names = [a.name for a in node.names if a.name in POSIX_NAMES.get(top, ())]
            if top in POSIX_MODULES or names:
                what = f"from {node.module} import {', '.join(names or [a.name for a in node.names])}"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if node.attr in POSIX_NAMES.get(module, ()):
                what = f"{module}.{node.attr}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "CDLL"
              and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value is None):
            what = "ctypes.CDLL(None)"
        if what and not guarded(node, parents):
            found.append((node.lineno, what))
        for child in ast.iter_child_nodes(node):
            visit(child, parents + [node])

    visit(tree, [])
    return found


def repository_modules():
    """Every .py file outside tests/: the files at the top, the packages' (plumbing, tools, hf, analysis) and the
    presets in config/."""
    paths = tracked("*.py") + tracked("config/*.py")  # the repository's: a learner's own files are theirs
    for init in tracked("*/__init__.py"):
        if os.path.basename(os.path.dirname(init)) != "tests":
            paths += tracked(os.path.join(os.path.relpath(os.path.dirname(init), ROOT), "*.py"))
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def test_no_module_uses_a_posix_only_name_outside_a_platform_test():
    assert {"train.py", "prepare.py", os.path.join("plumbing", "files.py"), os.path.join("tools", "sweep.py")} \
        <= set(repository_modules())
    found = {path: uses for path in repository_modules()
             if (uses := posix_uses(open(os.path.join(ROOT, path), encoding="utf-8").read(), path))}
    assert not found, "POSIX-only names outside a platform test (line, name): " + repr(found)


@pytest.mark.parametrize("snippet, expected", [
    ("import fcntl", [(1, "import fcntl")]),
    ("import os, resource as r", [(1, "import resource")]),
    ("from termios import TIOCSWINSZ", [(1, "from termios import TIOCSWINSZ")]),
    ("import os\nos.sysconf('SC_PAGE_SIZE')", [(2, "os.sysconf")]),
    ("import os as o\no.fork()", [(2, "os.fork")]),
    ("import os\nos.kill(pid, 0)", [(2, "os.kill")]),
    ("import signal\nsys.exit(128 + signal.SIGPIPE)", [(2, "signal.SIGPIPE")]),
    ("from signal import SIGKILL, SIGINT", [(1, "from signal import SIGKILL")]),
    ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)", [(2, "ctypes.CDLL(None)")]),
    ("import os\nif x:\n    os.killpg(p, 2)", [(3, "os.killpg")]),  # an if that does not ask the platform
    ("try:\n    import fcntl\nexcept Exception:\n    fcntl = None", [(2, "import fcntl")]),  # not ImportError
    # guarded: each passes
    ("try:\n    import fcntl\nexcept ImportError:\n    fcntl = None", []),
    ("import os\nhave = os.sysconf('SC_PAGE_SIZE') if hasattr(os, 'sysconf') else None", []),
    ("import os, sys\nif sys.platform != 'win32':\n    os.killpg(p, 2)", []),
    ("import os\nif os.name == 'nt':\n    pass\nelse:\n    os.fork()", []),
    ("import signal\nhasattr(signal, 'SIGPIPE') and signal.signal(signal.SIGPIPE, h)", []),
    ("import ctypes, platform\nif platform.system() == 'Linux':\n    ctypes.CDLL(None)", []),
    ("import signal\nsignal.signal(signal.SIGINT, h)\nsignal.SIGTERM", []),  # on Windows too
])
def test_the_static_check_flags_a_bare_use_and_passes_a_guarded_one(snippet, expected):
    assert posix_uses(snippet) == expected


def unencoded_text_files(source, filename="<snippet>"):
    """[(line, call)] of every text file source opens without naming its encoding (Windows' default is the ANSI code
    page, cp1252, not UTF-8): open() and os.fdopen() in a text mode, a path's open(), read_text() and write_text(),
    and tempfile's NamedTemporaryFile / TemporaryFile / SpooledTemporaryFile in a text mode (os.open's files have no
    encoding). The repository's own read_text(path, what, fix) is told apart from a path's by its arguments."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call) or any(k.arg == "encoding" for k in node.keywords):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        keywords = {k.arg: k.value for k in node.keywords}
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
        if (name == "open" and owner in (None, "io", "codecs")) or (name == "fdopen" and owner == "os"):
            mode, at = (node.args[1] if len(node.args) > 1 else keywords.get("mode")), 3  # (file, mode, buffering,
        elif name == "open" and owner != "os":  # a path's open(mode, buffering, encoding): a mode given as a string,
            mode, at = (node.args[0] if node.args else keywords.get("mode", ast.Constant("r"))), 2  # or none
            if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)):
                continue  # another library's open(name, ...): gzip, tarfile, an image
        elif name in ("NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"):
            mode, at = (node.args[0] if node.args else keywords.get("mode", ast.Constant("w+b"))), 3
        elif name == "read_text" and isinstance(f, ast.Attribute) and not node.args:
            mode, at = ast.Constant("r"), 0
        elif name == "write_text" and isinstance(f, ast.Attribute) and len(node.args) == 1:
            mode, at = ast.Constant("w"), 1
        else:
            continue
        text = mode is None or not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)) \
            or "b" not in mode.value  # a mode computed at run time counts as text
        if text and len(node.args) <= at:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_every_text_file_names_its_encoding():
    found = {path: calls for path in repository_modules()
             if (calls := unencoded_text_files(open(os.path.join(ROOT, path), encoding="utf-8").read(), path))}
    assert not found, "text files opened without an encoding (line, call): " + repr(found)


@pytest.mark.parametrize("snippet, flagged", [
    ("open(p)", True), ("open(p, 'w')", True), ("open(p, mode='a')", True), ("os.fdopen(fd, 'w')", True),
    ("pathlib.Path(p).read_text()", True), ("path.write_text(s)", True), ("path.open('w')", True),
    ("tempfile.NamedTemporaryFile('w')", True), ("open(p, mode)", True),
    ("open(p, encoding='utf-8')", False), ("open(p, 'rb')", False), ("open(p, 'w', -1, 'utf-8')", False),
    ("path.read_text(encoding='utf-8')", False), ("path.write_text(s, 'utf-8')", False), ("path.open('rb')", False),
    ("tempfile.NamedTemporaryFile()", False), ("read_text(path, 'the log', fix)", False),
    ("os.open(p, os.O_RDONLY)", False), ("gzip.open(p)", False), ("path.open()", True), ("io.open(p, 'w')", True),
])
def test_the_encoding_check_flags_a_text_file_without_one(snippet, flagged):
    assert bool(unencoded_text_files(snippet)) == flagged


# ---- the decisions made from what the platform reports ---------------------------------------------------------

@pytest.mark.parametrize("cuda, mps, version, expected", [
    (True, True, "2.9.0", "cuda"), (False, True, "2.9.0", "mps"), (False, False, "2.9.0", "cpu"),
    (False, True, "2.6.0", "cpu"),  # MPS before torch 2.7: attention without gradients aborts there
])
def test_device_auto_picks_cuda_then_mps_then_cpu_and_says_which(cuda, mps, version, expected, monkeypatch, capsys):
    import common
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion(version))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(cuda))
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    capsys.readouterr()
    assert common.resolve_device("auto").type == expected
    said = capsys.readouterr()
    assert any("auto" in line and re.search(rf"\b{expected}\b", line)  # a line naming the choice and its pick
               for line in (said.out + said.err).splitlines()), said


class Stop(Exception):
    """Raised by the monkeypatched init_process_group: the backend is chosen, nothing more of the run is needed."""


@pytest.mark.parametrize("cuda, nccl, expected", [(True, True, "nccl"), (True, False, "gloo"), (False, True, "gloo"),
                                                  (False, False, "gloo")])
def test_ddp_backend_is_nccl_only_where_torch_has_it(cuda, nccl, expected, tiny_data, tmp_path, monkeypatch):
    """A torchrun rank (WORLD_SIZE 2): nccl where the device is CUDA and torch.distributed.is_nccl_available() (not
    in Windows' builds of torch), else gloo."""
    import train
    chosen = []

    def init_process_group(backend=None, *args, **kwargs):
        chosen.append(backend)
        raise Stop

    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: nccl)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2 * cuda)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    args = [a for a in TINY if not a.startswith("--device")]
    with pytest.raises(Stop):
        train.main(["--data_dir", str(tiny_data), "--out_dir", str(tmp_path / "run"), "--max_iters=1", *args,
                    f"--device={'cuda' if cuda else 'cpu'}", "--dtype=float32", "--compile=false"])
    assert chosen == [expected]


@pytest.mark.parametrize("device, triton, expected", [("cuda", True, True), ("cuda", False, False),
                                                       ("cpu", True, False), ("mps", True, False)])
def test_compile_by_default_only_on_cuda_with_triton(device, triton, expected, monkeypatch):
    """--compile not given: compiled where it can work, CUDA with Triton importable (Windows' CUDA has no Triton);
    eager on the CPU and MPS. Given, it is what it says."""
    import train
    if triton:  # an importable triton, whatever this machine has
        module = types.ModuleType("triton")
        module.__spec__ = importlib.machinery.ModuleSpec("triton", None)
        module.__version__ = "3.0.0"
        monkeypatch.setitem(sys.modules, "triton", module)
    else:  # `import triton` raises ImportError, find_spec finds nothing
        monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: device == "cuda")
    monkeypatch.setattr(torch, "compile", lambda model, *args, **kwargs: ("compiled", model))
    model = torch.nn.Linear(2, 2)
    proc = types.SimpleNamespace(device=torch.device(device), world=1, rank=0)
    for given, wanted in ((None, expected), (True, True), (False, False)):
        trained, _ = train.wrap(model, types.SimpleNamespace(compile=given), proc)
        assert (trained == ("compiled", model)) == wanted, (given, device, triton)


@pytest.mark.parametrize("reports", [True, False])
def test_the_memory_check_only_where_the_system_reports_memory(reports, monkeypatch):
    """A model larger than the memory the system reports is refused before it is built; where the system reports
    none (Windows has no os.sysconf), the check is left out and the model's options pass."""
    import model_vanilla
    from plumbing.config import check_model_args
    from plumbing.errors import ConfigError
    if reports:
        pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 2**18}  # 1 GiB
        monkeypatch.setattr(os, "sysconf", pages.__getitem__, raising=False)
    else:
        monkeypatch.delattr(os, "sysconf", raising=False)
    args = {"n_layer": 64, "n_embd": 1024, "n_head": 8, "n_kv_head": 8, "ffn_hidden": 4096, "vocab_size": 257}
    if reports:  # 64 blocks of width 1024 need about 3 GiB
        with pytest.raises(ConfigError, match="memory"):
            check_model_args(model_vanilla, args, "the options")
    else:
        assert check_model_args(model_vanilla, args, "the options").n_layer == 64
