"""Checks of command-line input shared by the subcommands, made where the value enters.

Numbers are checked by argparse ``type`` functions (a bad one is a usage error, exit 2, before anything runs);
the values that need more than a number's syntax, but no torch, by :func:`check_before_import`, before the
command imports torch (which takes seconds); output directories are checked for writability before a run, so a
long run never ends by losing its results to a path it cannot write.

    >>> positive("3"), non_negative("0"), memory_size("1KiB")
    (3, 0, 1024)
    >>> positive("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be an integer from 1 to 2147483647, got 0
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

from .._errors import PolicyError
from .._util.policy_names import canonical_name, unknown_precision
from .._util.values import check_lr, check_tolerance, clip_from

__all__ = ["MAX_COUNT", "check_before_import", "device_text", "memory_size", "non_negative", "positive", "writable_dir"]

MAX_COUNT = 2**31 - 1
"""Largest count (steps, batch size, processes) accepted: beyond it tensor sizes and loops stop making sense,
and torch cannot even hold some of them (a batch of 2**64 overflows its int64 sizes)."""


def _int_in(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not low <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be an integer from {low} to {MAX_COUNT}, got {value}")
    return value


def positive(text: str) -> int:
    """An integer from 1 to :data:`MAX_COUNT` (argparse ``type``)."""
    return _int_in(text, 1)


def non_negative(text: str) -> int:
    """An integer from 0 to :data:`MAX_COUNT` (argparse ``type``)."""
    return _int_in(text, 0)


def memory_size(text: str) -> int:
    """A memory size such as ``24GiB`` as a positive number of bytes (argparse ``type``).

    >>> memory_size("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be more than 0 bytes, e.g. 24GiB or 80GB; got '0'
    """
    # Here, not at the top: the parsers (and --help) import this module.
    from ..memory._fit import parse_bytes

    try:
        value = parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 bytes, e.g. 24GiB or 80GB; got {text!r}")
    return value


def writable_dir(path: Path | None, option: str) -> None:
    """Create ``path`` (the directory of ``option``) if missing and prove a file can be written in it.

    Raises ValueError naming the option and the cause; does nothing for None. The probe file is removed.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     writable_dir(pathlib.Path(tmp) / "runs" / "a", "--out")
    ...     sorted(p.name for p in pathlib.Path(tmp, "runs", "a").iterdir())
    []
    """
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is a file; give a directory (it is created if missing).")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".ampkit-write-probe-"):
            pass  # created and removed on close: the directory takes new files
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ValueError(f"{option} {path} cannot be written ({reason}); give a directory you can write to.") from exc


_DEVICE = re.compile(r"(cpu|cuda)(:[0-9]+)?")


def device_text(text: str, *, command: str, predicts: bool = False) -> None:
    """Refuse a ``--device`` of ``ampkit command`` that is neither cpu, cuda nor cuda:N, naming the fix (ValueError).

    Imports nothing: whether CUDA is there is the command's to check, once torch is imported.

    >>> device_text("gpu", command="bench")
    Traceback (most recent call last):
    ...
    ValueError: --device gpu: ampkit bench runs on cpu, cuda or cuda:N.
    """
    if _DEVICE.fullmatch(text) is None:
        where = "predicts for cpu or cuda" if predicts else "runs on cpu, cuda or cuda:N"
        raise ValueError(f"--device {text}: ampkit {command} {where}.")


def check_before_import(args: argparse.Namespace) -> None:
    """Refuse what a command's arguments get wrong that can be told without torch: an unknown policy name in
    ``--precision`` (naming the closest), a ``--device`` that is no device, a ``--tolerance``, ``--clip`` or ``--lr``
    out of range. Raises PolicyError or ValueError naming the fix; the command checks the rest once torch is in.

    >>> check_before_import(argparse.Namespace(command="bench", precision="bf16,fp16-mixed"))
    Traceback (most recent call last):
    ...
    ampkit.PolicyError: Unknown precision 'fp16-mixed'. Did you mean '16-mixed'? Valid: 32-true, tf32, ...
    """
    precision = getattr(args, "precision", None)
    if precision is not None:
        for part in precision.split(","):
            if part.strip() and canonical_name(part) is None:
                raise PolicyError(unknown_precision(part.strip()))
    if getattr(args, "device", None) is not None:
        device_text(args.device, command=args.command, predicts=args.command == "memory")
    if getattr(args, "tolerance", None) is not None:
        check_tolerance(args.tolerance, "--tolerance")
    if getattr(args, "clip", None) is not None:
        clip_from(args.clip)
    if getattr(args, "lr", None) is not None:
        check_lr(args.lr)
