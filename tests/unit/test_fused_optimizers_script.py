"""benchmarks/fused_optimizers.py in smoke mode on the CPU: every row gets a computed verdict, and the verdicts agree
with what kernel_guards knows about torch's fused kernels (no number is expected; the script measures them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import redirect_stdout
from io import StringIO
from types import ModuleType

import pytest

from ampkit.training._kernel_guards import KNOWN_DEFECTS, torch_affected

DEFECTS = {d.name: d for d in KNOWN_DEFECTS}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory, load_script: Callable[..., ModuleType]) -> tuple[int, dict, str]:
    """One smoke run shared by the tests below (its main function, in process, as CI's smoke command runs it)."""
    out = tmp_path_factory.mktemp("fused") / "rows.json"
    with pytest.MonkeyPatch.context() as monkeypatch:
        script = load_script("fused_optimizers", monkeypatch)
        printed = StringIO()
        with redirect_stdout(printed):
            rc = script.main(["--device", "cpu", "--smoke", "--json", str(out)])
    return rc, json.loads(out.read_text()), printed.getvalue()


def rows_by_key(data: dict) -> dict[tuple[str, str], dict]:
    return {(r["optimizer"], r["dtype"]): r for r in data["rows"]}


def test_every_optimizer_and_dtype_gets_a_computed_verdict(smoke) -> None:
    rc, data, printed = smoke
    assert rc == 0  # mismatches are findings, not failures
    rows = rows_by_key(data)
    assert set(rows) == {(o, d) for o in ("Adam", "AdamW", "SGD momentum", "Adagrad") for d in ("fp32", "fp16", "bf16")}
    for key, r in rows.items():
        assert r["verdict"] in {"match", "MISMATCH", "unsupported", "torch refuses"}, key
        if r["verdict"] == "unsupported":
            assert r["note"].startswith("no fused kernel"), key
            continue
        assert r["unfused_skipped"] == 2 and r["ampkit_skipped"] is not None, key  # the two injected overflows
        assert r["ampkit_verdict"].split()[0] in {"match", "MISMATCH"}, key
    # The Markdown table comes last, one line per row.
    lines = printed.strip().splitlines()
    assert lines[-len(rows) - 2].startswith("| optimizer |") and all(line.startswith("| ") for line in lines[-len(rows) :])


def test_a_correct_fused_kernel_is_reported_as_a_match(smoke) -> None:
    # Adam's CPU fused kernel has no known defect: the verdict must be able to say "match".
    r = rows_by_key(smoke[1])[("Adam", "fp32")]
    assert r["verdict"] == "match" and r["fused_skipped"] == r["unfused_skipped"] == 2
    assert r["ampkit_verdict"] == "match"


def test_known_fused_sgd_defects_show_as_torch_mismatches_that_ampkit_avoids(smoke) -> None:
    rows = rows_by_key(smoke[1])
    # The overflowed first step leaves fused SGD's momentum uninitialised on every torch (kernel_guards' table).
    assert torch_affected(DEFECTS["fused-sgd-skipped-first-step"])
    for dtype in ("fp32", "fp16", "bf16"):
        r = rows[("SGD momentum", dtype)]
        assert r["verdict"] == "MISMATCH" and r["state_match"].startswith("no"), dtype
        assert r["ampkit_verdict"] == "match", dtype
    if torch_affected(DEFECTS["fused-sgd-cpu-16bit"]):
        # On torch < 2.14 the CPU kernel also leaves 16-bit vector blocks un-updated: ampkit switches to foreach.
        for dtype in ("fp16", "bf16"):
            assert rows[("SGD momentum", dtype)]["ampkit_max_dparam"] == 0.0
