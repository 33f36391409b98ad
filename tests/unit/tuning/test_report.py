"""The ranked table, its definitions and the winner's code, from a tune's measurements (no training here)."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest
import torch

import ampkit
from ampkit.bench import speedup_interval
from ampkit.tuning import Candidate, GuardResult, Trial, TuneResult, code, rows, write_files
from ampkit.tuning._guard import Reference
from ampkit.tuning._report import COLUMNS, VERDICTS, footnotes

START = Candidate(policy="32-true", micro_batch=32, accumulate=1)
BASE = [0.020, 0.021, 0.019, 0.020, 0.022, 0.020]


def _trial(c: Candidate, times: list[float], role: str = "candidate", **kw: object) -> Trial:
    return Trial(key=c.key, stage="precision", candidate=c.to_dict(), role=role, step_times_s=times, baseline_times_s=BASE, **kw)  # type: ignore[arg-type]


def _result() -> TuneResult:
    fast = dataclasses.replace(START, policy="bf16-mixed", compile="regional")
    lossy = dataclasses.replace(START, policy="bf16-true")
    slow = dataclasses.replace(START, threads=1)
    same = dataclasses.replace(START, policy="bf16-true-masters")
    broken = dataclasses.replace(START, fused_step=True)
    ref = Reference("accuracy", True, value=0.90, reordered=0.89, floor=0.02, steps=30)
    guard = {
        fast.numerics_key: GuardResult(fast.key, "accuracy", True, 0.895, 0.90, ref.noise, ref.tolerance),
        lossy.numerics_key: GuardResult(lossy.key, "accuracy", True, 0.60, 0.90, ref.noise, ref.tolerance),
    }
    trials = [
        _trial(START, BASE, role="baseline", peak_memory_bytes=4096),
        _trial(fast, [t / 2 for t in BASE], compile_s=8.0, peak_memory_bytes=None),
        _trial(lossy, [t / 3 for t in BASE]),
        _trial(slow, [t * 2 for t in BASE]),
        _trial(same, list(BASE)),
        _trial(broken, [], status="failed", error="ValueError: fused_step: no masters"),
    ]
    return TuneResult(workload="toy", description="", device={"type": "cpu", "name": "cpu"}, unit="samples", items_per_step=32,
                      run_steps=1000, budget_s=60, start=START, baseline=START, winner=fast, winner_reason="fastest proven",
                      trials=trials, reference=ref, guard=guard, settings={"clip_grad_norm": 1.0, "guard_steps": 30})


def test_rows_rank_the_winner_first_and_give_each_its_verdict() -> None:
    table = rows(_result())
    verdicts = {r["configuration"]: r["verdict"] for r in table}
    assert verdicts == {
        "precision bf16-mixed, compile regional": "winner", "precision bf16-true": "rejected", "1 threads": "slower",
        "precision bf16-true-masters": "no gain", "as given": "start", "fused step on": "failed",
    }
    assert table[0]["verdict"] == "winner" and table[-1]["verdict"] == "failed"
    assert set(verdicts.values()) <= set(VERDICTS)


def test_throughput_and_speed_up_amortise_compile_time_and_use_the_baselines_times_of_the_wave() -> None:
    winner = rows(_result())[0]
    amortised = statistics.median([t / 2 for t in BASE]) + 8.0 / 1000
    assert winner["throughput"] == pytest.approx(32 / amortised)
    assert winner["start_then"] == pytest.approx(32 / statistics.median(BASE))  # the speed-up's control, as throughput
    assert winner["throughput"] / winner["start_then"] == pytest.approx(winner["speedup"])
    assert winner["speedup"] == pytest.approx(statistics.median(BASE) / amortised)
    assert winner["interval"] == speedup_interval(BASE, [t / 2 + 8.0 / 1000 for t in BASE])
    assert winner["gap"] == pytest.approx(0.005) and winner["tolerance"] == pytest.approx(0.02)
    rejected = next(r for r in rows(_result()) if r["verdict"] == "rejected")
    assert "0.3 worse than fp32's 0.9, beyond the tolerance 0.02 (fp32's own noise 0.01)" in rejected["why"]


def test_every_column_and_every_verdict_used_is_defined_under_the_table() -> None:
    notes = footnotes(_result())
    for column in COLUMNS:
        assert any(n.startswith(f"{column}: ") for n in notes)
    assert any("fp32's own noise: 0.01" in n and "the larger of 0.02" in n and "30 steps" in n for n in notes)
    used = {r["verdict"] for r in rows(_result())}
    assert {n.split(":")[0] for n in notes} >= used


def test_the_winners_code_is_the_engine_call_the_tune_measured() -> None:
    result = _result()
    result.winner = Candidate(policy="bf16-true-masters", micro_batch=16, accumulate=2, compile="regional", fused_step=True,
                              recompute=True, threads=1, loader=(("num_workers", 2), ("persistent_workers", True), ("torch_threads", 1)))
    text = code(result)
    engine_line = next(line for line in text.splitlines() if line.startswith("engine = "))
    engine = eval(engine_line.removeprefix("engine = "), {"ampkit": ampkit})  # the line runs as printed
    assert (engine.policy.name, engine.accumulate, engine.clip_grad_norm, engine.compile_plan is not None) == ("bf16-true-masters", 2, 1.0, True)
    assert "fused_step=True" in engine_line
    assert "ampkit.recompute(model, ampkit.memory.repeated_blocks(model))" in text
    assert "DataLoader(dataset, batch_size=16, num_workers=2, persistent_workers=True)  # 16 x 2 micro-batches = your batch of 32" in text
    assert "torch.set_num_threads(1)" in text
    result.winner = Candidate(policy="16-mixed", micro_batch=32, accumulate=1, keep_fp32=("head",))  # the doctor's fix
    engine_line = next(line for line in code(result).splitlines() if line.startswith("engine = "))
    assert eval(engine_line.removeprefix("engine = "), {"ampkit": ampkit}).policy.keep_fp32 == ("head",)


def test_the_files_hold_the_same_table(tmp_path: Path) -> None:
    result = _result()
    data_path, report = write_files(result, tmp_path)
    data = json.loads(data_path.read_text())
    assert [r["verdict"] for r in data["rows"]] == [r["verdict"] for r in rows(result)]
    assert data["winner_code"] == code(result) and data["reference"]["tolerance"] == pytest.approx(0.02)
    text = report.read_text()
    assert "| precision bf16-mixed, compile regional |" in text and "- winner: the recommendation" in text
    assert Candidate.from_dict(data["winner"]) == result.winner


def test_a_channels_last_winners_code_converts_the_model_and_its_inputs() -> None:
    result = _result()
    assert "channels_last" not in code(result)
    result.winner = dataclasses.replace(result.winner, channels_last=True)
    lines = code(result).splitlines()
    model_line = lines.index("model = model.to(memory_format=torch.channels_last)  # before setup: convolutions in NHWC")
    assert model_line < next(i for i, line in enumerate(lines) if line.startswith("model, optimizer = engine.setup"))
    assert "# each batch's 4-D inputs: images = images.to(device, memory_format=torch.channels_last)" in lines
    model = torch.nn.Conv2d(3, 4, 3)
    converted = eval(lines[model_line].split("  #")[0].removeprefix("model = "), {"torch": torch, "model": model})  # runs as printed
    assert converted.weight.is_contiguous(memory_format=torch.channels_last)


def test_the_winners_code_is_in_the_terms_of_the_framework_the_model_came_from(tmp_path: Path) -> None:
    result = _result()  # bf16-mixed, compiled block by block, clipped at 1.0, on the CPU
    engine_form = code(result)
    assert engine_form.splitlines()[0] == "import ampkit" and "engine = ampkit.Engine('bf16-mixed'" in engine_form  # no tag: as before
    result.framework = "lightning"
    lightning = code(result)
    assert lightning.splitlines()[0] == "import lightning as L" and "ampkit.Engine" not in lightning
    assert 'L.Trainer(accelerator="cpu", precision="bf16-mixed", gradient_clip_val=1.0)' in lightning
    assert "    model.get_submodule(name).compile()" in lightning
    assert lightning.endswith("\ntrainer.fit(model)") and "DataLoader" not in lightning  # the user's batch, unchanged: their loader stays
    result.framework, result.supports_gradient_checkpointing = "transformers", True
    result.winner = dataclasses.replace(result.winner, micro_batch=16, accumulate=2, recompute=True, compile="model")
    hf = code(result)
    assert ("args = TrainingArguments(use_cpu=True, bf16=True, per_device_train_batch_size=16, gradient_accumulation_steps=2, max_grad_norm=1.0, "
            "torch_compile=True, activation_checkpointing=True)  # 16 x 2 micro-batches = your batch of 32; beside your other arguments") in hf
    assert "trainer = Trainer(model=model, args=args, train_dataset=train_dataset)" in hf and "ampkit.recompute" not in hf
    data_path, report = write_files(result, tmp_path)
    data = json.loads(data_path.read_text())
    assert (data["framework"], data["supports_gradient_checkpointing"], data["winner_code"]) == ("transformers", True, hf)
    assert f"```python\n{hf}\n```" in report.read_text()


def test_a_winner_measured_without_clipping_turns_off_the_trainers_default_clip() -> None:
    result = _result()
    result.framework, result.settings = "transformers", {"clip_grad_norm": None}
    assert "max_grad_norm=0.0" in code(result)  # the Trainer clips at 1.0 unless told
    result.settings = {}  # a result that does not say: nothing printed either way
    assert "max_grad_norm" not in code(result)


def test_a_disturbed_waves_rows_are_shown_not_judged_and_each_row_says_its_rounds(tmp_path: Path) -> None:
    # A candidate 2x faster in a wave the machine disturbed (its rounds could not be measured again): shown, with its
    # figures, as "disturbed", never "faster"; every row's rounds cell holds the rounds its figure rests on and those
    # dropped; the machine's line is under the table and in report.md.
    result = _result()
    lucky = dataclasses.replace(START, policy="bf16-true-kahan")
    result.trials.append(_trial(lucky, [t / 2 for t in BASE], rounds=2, dropped_rounds=3, disturbed=True))
    result.trials[1].rounds, result.trials[1].dropped_rounds = 4, 1
    result.machine = {"cores": 2, "others_cores_at_probe": 1.1, "busy_at_probe": True, "oversubscribed": True, "free_threads": 1}
    result.waves = [{"stage": "precision", "others_cores": 1.3, "dropped_rounds": 4, "disturbed": True}]
    table = {r["configuration"]: r for r in rows(result)}
    assert table["precision bf16-true-kahan"]["verdict"] == "disturbed" and table["precision bf16-true-kahan"]["speedup"] == pytest.approx(2.0)
    from ampkit.tuning._report import _cells

    assert _cells(result, table["precision bf16-true-kahan"])[6] == "2 +3"
    assert _cells(result, table["precision bf16-mixed, compile regional"])[6] == "4 +1"
    notes = footnotes(result)
    assert any(n.startswith("disturbed: the machine disturbed its wave") for n in notes)
    line = ("machine: busy: other processes took 1.1 of the 2 cores as the tune began, up to 1.3 during its waves; torch's threads "
            "would have oversubscribed the cores: measured at 1 thread(s), against the start there; 4 rounds dropped for drift and "
            "measured again; disturbed, not judged: precision")
    assert notes[-1] == line
    _, report = write_files(result, tmp_path)
    assert f"- {line}" in report.read_text()
