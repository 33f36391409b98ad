"""The recipe a bench runs: accumulation, clipping, a tolerance, compiled twins; each checked against a control run."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from ampkit._util.values import clip_from
from ampkit.bench._policy_run import PolicyRun
from ampkit.bench._recipe import compile_mode, runs_to_build
from ampkit.bench._results import BenchResult
from ampkit.bench._runner import run_bench
from ampkit.bench._table import definitions, table_rows
from ampkit.policy import get_policy
from ampkit.workloads._recipe import check_recipe
from ampkit.workloads._user import EvalLoss
from ampkit.workloads._workload import Accuracy, Workload, default_optimizer

# Dynamo's own warning when the optimizer reads .grad through a traced graph; torch's, not ampkit's.
pytestmark = pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")

ROWS, STEPS, WARMUP = 16, 6, 2
FAST_COMPILE = {"backend": "aot_eager"}  # traces through AOTAutograd like inductor, without generating C++


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    # A compile cached by another test would show no compile time here.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Linear(48, 4))  # no dropout or BN: accumulation is exact


def _batches(rows: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(rows, 12, generator=g), torch.randint(0, 4, (rows,), generator=g)) for _ in range(count)]


def _workload(batches: list[tuple[torch.Tensor, torch.Tensor]], **fields: object) -> Workload:
    fields.setdefault("metric", Accuracy)
    return Workload(name="toy", model=_model(), train_batches=batches, eval_batches=batches[:2],
                    items_per_batch=len(batches[0][1]), steps=STEPS, warmup=WARMUP, **fields)  # type: ignore[arg-type]


def _control(w: Workload, clip: float | None, lr: float = 1e-3) -> list[float]:
    """A hand-written fp32 loop: same weights, batches and optimizer (at ``lr``); clipped to ``clip`` or not at all."""
    model = copy.deepcopy(w.model)
    opt = default_optimizer(model.parameters(), lr=lr)
    losses = []
    for step in range(w.steps):
        x, y = w.batch(step)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_accumulating_two_batches_gives_the_weights_of_one_batch_twice_as_large() -> None:
    large = _batches(2 * ROWS, 4)
    halves = [(x[i : i + ROWS], y[i : i + ROWS]) for x, y in large for i in (0, ROWS)]
    once = PolicyRun(_workload(large), get_policy("32-true"), torch.device("cpu"), large, seed=0)
    twice = PolicyRun(_workload(halves, accumulate=2), get_policy("32-true"), torch.device("cpu"), halves, seed=0)
    for run in (once, twice):
        run.build()
        run.train(4, timed=False)
    assert once.model is not None and twice.model is not None
    for a, b in zip(once.model.parameters(), twice.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.stack(twice.losses), torch.stack(once.losses), rtol=1e-5, atol=1e-6)


def test_an_accumulated_step_counts_every_batch_of_it() -> None:
    result = run_bench(_workload(_batches(ROWS, 12), accumulate=3), ["32-true"], "cpu", rounds=1, count_flops=False)
    run = result.runs[0]
    assert len(run.losses) == STEPS and run.throughput == pytest.approx(3 * ROWS / run.step_time_median_s)
    assert result.settings["accumulate"] == 3 and result.settings["step_items"] == 3 * ROWS and result.settings["batch_size"] == ROWS


@pytest.mark.parametrize("clip", [0.05, None])
def test_the_clip_is_the_one_given_or_none(clip: float | None) -> None:
    w = _workload(_batches(ROWS, 4), clip_grad_norm=clip)
    result = run_bench(w, ["32-true"], "cpu", rounds=1, count_flops=False)
    assert result.runs[0].losses == pytest.approx(_control(w, clip), rel=1e-6)
    assert result.runs[0].losses[1:] != pytest.approx(_control(w, 1.0 if clip is None else None), rel=1e-4)  # clipping bites
    assert result.settings["clip_grad_norm"] == clip


def test_the_learning_rate_is_the_one_given_to_every_policy() -> None:
    w = _workload(_batches(ROWS, 4), lr=0.05)
    result = run_bench(w, ["32-true"], "cpu", rounds=1, count_flops=False)
    assert result.runs[0].losses == pytest.approx(_control(w, 1.0, lr=0.05), rel=1e-6)
    assert result.runs[0].losses[1:] != pytest.approx(_control(w, 1.0), rel=1e-4)  # the workload's own lr differs
    assert result.settings["lr"] == 0.05
    with pytest.raises(ValueError, match="--lr"):
        check_recipe(_workload(_batches(ROWS, 4), lr=-1.0))


def test_the_tolerance_flips_the_verdict_and_is_recorded() -> None:
    w = _workload(_batches(ROWS, 4), metric=lambda: EvalLoss(nn.functional.cross_entropy))  # finer than accuracy
    strict = run_bench(w, ["32-true", "bf16-true"], "cpu", rounds=1, count_flops=False, tolerance=0.0)
    loose = run_bench(w, ["32-true", "bf16-true", "bf16-true-remainder"], "cpu", rounds=1, count_flops=False, tolerance=1.0)
    ref, run = strict.runs
    assert run.eval_metric != ref.eval_metric  # bf16 weights land elsewhere
    # Tolerance 0: the reference's eval noise alone decides, and only on the worse side (control: the band by hand).
    from scipy import stats

    differences = np.subtract(run.eval_batch_metrics, ref.eval_batch_metrics)  # paired: the same eval batches
    band = stats.t.ppf(0.975, len(differences) - 1) * stats.sem(differences)
    assert strict.eval_tolerance.startswith("eval loss within 0 of 32-true")
    assert run.within_tolerance is bool(run.eval_metric - ref.eval_metric <= band + 1e-12)
    assert "within 1 of 32-true" in loose.runs[1].verdict and loose.eval_tolerance.startswith("eval loss within 1 of 32-true")
    assert loose.recovery is not None and loose.recovery.startswith("16-bit weights: bf16-true, bf16-true-remainder keep 32-true's eval loss (")
    assert "; the leanest that does: bf16-true (peak" in loose.recovery
    assert strict.settings["tolerance"] == 0.0 and loose.settings["tolerance"] == 1.0


def test_compiled_twins_run_beside_their_eager_runs_with_compile_time_apart(fresh_dynamo: None, tmp_path: Path) -> None:
    w = _workload(_batches(ROWS, 4))
    w.steps = 12
    result = run_bench(w, ["32-true", "bf16-mixed"], "cpu", rounds=2, compile=FAST_COMPILE)
    assert [r.label for r in result.runs] == ["32-true", "32-true compiled", "bf16-mixed", "bf16-mixed compiled"]
    for eager, compiled in zip(result.runs[::2], result.runs[1::2]):
        assert eager.status == compiled.status == "ok" and compiled.compile == "model" and eager.compile is None
        assert eager.compile_time_s is None and eager.speedup_vs_eager is None
        # Compiling is paid in the first steps, measured apart: the timed steps are steady, far below it.
        assert compiled.timed_steps == eager.timed_steps == w.steps - w.warmup
        # No timed step paid the compile: a compile left among them would be a step as long as it. (A ratio to the median
        # step, 3x, failed at 2.6x on a loaded machine: another process slows the steady steps, not the compile.)
        assert compiled.compile_time_s > max(compiled.step_times_s)
        assert compiled.speedup_vs_eager == pytest.approx(eager.step_time_median_s / compiled.step_time_median_s)
        assert compiled.speedup_vs_fp32 == pytest.approx(result.runs[0].step_time_median_s / compiled.step_time_median_s)
        assert compiled.flops_per_step == eager.flops_per_step > 0  # the same math, counted once
        assert compiled.flops_by_format == eager.flops_by_format
        # The CPU's peak counts tensors op by op, which compiled code hides: none rather than one of another kind.
        assert compiled.peak_memory_bytes is None and eager.peak_memory_bytes > 0
        # Checked against the tolerance like any policy: here compile changes nothing beyond rounding.
        assert compiled.within_tolerance is True
        torch.testing.assert_close(torch.tensor(compiled.losses), torch.tensor(eager.losses), rtol=1e-3, atol=1e-3)
        assert compiled.verdict.startswith(compiled.label + ":") and "(not in the step time)" in compiled.verdict
    assert "bf16-mixed eager" in result.runs[3].verdict  # "1.1x faster than", "as fast as"
    assert "Compiled runs on the CPU have no peak" in " ".join(definitions(result))
    rows = table_rows(result)
    assert {"Speed-up vs eager", "Compile time"} <= set(rows.headers)
    assert rows.rows[0][rows.headers.index("Compile time")] == "—" and rows.rows[1][rows.headers.index("Compile time")] != "—"
    back = BenchResult.read_json(result.write_json(tmp_path / "results.json"))
    assert back.run("bf16-mixed", "model").compile_time_s == result.runs[3].compile_time_s
    assert back.run("bf16-mixed").compile is None and json.loads((tmp_path / "results.json").read_text())["settings"]["compile"] == FAST_COMPILE


def test_a_compile_that_fails_is_its_rows_failure(fresh_dynamo: None) -> None:
    result = run_bench(_workload(_batches(ROWS, 4)), ["32-true"], "cpu", rounds=1, count_flops=False, compile={"backend": "no_such_backend"})
    eager, compiled = result.runs
    assert eager.status == "ok" and compiled.status == "failed" and "no_such_backend" in compiled.error
    assert compiled.verdict.startswith("32-true compiled: failed")


@pytest.mark.slow
def test_the_default_compiler_reports_its_compile_time_apart(fresh_dynamo: None) -> None:
    # inductor generates and builds C++: seconds of compilation against milliseconds of step.
    result = run_bench(_workload(_batches(ROWS, 4)), ["32-true"], "cpu", rounds=1, count_flops=False, compile=True)
    compiled = result.run("32-true", "model")
    assert compiled is not None and compiled.status == "ok" and compiled.compile_time_s > 10 * compiled.step_time_median_s


def test_runs_to_build_pairs_each_policy_with_its_twin() -> None:
    fp32, mixed = get_policy("32-true"), get_policy("bf16-mixed")
    assert runs_to_build([fp32, mixed]) == [(fp32, None), (mixed, None)]
    assert runs_to_build([fp32], True) == [(fp32, None), (fp32, "model")]
    assert compile_mode({"regional": True}) == "regional"
    with pytest.raises(ValueError, match="compile='regional'"):
        compile_mode("per-block")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"accumulate": 0}, "accumulate (--accumulate) 0: gradient accumulation takes an int >= 1"),
        ({"accumulate": 1.5}, "int >= 1"),
        ({"clip_grad_norm": -1.0}, "must be a positive finite number, or None (--clip none)"),
        ({"clip_grad_norm": float("inf")}, "positive finite"),
    ],
)
def test_a_recipe_the_engine_cannot_run_is_refused_before_anything_runs(fields: dict[str, object], message: str) -> None:
    w = _workload(_batches(ROWS, 2), **fields)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_recipe(w)
    with pytest.raises(ValueError, match="int >= 1|positive finite"):
        run_bench(w, ["32-true"], "cpu")


@pytest.mark.parametrize(("text", "value"), [("2", 2.0), ("0.5", 0.5), ("0", None), ("none", None), ("OFF", None)])
def test_clip_from_reads_a_norm_or_off(text: str, value: float | None) -> None:
    assert clip_from(text) == value


@pytest.mark.parametrize("text", ["-1", "nan", "inf", "big"])
def test_clip_from_refuses_what_is_not_a_norm(text: str) -> None:
    with pytest.raises(ValueError, match="--clip"):
        clip_from(text)
