"""ampkit.checkpoint._sharded: the checkpoints of runs spread over ranks, loaded in one process (no process group).

What differs between ranks is tested on spawned ranks in tests/unit/distributed/test_checkpoint*.py; here, the
single-process side of the same code: a sharded directory written as FSDP writes it, and the per-rank entries
of a DDP file.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ampkit import CheckpointError, Engine
from ampkit.checkpoint._dcp_state import sharded_state, single_process_intended
from ampkit.checkpoint._payload import training_payload
from ampkit.checkpoint._sharded import ENGINE_FILE, _gather_to_rank0, _raise_if_any, load_distributed
from ampkit.fileio._checkpoint_files import load_checkpoint, save_checkpoint


def test_in_a_world_of_one_rank_zero_gathers_its_own_and_an_error_names_no_rank() -> None:
    assert _gather_to_rank0({"rng": 1}) == [{"rng": 1}]
    _raise_if_any(None, "saving x")
    with pytest.raises(CheckpointError, match=r"^saving x failed on disk full$"):
        _raise_if_any("disk full", "saving x")


def _fsdp_directory(engine: Engine, directory: Path, extra: dict | None) -> Path:
    """What save_distributed writes under FSDP: the shards, then ampkit.pt without models and optimizers."""
    with single_process_intended():
        dcp.save(sharded_state(engine), checkpoint_id=directory, no_dist=True)
    save_checkpoint(training_payload(engine, extra, tensors=False), directory / ENGINE_FILE)
    return directory


def test_a_sharded_directory_resumes_in_one_process(tmp_path: Path, trained, tensors, same) -> None:
    saved, loading = trained(seed=0, micro_batches=3), trained(seed=1, micro_batches=1)
    directory = _fsdp_directory(saved, tmp_path / "ckpt", {"epoch": 2})
    assert load_distributed(loading, directory) == {"epoch": 2}
    assert same(tensors(loading), tensors(saved))
    assert loading.state_dict()["steps"] == saved.state_dict()["steps"] == 3
    assert loading.schedulers[0].state_dict() == saved.schedulers[0].state_dict()


def _ddp_file(engine: Engine, path: Path, pending: list) -> Path:
    """A file as rank 0 writes it for a run of len(pending) ranks, each with its own RNG and pending gradients."""
    payload = training_payload(engine, None)
    payload["ranks"] = {"strategy": "ddp", "world_size": len(pending), "rng": [payload["rng"]] * len(pending), "pending_grads": pending}
    save_checkpoint(payload, path)
    return path


def test_a_file_of_two_ranks_resumes_in_one_at_a_boundary_and_is_refused_inside_a_window(tmp_path: Path, trained, tensors, same, caplog) -> None:
    saved = trained(micro_batches=2)
    loading = trained(seed=1)
    path = _ddp_file(saved, tmp_path / "boundary.pt", [None, None])
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        load_distributed(loading, path)
    assert same(tensors(loading), tensors(saved))
    assert "was saved by 2 rank(s) and resumes on 1: weights, optimizer and scaler are restored, the random streams are not" in caplog.text

    loading = trained(seed=1)
    before = tensors(loading)
    grads = {name: torch.ones_like(p) for name, p in loading.named_parameters()}
    path = _ddp_file(saved, tmp_path / "window.pt", [grads, grads])
    with pytest.raises(CheckpointError, match=r"was saved by 2 rank\(s\) inside an accumulation window; resume it on 2 rank\(s\)"):
        load_distributed(loading, path)
    assert same(tensors(loading), before)
    assert load_checkpoint(path)["ranks"]["world_size"] == 2  # the file itself is left as it was


def test_every_failed_ranks_reason_reaches_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    from ampkit.checkpoint import _sharded

    # A world of three as the collectives would see it: rank 0 (this process) fine, ranks 1 and 2 out of space.
    monkeypatch.setattr(_sharded, "grouped", lambda: True)
    monkeypatch.setattr(_sharded.dist, "get_world_size", lambda: 3)
    monkeypatch.setattr(_sharded.dist, "all_gather_object", lambda out, obj: out.__setitem__(slice(None), [obj, "disk a full", "disk b full"]))
    with pytest.raises(CheckpointError, match=r"^saving x failed on rank 1: disk a full; rank 2: disk b full$"):
        _raise_if_any(None, "saving x")


def test_a_full_disk_under_a_sharded_save_is_named_and_the_partial_directory_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trained) -> None:
    import errno
    import shutil

    from torch.distributed.checkpoint.api import CheckpointException

    from ampkit._util.units import fmt_bytes
    from ampkit.checkpoint import _sharded
    from ampkit.fileio._disk import mount_point

    engine = trained()
    monkeypatch.setattr(_sharded, "FSDP", type(None))  # no strategy, one process: take the sharded path

    def fills_the_disk(state, checkpoint_id, no_dist):  # as DCP reports a write the disk refused
        Path(checkpoint_id).mkdir()
        (Path(checkpoint_id) / "__0_0.distcp").write_bytes(b"cut off")
        raise CheckpointException("save failed", {0: (OSError(errno.ENOSPC, "No space left on device"), None)})

    monkeypatch.setattr(dcp, "save", fills_the_disk)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1024, 1024))  # type: ignore[attr-defined]
    shard_bytes = sum(t.numel() * t.element_size() for t in tensors_of(engine))
    with pytest.raises(CheckpointError) as raised:
        _sharded.save_distributed(engine, tmp_path / "ckpt")
    assert f"saving {tmp_path / 'ckpt'} failed on no space left on {mount_point(tmp_path)}: this rank's shards need about " \
        f"{fmt_bytes(shard_bytes)}, {fmt_bytes(1024)} free" in str(raised.value)
    assert list(tmp_path.iterdir()) == []


def tensors_of(engine: Engine) -> list[torch.Tensor]:
    """The tensors of a sharded save: the model's parameters and AdamW's state (step counts are tensors too)."""
    opt = engine.optimizers[0]
    return [*engine.models[0].state_dict().values(), *(v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))]
