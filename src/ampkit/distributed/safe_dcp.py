"""Reading torch.distributed.checkpoint (DCP) directories without running code from them.

DCP's own reader unpickles the ``.metadata`` file with plain ``pickle`` and its default planner loads
non-tensor values with ``torch.load(weights_only=False)``: a checkpoint from elsewhere could run code. These two
drop-in replacements (DCP's documented extension points) refuse every global but DCP's metadata records,
torch dtypes and sizes, and load values with ``weights_only=True``.

    >>> import io, pickle
    >>> _RestrictedUnpickler(io.BytesIO(pickle.dumps(torch.Size([2, 3])))).load()
    torch.Size([2, 3])
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner itself uses
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from ..errors import CheckpointError

__all__ = ["SafeFileSystemReader", "SafeLoadPlanner"]

_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_OTHER = {("torch.serialization", "_get_layout"), ("collections", "OrderedDict"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath")}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _DCP_MODULES and not name.startswith("__"):
            found = super().find_class(module, name)
            if isinstance(found, type):  # records and enums only, no functions
                return found
        if module == "torch":
            found = getattr(torch, name, None)
            if isinstance(found, torch.dtype) or found is torch.Size:
                return found
        if (module, name) in _OTHER:
            return super().find_class(module, name)
        raise CheckpointError(f"the checkpoint's metadata refers to {module}.{name}, which a safe load refuses; was it written by torch.distributed.checkpoint?")


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose metadata is unpickled with an allow-list of DCP's own record types."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        path = self._get_metadata_path(rank)
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _RestrictedUnpickler(stream).load()
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path} does not hold torch.distributed.checkpoint metadata.")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that loads non-tensor values (optimizer settings) with ``weights_only=True``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], torch.load(value, weights_only=True))
        else:
            self.state_dict[read_item.dest_index.fqn] = torch.load(value, weights_only=True)
