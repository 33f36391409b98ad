"""``ampkit doctor`` end to end on CPU: a built-in workload, a user's model file, files written, bad input."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ampkit.cli._main import main
from ampkit.numerics._fp8_table import headroom_rows
from ampkit.numerics._table import module_rows

FRAGILE = Path(__file__).parents[1] / "numerics" / "fragile.py"


def test_builtin_workload_writes_json_report_and_histograms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "doc"
    code = main(["doctor", "-w", "gpt", "--size", "tiny", "--steps", "2", "--precision", "16-mixed", "--update-steps", "2", "--out", str(out)])
    assert code == 0
    data = json.loads((out / "doctor.json").read_text())
    assert data["recommended_precision"] == "16-mixed"
    assert data["workload"]["name"] == "gpt" and data["command"].startswith("ampkit doctor -w gpt")
    # The classic finding: some gradient values fall below 2^-24 unscaled, far fewer at the recommended scale.
    assert data["underflow_share_unscaled"] > 0
    assert data["underflow_share_scaled"] < data["underflow_share_unscaled"]
    assert (out / "report.md").read_text().count("16-mixed") >= 1
    assert (out / "gradient_exponents.png").read_bytes().startswith(b"\x89PNG")
    printed = capsys.readouterr().out
    assert "Engine(precision=" in printed
    # The update-precision check reaches all three outputs.
    assert data["update_precision"]["steps"] == 2 and data["update_precision"]["trials"][0]["policy"] == "bf16-true"
    assert "## Update precision" in (out / "report.md").read_text() and "Update precision" in printed
    # So does the fp8 headroom: every Linear of the model, worst first, under the default tensorwise recipe.
    fp8 = data["fp8_headroom"]
    assert fp8["recipe"] == "tensorwise" and fp8["layers"] and {"input", "weight", "grad_output"} == set(fp8["layers"][0]["operands"])
    assert fp8["layers"][0]["operands"]["grad_output"]["format"] == "e5m2"
    assert "## fp8 headroom" in (out / "report.md").read_text() and "fp8 headroom (tensorwise recipe)" in printed


def test_user_model_file_names_the_overflowing_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["doctor", "--model", f"{FRAGILE}:overflow_net", "--data", f"{FRAGILE}:batches", "--update-steps", "0", "--precision", "fp16"]
    code = main([*argv, "--fp8-recipe", "rowwise", "--out", str(tmp_path)])
    assert code == 0
    data = json.loads((tmp_path / "doctor.json").read_text())
    assert data["fp8_headroom"]["recipe"] == "rowwise" and data["fp8_headroom"]["layers"][0]["operands"]["grad_output"]["format"] == "e4m3fn"
    assert data["keep_fp32"] == ["amplify"] and data["modules"][0]["name"] == "amplify"
    assert 'keep_fp32=["amplify"]' in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["doctor", "-w", "gtp"], "did you mean 'gpt'"),
        (["doctor", "--model", f"{FRAGILE}:overflow_net"], "--model without --data"),
        (["doctor", "-w", "digits", "--size", "tiny", "--precision", "fp17"], "fp17"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ampkit: error:") and message in err


def test_out_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "file"
    f.write_text("")
    assert main(["doctor", "-w", "digits", "--size", "tiny", "--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_report_links_every_plot_with_a_relative_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every example in docs/guides/doctor.md passes a relative --out: the histograms must still be linked, relative to report.md.
    monkeypatch.chdir(tmp_path)
    assert main(["doctor", "--model", f"{FRAGILE}:overflow_net", "--data", f"{FRAGILE}:batches", "--update-steps", "0", "--precision", "fp16", "--out", "doc/run"]) == 0
    report = tmp_path / "doc" / "run" / "report.md"
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report.read_text(encoding="utf-8"))
    pngs = sorted(p.name for p in report.parent.glob("*.png"))
    assert pngs and sorted(links) == pngs
    assert all((report.parent / link).is_file() for link in links)


def test_in_a_log_the_module_table_keeps_every_column_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str], log_table: Callable[[str], Any]) -> None:
    # captured stdout is not a terminal: at rich's 80 columns the doctor left columns out and wrapped the problems
    assert main(["doctor", "--model", f"{FRAGILE}:overflow_net", "--data", f"{FRAGILE}:batches", "--update-steps", "0", "--precision", "fp16", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    headers, body = log_table(printed)
    data = json.loads((tmp_path / "doctor.json").read_text())
    expected = module_rows(data)
    assert headers == expected.headers and len(" ".join(headers)) > 80
    assert body == expected.rows
    # The fp8 headroom table after it, whole as well.
    fp8_headers, fp8_body = log_table(printed, 1)
    fp8 = headroom_rows(data["fp8_headroom"])
    assert fp8_headers == fp8.headers and fp8_body == fp8.rows


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")  # dynamo reads it
def test_compile_flag_checks_the_compiled_step_and_reports_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    torch._dynamo.reset()
    argv = ["doctor", "--model", f"{FRAGILE}:overflow_net", "--data", f"{FRAGILE}:batches", "--steps", "1", "--update-steps", "0", "--precision", "bf16-mixed"]
    assert main([*argv, "--out", str(tmp_path), "--compile", "--compile-backend", "aot_eager"]) == 0
    check = json.loads((tmp_path / "doctor.json").read_text())["compile_check"]
    assert check["agrees"] and check["compile"] == "compile={'backend': 'aot_eager', 'regional': False}"
    assert check["compiled"] == [""] and check["policy"] == "bf16-mixed"
    assert "compiled step agrees with eager under bf16-mixed" in capsys.readouterr().out
    assert "## Compiled against eager" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--compile-backend", "aot_eager"], "without --compile"),
        (["--compile", "--compile-backend", "inductr"], "not a torch.compile backend"),
    ],
)
def test_bad_compile_flags_are_one_line_and_exit_2(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "-w", "digits", "--size", "tiny", *extra]) == 2
    assert message in capsys.readouterr().err


def _tagged(monkeypatch: pytest.MonkeyPatch, framework: str) -> None:
    """The workload as the tools build it for a model from ``framework`` (``Workload.extra["framework"]``)."""
    import ampkit.cli._doctor as doctor

    build = doctor.workload_from_args

    def tagged(*args: Any, **kwargs: Any) -> Any:
        workload = build(*args, **kwargs)
        workload.extra["framework"] = framework
        return workload

    monkeypatch.setattr(doctor, "workload_from_args", tagged)


def test_a_model_from_lightning_gets_the_prescription_as_its_trainer(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import ast

    _tagged(monkeypatch, "lightning")
    argv = ["doctor", "--model", f"{FRAGILE}:overflow_net", "--data", f"{FRAGILE}:batches", "--update-steps", "0", "--precision", "fp16", "--fp8-recipe", "none"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "doctor.json").read_text())
    printed = capsys.readouterr().out.splitlines()
    start, end = printed.index("Paste into your Lightning script:"), next(i for i, line in enumerate(printed) if line.startswith("Or, in a plain PyTorch loop: "))
    code = "\n".join(printed[start + 1 : end])
    assert (data["framework"], data["framework_code"]) == ("lightning", code)
    assert printed[end] == f"Or, in a plain PyTorch loop: {data['engine_code']}"
    # fp16 on this CPU, with the doctor's fix: ampkit's plugin (Lightning's own 16-mixed runs bf16 here), its numbers the doctor's.
    plugin = next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and ast.unparse(n.func) == "AmpkitPrecision")
    keywords = {k.arg: ast.unparse(k.value) for k in plugin.keywords}
    assert ast.literal_eval(plugin.args[0]) == "16-mixed" and ast.literal_eval(keywords["keep_fp32"]) == data["keep_fp32"] == ["amplify"]
    assert keywords["scaler"] == f"ampkit.ScalerConfig(init_scale={data['recommended_loss_scale']!r})"
    assert "Paste into your Lightning script:" in (tmp_path / "report.md").read_text()


def test_an_unknown_framework_is_refused_before_the_doctor_runs(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _tagged(monkeypatch, "keras")
    monkeypatch.setattr("ampkit.numerics.diagnose", lambda *a, **k: pytest.fail("the doctor ran"))
    assert main(["doctor", "--model", f"{FRAGILE}:overflow_net", "--data", f"{FRAGILE}:batches", "--precision", "fp16"]) == 2
    assert "framework 'keras'" in capsys.readouterr().err


# -- exit code and progress ----------------------------------------------------------------------------------
def test_exit_1_says_why_and_progress_goes_to_stderr_a_line_per_phase(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["doctor", "--model", f"{FRAGILE}:root_shift_net", "--data", f"{FRAGILE}:batches", "--precision", "16-mixed"]
    code = main([*argv, "--steps", "2", "--update-steps", "0", "--fp8-recipe", "none"])
    out, err = capsys.readouterr()
    assert code == 1
    last = out.strip().splitlines()[-1]
    assert last.startswith("exit 1: no 16-bit policy was shown to train this model here") and "32-true" in last
    # stderr is no terminal here: a line per phase, as the bench prints in a log.
    phases = [line for line in err.splitlines() if re.match(r"\[\d+:\d\d\] \d+/\d+: ", line)]
    assert phases[0].endswith("fp32 reference: 2 steps") and phases[-1].endswith("done") and len(phases) >= 4


def test_exit_0_prints_no_exit_line_and_no_progress_silences_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["doctor", "--model", f"{FRAGILE}:overflow_net", "--data", f"{FRAGILE}:batches", "--precision", "16-mixed"]
    code = main([*argv, "--steps", "2", "--update-steps", "0", "--fp8-recipe", "none", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0 and "exit 1" not in out
    assert not re.search(r"\[\d+:\d\d\] \d+/\d+: ", err)
