"""ampkit.checkpoint._sharded_dir: a directory swapped into place whole, and found again after a crash mid-swap."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

import ampkit.checkpoint._sharded_dir as sharded_dir
from ampkit.checkpoint._sharded_dir import ENGINE_FILE, find_checkpoint, is_complete, swap_into_place
from ampkit.fileio._temporaries import _machine


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


# Names of the saves' own directories, their writer gone (no process has a pid above Linux's largest) or unknown.
_OLDER_AMPKIT = "0123456789ab"


def _killed(machine: str | None = None, random: str = "0123456789abcdef") -> str:
    return f"4194305-0-{machine or _machine()}-{random}"


def test_with_no_checkpoint_the_newest_complete_leftover_is_loaded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = tmp_path / "ckpt"
    assert find_checkpoint(target) is None
    _checkpoint(tmp_path / f"ckpt.{_OLDER_AMPKIT}.old", "older save", mtime_ns=1_000_000_000)
    newer = _checkpoint(tmp_path / f"ckpt.{_killed()}.tmp", "newer save", mtime_ns=2_000_000_000)  # killed between the renames
    _checkpoint(tmp_path / f"ckpt.{_killed(random='fedcba9876543210')}.tmp", "killed mid-write", complete=False)
    _checkpoint(tmp_path / f"other.{_killed()}.tmp", "another checkpoint's", mtime_ns=3_000_000_000)
    _checkpoint(tmp_path / "ckpt.backup.old", "a user's copy, not a save's", mtime_ns=3_000_000_000)
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        assert find_checkpoint(str(target)) == newer
    assert f"no checkpoint at {target}: a save was interrupted while swapping it into place; loading {newer}" in caplog.text
    _checkpoint(target, "the checkpoint")
    assert find_checkpoint(target) == target  # once it exists, it is the one


# A sharded save run for real (the clean-up, the DCP shards, ampkit.pt, the swap) and killed (SIGKILL, in a fork)
# just before its n-th filesystem operation, for every n until a save gets through: after each kill the path loads a
# complete checkpoint, the old one or the new one. One process and no process group, so save_distributed is told
# that "no strategy" is FSDP; the load then reads the directory as a single process resumes one. In "swap", the save
# replaces a checkpoint at the path (which must stay there throughout); in "gap", an earlier save was killed between
# the two renames: no checkpoint at the path, the old one beside it, and an older one set aside, which must never
# be what loads (the clean-up puts the old one back before it removes anything).
_KILL_AT_EVERY_OPERATION = r"""
import os, shutil, signal, sys, pathlib
import torch
from torch import nn
from ampkit import Engine
from ampkit.checkpoint import _sharded
from ampkit.checkpoint._sharded_dir import find_checkpoint, is_complete
from ampkit.fileio._temporaries import _machine

torch.set_num_threads(1)
_sharded.FSDP = type(None)  # engine.strategy is None here: take the sharded path in one process
root, scene = pathlib.Path(sys.argv[1]), sys.argv[2]

def engine(seed):
    torch.manual_seed(seed)
    e = Engine()
    model = nn.Linear(3, 2)
    e.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return e

def weights(e):
    return [p.detach().clone() for p in e.models[0].parameters()]

old, new, older = engine(0), engine(1), engine(3)
pristine = root / "pristine" / "ckpt"
if scene == "gap":
    killed = f"4194305-0-{_machine()}-0123456789abcdef"  # a writer of this machine that is gone
    _sharded.save_distributed(older, pristine)
    pristine.rename(pristine.with_name(f"ckpt.{killed}.old"))
    _sharded.save_distributed(old, pristine)  # its ampkit.pt is the newer one
    pristine.rename(pristine.with_name(f"ckpt.{killed}.tmp"))
else:
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
    found = find_checkpoint(target)
    assert found is not None and is_complete(found), f"killed before operation {n}: no complete checkpoint to load"
    assert scene == "gap" or found == target, f"killed before operation {n}: no checkpoint at the path"
    loading = engine(2)
    _sharded.load_distributed(loading, target)
    got = weights(loading)
    which = [name for name, e in (("old", old), ("new", new)) if all(torch.equal(a, b) for a, b in zip(got, weights(e)))]
    assert which, f"killed before operation {n}: the path loads neither the old checkpoint nor the new one"
    print(n, which[0], "finished" if finished else "killed", flush=True)
    if finished:
        assert sorted(os.listdir(work)) == ["ckpt"], os.listdir(work)  # every leftover removed
        break
"""


@pytest.mark.slow  # ~5 s each: a torch start and 13 forked saves; CI checks the swap itself below, stopped at each operation
@pytest.mark.parametrize("scene", ["swap", "gap"])
def test_a_save_killed_before_any_filesystem_operation_leaves_a_complete_checkpoint_at_the_path(tmp_path: Path, scene: str) -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-c", _KILL_AT_EVERY_OPERATION, str(tmp_path), scene], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert lines[-1][1:] == ["new", "finished"] and all(kind == "killed" for _, _, kind in lines[:-1])
    assert {which for _, which, _ in lines} == {"old", "new"}  # killed both before the swap and after it
    assert len(lines) > 5  # the clean-up, the shards, ampkit.pt and the swap were each a kill point


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
    new = _checkpoint(tmp_path / f"ckpt.{_killed()}.tmp", "new", mtime_ns=2_000_000_000)
    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING, logger="ampkit"):
        _stop_at(patch, 3)  # the exchange (refused), the first rename, then the second
        with pytest.raises(_Stopped):
            swap_into_place(new, target, _killed())
    assert "cannot exchange two directories atomically" in caplog.text
    assert not target.exists()  # the documented gap
    assert find_checkpoint(target) == new  # the newer complete copy
    sharded_dir._warn_no_exchange.cache_clear()


def test_the_exchange_swaps_two_directories_on_this_machine(tmp_path: Path) -> None:
    a, b = _checkpoint(tmp_path / "a", "a"), _checkpoint(tmp_path / "b", "b")
    if not sharded_dir._exchange(a, b):
        pytest.skip(f"no atomic exchange on {sys.platform} / this filesystem: swaps use the two renames")
    assert (a / ".metadata").read_text() == "b" and (b / ".metadata").read_text() == "a"
