"""Trials kept on disk (``--out DIR/trials.json``), so a tune that was killed resumes where it stopped.

The file is rewritten whole after each wave of trials and each accuracy-guard run (written to a temporary file and
renamed over the old one, so a kill mid-write leaves the previous file intact). A wave is stored under its stage
and the configuration it varied; a guard run under the configuration's numerics. A later tune with the same
``--out`` reads them back instead of measuring them again, provided it tunes the same thing: the file records a
**fingerprint** (workload, device, seed, trial lengths, versions), and a different one is refused with the fix.

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> store = TrialStore(out, {"workload": "digits"})
    >>> store.put_wave("precision|a", [{"key": "b"}]); TrialStore(out, {"workload": "digits"}).wave("precision|a")
    [{'key': 'b'}]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["TRIALS_FILE", "TrialStore"]

TRIALS_FILE = "trials.json"


class TrialStore:
    """The trials of one tune under ``out`` (None: kept in memory only), for ``fingerprint``."""

    def __init__(self, out: Path | None, fingerprint: dict[str, Any]) -> None:
        self.path = None if out is None else Path(out) / TRIALS_FILE
        self.fingerprint = fingerprint
        self.data: dict[str, Any] = {"fingerprint": fingerprint, "waves": {}, "guard": {}, "loader": {}}
        if self.path is not None and self.path.exists():
            stored = json.loads(self.path.read_text(encoding="utf-8"))
            if stored.get("fingerprint") != fingerprint:
                differ = sorted(k for k in {**fingerprint, **stored.get("fingerprint", {})} if stored.get("fingerprint", {}).get(k) != fingerprint.get(k))
                raise ValueError(
                    f"{self.path} holds the trials of another tune (it differs in {', '.join(differ)}); pass another --out, "
                    f"or delete {self.path} to start this one afresh."
                )
            self.data = stored

    def wave(self, key: str) -> list[dict[str, Any]] | None:
        found: list[dict[str, Any]] | None = self.data["waves"].get(key)
        return found

    def put_wave(self, key: str, trials: list[dict[str, Any]]) -> None:
        self.data["waves"][key] = trials
        self._save()

    def guard(self, key: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.data["guard"].get(key)
        return found

    def put_guard(self, key: str, result: dict[str, Any]) -> None:
        self.data["guard"][key] = result
        self._save()

    def loader(self, key: str) -> list[dict[str, Any]] | None:
        found: list[dict[str, Any]] | None = self.data["loader"].get(key)
        return found

    def put_loader(self, key: str, trials: list[dict[str, Any]]) -> None:
        self.data["loader"][key] = trials
        self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1), encoding="utf-8")
        os.replace(tmp, self.path)  # atomic on POSIX and Windows: a kill leaves the old file or the new one
