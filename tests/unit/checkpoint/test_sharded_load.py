"""ampkit.checkpoint._sharded_load: a sharded (DCP) directory read into a running model whole, or not at all.

One process, no process group: DCP writes and reads such a directory as it does on any number of ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp

from ampkit import CheckpointError, Engine
from ampkit.checkpoint._dcp_state import sharded_state, single_process_intended
from ampkit.checkpoint._sharded_load import load_shards, read_metadata


def _save_shards(engine: Engine, directory: Path) -> Path:
    with single_process_intended():
        dcp.save(sharded_state(engine), checkpoint_id=directory, no_dist=True)
    return directory


def test_the_shards_replace_the_models_and_optimizers_state(tmp_path: Path, trained, tensors, same) -> None:
    saved, loading = trained(seed=0, micro_batches=3), trained(seed=1, micro_batches=1)
    directory = _save_shards(saved, tmp_path / "ckpt")
    assert not same(tensors(loading), tensors(saved))
    load_shards(loading, directory, read_metadata(directory))
    assert same(tensors(loading), tensors(saved))  # the control: the saved run's own tensors
    assert loading.optimizers[0].param_groups[0]["lr"] == saved.optimizers[0].param_groups[0]["lr"]


def test_a_missing_or_cut_shard_file_is_found_before_a_byte_is_read(tmp_path: Path, trained) -> None:
    directory = _save_shards(trained(), tmp_path / "ckpt")
    (shard,) = directory.glob("*.distcp")
    whole = shard.read_bytes()
    shard.write_bytes(whole[:-1])
    with pytest.raises(CheckpointError, match=rf"is incomplete: shard files \['{shard.name} \({len(whole) - 1} of at least {len(whole)} bytes\)'\]"):
        read_metadata(directory)
    shard.unlink()
    with pytest.raises(CheckpointError, match=rf"shard files \['{shard.name} \(missing\)'\] are missing or truncated"):
        read_metadata(directory)


def test_another_models_shards_are_refused_and_nothing_changes(tmp_path: Path, trained, tensors, same) -> None:
    directory = _save_shards(trained(width=5), tmp_path / "ckpt")
    engine = trained(width=4)
    before = tensors(engine)
    with pytest.raises(CheckpointError, match=r"the model does not match the checkpoint \(missing \[\], unexpected \[\], shape mismatch \['model.0.0.bias \(5,\) vs \(4,\)', 'model.0.0.weight \(5, 3\) vs \(4, 3\)', 'model.0.2.weight \(2, 5\) vs \(2, 4\)'\]\)"):
        load_shards(engine, directory, read_metadata(directory))
    assert same(tensors(engine), before)


def test_a_value_where_the_model_has_a_tensor_is_refused(tmp_path: Path, trained) -> None:
    engine = trained()
    state = sharded_state(engine)
    state["model.0"]["0.bias"] = 1.5  # what a crafted or foreign checkpoint could hold
    with single_process_intended():
        dcp.save(state, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    with pytest.raises(CheckpointError, match=r"shape mismatch \['model.0.0.bias \(tensor vs value\)'\]"):
        load_shards(engine, tmp_path / "ckpt", read_metadata(tmp_path / "ckpt"))


def test_a_changed_learning_rate_is_named_by_a_sharded_load_too(tmp_path: Path, trained, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    directory = _save_shards(trained(seed=0), tmp_path / "ckpt")
    same_rate, changed = trained(seed=1), trained(seed=1)
    changed.optimizers[0].param_groups[0]["initial_lr"] = 0.05  # as if built with lr=0.05 under its scheduler
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        load_shards(same_rate, directory, read_metadata(directory))  # the twin: the rate it was built with
        assert not [r for r in caplog.records if r.name == "ampkit"]
        load_shards(changed, directory, read_metadata(directory))
    (record,) = [r for r in caplog.records if r.name == "ampkit"]  # torch's DCP logs its own events at DEBUG
    assert "was built with lr=0.05, the checkpoint holds lr=0.01: the checkpoint's wins" in record.getMessage()
