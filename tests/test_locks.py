"""The mechanisms that keep a guarantee on every system, Linux's included: filelock's locks (a run folder's, a
prepare.py run's, a sweep's results), whose file goes before the lock is let go; what a stopped prepare.py left,
removed by whoever takes the lock it held; the rename that Windows refuses while a data set is read; and the
decisions made before a run writes (MPS only where its torch evaluates grouped-query attention, --compile on CUDA
only with Triton)."""
import os
import subprocess
import sys
import types

import pytest
import torch

from conftest import ROOT


def test_a_lock_is_held_once_and_its_file_goes_with_it(tmp_path):
    from plumbing.files import held, let_go
    path = str(tmp_path / ".lock")
    first = held(path)
    assert first is not None and held(path) is None  # taken at once or not at all, in one process too
    let_go(first)
    assert not os.path.exists(path)
    again = held(path)
    assert again is not None
    let_go(again)


def test_a_lock_on_a_file_its_holder_removed_is_none(tmp_path, monkeypatch):
    """A process that took the lock on the file as its holder removed it (let_go) holds nothing: a third would take
    a new file, and two would go on."""
    from plumbing import files
    path = str(tmp_path / ".lock")
    exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: p != path and exists(p))  # as if removed before it was locked
    assert files.held(path) is None
    monkeypatch.undo()
    lock = files.held(path)  # and the one it took was let go
    assert lock is not None
    files.let_go(lock)


HOLD = """import filelock, sys, time
lock = filelock.FileLock(sys.argv[1])  # held while the process lives (a lock no name holds is let go at once)
lock.acquire()
print("held", flush=True)
time.sleep(300)
"""


def test_what_a_stopped_prepare_left_goes_once_its_lock_is_free(tmp_path):
    """Beside the data set d: a prepare.py run's temporary folder and an old set it renamed aside stay while its
    lock is held (it runs); once the process holding it is gone, the next run puts the old set back and removes
    the rest, lock file included. Nothing asks the system about a process id."""
    import prepare
    data = tmp_path / "data"
    for leftover in (".d.tmp-7", ".d.old-7"):
        (data / leftover).mkdir(parents=True)
        (data / leftover / "meta.json").write_text("{}", encoding="utf-8")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(data / ".d.lock-7")], stdout=subprocess.PIPE,
                              text=True, encoding="utf-8")
    try:
        assert holder.stdout.readline() == "held\n"
        prepare.remove_leftovers(data / "d")
        assert sorted(os.listdir(data)) == [".d.lock-7", ".d.old-7", ".d.tmp-7"]
    finally:
        holder.kill()
        holder.wait(timeout=60)
    prepare.remove_leftovers(data / "d")
    assert os.listdir(data) == ["d"] and os.listdir(data / "d") == ["meta.json"]


def test_a_data_set_that_windows_will_not_rename_is_kept_and_the_line_names_its_reader(tmp_path, monkeypatch,
                                                                                         capsys):
    """Without an exchange of two folders, the old set is renamed aside first; where the system refuses (Windows:
    a training or eval.py run has its files open), one line says so, and the old set and its folder are as they
    were."""
    import prepare
    from plumbing.errors import ConfigError
    (tmp_path / "a.txt").write_text("The set that is read while it would be replaced. " * 40, encoding="utf-8")
    (tmp_path / "b.txt").write_text("Its replacement, which waits. " * 40, encoding="utf-8")
    args = ["--out_dir", str(tmp_path / "data"), "--name=d", "--num_proc=1", "--files"]
    prepare.main([*args, str(tmp_path / "a.txt")])
    before = {f: (tmp_path / "data" / "d" / f).read_bytes() for f in prepare.FILES}
    rename = os.rename

    def refused(a, b):
        if os.path.basename(a) == "d":
            raise PermissionError(13, "Access is denied", str(a))
        return rename(a, b)
    monkeypatch.setattr(prepare, "exchange", lambda a, b: False)
    monkeypatch.setattr(os, "rename", refused)
    with pytest.raises(ConfigError, match=r"cannot replace .*d: Access is denied; a process that reads it, a "
                                          r"train.py or eval.py run on this data set likely"):
        prepare.main([*args, str(tmp_path / "b.txt")])
    assert os.listdir(tmp_path / "data") == ["d"]
    assert {f: (tmp_path / "data" / "d" / f).read_bytes() for f in prepare.FILES} == before


@pytest.mark.parametrize("version, chosen", [("2.6.0", "cpu"), ("2.7.0", "mps")])
def test_mps_only_where_its_torch_evaluates_grouped_query_attention(version, chosen, monkeypatch, capsys):
    """Before torch 2.7, SDPA with enable_gqa and no gradient aborts the process on MPS (every model file's default
    has fewer key/value heads than query heads): --device auto takes the CPU there and says why, and --device mps
    is one line naming the fix."""
    import common
    from plumbing.errors import ConfigError
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion(version))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert common.resolve_device("auto").type == chosen
    err = capsys.readouterr().err
    assert f"--device auto: {chosen}" in err and ("torch 2.7" in err) == (chosen == "cpu")
    if chosen == "cpu":
        with pytest.raises(ConfigError, match="--device mps needs torch 2.7 or later.*pip install -U torch"):
            common.resolve_device("mps")


def test_compile_asked_on_cuda_without_triton_is_refused_before_the_run(monkeypatch):
    """--compile true on CUDA where there is no Triton (torch's Windows builds) would fail at its first forward:
    it is one line before the run folder is taken."""
    import train
    from plumbing.errors import ConfigError
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = types.SimpleNamespace(gradient_accumulation_steps=1, device="cuda", compile=True, dtype="float32")
    with pytest.raises(ConfigError, match="--compile on CUDA needs Triton.*pass --compile false"):
        train.this_process(cfg)
