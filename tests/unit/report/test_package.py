"""Importing the report layer costs no heavy dependency: matplotlib and rich load only when a function needs them."""

from __future__ import annotations

import json
import subprocess
import sys


def test_importing_the_report_layer_loads_neither_matplotlib_nor_rich() -> None:
    # A fresh interpreter: in the test process every module is already imported and would hide an eager import.
    code = (
        "import ampkit._report, ampkit._report.figures, ampkit._report.markdown, ampkit._report.tables\n"
        "import json, sys\nprint(json.dumps(sorted(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert "ampkit._report.tables" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("matplotlib", "rich")] == []
