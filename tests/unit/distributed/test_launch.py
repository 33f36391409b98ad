"""The torchrun command ``ampkit bench --nproc N`` builds, without starting anything."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ampkit.distributed import _launch as launch
from ampkit.distributed._launch import relaunch, report_exit_code, strip_option, torchrun_command, worker_threads


def test_command_runs_the_module_under_torchrun_with_this_interpreter() -> None:
    cmd = torchrun_command(2, ["bench", "-w", "digits", "--out", "runs/a b"])
    assert cmd[:6] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    assert cmd[6:] == ["-m", "ampkit", "bench", "-w", "digits", "--out", "runs/a b"]  # arguments kept as they are


@pytest.mark.parametrize("nproc", [0, -1, True, 2.0])
def test_nproc_must_be_a_positive_int(nproc: object) -> None:
    with pytest.raises(ValueError, match="positive int"):
        torchrun_command(nproc, ["bench"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--nproc", "2", "-w", "digits"],
        ["bench", "--nproc=2", "-w", "digits"],
        ["bench", "-w", "digits", "--npr", "2"],
        ["bench", "--np=2", "-w", "digits"],
    ],
)
def test_the_option_and_its_value_are_stripped_in_every_spelling(argv: list[str]) -> None:
    assert strip_option(argv, "--nproc") == ["bench", "-w", "digits"]


def test_other_options_stay_even_when_they_share_a_prefix() -> None:
    argv = ["bench", "--no-progress", "--n", "x", "--steps", "6"]
    kept = strip_option(argv, "--nproc")
    # "--n" is too short to be --nproc (argparse calls it ambiguous); compared with a copy, not with argv itself.
    assert kept == ["bench", "--no-progress", "--n", "x", "--steps", "6"] and kept is not argv


def test_workers_share_the_cores() -> None:
    assert [worker_threads(n, cores=8) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]


def test_workers_share_the_cores_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # The usable cores are the affinity mask (taskset, cgroups, a batch scheduler), not every core in the machine.
    monkeypatch.setattr(launch.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    assert worker_threads(2) == 3 and worker_threads(4) == 1
    monkeypatch.delattr(launch.os, "sched_getaffinity")  # macOS and Windows have no affinity mask
    assert worker_threads(2) == 32


def test_exit_code_goes_through_the_file_when_relaunched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(launch.EXIT_CODE_FILE, raising=False)
    assert report_exit_code(1, rank=0) == 1  # plain torchrun: the code itself
    code_file = tmp_path / "code"
    monkeypatch.setenv(launch.EXIT_CODE_FILE, str(code_file))
    assert report_exit_code(1, rank=1) == 0 and not code_file.exists()  # only rank 0 writes
    assert report_exit_code(1, rank=0) == 0 and code_file.read_text().strip() == "1"


@pytest.mark.parametrize(("torchrun_rc", "written", "expected"), [(0, "1", 1), (0, "0", 0), (0, None, 0), (1, None, 1), (1, "2", 2), (1, "0", 1)])
def test_relaunch_returns_rank_zeros_code_unless_a_worker_crashed(
    monkeypatch: pytest.MonkeyPatch, torchrun_rc: int, written: str | None, expected: int
) -> None:
    seen: dict[str, object] = {}

    class Done:
        returncode = torchrun_rc

    def fake_run(cmd: list[str], env: dict[str, str], check: bool) -> Done:
        seen.update(cmd=cmd, env=env)
        if written is not None:
            Path(env[launch.EXIT_CODE_FILE]).write_text(written)
        return Done()

    monkeypatch.setattr(launch.subprocess, "run", fake_run)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert relaunch(2, ["bench"]) == expected
    env = seen["env"]
    assert isinstance(env, dict) and int(env["OMP_NUM_THREADS"]) == worker_threads(2)
    assert seen["cmd"] == torchrun_command(2, ["bench"])


def test_relaunch_keeps_your_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, str] = {}

    class Done:
        returncode = 0

    def fake_run(cmd: list[str], env: dict[str, str], check: bool) -> Done:
        seen.update(env)
        return Done()

    monkeypatch.setattr(launch.subprocess, "run", fake_run)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    relaunch(4, ["bench"])
    assert seen["OMP_NUM_THREADS"] == "3"
