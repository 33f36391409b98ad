"""A save that fills the disk says so (ampkit.fileio._disk): which filesystem, what the save needs, what is free."""

from __future__ import annotations

import errno
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ampkit.fileio._checkpoint_files as checkpoint_files
from ampkit._errors import CheckpointError
from ampkit._util.units import fmt_bytes
from ampkit.fileio._checkpoint_files import save_checkpoint
from ampkit.fileio._disk import full_disk_message, mount_point, storage_bytes

# 4000 bytes of float32 plus 80 of float64; the view shares the first storage and adds nothing.
_W = torch.arange(1000, dtype=torch.float32)
STATE = {"w": _W, "view": _W[:10], "nested": [{"v": torch.ones(10, dtype=torch.float64)}], "step": 3}
STATE_BYTES = 4000 + 80


def test_the_bytes_a_save_needs_are_its_storages_each_counted_once() -> None:
    assert storage_bytes(STATE) == STATE_BYTES == sum(t.numel() * t.element_size() for t in (_W, STATE["nested"][0]["v"]))
    assert storage_bytes({"none": None}) == 0


class _FillsUp(io.RawIOBase):
    """A file on a disk with ``room`` bytes left: the write past it fails with ENOSPC, as the kernel's does."""

    def __init__(self, real: Any, room: int) -> None:
        self.real, self.room = real, room

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return int(self.real.write(data))

    def fileno(self) -> int:
        return int(self.real.fileno())

    def close(self) -> None:
        self.real.close()
        super().close()


def _disk_with_room(monkeypatch: pytest.MonkeyPatch, room: int, free: int) -> None:
    real_open = checkpoint_files._open_temp_file

    def open_on_a_full_disk(target: Path) -> tuple[Path, Any]:
        temp, handle = real_open(target)
        return temp, _FillsUp(handle, room)

    monkeypatch.setattr(checkpoint_files, "_open_temp_file", open_on_a_full_disk)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - free, free))  # type: ignore[attr-defined]


def test_torchs_unexpected_pos_on_a_full_disk_becomes_a_message_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = save_checkpoint({"old": torch.ones(3)}, tmp_path / "ckpt.pt")
    before = target.read_bytes()
    _disk_with_room(monkeypatch, room=1500, free=1500)
    with pytest.raises(CheckpointError) as raised:
        save_checkpoint(STATE, target)
    assert "unexpected pos" in str(raised.value.__cause__)  # what torch said: the 19-of-26 message
    expected = f"no space left on {mount_point(tmp_path)}: the checkpoint needs about {fmt_bytes(STATE_BYTES)}, {fmt_bytes(1500)} free"
    assert expected in str(raised.value) and "unexpected pos" not in str(raised.value)
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_a_short_write_with_room_to_spare_is_not_called_a_full_disk(tmp_path: Path) -> None:
    # torch's short-write error without ENOSPC, on a disk with more room than the save needs: another cause.
    assert full_disk_message(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 8 vs 4"), tmp_path, 1) is None
    assert full_disk_message(ValueError("something else"), tmp_path, 10**18) is None
    short_and_short_of_room = full_disk_message(RuntimeError("unexpected pos 8 vs 4"), tmp_path, 10**18)
    assert short_and_short_of_room is not None and short_and_short_of_room.startswith(f"no space left on {mount_point(tmp_path)}")


# A real full filesystem: a 256 KiB tmpfs mounted in a user namespace (no root needed where the kernel allows them).
_REAL_FULL_DISK = r"""
import os, shutil, subprocess, sys, torch
from ampkit import CheckpointError
from ampkit.checkpoint import _sharded
from ampkit.fileio import save_checkpoint
from ampkit.fileio._disk import storage_bytes
from ampkit._util.units import fmt_bytes
from ampkit import Engine
mnt = sys.argv[1]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt], check=True)
state = {"w": torch.randn(100_000)}
try:
    save_checkpoint(state, os.path.join(mnt, "c.pt"))
except CheckpointError as e:
    free = shutil.disk_usage(mnt).free
    print("file", f"no space left on {mnt}: the checkpoint needs about {fmt_bytes(storage_bytes(state))}, {fmt_bytes(free)} free" in str(e), os.listdir(mnt))
_sharded.FSDP = type(None)  # one process, no group: take the sharded path
torch.manual_seed(0)
model = torch.nn.Linear(300, 300)
engine = Engine()
engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
try:
    _sharded.save_distributed(engine, os.path.join(mnt, "sharded"))
except CheckpointError as e:
    free = shutil.disk_usage(mnt).free
    print("sharded", f"no space left on {mnt}: this rank's shards need about {fmt_bytes(storage_bytes(dict(model.state_dict())))}, {fmt_bytes(free)} free" in str(e), "rank 0" not in str(e), os.listdir(mnt))
    print(e)
"""


def _user_namespaces() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return False
    return subprocess.run([unshare, "--user", "--map-root-user", "--mount", "true"], capture_output=True, timeout=30, check=False).returncode == 0


@pytest.mark.slow  # a torch start in a user namespace (~4 s); CI runs the injected full disk above and the sharded one in checkpoint/test_sharded.py
def test_a_real_full_filesystem_is_named_for_a_file_and_a_sharded_directory(tmp_path: Path) -> None:
    if not _user_namespaces():
        pytest.skip("no unprivileged user namespaces here to mount a small tmpfs; the injected ENOSPC tests cover the message")
    (tmp_path / "mnt").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-c", _REAL_FULL_DISK, str(tmp_path / "mnt")],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "file True []", done.stdout  # named, and nothing left behind
    assert lines[1] == "sharded True True []", done.stdout
