"""``ampkit bench`` from the command line: argument errors, the files it writes, every built-in workload."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ampkit.bench._results import BenchResult
from ampkit.bench._table import table_rows
from ampkit.cli._main import main

TOY = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self, fail_in_bf16=False):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
        self.fail_in_bf16 = fail_in_bf16

    def forward(self, x):
        if self.fail_in_bf16 and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            raise RuntimeError("no bf16 kernel in this model")
        return self.body(x)

def model():
    torch.manual_seed(0)
    return Net()

def bf16_hater():
    torch.manual_seed(0)
    return Net(fail_in_bf16=True)

def data():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(4)]

def data_with_eval():
    from ampkit.workloads._user import BenchData

    batches = data()
    return BenchData(train=batches[:3], eval=batches[3:])  # one eval batch of 16 samples: a handful
"""


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "bench_cli_toy.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "bench_cli_toy"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "-w", "gtp"], "gpt"),
        (["bench", "-w", "digits", "--size", "tiny", "--precision", "01"], "O1"),
        (["bench", "-w", "digits", "--size", "tiny", "--precision", "bf16,tf32"], "tf32 cannot run on cpu"),
        (["bench", "--device", "cuda:0"], "--device cpu"),
        (["bench", "--device", "gpu"], "cpu, cuda or cuda:N"),
        (["bench", "--model", "nocolon", "--data", "x:y"], "pkg.module:function"),
        (["bench", "--model", "no_such_pkg_xyz:build", "--data", "x:y"], "importing no_such_pkg_xyz failed"),
        (["bench", "--model", "{toy}:model"], "needs --workload"),
        (["bench", "--data", "{toy}:data"], "needs --model"),
        (["bench", "--model", "{toy}:model", "--data", "{toy}:model"], "returned Net; return a list"),
        (["bench", "-w", "digits", "--size", "tiny", "--steps", "3", "--warmup", "3"], "must exceed --warmup"),
        (["bench", "-w", "digits", "--size", "tiny", "--tolerance", "-1"], "--tolerance must be a non-negative finite number"),
        (["bench", "-w", "digits", "--size", "tiny", "--tolerance", "nan"], "got 'nan'"),
        (["bench", "-w", "digits", "--size", "tiny", "--tolerance", "2%"], "e.g. 0.01"),
        (["bench", "--model", "{toy}:model", "--data", "{toy}:data", "--tolerance", "0.1"], "has no eval metric to hold to it; drop --tolerance"),
        (["bench", "--model", "{toy}:model", "--data", "{toy}:data", "--batch-size", "8"], "--batch-size 8 applies to a built-in workload's data"),
        (["bench", "-w", "digits", "--size", "tiny", "--batch-size", "5000"], "use at most 1437"),
        (["bench", "-w", "digits", "--size", "tiny", "--clip", "-1"], "--clip -1: the gradient-norm clip must be a positive finite number; 0 or none"),
        (["bench", "-w", "digits", "--size", "tiny", "--clip", "max"], "--clip max: give a number"),
    ],
)
def test_bad_input_is_one_line_that_says_what_to_do(cli_error: Callable[[list[str]], str], toy: str, argv: list[str], message: str) -> None:
    if "cuda" in " ".join(argv) and torch.cuda.is_available():
        pytest.skip("CUDA is available here, so --device cuda is valid")
    assert message in cli_error([a.format(toy=toy) for a in argv])


def test_out_must_be_a_directory(cli_error: Callable[[list[str]], str], tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    assert "is a file; give a directory" in cli_error(["bench", "--out", str(f)])


def test_numbers_are_checked_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "--steps", "0"])
    assert info.value.code == 2 and "must be an integer from 1 to" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--accumulate", "0"], ["--batch-size", "-2"], ["--compile", "inductor"]])
def test_recipe_flags_are_checked_by_the_parser(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", *argv])
    assert info.value.code == 2 and f"argument {argv[0]}: " in capsys.readouterr().err  # not "unrecognized arguments"


# Dynamo's own warning when the optimizer reads .grad through a traced graph; torch's, not ampkit's.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_the_recipe_flags_change_the_run_and_are_recorded(
    capsys: pytest.CaptureFixture[str], toy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ampkit.cli._bench as bench_cli

    monkeypatch.setattr(bench_cli, "_COMPILE", {"model": {"backend": "aot_eager"}})  # inductor would take seconds
    torch._dynamo.reset()
    argv = ["bench", "--model", f"{toy}:model", "--data", f"{toy}:data_with_eval", "--precision", "bf16", "--steps", "4",
            "--warmup", "2", "--rounds", "1", "--accumulate", "3", "--clip", "none", "--tolerance", "0.5", "--compile",
            "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "each also compiled (model)" in out and "a step: one optimizer update over 3 batches (48 samples)" in out
    data = json.loads((tmp_path / "results.json").read_text())
    assert {k: data["settings"][k] for k in ("batch_size", "accumulate", "step_items", "clip_grad_norm", "tolerance", "compile")} == {
        "batch_size": 16, "accumulate": 3, "step_items": 48, "clip_grad_norm": None, "tolerance": 0.5, "compile": {"backend": "aot_eager"}}
    runs = BenchResult.read_json(tmp_path / "results.json").runs
    assert [r.label for r in runs] == ["32-true", "32-true compiled", "bf16-mixed", "bf16-mixed compiled"]
    for run in runs:
        assert run.status == "ok" and run.throughput == pytest.approx(48 / run.step_time_median_s)
        assert (run.compile_time_s is not None) == (run.compile is not None) and run.within_tolerance is not None
    report = (tmp_path / "report.md").read_text()
    assert "bf16-mixed compiled" in report and "Compile time" in report
    torch._dynamo.reset()


def test_batch_size_rebuilds_a_builtin_workload_and_its_throughput(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bench", "-w", "resnet", "--size", "tiny", "--precision", "32-true", "--steps", "4", "--rounds", "1",
                 "--batch-size", "6", "--out", str(tmp_path), "--no-progress"]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    run = data["runs"][0]
    assert data["settings"]["batch_size"] == 6 and data["workload_info"]["batch_size"] == 6
    assert run["throughput"] == pytest.approx(6 / run["step_time_median_s"])  # the tiny size's own batch is 4


def test_user_model_run_writes_every_promised_file(capsys: pytest.CaptureFixture[str], toy: str, tmp_path: Path) -> None:
    out, tb = tmp_path / "out", tmp_path / "tb"
    argv = ["bench", "--model", f"{toy}:model", "--data", f"{toy}:data", "--precision", "bf16", "--steps", "6", "--warmup", "2",
            "--rounds", "2", "--out", str(out), "--tensorboard", str(tb), "--no-progress"]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "32-true" in stdout and "bf16-mixed" in stdout
    data = json.loads((out / "results.json").read_text())
    assert data["command"] == "ampkit " + " ".join(argv) and data["workload"] == "Net"  # the model class, not "user"
    assert data["device"]["type"] == "cpu" and data["torch"] == torch.__version__
    assert [r["precision"] for r in data["runs"]] == ["32-true", "bf16-mixed"]
    for run in data["runs"]:
        assert run["status"] == "ok" and run["step_time_median_s"] > 0 and run["throughput"] > 0
        assert run["peak_memory_bytes"] > 0 and run["activation_bytes"] > 0 and run["skipped_steps"] == 0
        assert len(run["losses"]) == 6
    assert data["runs"][0]["speedup_vs_fp32"] == 1.0
    assert (out / "report.md").read_text().count("bf16-mixed") >= 2
    assert {p.name for p in out.glob("*.png")} == {"loss_curves.png", "time_memory.png"}
    assert list(tb.rglob("events.out.tfevents.*"))


def test_a_run_that_fails_is_a_row_and_exit_code_1(capsys: pytest.CaptureFixture[str], toy: str, tmp_path: Path) -> None:
    argv = ["bench", "--model", f"{toy}:bf16_hater", "--data", f"{toy}:data", "--precision", "bf16", "--steps", "5", "--warmup", "1",
            "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 1
    assert "no bf16 kernel in this model" in capsys.readouterr().out
    runs = {r["precision"]: r for r in json.loads((tmp_path / "results.json").read_text())["runs"]}
    assert runs["32-true"]["status"] == "ok" and runs["bf16-mixed"]["status"] == "failed"
    assert "no bf16 kernel" in runs["bf16-mixed"]["error"]


@pytest.mark.parametrize("workload", ["digits", "segment", "gpt", "resnet"])
def test_every_builtin_workload_runs_at_tiny_size(capsys: pytest.CaptureFixture[str], tmp_path: Path, workload: str) -> None:
    if workload == "digits":
        pytest.importorskip("sklearn", reason="Requires: scikit-learn (pip install -e '.[bench]')")
    assert main(["bench", "-w", workload, "--size", "tiny", "--precision", "bf16-mixed", "--rounds", "2", "--out", str(tmp_path), "--no-progress"]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["workload"] == workload and data["settings"]["size"] == "tiny"
    for run in data["runs"]:
        assert run["status"] == "ok", run["error"]
        assert run["final_loss"] is not None and run["step_time_median_s"] > 0
        if workload == "resnet":
            assert run["eval_metric_name"] is None  # throughput and memory only
        else:
            assert run["eval_metric_name"] and run["eval_metric"] is not None


def _linked_images(report: Path) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report.read_text(encoding="utf-8"))


def test_report_links_every_plot_with_a_relative_out(
    capsys: pytest.CaptureFixture[str], toy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every example in docs/guides/bench.md passes a relative --out: the plots must still be linked, relative to report.md.
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "--model", f"{toy}:model", "--data", f"{toy}:data", "--precision", "bf16", "--steps", "4", "--warmup", "1",
            "--rounds", "1", "--out", "runs/toy", "--no-progress"]
    assert main(argv) == 0
    report = tmp_path / "runs" / "toy" / "report.md"
    links = _linked_images(report)
    assert sorted(links) == ["loss_curves.png", "time_memory.png"]
    assert all((report.parent / link).is_file() for link in links)


def test_tolerance_sets_the_eval_tolerance_and_a_handful_of_eval_samples_is_flagged(
    capsys: pytest.CaptureFixture[str], toy: str, tmp_path: Path
) -> None:
    argv = ["bench", "--model", f"{toy}:model", "--data", f"{toy}:data_with_eval", "--precision", "bf16", "--steps", "8",
            "--warmup", "2", "--rounds", "1", "--tolerance", "0.5", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["eval_samples"] == 16
    assert data["eval_tolerance"].startswith("eval loss within 0.5 of 32-true (on only 16 eval samples")
    bf16 = data["runs"][1]
    assert bf16["eval_metric"] is not None and bf16["within_tolerance"] is True
    assert "within 0.5 of 32-true" in bf16["verdict"] and "on only 16 eval samples" in bf16["verdict"]
    assert len(bf16["step_times_s"]) == bf16["timed_steps"] == 6
    assert 0 < bf16["speedup_low"] <= bf16["speedup_high"]
    assert "on only 16 eval samples" in " ".join(stdout.split())  # the terminal may wrap the verdict
    assert "on only 16 eval samples" in (tmp_path / "report.md").read_text()


def test_in_a_log_the_table_keeps_every_column_whole_one_row_per_run(
    capsys: pytest.CaptureFixture[str], toy: str, tmp_path: Path, log_table: Callable[[str], Any]
) -> None:
    # captured stdout is not a terminal: rich alone would squeeze this table to 80 columns or turn it on its side
    argv = ["bench", "--model", f"{toy}:model", "--data", f"{toy}:data", "--precision", "bf16,bf16-true", "--steps", "4",
            "--warmup", "1", "--rounds", "1", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    headers, body = log_table(capsys.readouterr().out)
    expected = table_rows(BenchResult.read_json(tmp_path / "results.json"))
    assert headers == expected.headers and len(" ".join(headers)) > 80
    assert body == expected.rows


def test_in_a_log_progress_is_plain_lines_on_stderr(capsys: pytest.CaptureFixture[str], toy: str) -> None:
    # captured stderr is not a terminal, where the bar showed nothing at all for the whole run
    argv = ["bench", "--model", f"{toy}:model", "--data", f"{toy}:data", "--precision", "32-true", "--steps", "2", "--warmup", "1", "--rounds", "1"]
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("progress: ") and err[-1].endswith(" steps: finished")
    assert [line.split(" steps: ", 1)[1] for line in err[1:]] == ["32-true: measuring memory", "32-true: done", "finished"]


def test_a_bench_run_turns_each_precision_name_into_a_policy_once(toy: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # A name becomes a Policy through the registry's lookup of that name. The command line looks each one up once;
    # below it only Policy objects travel (the runner, each run's engine, the fp8 plans, the verdicts), so a run of
    # two policies looks up two names, however many engines and verdicts it builds.
    from ampkit.policy import _registry as registry

    looked_up: list[str] = []
    real = registry.canonical_name

    def counted(name: str) -> str | None:
        looked_up.append(name)
        return real(name)

    monkeypatch.setattr(registry, "canonical_name", counted)
    argv = ["bench", "--model", f"{toy}:model", "--data", f"{toy}:data_with_eval", "--precision", "bf16", "--tolerance", "0.5",
            "--steps", "2", "--warmup", "1", "--rounds", "1", "--no-progress"]
    assert main(argv) == 0
    assert sorted(looked_up) == ["32-true", "bf16"]
    assert "bf16-mixed" in capsys.readouterr().out


@pytest.mark.parametrize("nproc", [None, 2])
def test_an_unknown_framework_is_refused_before_any_run(nproc: int | None, toy: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # The closing advice is printed in the model's framework's terms: a tag it has no terms for is refused at once.
    import ampkit.cli._bench as bench

    build = bench.workload_from_args

    def tagged(*args: Any, **kwargs: Any) -> Any:
        workload = build(*args, **kwargs)
        workload.extra["framework"] = "keras"
        return workload

    monkeypatch.setattr(bench, "workload_from_args", tagged)
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: pytest.fail("the bench ran"))
    monkeypatch.setattr(bench, "relaunch", lambda *a, **k: pytest.fail("the workers were started"))
    argv = ["bench", "--model", f"{toy}:model", "--data", f"{toy}:data", "--steps", "6", "--warmup", "2", "--no-progress"]
    assert main(argv + (["--nproc", str(nproc)] if nproc else [])) == 2
    assert "framework 'keras'" in capsys.readouterr().err
