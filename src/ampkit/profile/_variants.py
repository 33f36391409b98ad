"""The DataLoader settings a loader trial varies, and the loader built with them: the same dataset, batching, order
and collation, only how the batches are made changed.

    >>> import torch
    >>> from torch.utils.data import TensorDataset
    >>> loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)
    >>> settings = dataclasses.replace(loader_settings(loader), num_workers=1)
    >>> settings.label(loader_settings(loader)), [b[0].tolist() for b in loader_variant(loader, settings)]
    ('num_workers=1', [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, Subset

__all__ = ["LoaderSettings", "loader_settings", "loader_variant"]


@dataclass(frozen=True)
class LoaderSettings:
    """The DataLoader settings a trial varies, and whether the loop copies its batches with ``non_blocking``."""

    num_workers: int = 0
    pin_memory: bool = False
    non_blocking: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    """Batches each worker keeps ready; None: DataLoader's default (2 with workers)."""
    torch_threads: int | None = None
    """``torch.set_num_threads`` for the training process while the loader runs; None: as it is."""

    def label(self, base: LoaderSettings) -> str:
        """What differs from ``base``, as the keyword arguments that set it ("as given" when nothing does).

        >>> LoaderSettings(num_workers=2, persistent_workers=True).label(LoaderSettings())
        'num_workers=2, persistent_workers=True'
        """
        changed = [
            f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(base, f.name)
        ]
        return ", ".join(changed) or "as given"

    def loader_kwargs(self) -> dict[str, Any]:
        """The DataLoader keywords of these settings (``non_blocking`` is the copy's, ``torch_threads`` the process's)."""
        kwargs: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                kwargs["prefetch_factor"] = self.prefetch_factor
        return kwargs


def loader_settings(loader: DataLoader[Any]) -> LoaderSettings:
    """The settings ``loader`` was built with (``non_blocking`` False: the loop's copy is not the loader's).

    >>> import torch
    >>> from torch.utils.data import TensorDataset
    >>> loader_settings(DataLoader(TensorDataset(torch.ones(4)), num_workers=2, persistent_workers=True))
    LoaderSettings(num_workers=2, pin_memory=False, non_blocking=False, persistent_workers=True, prefetch_factor=2, torch_threads=None)
    """
    return LoaderSettings(
        num_workers=loader.num_workers, pin_memory=loader.pin_memory, persistent_workers=loader.persistent_workers,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
    )


def loader_variant(loader: DataLoader[Any], settings: LoaderSettings, *, samples: int | None = None) -> DataLoader[Any]:
    """A DataLoader reading ``loader``'s dataset with the same batching, order and collation, set as ``settings``
    says; ``samples``: only the dataset's first that many items (a map-style dataset read in order).

    >>> import torch
    >>> from torch.utils.data import TensorDataset
    >>> variant = loader_variant(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4), LoaderSettings(num_workers=1))
    >>> [b[0].tolist() for b in variant]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    """
    dataset = loader.dataset
    batching: dict[str, Any]
    if samples is not None:
        if isinstance(dataset, IterableDataset) or loader.batch_size is None:
            raise ValueError("loader_variant(samples=...) reads a map-style dataset in order, in batches of batch_size.")
        dataset = Subset(dataset, range(min(samples, len(dataset))))  # type: ignore[arg-type]
        batching = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
    elif isinstance(dataset, IterableDataset):
        batching = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
    else:
        # The loader's own batch sampler keeps its order (a seeded shuffle stays seeded) and its batch size.
        batching = {"batch_sampler": loader.batch_sampler}
    return DataLoader(
        dataset, collate_fn=loader.collate_fn, worker_init_fn=loader.worker_init_fn, timeout=loader.timeout,
        multiprocessing_context=loader.multiprocessing_context, generator=loader.generator, **batching,
        **settings.loader_kwargs(),
    )
