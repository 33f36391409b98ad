"""Reading torch.distributed.checkpoint (DCP) directories without running code from them.

DCP's own reader unpickles the ``.metadata`` file with plain ``pickle`` and its default planner loads
non-tensor values with ``torch.load(weights_only=False)``: a checkpoint from elsewhere could run code. These two
drop-in replacements (DCP's documented extension points) unpickle the metadata through an allow-list of exact
objects and load values with ``weights_only=True``.

The allow-list names objects, never modules: pickle resolves a dotted name such as
``torch.distributed.checkpoint.filesystem`` + ``io.FileIO`` through the attributes of whatever that module
imported, so "any class of DCP's modules" would admit ``io.FileIO``, ``operator.methodcaller`` and the like.
Each ``(module, name)`` pair that DCP actually writes maps to one object, and nothing else resolves.

    >>> import io, pickle
    >>> _RestrictedUnpickler(io.BytesIO(pickle.dumps(torch.Size([2, 3])))).load()
    torch.Size([2, 3])
    >>> try:
    ...     _RestrictedUnpickler(io.BytesIO(pickle.dumps(io.BytesIO))).load()
    ... except CheckpointError as refused:
    ...     print(str(refused)[:60])
    the checkpoint's metadata refers to _io.BytesIO, which a saf
"""

from __future__ import annotations

import collections
import io
import os
import pathlib
import pickle
from typing import Any, TypeGuard

import torch
from torch.distributed.checkpoint import FileSystemReader, filesystem as _dcp_filesystem, metadata as _dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from .._compat import dcp_metadata_path, serialization_get_layout, set_element
from .._errors import CheckpointError

__all__ = ["SafeFileSystemReader", "SafeLoadPlanner", "storage_files"]


def _allowed_globals() -> dict[tuple[str, str], Any]:
    """Every ``(module, name)`` a DCP ``.metadata`` file written by torch may name, and the object it means."""
    records = [
        _dcp_metadata.Metadata,
        _dcp_metadata.MetadataIndex,
        _dcp_metadata.StorageMeta,
        _dcp_metadata.TensorStorageMetadata,
        _dcp_metadata.BytesStorageMetadata,
        _dcp_metadata.ChunkStorageMetadata,
        _dcp_metadata.TensorProperties,
        _dcp_metadata._MEM_FORMAT_ENCODING,
        _dcp_filesystem._StorageInfo,
    ]
    allowed: dict[tuple[str, str], Any] = {(r.__module__, r.__qualname__): r for r in records}
    allowed[("torch", "Size")] = torch.Size
    allowed.update({("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)})
    # torch pickles a layout (torch.strided) as a call of this lookup by name; it only reads a table.
    allowed[("torch.serialization", "_get_layout")] = serialization_get_layout
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    # StorageMeta.checkpoint_id may be a path. Python 3.13 moved the classes to pathlib._local; a path of the
    # other operating system cannot be instantiated here, so it becomes its pure (inert) twin.
    for module in ("pathlib", "pathlib._local"):
        for flavour in ("Posix", "Windows"):
            pure = getattr(pathlib, f"Pure{flavour}Path")
            native = (flavour == "Windows") == (os.name == "nt")
            allowed[(module, f"Pure{flavour}Path")] = pure
            allowed[(module, f"{flavour}Path")] = getattr(pathlib, f"{flavour}Path") if native else pure
    return allowed


_ALLOWED = _allowed_globals()


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # An exact lookup: pickle's own find_class would walk a dotted name through attributes, and import the
        # module, both of which are ways for a file to reach objects nobody allowed.
        found = _ALLOWED.get((module, name))
        if found is None:
            raise CheckpointError(
                f"the checkpoint's metadata refers to {module}.{name}, which a safe load refuses; only "
                "torch.distributed.checkpoint's own metadata records can be read. Was the directory written by "
                "engine.save() (torch.distributed.checkpoint)? Do not load files from an untrusted source otherwise."
            )
        return found


def storage_files(metadata: Metadata) -> dict[str, int]:
    """The data files ``metadata`` reads from, each with the least size it must have (largest offset + length).

    Every name must be a plain file name inside the checkpoint directory: metadata that points elsewhere
    (``../x``, an absolute path) is refused, since the reader would otherwise open files outside it.
    """
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not (_plain_file_name(name) and _byte_count(offset) and _byte_count(length)):
            raise CheckpointError(
                f"the checkpoint's metadata names the data location {name!r} (offset {offset!r}, length {length!r}), "
                "which is not a file inside the checkpoint directory; the metadata is corrupt or crafted."
            )
        needed[name] = max(needed.get(name, 0), offset + length)
    return needed


def _plain_file_name(name: object) -> TypeGuard[str]:
    return isinstance(name, str) and name not in ("", ".", "..") and os.path.basename(name) == name and "\\" not in name


def _byte_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose metadata is unpickled through an exact allow-list of DCP's record types."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        path = dcp_metadata_path(self, rank)
        with self.fs.create_stream(path, "rb") as stream:
            try:
                metadata = _RestrictedUnpickler(stream).load()
            except CheckpointError:
                raise
            except Exception as exc:  # any unpickling failure means a damaged file
                raise CheckpointError(f"{path} is truncated or corrupt ({type(exc).__name__}: {exc}); load an earlier checkpoint.") from exc
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path} does not hold torch.distributed.checkpoint metadata.")
        storage_files(metadata)  # refuse locations outside the directory before anything is read
        if metadata.storage_meta is None:
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
