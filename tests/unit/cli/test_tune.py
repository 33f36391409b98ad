"""``ampkit tune`` end to end on the CPU: the user's model and data tuned, its files written and resumed, bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ampkit.cli._main import build_parser, main

pytestmark = pytest.mark.usefixtures("quiet_machine")  # the tune measures differently on a busy machine

QUICK = ["--stages", "precision", "--precision", "bf16-mixed", "--rounds", "2", "--guard-steps", "6", "--no-progress", "--device", "cpu"]


def test_the_parser_takes_the_benchs_workload_flags_and_the_tunes_own() -> None:
    args = build_parser().parse_args(["tune", "-w", "digits", "--size", "tiny", "--budget", "120", "--out", "x"])
    assert (args.workload, args.size, args.budget, args.run_steps, args.out, args.rounds, args.chunk) == ("digits", "tiny", 120, 1000, Path("x"), 4, 3)
    assert args.model is None and args.data is None and args.device is None and args.guard_steps is None


def test_a_tune_of_the_users_model_writes_its_files_and_a_second_run_resumes_them(
    user: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], log_table: Callable[..., tuple[list[str], list[list[str]]]],
) -> None:
    argv = ["tune", "--model", f"{user}:model", "--data", f"{user}:data", "--out", str(tmp_path), *QUICK]
    assert main(argv) == 0
    out = capsys.readouterr().out
    headers, body = log_table(out)
    assert headers == ["configuration", "throughput", "start then", "speed-up", "MFU", "compile", "rounds", "peak memory", "accuracy", "verdict", "why"]
    assert {row[0] for row in body} == {"as given", "precision bf16-mixed"}
    assert "engine = ampkit.Engine(" in out
    data = json.loads((tmp_path / "tune.json").read_text())
    assert data["command"].startswith("ampkit tune --model") and (tmp_path / "report.md").exists() and (tmp_path / "trials.json").exists()
    assert main(argv) == 0
    again = capsys.readouterr().out
    assert "(resumed)" in again and "1 trial(s) read back from an earlier run" in again


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--stages", "precision,batch"], "--stages precision,batch: the stages are fit, loader, channels_last, precision, compile, fused_step, micro_batch, threads."),
        (["--precision", "tf32"], "--precision tf32 can run"),
    ],
)
def test_bad_input_is_refused_naming_the_fix(user: str, cli_error: Callable[[list[str]], str], extra: list[str], message: str) -> None:
    err = cli_error(["tune", "--model", f"{user}:model", "--data", f"{user}:data", "--device", "cpu", *extra])
    assert message in err or "cannot run on cpu" in err


def test_a_budget_too_small_names_the_minimum(user: str, cli_error: Callable[[list[str]], str]) -> None:
    # 5000 guard steps: the guard's three runs alone outlast a second of budget, whatever the machine.
    err = cli_error(["tune", "--model", f"{user}:model", "--data", f"{user}:data", "--budget", "1", *QUICK, "--guard-steps", "5000"])
    assert "--budget 1 s is too small for the least useful answer for cli_user:model here" in err and "or more." in err
