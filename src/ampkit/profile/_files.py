"""A profile's files and terminal view for the Python API, as ``ampkit profile`` writes and prints them.

    >>> import tempfile
    >>> from pathlib import Path
    >>> data = {"workload": {"name": "toy"}, "steps": 2, "step_s": {"median": 0.1},
    ...         "phases": {"data": {"median_s": 0.06, "share": 0.6}, "forward": {"median_s": 0.04, "share": 0.4}},
    ...         "per_step": [{"data": 0.06, "forward": 0.04, "total": 0.1}] * 2}
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     sorted(p.name for p in save_profile(data, Path(tmp) / "prof"))
    ['profile.json', 'report.md']
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .._report.out_dir import write_out
from ..fileio._atomic import write_text_atomic

__all__ = ["save_profile", "show_profile"]


def save_profile(data: dict[str, Any], out: str | Path) -> tuple[Path, Path]:
    """Write ``data`` (a :meth:`Profiler.result <ampkit.profile.Profiler.result>` or ``profile.json`` dict) into
    ``out``: ``profile.json``, the plots and ``report.md``; returns the JSON file and the report."""
    from ._plots import write_plots
    from ._report import write_report

    def write_json(path: Path) -> Path:
        return write_text_atomic(path, json.dumps(data, indent=2) + "\n")

    return write_out(Path(out), "profile.json", data, write_json=write_json, write_plots=write_plots, write_report=write_report)


def show_profile(data: dict[str, Any]) -> None:
    """Print ``data``'s table and advice to the terminal, as ``ampkit profile`` does."""
    from rich.console import Console

    from ._table import render

    render(data, Console())
