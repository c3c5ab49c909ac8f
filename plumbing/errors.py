"""
Plumbing a learner may skip: the one error boundary of every script. main_boundary() runs a script's main() and
turns every failure from outside the code into one `error: ...` line naming the file or the step and the fix, exit
code 1: a mistake in the input (ConfigError), a run that stopped (RunError), any OSError whatever its errno, what a
library raises on a bad file (inside a `handling(path, fix)` block), memory that cannot be allocated, and Ctrl-C. A
closed pipe (`python sample.py | head`) ends quietly, as `cat` does. Anything else keeps its traceback: a bug to fix.
"""
import contextlib
import errno
import os
import re
import signal
import sys

import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/errors.py is a library module (the one error boundary of every script); run a script, "
             "e.g. `python train.py --help`")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


def script_command():
    """How the script that runs is started: `python sample.py`, or `python -m hf.export` for one in a folder."""
    arg = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else "train.py"
    script = os.path.abspath(arg)
    here = os.path.relpath(script, ROOT) if script.startswith(ROOT + os.sep) else arg  # as given: hf/export.py
    return f"python -m {here[:-3].replace(os.sep, '.')}" if os.sep in here else f"python {here}"


def arg(name, value):
    """`--name value` as a printed command shows it, so that it runs when pasted whatever value holds: quoted, and
    `--name=value` where value starts with a dash (argparse would take it for an option)."""
    import shlex
    return f"--{name}{'=' if value.startswith('-') else ' '}{shlex.quote(value)}"


class ConfigError(Exception):
    """A mistake in the user's input (or a failure the user can fix), reported as one line."""


class RunError(Exception):
    """A run that failed while it ran (out of memory, a diverged loss, an interruption), reported as one line that
    says what is kept."""


class Interrupted(RunError):
    """Ctrl-C or SIGTERM stopped a run between two steps."""


class PeerLost(RunError):
    """Another process of a distributed run stopped; each process that is left says so (rank 0 may be the lost
    one)."""


class OutOfMemory(RunError):
    """An allocation that failed while a run ran, with what the run keeps; main_boundary() adds what to lower."""


def note(message):
    """One `note:` line on stderr (under torchrun: rank 0's, not one per process)."""
    if os.environ.get("RANK", "0") == "0":
        print(f"note: {message}", file=sys.stderr)


def fail(message, every_rank=False):
    if every_rank or os.environ.get("RANK", "0") == "0":  # under torchrun every process fails alike: one line
        print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


# ---- what the machine does to a script: any OSError, as one line with the fix its errno calls for

FIXES = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space (the disk quota is full)",
         errno.EFBIG: "the file grew past the size this system allows (ulimit -f): raise the limit or free the space",
         errno.EACCES: "check its permissions", errno.EPERM: "check its permissions",
         errno.EROFS: "the file system is read-only: choose a folder you can write",
         errno.ENAMETOOLONG: "choose a shorter name", errno.ELOOP: "a symbolic link there loops: fix the link",
         errno.EMFILE: "too many open files: raise the limit (ulimit -n) or use fewer processes",
         errno.ENFILE: "too many open files: raise the limit (ulimit -n) or use fewer processes",
         errno.ENOENT: "check the path", errno.ENOTDIR: "check the path", errno.EISDIR: "check the path"}

OPTION_PATHS = {}  # a path the user gave -> its option ("--out_dir"), registered by the parsers (plumbing/options.py)


def option_of(path):
    """The option whose path holds path (the longest that does), or None."""
    if not path:
        return None
    full = os.path.abspath(os.fsdecode(path))
    found = [(len(p), name) for p, name in OPTION_PATHS.items()
             if full == os.path.abspath(p) or full.startswith(os.path.join(os.path.abspath(p), ""))]
    return max(found)[1] if found else None


def printable(path):
    """A path as a line can show it: bytes that are not UTF-8 escaped (\\udcff stays printable, never a crash)."""
    return os.fsdecode(path).encode("utf-8", "backslashreplace").decode("utf-8")


def os_error_line(e, path=None, fix=None):
    """The one line of an OSError: the file, what the system said, what its errno calls for, and fix (else the
    option that names the file: choose another)."""
    path = path or e.filename
    option = option_of(path)
    fix = fix or (f"choose another {option}" if option else "")
    where = f" {printable(path)}" if path else ""
    return (f"cannot use{where}: {e.strerror or type(e).__name__}; {FIXES.get(e.errno, 'check the path')}"
            f"{', or ' + fix if fix else ''}, then run the same command again")


@contextlib.contextmanager
def handling(path, fix, os_fix=None):
    """A block that hands the file at path to a library (torch.load, load_state_dict, safetensors, json, numpy):
    whatever it raises on a bad file ends in one ConfigError naming path and fix, an OSError in one naming what the
    system said and os_fix (os_error_line). Keep the block to the library's calls: an error of the repository's own
    code in it would read as the file's."""
    try:
        yield
    except (ConfigError, RunError, KeyboardInterrupt, MemoryError):
        raise
    except OSError as e:
        raise ConfigError(os_error_line(e, path, os_fix)) from e
    except Exception as e:
        if allocation_failure(e) is not None:
            raise
        reason = " ".join(str(e).split())[:150] or type(e).__name__
        raise ConfigError(f"cannot use {printable(path)} ({type(e).__name__}: {reason}); {fix}") from e


def allocation_failure(error):
    """For an error that is a failed allocation of memory (CUDA's OutOfMemoryError, the CPU allocator's or MPS's
    RuntimeError, Python's MemoryError): the size asked for, as " of 12.2 GiB" where the message says it, else "";
    None for any other error."""
    text = str(error)
    if not (isinstance(error, (torch.OutOfMemoryError, MemoryError)) or isinstance(error, RuntimeError) and (
            "can't allocate memory" in text or "out of memory" in text)):
        return None
    asked = re.search(r"(?:tried to allocate|Tried to allocate) (\d+) bytes", text)
    if asked:
        n = int(asked.group(1))
        return f" of {n / 2**30:.1f} GiB" if n >= 2**30 else f" of {n / 2**20:.0f} MiB"
    asked = re.search(r"Tried to allocate ([\d.]+ [KMGT]i?B)", text)
    return f" of {asked.group(1)}" if asked else ""


# what to lower, said by main_boundary() for a failed allocation in a script that names nothing of its own
MEMORY_FIX = "use a smaller batch or model, or a device with more memory"


def main_boundary(main, memory_fix=MEMORY_FIX):
    """Run main(argv) as a script, the one place where an exception becomes a line (the module's docstring)."""
    for stream in (sys.stdout, sys.stderr):  # a name that is not UTF-8 prints escaped, never crashes a finished run
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        main(sys.argv[1:])
        sys.stdout.flush()  # a closed pipe shows here, inside the boundary
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    except KeyboardInterrupt:
        fail("interrupted; nothing was lost that had been saved")
    except (ConfigError, RunError) as e:
        stop_processes(isinstance(e, PeerLost))
        fail(f"{e}; {memory_fix}" if isinstance(e, OutOfMemory) else str(e), every_rank=isinstance(e, PeerLost))
    except OSError as e:
        stop_processes()
        fail(os_error_line(e))
    except (MemoryError, RuntimeError) as e:
        size = allocation_failure(e)
        if size is None:
            raise
        stop_processes()
        fail(f"out of memory: an allocation{size} failed; {memory_fix}")


def stop_processes(lost=False):
    if torch.distributed.is_initialized() and not lost:
        torch.distributed.destroy_process_group()


# ---- a training run that stops: the one line it ends in, and what it keeps


def catch_stop_signals():
    """(stop requests, the previous handlers): Ctrl-C and SIGTERM append to the list, which the training loop
    reads between two steps, and the run stops there (a KeyboardInterrupt raised wherever the signal lands can be
    swallowed by a library's cleanup code, and training would go on), saying so at once; a second signal
    interrupts at once."""
    stop = []

    def handler(signum, frame):
        if stop:
            raise KeyboardInterrupt
        stop.append(signum)
        note("stopping after this step (the last checkpoint is kept); press Ctrl-C again to stop now")
    return stop, {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}


def diverged(what, value, step, cfg, model_args, explicit, saved_step, dtype):
    """The RunError of a non-finite loss, in one line: what to check (the options this run set; float32, where the
    run computed in another dtype), and what is kept."""
    values = {**vars(cfg), **model_args}
    changed = [f"--{k} {values[k]}" for k in sorted(explicit) if k in values and k not in
               ("out_dir", "data_dir", "dataset", "max_iters", "resume", "device", "eval_interval", "log_interval")]
    kept = (f"the checkpoint of step {saved_step} is kept in {printable(cfg.out_dir)}" if saved_step is not None
            else "no checkpoint was written")
    return RunError(f"the {what} is {value} at step {step}: training diverged; check the options of this run "
                    f"({', '.join(changed) or 'the defaults'}: a learning rate, weight decay or model setting out of "
                    f"range){'' if dtype == 'float32' else ' or use --dtype float32'}; {kept}")


def lost_peer(error):
    """Whether a collective failed because another process of the run is gone."""
    return isinstance(error, torch.distributed.DistError) or any(
        s in str(error) for s in ("Connection closed by peer", "Connection reset by peer", "remote worker",
                                  "NCCL communicator was aborted", "Broken pipe"))


def stopped(error, iter_num, saved_step, cfg, proc):
    """The one-line error of a run stopped by Ctrl-C or SIGTERM, by a file it could not write, by memory that cannot
    be allocated (main_boundary() adds what to lower), or by another process of the run that is gone (gloo:
    connection closed; NCCL: aborted); any other error as it is. Each says what is kept, as it is on disk."""
    kept, again = ((f"the checkpoint of step {saved_step} is kept in {printable(cfg.out_dir)}", "continue with --resume")
                   if saved_step is not None else ("no checkpoint was written", "run the same command again"))
    if isinstance(error, KeyboardInterrupt):
        return Interrupted(f"interrupted at step {iter_num}; {kept}; {again}")
    if isinstance(error, OSError):
        return RunError(f"{os_error_line(error).rsplit(', then', 1)[0]}; stopped at step {iter_num}; {kept}")
    size = allocation_failure(error)
    if size is not None:
        return OutOfMemory(f"out of memory at step {iter_num}: an allocation{size} failed; {kept}")
    if proc.world == 1 or not lost_peer(error):
        return error
    return PeerLost(f"another process of this run stopped at step {iter_num}; {kept}; {again} once every process "
                    "can run")
