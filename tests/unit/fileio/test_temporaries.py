"""The temporaries of killed saves are removed by the next save into the same place, never a running save's or a
user's file (ampkit.fileio._temporaries)."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampkit._util.units import fmt_bytes
from ampkit.fileio import load_checkpoint, remove_stale_temporaries, save_checkpoint, write_text_atomic
from ampkit.fileio._temporaries import (
    _TEMP_SUFFIX,
    STALE_AFTER_S,
    WRITER_TOKEN,
    _machine,
    _open_temp_file,
    _own_start,
    _proc_stat,
    writer_token,
)

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Requires: /proc (Linux)")

# A real save, held after its last byte was written and before it is flushed and renamed into place: the window a
# kill leaves its temporary in. The parent kills it (SIGKILL, as the OOM killer or a preempted node does) from outside.
_HELD_MID_SAVE = """
import os, sys, time, torch
from ampkit.fileio import save_checkpoint
def held(fd):
    print("writing", flush=True)
    time.sleep(120)
os.fsync = held
save_checkpoint({"weight": torch.zeros(18 * 2**20 // 4)}, sys.argv[1])  # 18 MiB
"""


def _held_save(target: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _HELD_MID_SAVE, str(target)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.stdout.readline() != "writing\n":  # type: ignore[union-attr]
        proc.kill()
        raise AssertionError(f"the held save did not start: {proc.communicate()[1]}")
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def _temporaries(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.tmp"))


def _age(path: Path, seconds: float) -> Path:
    stamp = time.time() - seconds
    os.utime(path, (stamp, stamp))
    return path


def _name(target: Path, pid: int, start: int, machine: str | None = None) -> Path:
    """The temporary a writer with this pid, start and machine (default: this one) would have written."""
    return target.with_name(f"{target.name}.{pid}-{start}-{machine or _machine()}-0123456789abcdef.tmp")


def test_killed_saves_leave_their_temporary_and_the_next_save_removes_it_but_not_a_running_saves(tmp_path, caplog):
    target = tmp_path / "last.pt"
    save_checkpoint({"step": 0}, target)
    running = _held_save(target)
    try:
        (first,) = _temporaries(tmp_path)
        # Two processes saving to one place: this save leaves the other's temporary alone, and both are whole.
        save_checkpoint({"step": 1}, target)
        assert _temporaries(tmp_path) == [first]
        assert load_checkpoint(target) == {"step": 1}
    finally:
        _kill(running)
    assert _temporaries(tmp_path) == [first] and first.stat().st_size > 18 * 2**20  # nothing of it could clean up

    # Preempted again: the restarted run's save removes the first one's temporary before it writes, so repeated
    # kills leave one file at most, not one each.
    again = _held_save(target)
    try:
        (second,) = _temporaries(tmp_path)
        assert second != first
    finally:
        _kill(again)
    size = second.stat().st_size

    with caplog.at_level(logging.INFO, logger="ampkit"):
        save_checkpoint({"step": 2}, target)

    assert _temporaries(tmp_path) == [] and load_checkpoint(target) == {"step": 2}
    (record,) = [r for r in caplog.records if r.name == "ampkit"]  # one line, naming the file and its size
    message = record.getMessage()
    assert record.levelno == logging.INFO and str(target) in message and f"{second.name} ({fmt_bytes(size)})" in message


def test_a_save_with_nothing_to_remove_logs_nothing(tmp_path, caplog):
    target = tmp_path / "last.pt"
    with caplog.at_level(logging.DEBUG, logger="ampkit"):
        save_checkpoint({"step": 0}, target)
        save_checkpoint({"step": 1}, target)
    assert [r for r in caplog.records if r.name == "ampkit"] == []


def test_the_temporary_names_its_writer(tmp_path):
    temp, handle = _open_temp_file(tmp_path / "last.pt")
    handle.close()
    pid, start, machine, token = temp.name.removeprefix("last.pt.").removesuffix(".tmp").split("-")
    assert (int(pid), int(start), machine, len(token)) == (os.getpid(), _own_start(), _machine(), 16)


def test_the_token_other_writers_share_reads_as_a_temporarys_name_does():
    # The sharded checkpoint's directories carry writer_token() and are matched with WRITER_TOKEN: both must name the
    # writer exactly as a temporary file's name does, or one kind would be judged by another's rule.
    token = writer_token()
    shared, own = re.fullmatch(WRITER_TOKEN, token), _TEMP_SUFFIX.fullmatch(f".{token}.tmp")
    assert shared is not None and own is not None and token != writer_token()
    assert shared.groupdict() == {k: own[k] for k in ("pid", "start", "machine")} == {
        "pid": str(os.getpid()), "start": str(_own_start()), "machine": _machine()}


@needs_proc
def test_a_live_writer_is_kept_and_a_reused_pid_is_not(tmp_path, sleeper):
    target = tmp_path / "last.pt"
    (_, start) = _proc_stat(sleeper.pid)  # type: ignore[misc]
    live = _name(target, sleeper.pid, start)  # a save under way in another process of this machine
    ours = _name(target, os.getpid(), _own_start())  # one under way in another thread of this process
    # The pid of a killed writer now held by another process: a restarted container's training process gets the
    # pid of the one that was killed, so the pid alone would keep the file for good.
    reused = _name(target, sleeper.pid, start + 1)
    ours_before = _name(target, os.getpid(), _own_start() - 1)
    for path in (live, ours, reused, ours_before):
        path.write_bytes(b"x")
        _age(path, 10 * STALE_AFTER_S)  # a file of this machine's writer is judged by its writer, never its age
    assert sorted(remove_stale_temporaries(target)) == sorted([reused, ours_before])
    assert sorted(_temporaries(tmp_path)) == sorted([live, ours])


@needs_proc
def test_a_writer_that_died_unreaped_counts_as_gone(tmp_path):
    target = tmp_path / "last.pt"
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 60
        while (found := _proc_stat(zombie.pid)) is not None and found[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert found is not None and found[0] == "Z"  # exited, not yet waited for: its pid still exists
        stale = _name(target, zombie.pid, found[1])
        stale.write_bytes(b"x")
        assert remove_stale_temporaries(target) == [stale]
    finally:
        zombie.wait()


def test_a_writer_that_cannot_be_checked_here_counts_only_once_its_file_is_old(tmp_path):
    target = tmp_path / "last.pt"
    elsewhere = next(m for m in ("00000000", "00000001") if m != _machine())
    names = [
        _name(target, 4194305, 1, elsewhere),  # another node of a shared filesystem: its pids mean nothing here
        target.with_name("last.pt.4194305-0123456789abcdef.tmp"),  # the previous release's name: no machine
        target.with_name("last.pt.0123456789abcdef.tmp"),  # the first release's: no writer at all
    ]
    for path in names:
        path.write_bytes(b"x")
    assert remove_stale_temporaries(target) == []  # written to a moment ago: maybe a running save
    old = [_age(path, STALE_AFTER_S + 60) for path in names[:2]]
    assert sorted(remove_stale_temporaries(target)) == sorted(old)
    assert _temporaries(tmp_path) == [names[2]]
    assert remove_stale_temporaries(target, stale_after=0) == [names[2]]


def test_only_the_exact_names_of_this_targets_temporaries_are_touched(tmp_path, caplog):
    target = tmp_path / "model.pt"
    dead = 4194305  # above Linux's largest pid: no process has it
    kept = [
        tmp_path / "model.pt.tmp.notes",  # a user's files, named alike
        tmp_path / "model.pt.notes.tmp",
        tmp_path / "model.pt.tmp",
        tmp_path / "model.pt.0123456789ABCDEF.tmp",
        tmp_path / f"model.pt.{dead}-0-{_machine()}-0123456789abcdef.tmp.bak",
        _name(tmp_path / "other.pt", dead, 0),  # another target's, and the target's whose name this one begins
        _name(tmp_path / "model.pt.best", dead, 0),
    ]
    for path in kept:
        path.write_text("mine")
        _age(path, 10 * STALE_AFTER_S)
    directory = _name(target, dead, 0)
    directory.mkdir()  # not a file: not one of ours either
    stale = target.with_name(f"model.pt.{dead}-0-{_machine()}-fedcba9876543210.tmp")
    stale.write_bytes(b"x")

    with caplog.at_level(logging.INFO, logger="ampkit"):
        assert remove_stale_temporaries(target) == [stale]
    assert all(path.exists() for path in [*kept, directory])
    assert [r.levelno for r in caplog.records if r.name == "ampkit"] == [logging.INFO]  # none it tried and failed


def test_write_text_atomic_removes_them_too(tmp_path):
    target = tmp_path / "report.md"
    stale = _name(target, 4194305, 0)
    stale.write_bytes(b"half a report")
    write_text_atomic(target, "# whole\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_stale_after_must_be_a_number_of_seconds(tmp_path, bad):
    with pytest.raises(ValueError, match=r"stale_after=.*>= 0"):
        remove_stale_temporaries(tmp_path / "last.pt", stale_after=bad)


def test_a_missing_directory_has_nothing_to_remove(tmp_path):
    assert remove_stale_temporaries(tmp_path / "not" / "yet" / "last.pt") == []
