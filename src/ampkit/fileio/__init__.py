"""File IO at the bottom of the library: atomic writes, safe ``torch.load`` of checkpoint files, RNG snapshots.

It imports nothing from ampkit but errors and the small utilities, so every layer above may use it. Importing this
package imports none of its modules (nor torch): each public name loads on first use.

    >>> import tempfile, os, torch
    >>> from ampkit.fileio import load_checkpoint, save_checkpoint
    >>> path = os.path.join(tempfile.mkdtemp(), "state.pt")
    >>> _ = save_checkpoint({"step": 3, "w": torch.ones(2)}, path)
    >>> load_checkpoint(path)["step"]
    3
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._util.lazy import lazy_names

if TYPE_CHECKING:
    from ._atomic import write_text_atomic
    from ._checkpoint_files import load_checkpoint, save_checkpoint
    from ._rng import capture_rng_state, check_rng_state, restore_rng_state
    from ._temporaries import remove_stale_temporaries

# Where each public name lives (its module, relative to this package): imported on the name's first use.
_NAMES = {
    "save_checkpoint": "_checkpoint_files",
    "load_checkpoint": "_checkpoint_files",
    "capture_rng_state": "_rng",
    "check_rng_state": "_rng",
    "restore_rng_state": "_rng",
    "write_text_atomic": "_atomic",
    "remove_stale_temporaries": "_temporaries",
}

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "capture_rng_state",
    "check_rng_state",
    "restore_rng_state",
    "write_text_atomic",
    "remove_stale_temporaries",
]

__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
