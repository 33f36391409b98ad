"""ampkit.checkpoint._sharded_dir: a directory swapped into place whole, and found again after a crash mid-swap."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

import ampkit.checkpoint._sharded_dir as sharded_dir
from ampkit.checkpoint._sharded_dir import ENGINE_FILE, find_checkpoint, is_complete, remove_leftovers, swap_into_place


def _checkpoint(path: Path, marker: str, *, complete: bool = True, mtime_ns: int | None = None) -> Path:
    path.mkdir()
    (path / ".metadata").write_text(marker)
    if complete:
        (path / ENGINE_FILE).write_text(marker)
        if mtime_ns is not None:
            os.utime(path / ENGINE_FILE, ns=(mtime_ns, mtime_ns))
    return path


def test_a_directory_is_complete_with_dcps_metadata_and_ampkits_file(tmp_path: Path) -> None:
    assert is_complete(_checkpoint(tmp_path / "a", "a"))
    assert not is_complete(_checkpoint(tmp_path / "b", "b", complete=False))  # killed before ampkit.pt, written last


@pytest.mark.parametrize("existing", [True, False], ids=["over-a-checkpoint", "first-save"])
def test_the_new_directory_takes_the_place_and_nothing_else_is_left(tmp_path: Path, existing: bool) -> None:
    target = tmp_path / "ckpt"
    if existing:
        _checkpoint(target, "old")
    swap_into_place(_checkpoint(tmp_path / "ckpt.ab12.tmp", "new"), target, "ab12")
    assert (target / ".metadata").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_with_no_checkpoint_the_newest_complete_leftover_is_loaded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = tmp_path / "ckpt"
    assert find_checkpoint(target) is None
    _checkpoint(tmp_path / "ckpt.aa.old", "older save", mtime_ns=1_000_000_000)
    newer = _checkpoint(tmp_path / "ckpt.bb.tmp", "newer save", mtime_ns=2_000_000_000)  # killed between the renames
    _checkpoint(tmp_path / "ckpt.cc.tmp", "killed mid-write", complete=False)
    _checkpoint(tmp_path / "other.dd.tmp", "another checkpoint's", mtime_ns=3_000_000_000)
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        assert find_checkpoint(str(target)) == newer
    assert f"no checkpoint at {target}: a save was interrupted while swapping it into place; loading {newer}" in caplog.text
    _checkpoint(target, "the checkpoint")
    assert find_checkpoint(target) == target  # once it exists, it is the one


def test_leftovers_of_earlier_saves_are_removed_and_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    _checkpoint(target, "the checkpoint")
    for name in ("ckpt.aa.old", "ckpt.bb.tmp"):
        _checkpoint(tmp_path / name, name)
    (tmp_path / "ckpt.cc.tmp").write_text("a single-file save's temporary file")
    kept = ["ckpt", "ckpt.pt", "ckpt.tmp", "ckpt2.ee.tmp", "other.ff.old"]
    for name in kept[1:]:
        (tmp_path / name).write_text(name)
    remove_leftovers(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == kept


# A sharded save run for real (the DCP shards, ampkit.pt, the swap, the clean-up) and killed (SIGKILL, in a fork)
# just before its n-th filesystem operation, for every n until a save gets through: after each kill the path holds
# a complete checkpoint, the old one or the new one. One process and no process group, so save_distributed is told
# that "no strategy" is FSDP; the load then reads the directory as a single process resumes one.
_KILL_AT_EVERY_OPERATION = r"""
import os, shutil, signal, sys, pathlib
import torch
from torch import nn
from ampkit import Engine
from ampkit.checkpoint import _sharded
from ampkit.checkpoint._sharded_dir import is_complete

torch.set_num_threads(1)
_sharded.FSDP = type(None)  # engine.strategy is None here: take the sharded path in one process
root = pathlib.Path(sys.argv[1])

def engine(seed):
    torch.manual_seed(seed)
    e = Engine()
    model = nn.Linear(3, 2)
    e.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return e

def weights(e):
    return [p.detach().clone() for p in e.models[0].parameters()]

old, new = engine(0), engine(1)
pristine = root / "pristine" / "ckpt"
_sharded.save_distributed(old, pristine)
MUTATING = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.truncate", "shutil.rmtree", "shutil.move", "ctypes.call_function"}

def mutating(event, args):
    if event == "open":
        mode, flags = args[1], args[2]
        return (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
    return event in MUTATING

n = 0
while True:
    n += 1
    work = root / f"kill{n}"
    shutil.copytree(pristine.parent, work)
    target = work / "ckpt"
    pid = os.fork()
    if pid == 0:
        seen = [0]
        def hook(event, args):
            if mutating(event, args):
                seen[0] += 1
                if seen[0] == n:
                    os.kill(os.getpid(), signal.SIGKILL)
        sys.addaudithook(hook)
        _sharded.save_distributed(new, target)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    finished = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert finished or os.WTERMSIG(status) == signal.SIGKILL, status
    assert target.exists() and is_complete(target), f"killed before operation {n}: no complete checkpoint at the path"
    loading = engine(2)
    _sharded.load_distributed(loading, target)
    got = weights(loading)
    which = [name for name, e in (("old", old), ("new", new)) if all(torch.equal(a, b) for a, b in zip(got, weights(e)))]
    assert which, f"killed before operation {n}: the path loads neither the old checkpoint nor the new one"
    print(n, which[0], "finished" if finished else "killed", flush=True)
    if finished:
        break
"""


@pytest.mark.slow  # ~5 s: a torch start and 13 forked saves; CI checks the swap itself below, stopped at each operation
def test_a_save_killed_before_any_filesystem_operation_leaves_a_complete_checkpoint_at_the_path(tmp_path: Path) -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-c", _KILL_AT_EVERY_OPERATION, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert lines[-1][1:] == ["new", "finished"] and all(kind == "killed" for _, _, kind in lines[:-1])
    assert {which for _, which, _ in lines} == {"old", "new"}  # killed both before the swap and after it
    assert len(lines) > 5  # the shards, ampkit.pt, the swap and the clean-up were each a kill point


class _Stopped(Exception):
    """Stands for a kill: raised instead of the n-th filesystem operation, nothing after it runs."""


def _stop_at(monkeypatch: pytest.MonkeyPatch, n: int) -> list[str]:
    """Make the swap's n-th filesystem operation (rename, exchange, delete) raise; returns the operations seen."""
    seen: list[str] = []

    def counted(name: str, real):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(name)
            if len(seen) == n:
                raise _Stopped(name)
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(sharded_dir.os, "replace", counted("replace", os.replace))
    monkeypatch.setattr(sharded_dir, "_exchange", counted("exchange", sharded_dir._exchange))
    monkeypatch.setattr(sharded_dir.shutil, "rmtree", counted("rmtree", sharded_dir.shutil.rmtree))
    return seen


def test_the_path_holds_a_complete_checkpoint_whichever_operation_of_the_swap_is_the_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(1, 10):
        root = tmp_path / str(n)
        root.mkdir()
        target = _checkpoint(root / "ckpt", "old")
        with monkeypatch.context() as patch:
            seen = _stop_at(patch, n)
            try:
                swap_into_place(_checkpoint(root / "ckpt.ab12.tmp", "new"), target, "ab12")
                stopped = False
            except _Stopped:
                stopped = True
        assert target.exists() and is_complete(target), f"stopped at {seen}: no complete checkpoint at the path"
        assert (target / ".metadata").read_text() in ("old", "new")
        if not stopped:
            assert (target / ".metadata").read_text() == "new" and sorted(p.name for p in root.iterdir()) == ["ckpt"]
            assert seen == ["exchange", "rmtree"]  # one atomic step, then the old one is deleted
            return
    pytest.fail("the swap never finished")


def test_where_the_filesystem_cannot_exchange_the_two_renames_leave_a_gap_the_loader_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sharded_dir, "_exchange", lambda a, b: False)  # Windows, or a mount that answers EINVAL
    sharded_dir._warn_no_exchange.cache_clear()
    target = _checkpoint(tmp_path / "ckpt", "old", mtime_ns=1_000_000_000)
    new = _checkpoint(tmp_path / "ckpt.ab12.tmp", "new", mtime_ns=2_000_000_000)
    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING, logger="ampkit"):
        _stop_at(patch, 3)  # the exchange (refused), the first rename, then the second
        with pytest.raises(_Stopped):
            swap_into_place(new, target, "ab12")
    assert "cannot exchange two directories atomically" in caplog.text
    assert not target.exists()  # the documented gap
    assert find_checkpoint(target) == new  # the newer complete copy
    sharded_dir._warn_no_exchange.cache_clear()


def test_the_exchange_swaps_two_directories_on_this_machine(tmp_path: Path) -> None:
    a, b = _checkpoint(tmp_path / "a", "a"), _checkpoint(tmp_path / "b", "b")
    if not sharded_dir._exchange(a, b):
        pytest.skip(f"no atomic exchange on {sys.platform} / this filesystem: swaps use the two renames")
    assert (a / ".metadata").read_text() == "b" and (b / ".metadata").read_text() == "a"
