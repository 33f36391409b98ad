"""What killed sharded saves leave beside the checkpoint is removed by the next save, before it writes; a running
save's directory and a user's look-alike names never are (ampkit.checkpoint._sharded_dir.remove_leftovers)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampkit._util.units import fmt_bytes
from ampkit.checkpoint import _sharded
from ampkit.checkpoint._sharded_dir import ENGINE_FILE, find_checkpoint, is_complete, remove_leftovers
from ampkit.fileio._temporaries import STALE_AFTER_S, _machine, _own_start, _proc_stat, writer_token

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Requires: /proc (Linux)")

DEAD = 4194305  # above Linux's largest pid: no process has it


def _token(pid: int = DEAD, start: int = 0, machine: str | None = None, random: str = "0123456789abcdef") -> str:
    """The token a writer with this pid, start and machine (default: this one) names its directories with."""
    return f"{pid}-{start}-{machine or _machine()}-{random}"


def _age(path: Path, seconds: float) -> Path:
    """Make everything in ``path`` (and ``path``) look last written ``seconds`` ago."""
    stamp = time.time() - seconds
    for inner in sorted(path.rglob("*"), reverse=True) if path.is_dir() else []:
        os.utime(inner, (stamp, stamp), follow_symlinks=False)
    os.utime(path, (stamp, stamp), follow_symlinks=False)
    return path


def _directory(path: Path, *, complete: bool = True, age: float = 0.0) -> Path:
    """A sharded directory as a save leaves it: a shard, DCP's .metadata and, once finished, ampkit.pt."""
    path.mkdir()
    (path / "__0_0.distcp").write_bytes(b"s" * 1000)
    (path / ".metadata").write_bytes(b"m" * 10)
    if complete:
        (path / ENGINE_FILE).write_bytes(b"e" * 100)
    return _age(path, age) if age else path


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_a_users_look_alike_names_are_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = _directory(tmp_path / "ckpt")
    kept = [
        _directory(tmp_path / "ckpt.notes.tmp"),  # a user's, named alike: never ours, however old
        _directory(tmp_path / "ckpt.backup.old"),
        _directory(tmp_path / "ckpt.tmp"),
        _directory(tmp_path / "ckpt.0123456789AB.tmp"),  # not the hex a token has
        _directory(tmp_path / "ckpt.0123456789ab.bak"),
        _directory(tmp_path / f"ckpt.{_token()}.tmp.bak"),
        _directory(tmp_path / f"ckpt.{_token()}"),
        _directory(tmp_path / f"ckpt2.{_token()}.tmp"),  # another checkpoint's: its own save cleans it up
        _directory(tmp_path / f"ckpt.pt.{_token()}.tmp"),  # and the one whose name this one begins
    ]
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / f"ckpt.{_token(random='1111111111111111')}.tmp"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)  # a link is never a save's
    for path in kept:
        _age(path, 10 * STALE_AFTER_S)
    killed = _directory(tmp_path / f"ckpt.{_token(random='fedcba9876543210')}.tmp", complete=False)

    with caplog.at_level(logging.INFO, logger="ampkit"):
        assert remove_leftovers(target) == [killed]
    assert _names(tmp_path) == sorted(p.name for p in [target, *kept, link, tmp_path / "elsewhere"])
    assert is_complete(target) and all(is_complete(p) for p in kept)
    assert [r.levelno for r in caplog.records if r.name == "ampkit"] == [logging.INFO]  # nothing it tried and failed


@needs_proc
def test_a_live_writers_directories_are_kept_and_a_reused_pids_are_not(tmp_path: Path, sleeper: subprocess.Popen) -> None:
    target = _directory(tmp_path / "ckpt")
    (_, start) = _proc_stat(sleeper.pid)  # type: ignore[misc]
    live = [  # a save under way in another process of this machine: its staging, and the old copy it sets aside
        _directory(tmp_path / f"ckpt.{_token(sleeper.pid, start)}.tmp", complete=False),
        _directory(tmp_path / f"ckpt.{_token(sleeper.pid, start)}.old"),
        # This process's: every rank of a job writes into the directory named by rank 0's token, so rank 0's own
        # running save (whichever rank created the folder) is this one.
        _directory(tmp_path / f"ckpt.{writer_token()}.tmp", complete=False),
    ]
    # A killed writer's pid now held by another process (a restarted container's training process), and this
    # process's pid as an earlier process held it.
    reused = [
        _directory(tmp_path / f"ckpt.{_token(sleeper.pid, start + 1)}.tmp", complete=False),
        _directory(tmp_path / f"ckpt.{_token(os.getpid(), _own_start() - 1)}.old"),
    ]
    for path in live + reused:
        _age(path, 10 * STALE_AFTER_S)  # a directory of this machine's writer is judged by its writer, never its age
    assert sorted(remove_leftovers(target)) == sorted(reused)
    assert _names(tmp_path) == sorted(p.name for p in [target, *live])


def test_an_earlier_ampkits_or_another_machines_leftover_goes_only_once_nothing_in_it_was_written_for_long(tmp_path: Path) -> None:
    target = _directory(tmp_path / "ckpt")
    elsewhere = next(m for m in ("00000000", "00000001") if m != _machine())
    older = [
        _directory(tmp_path / "ckpt.0123456789ab.tmp", complete=False),  # an earlier ampkit's: no writer in the name
        _directory(tmp_path / "ckpt.0123456789ac.old"),
        _directory(tmp_path / f"ckpt.{_token(4, 1, elsewhere)}.tmp", complete=False),  # another node of a shared filesystem
    ]
    assert remove_leftovers(target) == []  # written a moment ago: maybe a running save
    for path in older:
        _age(path, STALE_AFTER_S + 60)
    (older[0] / "__1_0.distcp").write_bytes(b"s")  # one file still being written: the whole directory is in use
    assert remove_leftovers(target) == older[1:]
    assert _names(tmp_path) == ["ckpt", "ckpt.0123456789ab.tmp"]
    assert remove_leftovers(target, stale_after=0) == older[:1]


def test_with_no_checkpoint_at_the_path_the_newest_complete_copy_is_put_back_not_removed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = tmp_path / "ckpt"  # killed between the two renames: the old one aside, the new one complete
    aside = _directory(tmp_path / f"ckpt.{_token()}.old")
    os.utime(aside / ENGINE_FILE, ns=(1_000_000_000, 1_000_000_000))
    newer = _directory(tmp_path / f"ckpt.{_token()}.tmp")
    (newer / ".metadata").write_text("newer")
    cut = _directory(tmp_path / f"ckpt.{_token(random='fedcba9876543210')}.tmp", complete=False)
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        assert sorted(remove_leftovers(target)) == sorted([aside, cut])
    assert _names(tmp_path) == ["ckpt"] and (target / ".metadata").read_text() == "newer"
    assert f"no checkpoint at {target}: a save was killed while swapping it into place; {newer.name}" in caplog.text


@needs_proc
def test_with_no_checkpoint_at_the_path_a_running_saves_complete_copy_is_left_to_it(tmp_path: Path, sleeper: subprocess.Popen) -> None:
    target = tmp_path / "ckpt"
    (_, start) = _proc_stat(sleeper.pid)  # type: ignore[misc]
    aside = _directory(tmp_path / f"ckpt.{_token()}.old")  # an older save's, killed: the running one's is newer
    os.utime(aside / ENGINE_FILE, ns=(1_000_000_000, 1_000_000_000))
    running = _directory(tmp_path / f"ckpt.{_token(sleeper.pid, start)}.tmp")  # between its renames right now
    assert remove_leftovers(target) == [aside]
    assert not target.exists() and find_checkpoint(target) == running


def test_what_cannot_be_removed_gets_a_warning_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    target = _directory(tmp_path / "ckpt")
    killed = _directory(tmp_path / f"ckpt.{_token()}.tmp", complete=False)

    def refused(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise PermissionError(13, "Permission denied", str(path))

    from ampkit.checkpoint import _sharded_dir

    monkeypatch.setattr(_sharded_dir.shutil, "rmtree", refused)
    with caplog.at_level(logging.INFO, logger="ampkit"):
        assert remove_leftovers(target) == []
    assert killed.exists()
    (record,) = [r for r in caplog.records if r.name == "ampkit"]
    assert record.levelno == logging.WARNING and f"could not remove {killed}, left by an interrupted save" in record.getMessage()


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_stale_after_must_be_a_number_of_seconds(tmp_path: Path, bad: float) -> None:
    with pytest.raises(ValueError, match=r"stale_after=.*>= 0"):
        remove_leftovers(tmp_path / "ckpt", stale_after=bad)


# A real sharded save (one process told that "no strategy" is FSDP), held after its shards were written and before
# ampkit.pt: a job killed mid-save. The test kills it from outside (SIGKILL, as a preemption does).
_HELD_MID_SAVE = r"""
import sys, time, torch
from torch import nn
from ampkit import Engine
from ampkit.checkpoint import _sharded
torch.set_num_threads(1)
_sharded.FSDP = type(None)
def held(payload, path):
    print(path.parent.name, flush=True)
    time.sleep(120)
_sharded.save_checkpoint = held
engine = Engine()
model = nn.Linear(64, 64)
engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
_sharded.save_distributed(engine, sys.argv[1])
"""


def test_a_killed_saves_staging_is_removed_by_the_next_save_before_it_writes_and_a_running_ones_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trained, caplog: pytest.LogCaptureFixture
) -> None:
    import torch.distributed.checkpoint as dcp

    target = tmp_path / "ckpt"
    monkeypatch.setattr(_sharded, "FSDP", type(None))  # engine.strategy is None here: take the sharded path
    engine = trained()

    def held_save() -> tuple[subprocess.Popen[str], Path]:
        proc = subprocess.Popen([sys.executable, "-c", _HELD_MID_SAVE, str(target)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        name = proc.stdout.readline().strip()  # type: ignore[union-attr]
        if not name:
            proc.kill()
            raise AssertionError(f"the held save did not start: {proc.communicate()[1]}")
        return proc, tmp_path / name

    def kill(proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL

    _sharded.save_distributed(engine, target)
    running, first = held_save()
    try:
        _sharded.save_distributed(engine, target)  # two saves to one place: this one leaves the other's alone
        assert _names(tmp_path) == sorted(["ckpt", first.name])
    finally:
        kill(running)
    again, second = held_save()  # preempted again: one leftover removed at the start of this save, before it wrote
    kill(again)
    assert not is_complete(first) and not is_complete(second)
    assert _names(tmp_path) == sorted(["ckpt", second.name])
    size = sum(f.stat().st_size for f in second.rglob("*"))
    assert size > 64 * 64 * 4

    real_save, seen = dcp.save, []

    def save(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(_names(tmp_path))  # what is beside the checkpoint when this save starts writing
        return real_save(*args, **kwargs)

    monkeypatch.setattr(dcp, "save", save)
    with caplog.at_level(logging.INFO, logger="ampkit"):
        _sharded.save_distributed(engine, target)
    assert seen == [["ckpt"]] and _names(tmp_path) == ["ckpt"]
    (record,) = [r for r in caplog.records if r.name == "ampkit"]  # one line, naming the directory and its size
    message = record.getMessage()
    assert record.levelno == logging.INFO and str(target) in message and f"{second.name} ({fmt_bytes(size)})" in message
