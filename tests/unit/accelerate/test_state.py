"""``accelerator.save_state`` / ``load_state`` with the engine's state: a run saved mid-way and resumed by a fresh
accelerator, model and optimizer continues the uninterrupted run bit for bit (dropout, accumulation, a loss scale that
has moved, fp32 masters), as Accelerate's own bf16 run does; and a folder that cannot be resumed exactly is named."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from torch import nn

import ampkit
from ampkit.accelerate import AmpkitAccelerator

STEPS, SAVE_AT, ACCUMULATE = 10, 4, 2
Batch = tuple[torch.Tensor, torch.Tensor]


def _fresh(make: Callable[[], Accelerator]) -> Accelerator:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return make()


def _batches() -> list[Batch]:
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(8, 3, generator=g)
    xs = [torch.randn(16, 8, generator=g) for _ in range(STEPS * ACCUMULATE)]
    return [(x, (x @ teacher).argmax(1)) for x in xs]


MAKERS: dict[str, Callable[[], Accelerator]] = {
    # Accelerate's own bf16: the control, showing which difference (if any) is ampkit's.
    "accelerate bf16": lambda: Accelerator(mixed_precision="bf16", gradient_accumulation_steps=ACCUMULATE),
    "ampkit bf16-mixed": lambda: AmpkitAccelerator("bf16-mixed", gradient_accumulation_steps=ACCUMULATE),
    # The scale grows every 2 clean steps: a resume that lost it would train on another scale.
    "ampkit 16-mixed": lambda: AmpkitAccelerator("16-mixed", scaler=ampkit.ScalerConfig(init_scale=2.0**8, growth_interval=2),
                                                 gradient_accumulation_steps=ACCUMULATE),
    "ampkit bf16-true-masters": lambda: AmpkitAccelerator("bf16-true-masters", gradient_accumulation_steps=ACCUMULATE),
}


def _train(make: Callable[[], Accelerator], batches: list[Batch], steps: range, save: Path | None = None, load: Path | None = None) -> dict[str, Any]:
    """Build everything afresh (as a new process would), optionally load a folder, train ``steps``, optionally save."""
    accelerator = _fresh(make)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / (2 * STEPS))
    model, opt, sched = accelerator.prepare(model, opt, sched)
    torch.manual_seed(1)  # the dropout stream, which save_state/load_state carry
    if load is not None:
        accelerator.load_state(str(load))
    losses = []
    for i in range(steps.start * ACCUMULATE, steps.stop * ACCUMULATE):
        x, y = batches[i]
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x).float(), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
        losses.append(loss.item())
    if save is not None:
        accelerator.save_state(str(save))
    engine = getattr(accelerator, "engine", None)
    return {"losses": losses, "params": [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()],
            "scale": engine.scale if engine is not None else None, "accelerator": accelerator}


@pytest.mark.parametrize("name", list(MAKERS))
def test_a_resumed_run_continues_the_uninterrupted_one_bit_for_bit(tmp_path: Path, name: str) -> None:
    make, data = MAKERS[name], _batches()
    whole = _train(make, data, range(STEPS))
    first = _train(make, data, range(SAVE_AT), save=tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "ampkit_state.pt").exists() == name.startswith("ampkit")
    second = _train(make, data, range(SAVE_AT, STEPS), load=tmp_path / "ckpt")
    assert first["losses"] + second["losses"] == whole["losses"]
    for p, q in zip(second["params"], whole["params"]):
        assert torch.equal(p, q)
    assert second["scale"] == whole["scale"]
    if name == "ampkit 16-mixed":
        assert whole["scale"] > 2.0**8  # it moved, and the resume took it up where it was


def test_masters_and_scale_come_from_the_file_not_from_the_weights(tmp_path: Path) -> None:
    """The file is what makes the resume exact: without it (a folder from a plain Accelerator), the masters restart from
    the rounded bf16 weights and the run drifts; that case is named in a warning, not trained on in silence."""
    make, data = MAKERS["ampkit bf16-true-masters"], _batches()
    whole = _train(make, data, range(STEPS))
    _train(make, data, range(SAVE_AT), save=tmp_path / "ckpt")
    (tmp_path / "ckpt" / "ampkit_state.pt").unlink()
    logger = logging.getLogger("ampkit")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        second = _train(make, data, range(SAVE_AT, STEPS), load=tmp_path / "ckpt")
    finally:
        logger.removeHandler(handler)
    message = " ".join(r.getMessage() for r in records)
    assert "has no ampkit_state.pt" in message and "master weights are taken from the saved 16-bit weights" in message
    assert any(not torch.equal(p, q) for p, q in zip(second["params"], whole["params"]))


def _saved(tmp_path: Path, policy: str = "16-mixed") -> tuple[Path, Callable[[], Accelerator]]:
    make = lambda: AmpkitAccelerator(policy, gradient_accumulation_steps=ACCUMULATE)
    _train(make, _batches(), range(2), save=tmp_path / "ckpt")
    return tmp_path / "ckpt", make


def _load_fails(folder: Path, make: Callable[[], Accelerator], match: str) -> None:
    """load_state of ``folder`` raises ``match`` before Accelerate has loaded anything: the model is as it was."""
    accelerator = _fresh(make)
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2)
    model, opt = accelerator.prepare(model, opt)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ampkit.CheckpointError, match=match):
        accelerator.load_state(str(folder))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_a_damaged_state_file_is_refused_before_anything_loads(tmp_path: Path) -> None:
    folder, make = _saved(tmp_path)
    path = folder / "ampkit_state.pt"
    path.write_bytes(path.read_bytes()[:-100])
    _load_fails(folder, make, "truncated or corrupt")


class _Payload:
    def __reduce__(self) -> Any:
        return (print, ("this ran at load time",))


def test_a_state_file_that_would_run_code_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Read with weights_only=True: a pickled callable is refused, not called (Accelerate's register_for_checkpointing
    would load it with weights_only=False)."""
    folder, make = _saved(tmp_path)
    torch.save({"format": "ampkit-checkpoint", "format_version": 1, "state": _Payload()}, folder / "ampkit_state.pt")
    _load_fails(folder, make, "arbitrary Python objects")
    assert "this ran at load time" not in capsys.readouterr().out


def test_a_state_file_of_another_policy_is_refused_naming_it(tmp_path: Path) -> None:
    folder, _ = _saved(tmp_path, "16-mixed")
    _load_fails(folder, lambda: AmpkitAccelerator("bf16-true-masters", gradient_accumulation_steps=ACCUMULATE), "written under policy '16-mixed'")


def test_without_the_file_the_masters_take_the_loaded_weights_not_the_fresh_models(tmp_path: Path) -> None:
    """Loaded into a model initialised otherwise, the fp32 masters take the loaded (16-bit) weights, as the warning
    says; they do not keep the fresh model's values, which the first step would write back over the loaded ones."""
    make, data = MAKERS["ampkit bf16-true-masters"], _batches()
    saved = _train(make, data, range(SAVE_AT), save=tmp_path / "ckpt")
    (tmp_path / "ckpt" / "ampkit_state.pt").unlink()
    accelerator = _fresh(make)
    torch.manual_seed(7)  # another initialisation than the saved run's
    model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 3))
    model, _ = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=2e-2))
    accelerator.load_state(str(tmp_path / "ckpt"))
    masters = accelerator.engine.masters
    assert all(torch.equal(m.to(p.dtype), p) for m, p in zip(masters.masters, masters.model_params))
    for p, q in zip(accelerator.unwrap_model(model).parameters(), saved["params"]):
        assert torch.equal(p, q)
