"""ampkit.checkpoint._safe_dcp: DCP's reader and planner, with nothing in a checkpoint able to run code."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

from ampkit import CheckpointError
from ampkit.checkpoint._dcp_state import single_process_intended
from ampkit.checkpoint._safe_dcp import SafeFileSystemReader, SafeLoadPlanner, _RestrictedUnpickler, storage_files


def _metadata(*locations: tuple[Any, Any, Any]) -> Metadata:
    return Metadata(state_dict_metadata={}, storage_data={MetadataIndex(f"t{i}"): _StorageInfo(*loc) for i, loc in enumerate(locations)})


def test_each_data_file_needs_the_end_of_its_furthest_item() -> None:
    files = storage_files(_metadata(("__0_0.distcp", 0, 100), ("__0_0.distcp", 100, 28), ("__1_0.distcp", 8, 8)))
    assert files == {"__0_0.distcp": 128, "__1_0.distcp": 16}


@pytest.mark.parametrize(
    "location",
    [("../elsewhere", 0, 1), ("/etc/passwd", 0, 1), ("sub/file", 0, 1), ("a\\b", 0, 1), ("..", 0, 1), ("", 0, 1),
     ("f", -1, 1), ("f", 0, True), ("f", 0, None), (None, 0, 1)],
    ids=["parent", "absolute", "subfolder", "backslash", "dotdot", "empty", "negative", "bool", "none", "no-name"],
)
def test_a_location_outside_the_directory_or_without_a_byte_range_is_refused(location) -> None:
    with pytest.raises(CheckpointError, match=r"which is not a file inside the checkpoint directory; the metadata is corrupt or crafted"):
        storage_files(_metadata(("__0_0.distcp", 0, 4), location))


def _global(module: str, name: str) -> bytes:
    """A pickle (protocol 4) of the object ``module``.``name`` names, as a crafted file would hold it."""
    m, n = module.encode(), name.encode()
    return b"\x80\x04\x8c" + bytes([len(m)]) + m + b"\x8c" + bytes([len(n)]) + n + b"\x93."


def test_the_unpickler_resolves_no_name_through_a_modules_attributes() -> None:
    # DCP's own filesystem module imports io: plain pickle walks the dotted name to the file class.
    crafted = _global("torch.distributed.checkpoint.filesystem", "io.FileIO")
    assert pickle.loads(crafted) is io.FileIO  # what the plain unpickler DCP uses hands back
    with pytest.raises(CheckpointError, match=r"refers to torch.distributed.checkpoint.filesystem.io.FileIO, which a safe load refuses"):
        _RestrictedUnpickler(io.BytesIO(crafted)).load()
    with pytest.raises(CheckpointError, match=r"refers to posix.system"):
        _RestrictedUnpickler(io.BytesIO(_global("posix", "system"))).load()
    assert _RestrictedUnpickler(io.BytesIO(pickle.dumps([torch.bfloat16, torch.Size([2])]))).load() == [torch.bfloat16, torch.Size([2])]


def _saved(tmp_path: Path, state: dict[str, Any]) -> Path:
    with single_process_intended():
        dcp.save(state, checkpoint_id=tmp_path, no_dist=True)
    return tmp_path


def test_the_safe_reader_reads_what_dcp_wrote_as_dcps_own_reader_does(tmp_path: Path) -> None:
    directory = _saved(tmp_path, {"w": torch.arange(6.0).view(2, 3), "lr": 0.5})
    ours, theirs = SafeFileSystemReader(directory), FileSystemReader(directory)
    ours.reset(), theirs.reset()
    mine, control = ours.read_metadata(), theirs.read_metadata()
    assert mine.state_dict_metadata == control.state_dict_metadata and mine.storage_data == control.storage_data
    assert mine.storage_meta is not None and mine.storage_meta.load_id == ours.load_id


def test_a_crafted_or_cut_metadata_file_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    directory = _saved(tmp_path, {"w": torch.ones(4)})
    whole = (directory / ".metadata").read_bytes()
    (directory / ".metadata").write_bytes(b"cbuiltins\neval\n(S'1'\ntR.")
    with pytest.raises(CheckpointError, match=r"refers to builtins.eval, which a safe load refuses"):
        SafeFileSystemReader(directory).read_metadata()
    (directory / ".metadata").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError, match=r"\.metadata is truncated or corrupt \(\w+Error: .*\); load an earlier checkpoint"):
        SafeFileSystemReader(directory).read_metadata()
    (directory / ".metadata").write_bytes(pickle.dumps({"not": "metadata"}))
    with pytest.raises(CheckpointError, match=r"does not hold torch.distributed.checkpoint metadata"):
        SafeFileSystemReader(directory).read_metadata()


class Payload:  # any class a pickle names: torch.load(weights_only=True) refuses to build it
    pass


def test_the_planner_loads_values_with_weights_only(tmp_path: Path) -> None:
    directory = _saved(tmp_path, {"w": torch.ones(2), "lr": 0.25, "obj": Payload()})

    def load(planner: Any, keys: tuple[str, ...]) -> dict[str, Any]:
        state: dict[str, Any] = {"w": torch.zeros(2), "lr": 0.0, "obj": None}
        state = {k: state[k] for k in keys}
        with single_process_intended():
            dcp.load(state, storage_reader=SafeFileSystemReader(directory), planner=planner, no_dist=True)
        return state

    loaded = load(SafeLoadPlanner(), ("w", "lr"))
    assert torch.equal(loaded["w"], torch.ones(2)) and loaded["lr"] == 0.25
    assert isinstance(load(DefaultLoadPlanner(), ("obj",))["obj"], Payload)  # the control: DCP's own planner builds it
    with pytest.raises(CheckpointException, match="Weights only load failed"):
        load(SafeLoadPlanner(), ("obj",))
