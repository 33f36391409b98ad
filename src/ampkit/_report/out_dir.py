"""The ``--out DIR`` folder of bench, doctor and profile: one JSON file of results, PNG figures, and a markdown
report that embeds them, written in that order so the report links only figures that exist.

Each tool brings its own writers (:mod:`ampkit.bench` for a bench result, :mod:`ampkit.numerics` for a
diagnosis, :mod:`ampkit.profile` for a profile); this module only fixes the layout and the order, so the commands
(and the profile's Python API) cannot drift apart.

    >>> import json, tempfile
    >>> from pathlib import Path
    >>> def write_json(path: Path) -> Path:
    ...     path.write_text(json.dumps({"loss": 0.5}))
    ...     return path
    >>> def write_report(data: dict, out: Path, plots: list[Path]) -> Path:
    ...     (out / "report.md").write_text(f"loss {data['loss']}, {len(plots)} figures")
    ...     return out / "report.md"
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     paths = write_out(Path(tmp) / "runs" / "a", "results.json", {"loss": 0.5}, write_json=write_json,
    ...                       write_plots=lambda data, out: [], write_report=write_report)
    ...     [p.name for p in paths], paths[1].read_text()
    (['results.json', 'report.md'], 'loss 0.5, 0 figures')
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["write_out"]

T = TypeVar("T")


def write_out(
    out: Path,
    json_name: str,
    subject: T,
    *,
    write_json: Callable[[Path], Path],
    write_plots: Callable[[T, Path], list[Path]],
    write_report: Callable[..., Path],
) -> tuple[Path, Path]:
    """Create ``out`` if missing; write ``out/json_name`` with ``write_json``, the figures of ``subject`` with
    ``write_plots``, then the report embedding them with ``write_report(subject, out, plots=...)``.

    Returns the JSON file and the report. ``out`` was checked for writability before the run
    (:func:`ampkit.cli._checks.writable_dir`); it is created here again in case it was removed meanwhile.
    """
    out.mkdir(parents=True, exist_ok=True)
    json_path = write_json(out / json_name)
    plots = write_plots(subject, out)
    return json_path, write_report(subject, out, plots=plots)
