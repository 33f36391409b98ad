"""ampkit.checkpoint._sharded_dir: a directory swapped into place whole, and found again after a crash mid-swap."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

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
