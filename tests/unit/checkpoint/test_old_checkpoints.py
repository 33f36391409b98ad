"""Checkpoints written before the optimizer step became a component of its own still load and resume bitwise.

The files in ``data/`` were written by ampkit as of 2026-11-28 (commit 21bdd22, the last one before the change) with
:func:`write_fixture`: a run of ``16-true-masters`` (fp16 model, fp32 masters, dynamic loss scale, an overflowed step)
and one of ``bf16-true-remainder`` (masters kept as int16 remainders), each saved inside an accumulation window,
so that every part of the engine's state is in the file: counters, the skipped count, the scaler, the masters, the
pending gradients, a scheduler. Each file's ``extra`` holds the weights the writer's uninterrupted run ended with.

Regenerate them only if the format changes on purpose (then old files are what this test is about, so keep
these): ``PYTHONPATH=src python tests/unit/checkpoint/test_old_checkpoints.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit import Engine, ScalerConfig

DATA = Path(__file__).with_name("data")
ACCUMULATE, STOP_AT, MICRO_BATCHES = 2, 7, 12  # saved after micro-batch 7: one micro-batch of a window pending
CASES = {"16-true-masters": "engine-2026-11-28-16-true-masters.pt", "bf16-true-remainder": "engine-2026-11-28-bf16-true-remainder.pt"}


class Net(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def build(precision: str, seed: int) -> tuple[Engine, nn.Module]:
    model = Net(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = ScalerConfig(init_scale=2.0**8, growth_interval=2) if precision.startswith("16-") else None
    engine = Engine(precision, accumulate=ACCUMULATE, clip_grad_norm=1.0, scaler=scaler)
    model, _ = engine.setup(model, opt, schedulers=sched)
    return engine, model


def train(engine: Engine, model: nn.Module, start: int, stop: int) -> None:
    for i in range(start, stop):
        g = torch.Generator().manual_seed(1000 + i)
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
        loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        if i == 3 and engine.scaler is not None:
            model.body[0].weight.grad.fill_(float("inf"))  # an overflowed (skipped) step before the save
        engine.step()


def weights(engine: Engine, model: nn.Module) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in model.parameters()]
    # Through state_dict(): remainder masters hold no fp32 data between steps.
    return tensors + (list(engine.masters.state_dict().values()) if engine.masters is not None else [])


def write_fixture(precision: str, path: Path) -> None:
    """Save ``precision``'s run at :data:`STOP_AT`, with the uninterrupted run's final weights in ``extra``."""
    reference, ref_model = build(precision, seed=0)
    train(reference, ref_model, 0, MICRO_BATCHES)
    engine, model = build(precision, seed=0)
    train(engine, model, 0, STOP_AT)
    engine.save(path, extra={"final": weights(reference, ref_model), "torch": str(torch.__version__)})


def _skip_where_this_torchs_scheduler_state_differs(saved: dict) -> None:
    """The files were written on torch 2.13, whose LR schedulers keep entries older releases lack (``_is_initial``);
    ampkit refuses a scheduler state with other entries (a different scheduler), so on such a torch (the
    oldest-torch leg's) the old file cannot load, whatever ampkit's own layout."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    here = set(torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5).state_dict())
    if here != set(saved["schedulers"][0]):
        pytest.skip(f"torch {torch.__version__}'s StepLR keeps other entries than the writer's torch {saved['extra']['torch']}")


def _load(precision: str) -> tuple[Engine, nn.Module, dict]:
    path = DATA / CASES[precision]
    engine, model = build(precision, seed=99)  # other weights: the load overwrites them
    extra = engine.load(path)
    return engine, model, extra


@pytest.mark.parametrize("precision", list(CASES))
def test_a_checkpoint_of_the_old_layout_puts_every_part_back(precision: str) -> None:
    """Each part lands where it belongs: the engine's state read back equals the file's, entry for entry."""
    saved = torch.load(DATA / CASES[precision], weights_only=True)["payload"]
    _skip_where_this_torchs_scheduler_state_differs(saved)
    engine, model, _ = _load(precision)
    state = engine.state_dict()
    assert sorted(state) == sorted(saved["engine"])
    for key, value in saved["engine"].items():
        if key in ("masters", "pending_grads"):
            assert sorted(state[key]) == sorted(value)
            for name, tensor in value.items():
                assert state[key][name].dtype == tensor.dtype and torch.equal(state[key][name], tensor), (key, name)
        else:
            assert state[key] == value, key
    for (name, tensor), p in zip(saved["models"][0].items(), model.state_dict().values()):
        assert torch.equal(p, tensor), name
    assert engine.micro_batches_pending == STOP_AT % ACCUMULATE and engine.steps == STOP_AT // ACCUMULATE
    if precision.startswith("16-"):
        assert engine.skipped_steps == 1


@pytest.mark.parametrize("precision", list(CASES))
def test_a_checkpoint_of_the_old_layout_resumes_bitwise(precision: str) -> None:
    """Resumed from the old file, the run ends on the very weights the writer's uninterrupted run ended on.

    Those were computed by the writer's torch on the writer's CPU: where this machine computes the first
    micro-batches otherwise (another torch, another instruction set), they cannot be met bit for bit, and the test
    says so (tests/unit/checkpoint/test_checkpoint.py checks resume on every machine, with files it writes)."""
    saved = torch.load(DATA / CASES[precision], weights_only=True)["payload"]
    _skip_where_this_torchs_scheduler_state_differs(saved)
    control, control_model = build(precision, seed=0)
    train(control, control_model, 0, STOP_AT)
    if not all(torch.equal(p, t) for p, t in zip(control_model.state_dict().values(), saved["models"][0].values())):
        pytest.skip(f"this machine's kernels round the first micro-batches otherwise than the writer's (torch {saved['extra']['torch']})")
    engine, model, extra = _load(precision)
    train(engine, model, STOP_AT, MICRO_BATCHES)
    got = weights(engine, model)
    assert len(got) == len(extra["final"])
    for a, b in zip(got, extra["final"]):
        assert torch.equal(a, b)
    train(control, control_model, STOP_AT, MICRO_BATCHES)
    assert (engine.steps, engine.skipped_steps, engine.scale) == (control.steps, control.skipped_steps, control.scale)

if __name__ == "__main__":
    DATA.mkdir(exist_ok=True)
    for name, file in CASES.items():
        write_fixture(name, DATA / file)
        print("wrote", DATA / file, file=sys.stderr)
