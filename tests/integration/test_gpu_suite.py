"""benchmarks/gpu_suite.py: its CPU smoke mode runs every step end to end (so the suite cannot rot between GPU
windows), and its own machinery (limits, digests, refusals) does what it says. No GPU result is asserted here."""

from __future__ import annotations

import dataclasses
import doctest
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any
from xml.etree import ElementTree

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def suite(load_script: Callable[..., ModuleType]) -> ModuleType:
    return load_script("gpu_suite")


# Steps whose smoke run (the same script, --smoke, on the CPU) a test of its own already makes in CI. The suite's
# CI test runs the others through the suite. (A slow test ran the whole suite's smoke once more, every step: since CI
# runs every test, that only repeated these smoke runs, 77 s of CI's 30 minutes, and it went in issue 48.)
SMOKED_ELSEWHERE = {
    "first_contact": "tests/unit/test_first_contact_script.py",
    "fused_optimizers": "tests/unit/test_fused_optimizers_script.py",
    "cnn": "tests/unit/bench/test_cnn_throughput_script.py",
    "engine_overhead": "tests/unit/bench/test_engine_overhead_script.py",
    "memory_prediction": "tests/unit/bench/test_memory.py",
    "doctor": "tests/unit/numerics/test_benchmarks.py",
    "numerics_sampler": "tests/unit/numerics/test_benchmarks.py",
    "apex": "tests/integration/test_legacy_apex_overhead.py",
    "optimizer_steps": "tests/unit/test_lowbit_step_script.py",
    "profile": "tests/unit/test_profile_advice_script.py",
    "fp8": "tests/unit/test_fp8_training_script.py",
    # The CLI's own tune of a tiny model end to end (files written, a second run resuming them): the same command.
    "tune": "tests/unit/cli/test_tune.py",
}


def test_every_step_is_smoked_in_ci_by_the_suite_or_by_a_test_of_its_script(suite: ModuleType) -> None:
    for step in suite.STEPS:
        if step.name not in SMOKED_ELSEWHERE:
            continue  # smoked through the suite in the next test
        # A script's name, or the ampkit command a `-m ampkit CMD` step runs.
        script = step.smoke[2] if step.smoke[:2] == ("-m", "ampkit") else Path(step.smoke[0]).name
        test = (ROOT / SMOKED_ELSEWHERE[step.name]).read_text()
        # A script without a smoke mode (its CPU run is short as it is) is run as the suite runs it.
        smoked = "--smoke" in test or "--smoke" not in step.smoke
        assert Path(script).stem in test and smoked, f"{step.name}: no smoke test of {script} in {SMOKED_ELSEWHERE[step.name]}"


PLANTED = "def test_planted_failure():\n    assert 1 + 1 == 3, 'planted: the summary must name this test'\n"


def test_smoke_mode_runs_the_other_steps_and_names_a_failing_test_as_it_is_reported(
    suite: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tests step (its smoke files, under xdist and the timeouts as on the GPU) plus a failing test in a file of
    # its own: the failure must be in the suite's failure file (written as reported, by the controller alone),
    # in its junit XML, and listed under the tests step in summary.md; the other tests still pass.
    planted = tmp_path / "test_planted.py"
    planted.write_text(PLANTED)
    steps = tuple(dataclasses.replace(s, smoke=(*s.smoke, str(planted))) if s.name == "tests" else s for s in suite.STEPS)
    monkeypatch.setattr(suite, "STEPS", steps)
    out = tmp_path / "suite"
    others = [s.name for s in suite.STEPS if s.name not in SMOKED_ELSEWHERE]
    code = suite.main(["--device", "cpu", "--smoke", "--only", ",".join(others), "--out", str(out)])
    summary = (out / "summary.md").read_text()
    assert code == 1 and "| tests | failed |" in summary, summary
    recorded = (out / suite.FAILURE_LOG).read_text().splitlines()
    # once (the controller writes, not the workers too); a file outside the rootdir has pytest's node id "::name"
    assert len(recorded) == 1 and re.fullmatch(r"FAILED \S*::test_planted_failure - AssertionError: planted: the summary must name this test", recorded[0])
    tests = summary.split("## tests")[1].split("\n## ")[0]
    assert f"- {recorded[0]}" in tests and re.search(r"\*\*1 failed, \d+ passed", tests), tests
    junit = ElementTree.parse(out / suite.JUNIT_XML).getroot()
    assert sum(int(s.get("failures")) for s in junit.iter("testsuite")) == 1
    _check_folder(suite, out, 0, [s for s in suite.STEPS if s.name in others and s.name != "tests"])
    bench_log = next(out.glob("*-bench.log")).read_text()
    assert re.search(r"^\[\d+:\d\d\] \d+/\d+ steps: bf16-mixed: done$", bench_log, re.MULTILINE), "the bench's progress lines are in its log"


def _check_folder(suite: ModuleType, out: Path, code: int, steps: Sequence[Any]) -> None:
    summary = (out / "summary.md").read_text()
    assert code == 0, summary
    for step in steps:
        assert f"| {step.name} | ok |" in summary, step.name
        (log,) = out.glob(f"*-{step.name}.log")
        assert log.read_text().startswith("$ "), "each log starts with the exact command"
        if step.writes_json:
            json.loads((out / f"{step.name}.json").read_text())  # each benchmark's rows, machine-readable
    assert json.loads((out / "bench" / "results.json").read_text())["device"]["type"] == "cpu"
    if any(step.name == "tune" for step in steps):  # the tune writes tune.json in its --out, and the summary shows its table
        assert json.loads((out / "tune" / "tune.json").read_text())["device"]["type"] == "cpu"
        assert "| configuration | throughput |" in summary.split("## tune")[1]
    env = json.loads((out / "env.json").read_text())
    assert env["torch"] and env["python"] and env["device"] == "cpu"
    assert "passed" in summary.split("## tests")[1].split("##")[0], "the pytest digest shows the pass's counts"
    assert (out / suite.FAILURE_LOG).exists(), "the tests step writes its failure file, empty when none failed"


def test_a_step_past_its_limit_is_killed_and_keeps_what_it_printed(suite: ModuleType, tmp_path: Path) -> None:
    step = suite.Step("slow", "sleeps", (), (), budget_s=1, writes_json=False)
    code = "import time; print('started', flush=True); time.sleep(60)"
    result = suite.run_step(step, [sys.executable, "-c", code], tmp_path / "slow.log", timeout_s=2)
    assert result.status == "timeout" and result.seconds < 30
    assert "started" in (tmp_path / "slow.log").read_text()


def test_a_failing_step_is_recorded_and_the_suite_exits_1(suite: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = suite.Step("broken", "raises", ("-c", "raise SystemExit(3)"), ("-c", "raise SystemExit(3)"), budget_s=10, writes_json=False)
    monkeypatch.setattr(suite, "STEPS", (broken,))
    monkeypatch.setattr(suite, "command_for", lambda step, device, smoke, out: [sys.executable, *step.smoke])
    assert suite.main(["--device", "cpu", "--smoke", "--out", str(tmp_path / "s")]) == 1
    summary = (tmp_path / "s" / "summary.md").read_text()
    assert "| broken | failed |" in summary and "Last lines of" in summary


def test_a_spent_budget_leaves_later_steps_not_run(suite: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = tuple(suite.Step(n, n, ("-c", "pass"), ("-c", "pass"), budget_s=10, writes_json=False) for n in ("a", "b"))
    monkeypatch.setattr(suite, "STEPS", steps)
    monkeypatch.setattr(suite, "command_for", lambda step, device, smoke, out: [sys.executable, *step.smoke])
    assert suite.main(["--device", "cpu", "--smoke", "--budget-s", "1", "--out", str(tmp_path / "s")]) == 1
    assert "| a | not run |" in (tmp_path / "s" / "summary.md").read_text()


def test_the_steps_budgets_and_the_suites_own_work_fit_the_suites_budget(suite: ModuleType) -> None:
    # 540 s: the run command's timeout is 600 s (the wheels' install and the tarball besides), and a 15-minute GPU
    # window holds the machine's start (about 30 s on 2026-11-28), that call and a short rerun of what failed.
    assert sum(step.budget_s for step in suite.STEPS) + suite.SUITE_OWN_S <= suite.DEFAULT_BUDGET_S <= 540


def test_every_budget_covers_the_process_start_its_first_compile_and_its_longest_unit(suite: ModuleType) -> None:
    # Every step is a fresh process: import torch and the CUDA handles (4.4 s on the H200), and a first torch.compile
    # (11.6 s) where it compiles, come before its first row. On 2026-11-28 first_contact's 12 s budget killed it
    # before its compile rows printed. Then a step that keeps to a time limit must still have time to start its
    # first unit of work, and to finish the longest one it starts before its limit.
    for step in suite.STEPS:
        fixed = suite.PROCESS_START_S + (suite.FIRST_COMPILE_S if step.compiles else 0.0)
        assert step.budget_s >= fixed + (step.time_limit_margin_s or 0.0) + 1, step.name
    (first_contact,) = [s for s in suite.STEPS if s.name == "first_contact"]
    assert first_contact.compiles and first_contact.budget_s >= suite.PROCESS_START_S + suite.FIRST_COMPILE_S + 2


def test_every_step_but_the_bench_keeps_to_a_time_limit_of_its_own_or_is_short(suite: ModuleType) -> None:
    # A step killed at its limit loses what it had not printed: each long step stops itself first. The bench is sized
    # to fit instead (its policies train in interleaved rounds: a cut would leave them unequal). Short: its own work,
    # beyond the process's start and first compile, is half a minute at most (compile's one row).
    for step in suite.STEPS:
        own_work = step.budget_s - suite.PROCESS_START_S - (suite.FIRST_COMPILE_S if step.compiles else 0.0)
        assert step.time_limit_margin_s is not None or own_work <= 30 or step.name == "bench", step.name


def test_the_tune_step_tunes_the_124m_gpt_within_the_steps_limit(suite: ModuleType) -> None:
    # The MFU claim is about a 124M GPT at batch 8: gpt large (GPT-2 small's shape, batch 8 x 1024). The tune is
    # told the step's limit less the process's start and its margin as --budget (its own wall clock), so it starts no
    # trial that would not end in time and lists what it did not try; its files go to <suite>/tune.
    (step,) = [s for s in suite.STEPS if s.name == "tune"]
    command = suite.with_time_limit(step, suite.command_for(step, "cuda", False, Path("/tmp/s")), step.budget_s)
    assert command[command.index("-w") + 1] == "gpt" and command[command.index("--size") + 1] == "large"
    assert command[command.index("--out") + 1] == "/tmp/s/tune" and "--time-limit" not in command
    assert float(command[command.index("--budget") + 1]) == round(step.budget_s - step.time_limit_margin_s - suite.PROCESS_START_S)
    assert "compile" in command[command.index("--stages") + 1].split(",") and step.compiles
    smoke = suite.command_for(step, "cpu", True, Path("/tmp/s"))
    assert smoke[smoke.index("--size") + 1] == "tiny"


def test_the_tune_digest_shows_its_table_the_winner_and_the_mfu_of_start_and_winner(suite: ModuleType, tmp_path: Path) -> None:
    rows = [{"key": "w", "configuration": "precision bf16-mixed", "verdict": "winner", "mfu": 0.305, "mfu_note": None},
            {"key": "s", "configuration": "as given", "verdict": "start", "mfu": 0.121, "mfu_note": None}]
    (tmp_path / "tune.json").write_text(json.dumps({"rows": rows, "workload": "gpt", "device": {"name": "NVIDIA H200"}, "elapsed_s": 30,
                                                    "budget_s": 40, "winner_reason": "fastest proven", "not_tried": [
                                                        {"change": "compile model", "reason": "no time left in the budget"}]}))
    (tmp_path / "report.md").write_text("# t\n\n| configuration | MFU |\n|---|---|\n| precision bf16-mixed | 30.5% |\n\n- MFU: the definition\n")
    digest = suite.tune_digest(tmp_path)
    assert "| precision bf16-mixed | 30.5% |" in digest and "- MFU: the definition" in digest
    assert "MFU: start 12.1%, winner 30.5%" in digest and "**Winner**: precision bf16-mixed" in digest
    assert "not tried: compile model: no time left in the budget" in digest
    assert suite.tune_digest(tmp_path / "none") == ""


def test_a_scripts_time_limit_leaves_out_the_process_start_and_its_longest_unit(suite: ModuleType) -> None:
    # A script's --time-limit runs from its own start (torch already imported), the suite's limit from the process's
    # spawn: passing the limit less the margin alone let cnn start a 13 s cuDNN search at 22 s of a 30 s limit.
    step = suite.Step("x", "x", (), (), budget_s=60, time_limit_margin_s=20)
    limit = float(suite.with_time_limit(step, ["python", "x.py"], 90)[-1])
    assert limit == round(90 - 20 - suite.PROCESS_START_S)


def test_the_tests_step_stops_itself_with_time_for_a_running_test_and_the_summary(suite: ModuleType) -> None:
    # pytest-timeout's session timeout is checked between tests: a test running at it goes on up to the per-test
    # timeout, then the workers stop and pytest prints its summary. Today's pass (96% at about 75 s) fits.
    (tests,) = [s for s in suite.STEPS if s.name == "tests"]
    command = suite.with_time_limit(tests, suite.command_for(tests, "cuda", False, Path("/tmp/s")), tests.budget_s)
    per_test, session = float(command[command.index("--timeout") + 1]), float(command[command.index("--session-timeout") + 1])
    assert per_test + 5 <= tests.time_limit_margin_s and session + tests.time_limit_margin_s + suite.PROCESS_START_S <= tests.budget_s + 0.5
    assert session >= 85, "the CUDA pass took about 75 s of session at -n 8 on 2026-11-28"
    assert command[command.index("--failure-log") + 1] == f"/tmp/s/{suite.FAILURE_LOG}" and "benchmarks.failure_log" in command
    assert command[command.index("--junitxml") + 1] == f"/tmp/s/{suite.JUNIT_XML}"


def test_a_test_pass_killed_at_its_limit_still_lists_its_failures_in_the_summary(suite: ModuleType, tmp_path: Path) -> None:
    # The 2026-11-28 pass: killed (or crashed) before pytest printed its summary, so the log names no failure; the
    # failure file written as the tests were reported does.
    (tests,) = [s for s in suite.STEPS if s.name == "tests"]
    log = tmp_path / "02-tests.log"
    log.write_text("$ python -m pytest\n\nbringing up nodes...\n..F.sss.F [ 95%]\n..")
    (tmp_path / suite.FAILURE_LOG).write_text("FAILED tests/a.py::test_x - AssertionError: boom\nERROR tests/b.py::test_y - RuntimeError: setup\n")
    result = suite.StepResult(tests, ["python"], status="timeout", log=log, notes=["killed at its limit of 130 s"])
    result.figures = suite.figures_of(result, tmp_path)
    summary = suite.summary_markdown({"cpu": "x", "cpu_count": 1, "python": "3", "torch": "2", "torch_cuda": None, "cudnn": None,
                                      "triton": None, "transformers": None, "commit": "abc", "dirty": False, "date": "today", "device": "cuda"},
                                     [result], smoke=False, budget_s=540, wall_s=130)
    section = summary.split("## tests")[1]
    assert "- FAILED tests/a.py::test_x - AssertionError: boom" in section and "- ERROR tests/b.py::test_y - RuntimeError: setup" in section
    assert "killed at 95% of the tests" in section


DEV_PLUGINS = ("xdist", "pytest_timeout", "pytest_benchmark", "pytest_cov", "pytest_mock", "hypothesis")


def test_the_dev_extra_brings_the_gpu_images_pytest_plugins_and_the_smoke_pass_runs_under_them(suite: ModuleType) -> None:
    # The first GPU run's test pass died at configure time: pytest-benchmark warns when xdist is active. CI installs
    # the same plugins (the dev extra), and the smoke pass runs the tests step as the GPU pass does, with -n and the
    # timeouts, so such a clash fails here.
    missing = [m for m in DEV_PLUGINS if not suite._importable(m)]
    assert not missing, f"not installed: {missing}; pip install -c constraints.txt -e '.[dev]'"
    (tests,) = [s for s in suite.STEPS if s.name == "tests"]
    command = suite.with_time_limit(tests, suite.command_for(tests, "cpu", True, Path("/tmp/s")), 60, smoke=True)
    assert command[command.index("-n") + 1] == "2" and "--timeout" in command
    assert command[command.index("--session-timeout") + 1] == f"{60 - tests.time_limit_margin_s - suite.PROCESS_START_S:.0f}"
    full = suite.with_time_limit(tests, suite.command_for(tests, "cuda", False, Path("/tmp/s")), 80)
    assert full[full.index("-n") + 1] == "8" and "--session-timeout" in full


def test_the_pytest_digest_says_when_the_pass_stopped_at_its_session_timeout(suite: ModuleType) -> None:
    text = "..\n!!!!!!!! xdist.dsession.Interrupted: session-timeout: 65.0 sec exceeded !!!!!!!!!\n2 passed in 70.1s\n"
    digest = suite.pytest_digest(text)
    assert digest.startswith("**2 passed in 70.1s**") and "stopped at its session timeout" in digest
    # the command line in the log's first line names the flag: that alone is no stop
    assert "session timeout" not in suite.pytest_digest("$ python -m pytest --session-timeout 65\n3 passed in 9.0s\n")


def test_a_step_with_a_time_limit_of_its_own_gets_the_suites_limit_less_its_margin(suite: ModuleType) -> None:
    (fp8,) = [s for s in suite.STEPS if s.name == "fp8"]
    command = suite.command_for(fp8, "cuda", False, Path("/tmp/s"))
    assert suite.with_time_limit(fp8, command, 100)[-2:] == ["--time-limit", f"{100 - fp8.time_limit_margin_s - suite.PROCESS_START_S:.0f}"]
    assert suite.with_time_limit(suite.STEPS[0], ["python"], 100) == ["python"]


def _wheel(folder: Path, name: str, source: str) -> None:
    """A minimal pure-Python wheel holding one module ``name``."""
    import zipfile

    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}.py": source,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)


def test_carried_wheels_are_installed_for_the_steps(suite: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = tmp_path / "whl"
    wheels.mkdir()
    _wheel(wheels, "carried_demo", "VALUE = 7\n")
    step = suite.Step("uses_wheel", "imports the carried module", (), ("-c", "import carried_demo, sys; sys.exit(carried_demo.VALUE - 7)"), budget_s=30, writes_json=False)
    monkeypatch.setattr(suite, "WHEELS", wheels)
    monkeypatch.setattr(suite, "STEPS", (step,))
    monkeypatch.setattr(sys, "path", list(sys.path))  # the suite puts the wheels' folder on its own path too
    assert suite.main(["--device", "cpu", "--smoke", "--out", str(tmp_path / "s")]) == 0, (tmp_path / "s" / "summary.md").read_text()
    assert "| uses_wheel | ok |" in (tmp_path / "s" / "summary.md").read_text()
    assert json.loads((tmp_path / "s" / "env.json").read_text())["wheels"] == ["carried_demo-1.0-py3-none-any.whl"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "cpu", "--smoke"], "--out DIR is required"),
        (["--only", "tests,nope", "--out", "x"], "unknown step(s) nope"),
    ],
)
def test_bad_arguments_are_refused_naming_the_fix(suite: ModuleType, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        suite.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_a_folder_with_results_in_it_is_not_mixed_into(suite: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old.log").write_text("earlier run")
    with pytest.raises(SystemExit):
        suite.main(["--device", "cpu", "--smoke", "--out", str(tmp_path)])
    assert "not empty" in capsys.readouterr().err


def test_cuda_without_a_gpu_names_the_cpu_smoke_command(suite: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: --device cuda is valid")
    assert suite.main(["--out", str(tmp_path / "s")]) == 2
    assert "--device cpu --smoke" in capsys.readouterr().err


def test_list_prints_every_step_with_its_command(suite: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert suite.main(["--list"]) == 0
    text = capsys.readouterr().out
    assert all(step.name in text for step in suite.STEPS) and "--device cuda" in text


def test_the_digests_examples_hold(suite: ModuleType) -> None:
    failures, tried = doctest.testmod(suite)
    assert tried >= 3 and failures == 0


def test_the_failure_logs_examples_hold() -> None:
    import failure_log  # benchmarks/ is on the tests' path (pyproject's pythonpath)

    failures, tried = doctest.testmod(failure_log)
    assert tried >= 2 and failures == 0
