"""Print the oldest torch release pyproject.toml declares (``torch>=2.6`` prints ``2.6``), for the oldest-torch leg.

The leg reads the floor from here, so raising it in pyproject.toml moves the leg with it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def torch_floor(dependencies: list[str]) -> str:
    """The X.Y of the one ``torch>=X.Y`` requirement; a clear error for anything else.

    >>> torch_floor(["numpy>=1.24", "torch>=2.6", "rich>=13"])
    '2.6'
    """
    found = [m.group(1) for dep in dependencies if (m := re.fullmatch(r"torch\s*>=\s*(\d+\.\d+)(?:\.\d+)?(?:\s*,.*)?", dep.strip()))]
    if len(found) != 1:
        raise SystemExit(f"pyproject.toml must declare torch once as 'torch>=X.Y' (found {dependencies}); the oldest-torch leg reads it")
    return found[0]


if __name__ == "__main__":
    with PYPROJECT.open("rb") as f:
        print(torch_floor(tomllib.load(f)["project"]["dependencies"]))
    sys.exit(0)
