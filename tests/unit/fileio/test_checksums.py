"""Checksums of checkpoint files (ampkit.fileio._checksums): a damaged byte anywhere is refused, never loaded as a
silently different value."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from ampkit._errors import CheckpointError
from ampkit.fileio._checkpoint_files import capture_rng_state, load_checkpoint, save_checkpoint


def _equal(a: Any, b: Any) -> bool:
    """Bitwise equality of nested checkpoint contents (tensors by dtype, shape and bytes)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8) if a.dim() else a, b.view(torch.uint8) if b.dim() else b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    return {"model": {"w": torch.randn(32, 32), "b": torch.randn(32, dtype=torch.float64)}, "rng": capture_rng_state(), "step": 7, "lr": 0.01}


@pytest.mark.parametrize("damage", ["flip-one-bit", "overwrite-8-bytes"])
def test_damage_at_random_offsets_is_refused_naming_the_file_or_changes_nothing(tmp_path: Path, damage: str) -> None:
    state = _state()
    original = save_checkpoint(state, tmp_path / "ckpt.pt").read_bytes()
    rng = random.Random(38)
    refused, named_records = 0, set()
    for i in range(60):
        data = bytearray(original)
        at = rng.randrange(len(data) - 8)
        if damage == "flip-one-bit":
            data[at] ^= 1 << rng.randrange(8)
        else:
            data[at:at + 8] = rng.randbytes(8)
        copy = tmp_path / f"copy{i}.pt"
        copy.write_bytes(bytes(data))
        try:
            loaded = load_checkpoint(copy)
        except CheckpointError as exc:
            refused += 1
            assert str(copy) in str(exc)
            if "does not match its checksum" in str(exc):
                named_records.add(str(exc).split("record ", 1)[1].split(" ", 1)[0])
            continue
        assert _equal(loaded, state), f"byte {at} of {len(data)} damaged: loaded silently with changed values"
    # Most damage lands in the tensors' and the pickle's bytes, each refused by its record's name.
    assert refused > 40 and "archive/data.pkl" in named_records and any(r.startswith("archive/data/") for r in named_records)


def test_a_file_written_without_torchs_crc_loads_with_a_note(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from torch.utils.serialization import config

    path = tmp_path / "old.pt"
    previous = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        torch.save({"format": "ampkit-checkpoint", "format_version": 1, "payload": {"w": torch.ones(2)}}, path)
    finally:
        config.save.compute_crc32 = previous
    with caplog.at_level(logging.INFO, logger="ampkit"):
        assert torch.equal(load_checkpoint(path)["w"], torch.ones(2))
    assert "carries no checksums" in caplog.text


def test_a_save_writes_the_checksums_even_where_torchs_crc_is_turned_off(tmp_path: Path) -> None:
    import zipfile

    from torch.utils.serialization import config

    previous = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        path = save_checkpoint({"w": torch.ones(2)}, tmp_path / "c.pt")
        assert config.save.compute_crc32 is False  # the user's setting is put back
    finally:
        config.save.compute_crc32 = previous
    with zipfile.ZipFile(path) as archive:
        assert all(r.CRC != 0 for r in archive.infolist())
