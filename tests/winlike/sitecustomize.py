"""Python that plays Windows as far as Linux can, for the subprocesses of tests/test_platforms.py: Python imports this
module at its start when this folder is on PYTHONPATH (with PYTHONUTF8=0, as on Windows by default).

WINLIKE=windows (the default): the POSIX-only modules and names are absent, the spawn start method is the only one
and cp1252 is the default text encoding (open() without encoding, pathlib, the locale, piped stdio).
WINLIKE=macos: the spawn start method is the default, nothing else changes.
WINLIKE_ROOT: the folder whose files play the repository's (default: the repository; the harness's own test).

The modules and names are absent only for the repository's own files (tests included): what they import is checked
by the importing file's path. torch, numpy, filelock and the standard library keep them, because on Windows they
take their own win32 branches, which this Linux cannot play; taking the names from them too would test their Linux
branches without the facilities those branches need (torchrun's agent reads signal.SIGKILL and calls os.killpg,
filelock picks its lock by whether fcntl imports), not the repository. A repository file that imports fcntl,
resource, termios, pty or tty gets ModuleNotFoundError; `import os` and `import signal` give it the module less
the absent names, so a bare os.sysconf raises AttributeError and hasattr(os, "sysconf") is False, as on Windows.
importlib.import_module("fcntl") and __import__("fcntl") called by hand are not played (the repository uses
neither for these). What is played is the facilities' absence, which code finds by asking for them (hasattr, a try
of the import); sys.platform and os.name still say Linux, so a branch on them takes Linux's way (ctypes.CDLL(None),
which Windows refuses, is left to tests/test_portable.py's static check for that reason).
"""
import _io
import builtins
import io
import locale
import multiprocessing
import multiprocessing.context
import os
import sys
import sysconfig
import types

PLAY = os.environ.get("WINLIKE", "windows")
ABSENT_MODULES = {"fcntl", "resource", "termios", "pty", "tty"}  # (pty and tty import termios)
ABSENT_NAMES = {"os": {"sysconf", "fork", "killpg"}, "signal": {"SIGPIPE", "SIGKILL", "SIGHUP"}}
ENCODING = "cp1252"  # Windows' ANSI code page in Western Europe and the Americas: no 'Δ', no '\ufffd'

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.environ.get("WINLIKE_ROOT") or os.path.dirname(os.path.dirname(HERE)))
# a virtual environment inside the repository holds libraries, not the repository's files
LIBRARIES = {os.path.join(sysconfig.get_paths()[k], "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}


class Without(types.ModuleType):
    """A module as Windows has it: every attribute of the real one but the absent names."""

    def __init__(self, module, absent):
        super().__init__(module.__name__, module.__doc__)
        object.__setattr__(self, "_winlike", (module, frozenset(absent)))

    def __getattribute__(self, name):
        module, absent = object.__getattribute__(self, "_winlike")
        if name in absent:
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        return getattr(module, name)

    def __setattr__(self, name, value):
        setattr(object.__getattribute__(self, "_winlike")[0], name, value)

    def __dir__(self):
        module, absent = object.__getattribute__(self, "_winlike")
        return sorted(set(dir(module)) - absent)


_ours = {}


def repository_file(globals_):
    """Whether the importing module is one of the repository's files (not this folder, not a library in it)."""
    path = (globals_ or {}).get("__file__")
    if not isinstance(path, str):
        return False
    if path not in _ours:
        full = os.path.abspath(path)
        _ours[path] = (full.startswith(os.path.join(ROOT, "")) and not full.startswith(os.path.join(HERE, ""))
                       and not any(full.startswith(lib) for lib in LIBRARIES))
    return _ours[path]


def play_windows():
    views = {name: Without(__import__(name), absent) for name, absent in ABSENT_NAMES.items()}
    real_import = builtins.__import__

    def windows_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level or not repository_file(globals):
            return real_import(name, globals, locals, fromlist, level)
        top = name.partition(".")[0]
        if top in ABSENT_MODULES:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        module = real_import(name, globals, locals, fromlist, level)
        # `import os`, `import os.path` and `from os import x` hand over the top module: the view
        return views[top] if top in views and (not fromlist or name == top) else module

    builtins.__import__ = windows_import

    # only spawn, as on Windows: get_context("fork") raises ValueError there
    for method in ("fork", "forkserver"):
        multiprocessing.context._concrete_contexts.pop(method, None)
    multiprocessing.set_start_method("spawn", force=True)

    # cp1252 where Python chooses the encoding of a text file: open() (builtins, io, _io), io.text_encoding
    # (pathlib, tempfile), the locale's functions; the C-level default of a TextIOWrapper made directly is left
    # (the repository makes none)
    real_open = _io.open

    def windows_open(file, mode="r", buffering=-1, encoding=None, *args, **kwargs):
        if "b" not in mode and encoding in (None, "locale"):
            encoding = ENCODING
        return real_open(file, mode, buffering, encoding, *args, **kwargs)

    def text_encoding(encoding, stacklevel=2):
        return ENCODING if encoding in (None, "locale") else encoding

    builtins.open = io.open = _io.open = windows_open
    io.text_encoding = _io.text_encoding = text_encoding
    locale.getpreferredencoding = lambda do_setlocale=True: ENCODING
    locale.getencoding = lambda: ENCODING
    # stdio on a pipe or a file uses the ANSI code page on Windows (stdout strict, stderr backslashreplace); a
    # console uses UTF-8
    for stream, errors in ((sys.stdout, "strict"), (sys.stderr, "backslashreplace")):
        if stream is not None and not stream.isatty():
            stream.reconfigure(encoding=ENCODING, errors=errors)


if PLAY == "windows":
    play_windows()
elif PLAY == "macos":
    multiprocessing.set_start_method("spawn", force=True)
