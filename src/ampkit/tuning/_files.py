"""A tune's files in ``--out``: ``tune.json``, the two plots, and ``report.md`` linking them, in that order (the
shared :func:`ampkit._report.out_dir.write_out`, as bench, doctor and profile write theirs).

Without matplotlib the plots are not drawn and report.md says so, with the install line: the table, the winner and
``tune.json`` stand on their own.

    >>> import tempfile
    >>> from ampkit.tuning import Candidate, TuneResult
    >>> start = Candidate(policy="32-true", micro_batch=8, accumulate=1)
    >>> result = TuneResult(workload="toy", description="", device={"type": "cpu"}, unit="samples", items_per_step=8,
    ...                     run_steps=100, budget_s=60, start=start, baseline=start, winner=start)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = write_files(result, Path(tmp))
    ...     sorted(p.name for p in Path(tmp).iterdir())
    ['loss_curves.png', 'report.md', 'speed_memory.png', 'tune.json']
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import AmpkitError
from .._report.out_dir import write_out
from ..fileio._atomic import write_text_atomic
from ._report import code, rows, write_report

if TYPE_CHECKING:
    from ._result import TuneResult

__all__ = ["write_files"]

log = logging.getLogger("ampkit")


def write_files(result: TuneResult, out: Path) -> tuple[Path, Path]:
    """``tune.json``, ``speed_memory.png``, ``loss_curves.png`` and ``report.md`` in ``out`` (created if missing);
    returns the JSON file and the report."""
    from ._plots import write_plots

    missing: list[str] = []

    def write_json(path: Path) -> Path:
        data = {**result.to_dict(), "rows": rows(result), "winner_code": code(result)}
        return write_text_atomic(path, json.dumps(data, indent=1, default=str))

    def plots(subject: TuneResult, folder: Path) -> list[Path]:
        try:
            return write_plots(subject, folder)
        except AmpkitError as exc:  # no matplotlib: the report says so instead of failing the tune's output
            log.warning("tune: %s; writing no plots", exc)
            missing.append(str(exc))
            return []

    def report(subject: TuneResult, folder: Path, plots: list[Path]) -> Path:
        return write_report(subject, folder, plots=plots, plots_note=missing[0] if missing else None)

    return write_out(Path(out), "tune.json", result, write_json=write_json, write_plots=plots, write_report=report)
