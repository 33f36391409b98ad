"""The runner: numbers checked against a hand-written fp32 loop, interleaving that changes nothing, failures in rows."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ampkit.bench import _flops as flops, _runner as runner
from ampkit.bench._flops import peak_flops
from ampkit.bench._policy_run import PolicyRun
from ampkit.bench._runner import run_bench
from ampkit.policy._gpu_specs import GpuSpec
from ampkit.workloads._workload import Accuracy, Workload, default_optimizer

STEPS, WARMUP = 8, 2


class _Net(nn.Module):
    """An MLP with dropout (so per-run RNG matters) and an optional trap for one compute dtype."""

    def __init__(self, scale: float = 1.0, fail_under: torch.dtype | None = None) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Dropout(0.2), nn.Linear(48, 4))
        self.scale, self.fail_under = scale, fail_under

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail_under is not None and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == self.fail_under:
            raise RuntimeError("this model has no kernel for that dtype")
        return self.body(x) * self.scale


def _workload(**net: object) -> Workload:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    batches = [(torch.randn(16, 12, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(3)]
    return Workload(name="toy", model=_Net(**net), train_batches=batches, eval_batches=batches[:2], metric=Accuracy,  # type: ignore[arg-type]
                    items_per_batch=16, steps=STEPS, warmup=WARMUP)


def _control_losses(w: Workload, device: torch.device, seed: int = 0) -> list[float]:
    # What a user would write by hand in fp32: same weights, same batches, same clipping, same optimizer, same device.
    torch.manual_seed(seed)
    model = copy.deepcopy(w.model).to(device)
    opt = default_optimizer(model.parameters())
    losses = []
    for step in range(w.steps):
        x, y = (t.to(device) for t in w.batch(step))
        loss = nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), w.clip_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_fp32_run_reproduces_a_hand_written_loop_step_for_step(device: torch.device) -> None:
    w = _workload()
    result = run_bench(w, ["32-true"], device, rounds=3)
    assert result.runs[0].losses == _control_losses(w, device)


def test_interleaving_with_other_policies_changes_no_runs_numbers(device: torch.device, mixed_policy: str) -> None:
    w = _workload()
    alone = run_bench(w, [mixed_policy], device, rounds=1).runs[0]
    together = run_bench(w, ["32-true", mixed_policy, "bf16-true"], device, rounds=3).run(mixed_policy)
    assert together is not None and together.losses == alone.losses
    assert together.eval_metric == alone.eval_metric


def test_every_run_is_timed_and_summarised(device: torch.device) -> None:
    result = run_bench(_workload(), ["32-true", "bf16-mixed", "16-mixed"], device, rounds=2)
    for run in result.runs:
        assert run.status == "ok" and run.timed_steps == STEPS - WARMUP and len(run.losses) == STEPS
        assert run.step_time_p10_s <= run.step_time_median_s <= run.step_time_p90_s
        assert run.throughput == pytest.approx(16 / run.step_time_median_s)
        assert run.flops_per_step > 0 and run.achieved_flops == pytest.approx(run.flops_per_step / run.step_time_median_s)
        assert run.eval_metric_name == "accuracy" and 0 <= run.eval_metric <= 1 and run.within_tolerance is not None
        if device.type == "cpu":
            assert run.mfu is None  # no published peak for a CPU
        elif run.mfu is not None:  # a GPU with a published peak
            assert 0 < run.mfu < 1
        if device.type == "cuda":
            assert run.peak_memory_bytes > 0  # the caching allocator's own peak
    fp16 = result.run("16-mixed")
    assert fp16.final_loss_scale == 2.0**16 and fp16.skipped_steps == 0
    assert result.run("bf16-mixed").final_loss_scale is None
    assert result.settings["rounds"] == 2 and result.device["type"] == device.type and result.torch == torch.__version__


def test_memory_is_exact_on_cpu_and_smaller_in_16_bits() -> None:
    result = run_bench(_workload(), ["32-true", "bf16-mixed", "bf16-true"], "cpu", rounds=1)
    n = sum(p.numel() for p in _workload().model.parameters())
    fp32, mixed, half = (result.run(p) for p in ("32-true", "bf16-mixed", "bf16-true"))
    for run in (fp32, mixed, half):  # the peak itself is checked against ampkit.memory in test_policy_run.py
        parts = run.memory_breakdown
        assert run.peak_memory_bytes >= parts["parameters"] + parts["optimizer_state"] + parts["activations"]
        assert run.peak_rss_bytes is None or run.peak_rss_bytes > run.peak_memory_bytes
    assert fp32.memory_breakdown["parameters"] == 4 * n and half.memory_breakdown["parameters"] == 2 * n
    assert mixed.activation_bytes < fp32.activation_bytes
    assert half.memory_saved_vs_fp32 > 0


def test_rounds_rotate_which_policy_goes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, bool]] = []
    original = PolicyRun.train

    def spy(self: PolicyRun, steps: int, timed: bool) -> None:
        calls.append((self.precision, timed))
        original(self, steps, timed)

    monkeypatch.setattr(PolicyRun, "train", spy)
    run_bench(_workload(), ["32-true", "bf16-mixed", "bf16-true"], "cpu", rounds=3, count_flops=False)
    timed = [p for p, t in calls if t]
    assert timed == ["32-true", "bf16-mixed", "bf16-true", "bf16-mixed", "bf16-true", "32-true", "bf16-true", "32-true", "bf16-mixed"]


def test_each_eval_batch_is_also_scored_alone_for_the_reference_eval_noise() -> None:
    w = _workload()  # two eval batches of 16 rows
    result = run_bench(w, ["32-true", "bf16-mixed"], "cpu", rounds=1, count_flops=False)
    for run in result.runs:
        assert len(run.eval_batch_metrics) == len(w.eval_batches) == 2
        # Control: accuracy over equal batches is the mean of the batches' accuracies.
        assert sum(run.eval_batch_metrics) / 2 == pytest.approx(run.eval_metric)
    assert result.eval_noise is not None and "over 2 eval batches" in result.eval_noise
    w.eval_batches = w.eval_batches[:1]
    one = run_bench(w, ["32-true"], "cpu", rounds=1, count_flops=False).runs[0]
    assert one.eval_batch_metrics == [] and one.eval_metric is not None  # one batch: no spread to measure


def test_a_failing_policy_stays_in_its_row_and_the_others_complete() -> None:
    result = run_bench(_workload(fail_under=torch.bfloat16), ["32-true", "bf16-mixed", "16-mixed"], "cpu", rounds=2)
    failed = result.run("bf16-mixed")
    assert failed.status == "failed" and "no kernel for that dtype" in failed.error and failed.error.startswith("RuntimeError")
    assert failed.verdict.startswith("bf16-mixed: failed: RuntimeError")
    assert result.run("32-true").status == "ok" and result.run("16-mixed").status == "ok"
    assert result.run("16-mixed").speedup_vs_fp32 is not None


def test_a_policy_whose_loss_overflows_is_marked_diverged() -> None:
    # Logits of ~1e5 are fine in fp32 but overflow fp16's 65504: the 16-true loss turns inf/NaN.
    result = run_bench(_workload(scale=1e5), ["32-true", "16-true"], "cpu", rounds=1, count_flops=False)
    assert result.run("32-true").status == "ok"
    diverged = result.run("16-true")
    assert diverged.status == "diverged" and "diverged" in diverged.verdict


def test_the_callers_rng_is_left_as_it_was(device: torch.device) -> None:
    w = _workload()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    run_bench(w, ["32-true"], device, rounds=1, count_flops=False)  # dropout draws from the device's generator
    assert torch.equal(torch.get_rng_state(), state)
    if cuda_state is not None:
        assert torch.equal(torch.cuda.get_rng_state(device), cuda_state)


def test_without_the_reference_no_ratio_is_invented() -> None:
    run = run_bench(_workload(), ["bf16-mixed"], "cpu", rounds=1, count_flops=False).runs[0]
    assert run.speedup_vs_fp32 is None and "no 32-true reference" in run.verdict


def test_a_policy_the_device_cannot_run_is_an_unsupported_row() -> None:
    result = run_bench(_workload(), ["32-true", "tf32"], "cpu", rounds=1, count_flops=False)
    tf32 = result.run("tf32")
    assert tf32.status == "unsupported" and "CUDA" in tf32.error and tf32.losses == []
    assert result.run("32-true").status == "ok"


def _on_a_gpu_named(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # MFU is a GPU figure; the CPU run's counted FLOPs and times stand in for a GPU's, under the GPU's name.
    monkeypatch.setattr(runner, "device_info", lambda device: {"type": "cuda", "name": name, "capability": "9.0"})


def test_mfu_on_a_known_gpu_is_over_the_peak_of_the_format_the_matmuls_ran_in(monkeypatch: pytest.MonkeyPatch) -> None:
    _on_a_gpu_named(monkeypatch, "NVIDIA H200")
    result = run_bench(_workload(), ["32-true", "bf16-true"], "cpu", rounds=1)
    for run in result.runs:  # bf16-true multiplies in bf16 (as bf16-mixed does): it is held to the 16-bit peak
        fmt = "fp32" if run.precision == "32-true" else "16-bit"
        assert run.flops_by_format == {fmt: run.flops_per_step} and run.recomputed_flops == 0
        assert run.mfu == pytest.approx(run.flops_per_step / peak_flops("NVIDIA H200", fmt) / run.step_time_median_s)
        assert run.mfu_note is None


def test_an_mfu_above_100_percent_or_without_a_peak_is_never_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    _on_a_gpu_named(monkeypatch, "NVIDIA H200")
    slow = GpuSpec("H200", bf16_tflops=1e-9, tf32_tflops=1e-9, fp32_tflops=1e-9, fp8_tflops=None, bandwidth_tbs=1.0)
    monkeypatch.setattr(flops, "gpu_spec", lambda name: slow)  # a peak far below what the step measures
    run = run_bench(_workload(), ["32-true"], "cpu", rounds=1).runs[0]
    assert run.mfu is None and "of H200's dense peak is impossible" in run.mfu_note
    monkeypatch.undo()
    _on_a_gpu_named(monkeypatch, "NVIDIA Future GPU")
    run = run_bench(_workload(), ["32-true"], "cpu", rounds=1).runs[0]
    assert run.mfu is None and "no dense peak is known for 'NVIDIA Future GPU'" in run.mfu_note


def test_policy_objects_run_as_given_and_are_never_looked_up_again_by_name() -> None:
    # Policies the registry does not know by these names: a layer that turned a run's name back into a policy
    # (the runner's support check, the engine, the verdict's 16-bit-weights test) would fail or misjudge them.
    from ampkit.policy import BF16True, BF16TrueMasters, FullPrecision, get_policy

    def short() -> Workload:
        w = _workload()
        w.steps, w.warmup = 4, 1  # enough for losses and verdicts; the test is about which policy ran
        return w

    toys = [FullPrecision(), BF16True(name="toy-bf16-true", keep_fp32=("body.3",)), BF16TrueMasters(name="toy-masters")]
    result = run_bench(short(), toys, "cpu", rounds=1, count_flops=False)
    assert [(r.precision, r.status) for r in result.runs] == [("32-true", "ok"), ("toy-bf16-true", "ok"), ("toy-masters", "ok")]
    # Control: the registered policies with the same settings train the same numbers and earn the same recovery line.
    named = run_bench(short(), ["32-true", get_policy("bf16-true", keep_fp32=["body.3"]), "bf16-true-masters"], "cpu", rounds=1, count_flops=False)
    assert result.run("toy-bf16-true").losses == named.run("bf16-true").losses
    assert result.run("toy-masters").losses == named.run("bf16-true-masters").losses
    assert named.recovery is not None
    assert result.recovery == named.recovery.replace("bf16-true-masters", "toy-masters").replace("bf16-true", "toy-bf16-true")
