r"""What a file that is not a checkpoint is, so that loading one says so instead of calling it a damaged checkpoint.

``torch.save`` writes a zip archive (``PK\x03\x04``) or, in its legacy format, a pickle (``\x80``); anything else
handed to ``engine.load()`` (a log, a config, a safetensors file of weights) is not a cut-off checkpoint and
"load an earlier checkpoint" would send its user the wrong way. Read only when a load has failed already.

    >>> import pathlib, tempfile
    >>> notes = pathlib.Path(tempfile.mkdtemp()) / "notes.txt"; _ = notes.write_text("epoch 3: loss 0.41\n")
    >>> print(str(not_a_checkpoint(notes)).partition("notes.txt ")[2])  # doctest: +ELLIPSIS
    is not a checkpoint: it holds text ('epoch 3: loss 0.41'), not the zip archive engine.save() writes. ...
"""

from __future__ import annotations

import os
import pathlib

from .._errors import CheckpointError

__all__ = ["not_a_checkpoint"]

_TORCH_STARTS = (b"PK\x03\x04", b"\x80")  # torch.save's zip archive; its legacy pickle format


def not_a_checkpoint(path: str | os.PathLike[str]) -> CheckpointError | None:
    """The error for a file at ``path`` that no ``torch.save`` wrote (None for one that it may have, or no file)."""
    file = pathlib.Path(path)
    try:
        with file.open("rb") as f:
            head = f.read(256)
    except OSError:
        return None  # missing, a directory, unreadable: the loader's own message says which
    if not head or head.startswith(_TORCH_STARTS):
        return None  # empty or torch's: cut off or damaged, as the loader says
    fix = "Pass the path engine.save(path) was given (ampkit.checkpoint_exists(path) tests one)."
    if len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100_000_000:
        what = "a safetensors file of weights"
        fix = "To start from these weights, load them into the model before engine.setup(): model.load_state_dict(safetensors.torch.load_file(path))."
    else:
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and all(c.isprintable() or c in "\n\r\t" for c in text.rstrip("\x00")):
            first = text.strip().splitlines()[0][:60] if text.strip() else ""
            what = f"text ({first!r})"
        else:
            what = f"data of another format (it starts {head[:8]!r})"
    return CheckpointError(
        f"{file} is not a checkpoint: it holds {what}, not the zip archive engine.save() writes. {fix}"
    )
