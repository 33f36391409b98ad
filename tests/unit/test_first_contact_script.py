"""benchmarks/first_contact.py on the CPU: every first contact timed in order and printed as it is measured; the
CUDA-only one says so instead of a figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "first_contact.py"


def test_each_first_contact_is_timed_in_a_fresh_process_and_printed_as_measured(tmp_path: Path) -> None:
    out = tmp_path / "first_contact.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["what"] for r in rows] == [
        "import torch", "CUDA context", "first matmul, fp32", "first matmul, bf16", "first conv, forward + backward",
        "first torch.compile", "second torch.compile",
    ]
    cuda = rows[1]
    assert cuda["status"] == "n/a" and "seconds" not in cuda  # no figure where nothing was measured
    timed = [r for r in rows if r is not cuda]
    assert all(r["status"] == "ok" and r["seconds"] > 0 for r in timed), timed
    # a compile takes far longer than a matmul: the rows time what they name, not the same thing seven times
    assert rows[5]["seconds"] > 10 * rows[2]["seconds"]
    table = [line for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| first contact |")]
    assert [line.split("|")[1].strip() for line in table] == [r["what"] for r in rows]
    assert table[1].split("|")[2].strip() == "n/a" and table[0].split("|")[2].strip() == f"{rows[0]['seconds']:.2f}"
