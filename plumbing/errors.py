"""
Plumbing a learner may skip: the one error boundary of every script. main_boundary() runs a script's main() and turns
every failure from outside the code into one `error: ...` line naming the file or the step and the fix: a mistake in
the input (ConfigError), a run that stopped (RunError), any OSError, what a library raises on a bad file (handling()),
memory that cannot be allocated, Ctrl-C. A closed pipe ends quietly, as cat does; anything else is a bug: a traceback.
"""
import contextlib
import errno
import os
import pickle
import re
import shlex
import signal
import sys

import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/errors.py is a library module (every script's error boundary); run `python train.py --help`")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


class ConfigError(Exception):
    """A mistake in the user's input (or a failure the user can fix), reported as one line."""


class RunError(Exception):
    """A run that failed while it ran, reported as one line that says what is kept."""


class Interrupted(RunError):  # Ctrl-C or SIGTERM stopped a run between two steps
    pass


class PeerLost(RunError):  # another process of a distributed run stopped: each process left says so
    pass


class OutOfMemory(RunError):  # an allocation failed while a run ran: main_boundary() adds what to lower
    pass


def script_command():
    """How the running script is started: `python sample.py`, or `python -m hf.export` for one in a folder."""
    arg = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else "train.py"
    script = os.path.abspath(arg)
    here = os.path.relpath(script, ROOT) if script.startswith(ROOT + os.sep) else arg
    return f"python -m {here[:-3].replace(os.sep, '.')}" if os.sep in here else f"python {here}"


def arg(name, value):
    """`--name value` for a printed command that runs when pasted: quoted, `--name=value` for a value that starts
    with a dash (argparse would take it for an option)."""
    return f"--{name}{'=' if value.startswith('-') else ' '}{shlex.quote(value)}"


def printable(path):  # a path as a line shows it: bytes that are not UTF-8 escaped
    return os.fsdecode(path).encode("utf-8", "backslashreplace").decode("utf-8")


def note(message):  # one `note:` line on stderr (under torchrun: rank 0's)
    if os.environ.get("RANK", "0") == "0":
        print(f"note: {message}", file=sys.stderr)


def fail(message, every_rank=False):
    if every_rank or os.environ.get("RANK", "0") == "0":  # under torchrun every process fails alike: one line
        print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


# what an OSError's errno calls for; the option whose path holds the file is named too
FULL, LIMIT, FILES = "free some space", "raise the file-size limit (ulimit -f on Linux, macOS) or free some space", \
    "raise the open-file limit (ulimit -n on Linux, macOS) or use fewer processes"
FIXES = {errno.ENOSPC: FULL, errno.EDQUOT: FULL, errno.EFBIG: LIMIT, errno.EMFILE: FILES, errno.ENFILE: FILES,
         errno.EACCES: "check its permissions", errno.EPERM: "check its permissions",
         errno.EROFS: "choose a folder you can write", errno.ENAMETOOLONG: "choose a shorter name",
         errno.ELOOP: "fix the symbolic link that loops", errno.EEXIST: "a file is in the way of a folder: move it",
         errno.ENOTDIR: "a part of the path is a file, not a folder"}
OPTION_PATHS = {}  # a path the user gave -> its option (--out_dir), registered by plumbing/options.py


def os_error_line(e, path=None, fix=None):
    """The one line of an OSError: the file, what the system said, what its errno calls for, and fix (else: choose
    another value of the option whose path holds the file, or lies in it: a folder made for it)."""
    path = path or e.filename
    full = os.path.abspath(os.fsdecode(path)) if path else ""
    options = [(len(p), o) for p, o in OPTION_PATHS.items() if full and os.path.commonpath(
        [full, os.path.abspath(p)]) in (full, os.path.abspath(p))]
    fix = fix or (f"choose another {max(options)[1]}" if options else "")
    return (f"cannot use{' ' + printable(path) if path else ''}: {e.strerror or type(e).__name__}; "
            f"{FIXES.get(e.errno, 'check the path')}{', or ' + fix if fix else ''}, then run the same command again")


@contextlib.contextmanager
def naming(path):
    """An OSError in the block that names no file (a write to an open file, its close, one that torch's zip writer
    wraps in a RuntimeError) names path: the file the user knows, where the block writes a temporary one."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        error = e if isinstance(e, OSError) else e.__context__
        if not isinstance(error, OSError):
            raise
        error.filename = error.filename or os.fsdecode(path)
        raise error


@contextlib.contextmanager
def handling(path, fix, os_fix=None):
    """A block that hands the file at path to a library (torch.load, load_state_dict, safetensors, json): what it
    raises on a bad file ends in one ConfigError naming path and fix (file_line). Keep the block to the library's
    calls: an error of the repository's own code in it would read as the file's."""
    try:
        yield
    except Exception as e:
        line = file_line(e, path, fix, os_fix)
        if line is None:
            raise
        raise ConfigError(line) from e


def file_line(e, path, fix, os_fix):
    """The line of what a library raised on the file at path: an OSError's with os_fix, another's with fix; None
    for an error that is already a line, or memory that cannot be allocated."""
    if isinstance(e, (ConfigError, RunError, MemoryError)) or allocation_failure(e) is not None:
        return None
    if isinstance(e, OSError):
        return os_error_line(e, path, os_fix)
    unsafe = re.search(r"GLOBAL (\S+)", str(e)) if isinstance(e, pickle.UnpicklingError) else None
    if unsafe:  # torch.load(weights_only=True) refused a global
        return (f"{printable(path)} holds {unsafe[1]}: unpickling it could run code, so it was not loaded; use a file "
                "that train.py wrote, from a source you trust")
    reason = " ".join(str(e).split())[:150] or type(e).__name__
    return f"cannot use {printable(path)} ({type(e).__name__}: {reason}); {fix}"


def allocation_failure(error):
    """For a failed allocation of memory (CUDA's OutOfMemoryError, the CPU allocator's RuntimeError, MemoryError):
    the size asked for as " of 12.2 GiB" where the message says it, else ""; None for any other error."""
    text = str(error)
    if not (isinstance(error, (torch.OutOfMemoryError, MemoryError)) or isinstance(error, RuntimeError) and (
            "can't allocate memory" in text or "out of memory" in text)):
        return None
    asked = re.search(r"[Tt]ried to allocate (?:(\d+) bytes|([\d.]+ [KMGT]i?B))", text)
    n, size = asked.groups() if asked else (None, None)
    if n:
        return f" of {int(n) / 2**30:.1f} GiB" if int(n) >= 2**30 else f" of {int(n) / 2**20:.0f} MiB"
    return f" of {size}" if size else ""


def main_boundary(main, memory_fix="use a smaller batch or model, or a device with more memory"):
    """Run main(argv) as a script: the one place where an exception becomes a line (the module's docstring)."""
    for stream in (sys.stdout, sys.stderr):  # a name that is not UTF-8 prints escaped, never crashes a finished run
        getattr(stream, "reconfigure", lambda **_: None)(errors="backslashreplace")
    try:
        main(sys.argv[1:])
        sys.stdout.flush()  # a closed pipe shows here, inside the boundary
    except (Exception, KeyboardInterrupt) as e:
        line = error_line(e, memory_fix)
        if line is None:
            raise  # a bug: its traceback
        fail(line, every_rank=isinstance(e, PeerLost))


def interrupted(e):
    """Whether e is a Ctrl-C, or an error raised while one unwound: a library's cleanup that fails half-way (torch.save
    closing a file cut short) hides the KeyboardInterrupt in its __context__."""
    while e is not None:
        if isinstance(e, KeyboardInterrupt):
            return True
        e = e.__context__
    return False


def error_line(e, memory_fix):
    """The one line a script ends in for e, None for a bug; a closed pipe (the reader went away) ends quietly, as
    cat does."""
    if isinstance(e, BrokenPipeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE if hasattr(signal, "SIGPIPE") else 1)  # (Windows has no SIGPIPE)
    if interrupted(e) and not isinstance(e, (ConfigError, RunError)):  # (a run's own line says where it stopped)
        return "interrupted; nothing was lost that had been saved"
    size = allocation_failure(e)
    if not isinstance(e, (ConfigError, RunError, OSError)) and size is None:
        return None
    if torch.distributed.is_initialized() and not isinstance(e, PeerLost):
        torch.distributed.destroy_process_group()
    if isinstance(e, OSError):
        return os_error_line(e)
    if size is not None and not isinstance(e, (ConfigError, RunError)):
        return f"out of memory: an allocation{size} failed; {memory_fix}"
    return f"{e}; {memory_fix}" if isinstance(e, OutOfMemory) else str(e)


# ---- a training run that stops: the one line it ends in, and what it keeps

def catch_stop_signals(say=note):
    """(stop requests, the previous handlers): Ctrl-C and SIGTERM append to the list, read between two steps (a
    KeyboardInterrupt where the signal lands can be swallowed by a library's cleanup), and say(text) says so at once
    (train.py: on a line of its own, above the progress bar); a second interrupts at once."""
    stop = []

    def handler(signum, frame):
        if stop:
            raise KeyboardInterrupt
        stop.append(signum)
        say("stopping after this step, which is saved; press Ctrl-C again to stop now (the last checkpoint is kept)")
    return stop, {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}


def kept(saved_step, out_dir):  # what a run that stops keeps, as it is on disk
    return (f"the checkpoint of step {saved_step} is kept in {printable(out_dir)}" if saved_step is not None
            else "no checkpoint was written")


def diverged(what, value, step, cfg, model_args, explicit, saved_step, dtype):
    """The RunError of a non-finite loss: the options this run set to check (and float32, where it computed in
    another dtype), and what is kept."""
    values = {**vars(cfg), **model_args}
    changed = [f"--{k} {values[k]}" for k in sorted(explicit) if k in values and k not in
               ("model", "out_dir", "data_dir", "dataset", "max_iters", "resume", "device", "eval_interval",
                "log_interval")]
    return RunError(f"the {what} is {value} at step {step}: training diverged; check the options of this run "
                    f"({', '.join(changed) or 'the defaults'}: a learning rate, weight decay or model setting out of "
                    f"range){'' if dtype == 'float32' else ' or use --dtype float32'}; {kept(saved_step, cfg.out_dir)}")


def stopped(error, iter_num, saved_step, cfg, proc):
    """The one-line error of a run stopped by Ctrl-C or SIGTERM, by a file it could not write, by memory that cannot
    be allocated, or by another process of the run that is gone (gloo: connection closed; NCCL: aborted); any
    other error as it is."""
    again = "continue with --resume" if saved_step is not None else "run the same command again"
    what = kept(saved_step, cfg.out_dir)
    if interrupted(error):
        return Interrupted(f"interrupted at step {iter_num}; {what}; {again}")
    if isinstance(error, OSError):
        return RunError(f"{os_error_line(error).rsplit(', then', 1)[0]}; stopped at step {iter_num}; {what}")
    size = allocation_failure(error)
    if size is not None:
        return OutOfMemory(f"out of memory at step {iter_num}: an allocation{size} failed; {what}")
    lost = isinstance(error, torch.distributed.DistError) or any(s in str(error) for s in (
        "Connection closed by peer", "Connection reset by peer", "remote worker", "NCCL communicator was aborted",
        "Broken pipe"))
    if proc.world == 1 or not lost:
        return error
    return PeerLost(f"another process of this run stopped at step {iter_num}; {what}; {again} once every process "
                    "can run")
