"""``ampkit profile`` shows progress as bench does: off a terminal a line per phase on stderr (stdout stays the
profile), none with ``--no-progress``."""

from __future__ import annotations

import pytest

from ampkit.cli._main import main

ARGV = ["profile", "-w", "gpt", "--size", "tiny", "--precision", "32-true", "--warmup", "1", "--plain-steps", "1", "--steps", "2",
        "--sync-steps", "1", "--trace-steps", "1"]  # fmt: skip


def test_off_a_terminal_each_phase_is_a_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ARGV) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines[0].startswith("progress: 6 steps")
    phases = [line.split(" steps: ", 1)[1] for line in lines[1:]]
    assert phases == [
        "warm-up steps (not measured)", "plain steps (the overhead's baseline)", "timed steps (phases timed)",
        "steps with the host syncs counted", "steps traced by torch.profiler", "finished",
    ]  # fmt: skip
    assert lines[-1].endswith("6/6 steps: finished") and "progress:" not in out


def test_no_progress_prints_none(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGV, "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert "progress" not in err and "steps:" not in err and "Where the step's time goes" in out
