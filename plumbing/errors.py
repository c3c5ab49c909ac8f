"""
Plumbing a learner may skip: the one-line errors of every script. A mistake the user can fix (bad input, a file that
cannot be written, a run that diverged or was stopped) ends in one `error: ...` line and exit code 1, naming the
fix; anything else keeps its traceback, as a bug to fix. main_boundary() is each script's one error boundary.
"""
import dataclasses
import errno
import os
import re
import signal
import sys

import torch

if __name__ == "__main__":  # a library module, not a script: say so, and which script to run
    sys.exit("plumbing/errors.py is a library module (the one-line errors of every script); run a script, "
             "e.g. `python train.py --help`")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


def script_command():
    """How the script that runs is started: `python sample.py`, or `python -m hf.export` for one in a folder."""
    arg = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else "train.py"
    script = os.path.abspath(arg)
    here = os.path.relpath(script, ROOT) if script.startswith(ROOT + os.sep) else arg  # as given: hf/export.py
    return f"python -m {here[:-3].replace(os.sep, '.')}" if os.sep in here else f"python {here}"


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
    """Run main(argv) as a script: the expected failure classes end in one `error:` line, the rest in a traceback.
    It is also the one allocation boundary: memory that cannot be allocated, anywhere in a script, ends in one line
    with memory_fix, the script's options to lower."""
    try:
        main(sys.argv[1:])
    except (ConfigError, RunError) as e:
        if torch.distributed.is_initialized() and not isinstance(e, PeerLost):
            torch.distributed.destroy_process_group()
        fail(f"{e}; {memory_fix}" if isinstance(e, OutOfMemory) else str(e), every_rank=isinstance(e, PeerLost))
    except (MemoryError, RuntimeError) as e:
        size = allocation_failure(e)
        if size is None:
            raise
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        fail(f"out of memory: an allocation{size} failed; {memory_fix}")
    except OSError as e:
        fix = ("free some space or choose another folder" if e.errno in (errno.ENOSPC, errno.EDQUOT) else
               "check the path" if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR) else "choose another folder")
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
                           errno.EISDIR, errno.ENOTDIR):
            raise
        fail(f"cannot write or read {e.filename or 'a file'}: {e.strerror}; {fix}, then run the same command again")
    except KeyboardInterrupt:
        fail("interrupted; nothing was lost that had been saved")


# ---- a training run that stops: the one line it ends in, and what it keeps


def diverged(what, value, step, cfg, model_args, explicit, saved_step, dtype):
    """The RunError of a non-finite loss, in one line: what to check (the options this run set; float32, where the
    run computed in another dtype), and what is kept."""
    values = {**dataclasses.asdict(cfg), **model_args}
    changed = [f"--{k} {values[k]}" for k in sorted(explicit) if k in values and k not in
               ("out_dir", "data_dir", "dataset", "max_iters", "resume", "device", "eval_interval", "log_interval")]
    kept = (f"the checkpoint of step {saved_step} in {cfg.out_dir} is kept" if saved_step is not None
            else "no checkpoint was written")
    return RunError(f"the {what} is {value} at step {step}: training diverged; check the options of this run "
                    f"({', '.join(changed) or 'the defaults'}: a learning rate, weight decay or model setting out of "
                    f"range){'' if dtype == 'float32' else ' or use --dtype float32'}; {kept}")


def catch_stop_signals():
    """(stop requests, the previous handlers): Ctrl-C and SIGTERM append to the list, which the training loop
    reads between two steps, and the run stops there (a KeyboardInterrupt raised wherever the signal lands can be
    swallowed by a library's cleanup code, and training would go on); a second signal interrupts at once."""
    stop = []

    def handler(signum, frame):
        if stop:
            raise KeyboardInterrupt
        stop.append(signum)
    return stop, {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}


def lost_peer(error):
    """Whether a collective failed because another process of the run is gone."""
    return isinstance(error, torch.distributed.DistError) or any(
        s in str(error) for s in ("Connection closed by peer", "Connection reset by peer", "remote worker",
                                  "NCCL communicator was aborted", "Broken pipe"))


def stopped(error, iter_num, saved_step, cfg, proc):
    """The one-line error of a run stopped by Ctrl-C or SIGTERM, by memory that cannot be allocated (main_boundary()
    adds what to lower), or by another process of the run that is gone (gloo: connection closed; NCCL: aborted); any
    other error as it is."""
    kept, again = ((f"the checkpoint of step {saved_step} is kept", "continue with --resume") if saved_step is not None
                   else ("no checkpoint was written", "run the same command again"))
    if isinstance(error, KeyboardInterrupt):
        return Interrupted(f"interrupted at step {iter_num}; {kept} in {cfg.out_dir}; {again}")
    size = allocation_failure(error)
    if size is not None:
        return OutOfMemory(f"out of memory at step {iter_num}: an allocation{size} failed; {kept} in {cfg.out_dir}")
    if proc.world == 1 or not lost_peer(error):
        return error
    return PeerLost(f"another process of this run stopped at step {iter_num}; {kept} in {cfg.out_dir}; {again} "
                    "once every process can run")


