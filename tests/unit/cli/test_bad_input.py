"""Bad input to ``ampkit bench``/``memory``/``doctor``: one line that names the fix and a non-zero exit, never a
traceback, a silent default, or exit 0 with no result."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ampkit.cli._main import main


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def _bench(user: str, data: str, *more: str) -> list[str]:
    return ["bench", "--model", f"{user}:model", "--data", f"{user}:{data}", "--steps", "3", "--warmup", "1",
            "--precision", "32-true", "--no-progress", *more]


def test_a_data_generator_raising_midway_names_the_data_and_the_error(user: str, cli_error: Callable[[list[str]], str]) -> None:
    err = cli_error(_bench(user, "failing_generator", "--steps", "4"))
    assert f"--data {user}:failing_generator: reading training batch 2 failed (OSError: shard 2 is unreadable)" in err


def test_bench_data_with_a_bad_eval_says_what_eval_must_be(user: str, cli_error: Callable[[list[str]], str]) -> None:
    err = cli_error(_bench(user, "eval_five"))
    assert "BenchData(eval=...) got int; eval must be a list (or any iterable" in err


@pytest.mark.parametrize("command", ["bench", "memory", "doctor"])
def test_a_factory_that_exits_is_an_error_not_success(command: str, user: str, cli_error: Callable[[list[str]], str]) -> None:
    err = cli_error([command, "--model", f"{user}:exiting_model", "--data", f"{user}:data"])
    assert "exiting_model() exited (sys.exit(0)) instead of returning" in err


def test_a_data_iterable_that_exits_is_an_error(user: str, cli_error: Callable[[list[str]], str]) -> None:
    err = cli_error(_bench(user, "exiting_generator"))
    assert "reading training batch 1 exited (sys.exit(0))" in err


def test_a_module_that_exits_on_import_is_an_error(tmp_path: Path, user: str, cli_error: Callable[[list[str]], str]) -> None:
    script = tmp_path / "script_like.py"
    script.write_text("import sys\nsys.exit(0)\ndef model(): pass\n")
    err = cli_error(["memory", "--model", f"{script}:model", "--data", f"{user}:data"])
    assert "exited (sys.exit(0))" in err and 'if __name__ == "__main__":' in err


def test_memory_batch_size_beyond_any_tensor_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, ["memory", "--batch-size", "18446744073709551616"])
    assert "--batch-size: must be an integer from 1 to 2147483647, got 18446744073709551616" in err


@pytest.mark.parametrize("size", ["0", "0GiB", "lots"])
def test_memory_device_memory_must_be_a_positive_size(size: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, ["memory", "--device-memory", size])
    assert "--device-memory" in err and "24GiB" in err


@pytest.mark.parametrize("command", ["bench", "memory", "doctor"])
def test_an_empty_workload_name_is_refused_listing_the_valid_ones(command: str, cli_error: Callable[[list[str]], str]) -> None:
    assert "unknown workload ''; choose one of digits, digits-aug, gpt, resnet, segment" in cli_error([command, "-w", ""])


@pytest.mark.parametrize("command", ["bench", "doctor"])
def test_an_unwritable_out_is_refused_before_the_run(command: str, user: str, tmp_path: Path, cli_error: Callable[[list[str]], str]) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    out = blocker / "results"  # a directory cannot be made under a file, even by root
    argv = [command, "--model", f"{user}:model", "--data", f"{user}:data", "--out", str(out)]
    err = cli_error(argv)
    assert f"--out {out} cannot be written" in err and "give a directory you can write to" in err
    assert user not in sys.modules  # refused before the model or data were even imported


def test_out_probe_leaves_the_new_directory_empty(tmp_path: Path) -> None:
    from ampkit.cli._checks import writable_dir

    writable_dir(tmp_path / "new" / "dir", "--out")
    assert list((tmp_path / "new" / "dir").iterdir()) == []


@pytest.mark.parametrize("command", ["memory", "doctor", "bench"])
def test_missing_bench_extra_names_the_install_command(command: str, monkeypatch: pytest.MonkeyPatch, cli_error: Callable[[list[str]], str]) -> None:
    from ampkit.workloads import _digits as digits

    digits._digits.cache_clear()  # a cached load would not import scikit-learn again
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    err = cli_error([command, "--device", "cpu"])  # digits: the default workload on a CPU
    assert 'needs the bench extra: pip install "ampkit[bench]"' in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--precision", "bf16,fp16-mixed"], "Unknown precision 'fp16-mixed'. Did you mean '16-mixed'?"),
        (["memory", "--precision", "half"], "Unknown precision 'half'. Did you mean '16-mixed'?"),
        (["doctor", "--precision", "float32-true"], "Did you mean '32-true'?"),
        (["profile", "--precision", "01"], "Did you mean 'O1'?"),
        (["bench", "--device", "gpu"], "--device gpu: ampkit bench runs on cpu, cuda or cuda:N."),
        (["memory", "--device", "mps"], "--device mps: ampkit memory predicts for cpu or cuda."),
        (["bench", "--tolerance", "2%"], "--tolerance must be a non-negative finite number"),
        (["bench", "--clip", "max"], "--clip max: give a number"),
        (["bench", "--lr", "-1"], "--lr -1.0: the learning rate must be a positive finite number"),
    ],
)
def test_a_bad_name_or_value_is_refused_before_torch_is_imported(argv: list[str], message: str) -> None:
    # Importing torch takes seconds (7-20 s on a loaded machine): a typo must not wait for it.
    script = "import sys\nfrom ampkit.cli._main import main\ncode = main(sys.argv[1:])\nprint('torch' in sys.modules, end='')\nsys.exit(code)"
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("ampkit: error: ") and done.stderr.count("\n") == 1 and message in done.stderr
    assert done.stdout == "False"  # torch not imported
