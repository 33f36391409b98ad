"""Which training framework an object comes from, told without importing any framework.

An object can only be a ``LightningModule``, a ``transformers.PreTrainedModel`` or a ``datasets.Dataset`` if its
package is already imported (its class lives there), so each check looks in ``sys.modules`` first and never imports:
``import ampkit`` and every tool run on plain torch objects load none of these packages.

What is recorded in ``Workload.extra`` for the advice that names the user's framework (:func:`framework_facts`):
``framework`` is ``"transformers"`` for a Hugging Face model, ``"lightning"`` for a LightningModule, absent otherwise;
a Hugging Face model adds ``supports_gradient_checkpointing`` (the model's own attribute).

    >>> from torch import nn
    >>> framework_facts(nn.Linear(2, 2)), is_lightning_module(nn.Linear(2, 2)), is_hf_dataset([1, 2])
    ({}, False, False)
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = [
    "framework_facts", "is_datamodule", "is_hf_dataset", "is_hf_dataset_dict", "is_hf_model", "is_lightning_module", "lightning_package",
]

# The two names Lightning ships under: the unified package (``lightning.pytorch``) and the standalone one.
_LIGHTNING = ("lightning.pytorch", "pytorch_lightning")


def _classes(attribute: str) -> list[tuple[str, type]]:
    """``attribute`` of each Lightning package already imported, with the package's name."""
    found = []
    for name in _LIGHTNING:
        module = sys.modules.get(name)
        cls = getattr(module, attribute, None) if module is not None else None
        if isinstance(cls, type):
            found.append((name, cls))
    return found


def lightning_package(obj: Any) -> str | None:
    """The Lightning package whose ``LightningModule`` ``obj`` is (``lightning.pytorch`` or ``pytorch_lightning``), or None."""
    return next((name for name, cls in _classes("LightningModule") if isinstance(obj, cls)), None)


def is_lightning_module(obj: Any) -> bool:
    """Whether ``obj`` is a LightningModule (of either package)."""
    return lightning_package(obj) is not None


def is_datamodule(obj: Any) -> bool:
    """Whether ``obj`` is a LightningDataModule (of either package)."""
    return any(isinstance(obj, cls) for _, cls in _classes("LightningDataModule"))


def is_hf_model(obj: Any) -> bool:
    """Whether ``obj`` is a ``transformers.PreTrainedModel``."""
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return False
    # transformers resolves its top-level names lazily: PreTrainedModel is read only once the package is imported.
    return isinstance(obj, transformers.PreTrainedModel)


def is_hf_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a map-style ``datasets.Dataset``."""
    datasets = sys.modules.get("datasets")
    return datasets is not None and isinstance(obj, datasets.Dataset)


def is_hf_dataset_dict(obj: Any) -> bool:
    """Whether ``obj`` is a ``datasets.DatasetDict`` (splits by name)."""
    datasets = sys.modules.get("datasets")
    return datasets is not None and isinstance(obj, datasets.DatasetDict)


def framework_facts(model: Any) -> dict[str, Any]:
    """What ``Workload.extra`` records of the framework ``model`` comes from (see the module's docstring)."""
    if is_lightning_module(model):
        return {"framework": "lightning"}
    if is_hf_model(model):
        return {"framework": "transformers", "supports_gradient_checkpointing": bool(getattr(model, "supports_gradient_checkpointing", False))}
    return {}
