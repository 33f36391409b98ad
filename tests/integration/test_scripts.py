"""The README's promises about the repository itself: its commands, example and benchmark actually run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text(encoding="utf-8"))


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    tests = [c for c in readme_commands() if "pytest" in c]
    assert len(tests) == 1, "the README must give exactly one test command"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert tests[0] in ci.splitlines()
    assert "set -euo pipefail" in ci  # a failing command fails CI


def test_ci_runs_the_unit_tests_again_on_the_oldest_declared_torch() -> None:
    from ampkit._compat import OLDEST_TORCH

    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "bash .ci/oldest-torch" in ci, ".ci/run must run the oldest-torch leg"
    floor = subprocess.run([sys.executable, ".ci/torch_floor.py"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert floor.stdout.strip() == OLDEST_TORCH  # the leg installs the floor pyproject.toml declares
    leg = (ROOT / ".ci" / "oldest-torch").read_text(encoding="utf-8")
    assert "set -euo pipefail" in leg and 'torch==${floor}.*' in leg


def test_ci_lints_type_checks_and_builds_the_site_before_every_test_and_runs_the_oldest_torch_leg_in_two_workers() -> None:
    tomllib = pytest.importorskip("tomllib", reason="Requires: Python >= 3.11 (tomllib) to read pyproject.toml")
    (command,) = [c for c in readme_commands() if "pytest" in c]
    steps = [step.strip() for step in command.split("&&")]
    (mypy,) = [step for step in steps if step.startswith("mypy ")]
    # fail fast: the lint, the types and the site's strict build before the tests, which are all of them (no -m filter:
    # the slow tier's kill-and-relaunch, real full disk and torchrun tests guard what users rely on most)
    (pytest_step,) = [step for step in steps if step.startswith("python -m pytest")]
    assert steps.index("ruff check .") < steps.index(mypy) < steps.index("mkdocs build --strict") < steps.index(pytest_step)
    options = pytest_step.split()[3:]  # after "python -m pytest"
    assert steps[-1] == pytest_step and "-m" not in options and "-k" not in options  # every test
    # The slowest tests are printed with every run, so a CI log shows where its time goes (DEVELOPERS.md, "CI's time").
    assert "--durations=" in pytest_step
    checked = mypy.split()[2::2]  # mypy -p a -p b ...
    configured = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]["packages"]
    assert mypy.split()[1::2] == ["-p"] * len(checked)
    assert checked == configured, "CI type-checks every package pyproject.toml's [tool.mypy] lists, in its order"
    leg = (ROOT / ".ci" / "oldest-torch").read_text(encoding="utf-8")
    assert "pytest-xdist" in leg and "python -m pytest -q -n 2 " in leg


def test_readme_main_job_is_ampkit_bench_on_its_default() -> None:
    (main,) = [c for c in readme_commands() if "pytest" not in c and c.startswith("python3 -m venv")]
    assert main.endswith("&& ampkit bench")


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


# CI time (issue 36): the profile's sync sites, trials and advice are checked in CI on benchmarks/profile_advice.py
# (tests/unit/test_profile_advice_script.py) and tests/unit/profile; this run of the example is in the slow tier.
@pytest.mark.slow
def test_profile_example_finds_its_read_back_and_times_the_loader(tmp_path: Path) -> None:
    out = tmp_path / "prof"
    printed = run("examples/profile_my_loop.py", "--samples", "1280", "--work", "2", "--timed", "4", "--out", str(out))
    data = json.loads((out / "profile.json").read_text())
    (site,) = data["syncs"]["sites"]
    assert "examples/profile_my_loop.py:" in site["where"] and "loss.item()" in site["code"] and site["per_step"] == 1
    assert data["trials"][0]["name"] == "as given" and len(data["trials"]) > 1
    assert any(a["topic"] == "host syncs" for a in data["advice"]) and "Advice:" in printed
    assert (out / "report.md").exists() and (out / "trace.json").exists()


# CI time (2026-11-28): slow tier. CI checks save and resume of a loop like this one, bitwise per policy
# (tests/unit/checkpoint/test_resume_loader.py), and runs examples/train_digits.py in the next test (its refusal).
@pytest.mark.slow
def test_example_trains_and_resumes(tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="Requires: scikit-learn (pip install -e '.[examples]')")
    ckpt = str(tmp_path / "digits.pt")
    first = run("examples/train_digits.py", "--precision", "bf16", "--epochs", "2", "--checkpoint", ckpt)
    assert "[bf16-mixed] epoch 2/2" in first
    accuracy = float(first.strip().splitlines()[-1].split()[3])
    assert accuracy > 0.8  # two epochs on real digits; chance is 0.1
    again = run("examples/train_digits.py", "--precision", "bf16", "--epochs", "2", "--checkpoint", ckpt)
    assert "resumed from" in again and "at epoch 2" in again


def test_example_rejects_an_unknown_policy_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "examples/train_digits.py", "--precision", "01"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and "Did you mean 'O1'?" in done.stderr and "Traceback" not in done.stderr


def test_main_job_runs_the_default_bench_and_keeps_its_promises(tmp_path: Path) -> None:
    # The README's main job, as a fresh machine runs it. Timing is not asserted here (BENCHMARKS.md holds the
    # speed-ups); what must hold on any machine: every policy ran, bf16 saved activations, accuracy held.
    pytest.importorskip("sklearn", reason="Requires: scikit-learn (pip install -e '.[bench]')")
    done = subprocess.run([sys.executable, "-m", "ampkit", "bench", "--no-progress", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    runs = {r["precision"]: r for r in data["runs"]}
    assert data["workload"] == "digits" and next(iter(runs)) == "32-true"
    assert all(r["status"] == "ok" for r in runs.values())
    mixed, fp32 = runs["bf16-mixed"], runs["32-true"]
    assert mixed["activation_bytes"] < 0.8 * fp32["activation_bytes"]
    assert mixed["within_tolerance"] is True and fp32["eval_metric"] > 0.9
    assert "bf16-mixed:" in done.stdout and (tmp_path / "report.md").exists()


# CI time (issue 36): the example's model and data run in CI through tests/unit/memory/test_hf_models.py (the hf_gpt2
# fixture), its Engine save/load through tests/unit/checkpoint; this run of the whole script is in the slow tier.
@pytest.mark.slow
def test_hf_example_trains_saves_and_loads_back(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="Requires: transformers (pip install -e '.[hf]')")
    out = run("examples/train_hf_gpt2.py", "--steps", "6", "--checkpoint", str(tmp_path / "gpt2.pt"))
    before, after = (float(line.split()[-1]) for line in out.splitlines() if "eval loss" in line and "training" in line)
    assert after < before  # six steps on a counting pattern already move the held-out loss
    assert out.strip().endswith("the same as before saving") and (tmp_path / "gpt2.pt").exists()


def test_hf_example_without_transformers_says_how_to_install_it(tmp_path: Path) -> None:
    (tmp_path / "transformers.py").write_text("raise ImportError('No module named transformers')\n")  # shadows the real one
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "train_hf_gpt2.py")], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 1 and "pip install ampkit[hf]" in done.stderr and "Traceback" not in done.stderr


def test_lightning_example_trains_and_resumes_from_lightnings_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="Requires: lightning (pip install -e '.[lightning]')")
    first = run("examples/train_digits_lightning.py", "--precision", "bf16-true-masters", "--epochs", "1", "--checkpoint", str(tmp_path))
    resumed = run("examples/train_digits_lightning.py", "--precision", "bf16-true-masters", "--epochs", "2", "--checkpoint", str(tmp_path), "--resume")
    assert "after 23 optimizer steps (0 skipped)" in first  # 1,437 training images in batches of 64
    assert "after 46 optimizer steps (0 skipped)" in resumed  # the counters came back with Lightning's checkpoint
    assert float(resumed.split("val accuracy ")[1].split()[0]) > 0.5
