"""MFU in the tune's table: the bench's definition on the bench's FLOP counter, checked against FLOPs counted by hand
for a small MLP and against a fake GPU's peaks (no GPU here)."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch
from torch import nn

from ampkit.policy import _gpu_specs
from ampkit.tuning import Candidate, TuneResult, WaveSettings, rows
from ampkit.tuning._mfu import counts_flops
from ampkit.tuning._report import HEADERS, footnotes
from ampkit.tuning._trials import step_flops
from ampkit.tuning._wave import measure_wave
from ampkit.workloads import Workload

ROWS, IN, HIDDEN, OUT = 8, 6, 16, 3
# One optimizer step by hand: each Linear's forward is 2*rows*in*out; backward computes its weight's gradient (the
# same again) and its input's (the same again), except the first layer's: the data needs no gradient.
LAYERS = [(IN, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, OUT)]
HAND_FLOPS = sum(2 * ROWS * i * o * (2 if n == 0 else 3) for n, (i, o) in enumerate(LAYERS))
FAKE = _gpu_specs.GpuSpec("Fake GPU X1", bf16_tflops=2.0, tf32_tflops=1.5, fp32_tflops=1.0, fp8_tflops=None, bandwidth_tbs=1.0)
START = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)


def _workload() -> Workload:
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(ROWS, IN, generator=g), torch.randint(0, OUT, (ROWS,), generator=g)) for _ in range(3)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh()), nn.Linear(HIDDEN, OUT))
    return Workload(name="mlp", model=model, train_batches=batches, items_per_batch=ROWS, steps=4, warmup=1)


@pytest.fixture(scope="module")
def wave() -> tuple[list, dict]:
    # fp32 (the control), bf16-mixed (its matmuls in 16-bit), and the same fp32 step in two micro-batches: the
    # useful FLOPs of the global batch are the same.
    flops: dict[str, dict[str, float]] = {}
    candidates = [dataclasses.replace(START, policy="bf16-mixed"), dataclasses.replace(START, micro_batch=ROWS // 2, accumulate=2)]
    trials = measure_wave(_workload(), "precision", START, candidates, torch.device("cpu"),
                          settings=WaveSettings(rounds=2, chunk=2, warmup=1), flops=flops)
    return trials, flops


def test_each_configurations_step_flops_are_counted_by_format_as_by_hand(wave: tuple[list, dict]) -> None:
    trials, flops = wave
    by_key = {t.key: t.flops_by_format for t in trials}
    assert by_key[START.key] == {"fp32": HAND_FLOPS}
    assert by_key[dataclasses.replace(START, policy="bf16-mixed").key] == {"16-bit": HAND_FLOPS}
    assert by_key[dataclasses.replace(START, micro_batch=ROWS // 2, accumulate=2).key] == {"fp32": HAND_FLOPS}
    assert len(flops) == 3  # once per policy and micro-batches


def test_a_compiled_configurations_flops_are_its_eager_twins_with_recompute_left_out() -> None:
    # Nothing compiles here: the count runs the eager twin (the bench copies a compiled run's count from its eager run).
    compiled = dataclasses.replace(START, compile="model", fused_step=True, recompute=True)
    assert step_flops(_workload(), compiled, torch.device("cpu"), seed=0) == {"fp32": HAND_FLOPS}


def test_mfu_is_the_steps_flops_at_each_formats_peak_over_the_median_step(wave: tuple[list, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    trials, _ = wave
    monkeypatch.setattr(_gpu_specs, "GPU_SPECS", (*_gpu_specs.GPU_SPECS, FAKE))
    result = TuneResult(workload="mlp", description="", device={"type": "cuda", "name": "Fake GPU X1"}, unit="samples",
                        items_per_step=ROWS, run_steps=1000, budget_s=60, start=START, baseline=START, winner=START, trials=trials)
    table = {r["key"]: r for r in rows(result)}
    peaks = {"32-true": FAKE.fp32_tflops * 1e12, "bf16-mixed": FAKE.bf16_tflops * 1e12}
    for t in trials:
        expected = HAND_FLOPS / peaks[t.candidate["policy"]] / statistics.median(t.step_times_s)
        assert table[t.key]["mfu"] == pytest.approx(expected, rel=1e-9), t.key
        assert table[t.key]["flops_per_step"] == HAND_FLOPS
    assert "MFU" in HEADERS and any(n.startswith("MFU: model FLOPs utilisation, ampkit bench's definition") for n in footnotes(result))


def test_no_mfu_and_no_count_where_the_devices_peak_is_unknown(wave: tuple[list, dict]) -> None:
    trials, _ = wave
    cpu = {"type": "cpu", "name": "Intel(R) Xeon(R) Processor"}
    assert not counts_flops(cpu) and counts_flops({"type": "cuda", "name": "NVIDIA H100 80GB HBM3"})
    result = TuneResult(workload="mlp", description="", device=cpu, unit="samples", items_per_step=ROWS, run_steps=1000,
                        budget_s=60, start=START, baseline=START, winner=START, trials=trials)
    assert {(r["mfu"], r["mfu_note"]) for r in rows(result)} == {(None, "no dense peak is known for this device")}
