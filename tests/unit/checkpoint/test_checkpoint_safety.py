"""A load that fails changes nothing: every mismatch is found before the first assignment, and a failure
part-way (found only while applying) puts the whole run back, bitwise."""

from __future__ import annotations

import collections
import enum
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from torch import nn

from ampkit import CheckpointError, Engine
from ampkit.fileio._checkpoint_files import load_checkpoint, save_checkpoint


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.GELU(), nn.Dropout(0.1), nn.Linear(16, 3))


def _run(precision: str = "32-true", *, seed: int = 0, optimizer: str = "adamw", scaler: Any = None, steps: int = 3) -> tuple[Engine, nn.Module]:
    model = _net(seed)
    if optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    engine = Engine(precision, scaler=scaler, accumulate=2)
    model, _ = engine.setup(model, opt, schedulers=sched)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps * 2 + 1):  # ends inside a window: pending gradients are part of the state
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(torch.randn(8, 6, generator=g)).float(), torch.randint(0, 3, (8,), generator=g))
        engine.backward(loss)
        engine.step()
    return engine, model


def _everything(engine: Engine) -> dict[str, Any]:
    """All a load may touch, copied: weights, gradients, optimizer state and groups, scheduler, counters, RNG."""
    model = engine.models[0]
    opt = engine.optimizers[0]
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "opt_state": {i: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()} for i, s in enumerate(opt.state.values())},
        "opt_groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        "sched": dict(engine.schedulers[0].state_dict()),
        "counters": (engine.steps, engine.step_state.micro, engine.skipped_steps, engine.scale),
        "rng": (torch.get_rng_state().clone(), random.getstate()),
    }


def _assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    for a, b in zip(before["params"], after["params"]):
        assert torch.equal(a, b)
    for a, b in zip(before["grads"], after["grads"]):
        assert (a is None and b is None) or torch.equal(a, b)
    assert before["opt_state"].keys() == after["opt_state"].keys()
    for i, entry in before["opt_state"].items():
        assert entry.keys() == after["opt_state"][i].keys()
        for k, v in entry.items():
            assert torch.equal(v, after["opt_state"][i][k]) if isinstance(v, torch.Tensor) else v == after["opt_state"][i][k]
    assert before["opt_groups"] == after["opt_groups"]
    assert before["sched"] == after["sched"]
    assert before["counters"] == after["counters"]
    assert torch.equal(before["rng"][0], after["rng"][0]) and before["rng"][1] == after["rng"][1]


def _refused(engine: Engine, path: Path, match: str) -> None:
    before = _everything(engine)
    with pytest.raises(CheckpointError, match=match):
        engine.load(path)
    _assert_same(before, _everything(engine))


def _tampered(tmp_path: Path, change: Callable[[dict], None], **run: Any) -> Path:
    engine, _ = _run(**run)
    path = tmp_path / "ckpt.pt"
    engine.save(path)
    payload = load_checkpoint(path)
    change(payload)
    save_checkpoint(payload, path)
    return path


@pytest.mark.parametrize("saved, loading", [(None, 128.0), (128.0, None)], ids=["dynamic-into-static", "static-into-dynamic"])
def test_a_checkpoint_of_another_scaler_kind_is_refused_before_anything_changes(tmp_path, saved, loading):
    writer, _ = _run("16-mixed", scaler=saved)
    writer.save(tmp_path / "c.pt")
    reader, _ = _run("16-mixed", seed=1, scaler=loading)
    _refused(reader, tmp_path / "c.pt", "loss scaler is '(dynamic|static)'.*pass the same scaler=")


def test_an_sgd_checkpoint_is_refused_by_an_adamw_run_and_back(tmp_path):
    sgd, _ = _run(optimizer="sgd")
    sgd.save(tmp_path / "sgd.pt")
    adamw, _ = _run(optimizer="adamw", seed=1)
    adamw.save(tmp_path / "adamw.pt")
    _refused(adamw, tmp_path / "sgd.pt", "saved from another optimizer class")
    _refused(sgd, tmp_path / "adamw.pt", "saved from another optimizer class")


def _set(*keys: Any, value: Any) -> Callable[[dict], None]:
    def change(payload: dict) -> None:
        node = payload
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value

    return change


def _drop(*keys: Any) -> Callable[[dict], None]:
    def change(payload: dict) -> None:
        node = payload
        for k in keys[:-1]:
            node = node[k]
        del node[keys[-1]]

    return change


@pytest.mark.parametrize(
    "change, match",
    [
        (_set("engine", "steps", value="many"), "engine counters are invalid.*steps='many'"),
        (_set("engine", "skipped_steps", value=-1), "engine counters are invalid"),
        (_set("engine", "rounding", value={"seed": "lucky", "draws": 0}), "engine counters are invalid.*rounding="),
        (_drop("engine", "micro"), r"engine state lacks \['micro'\]"),
        (_set("rng", "torch", value=torch.zeros(7, dtype=torch.uint8)), "RNG snapshot's torch state is malformed"),
        (_set("rng", "python", value=[3, [1, 2], None]), "RNG snapshot's python state is malformed"),
        (_set("schedulers", 0, "last_epoch", value="late"), r"scheduler 0 \(StepLR\)\['last_epoch'\] is a str"),
        (_drop("schedulers", 0, "gamma"), "scheduler 0 .*missing \\['gamma'\\]"),
        (_set("optimizers", 0, "state", 0, "exp_avg", value=torch.zeros(3)), "exp_avg.* has shape \\(3,\\)"),
        (_set("optimizers", 0, "param_groups", 0, "betas", value="fast"), "setting 'betas' is a str"),
        (_set("models", 0, "0.weight", value="weights"), "not tensors \\['0.weight'\\]"),
        (_set("engine", "pending_grads", "0.weight", value=torch.zeros(2)), "pending gradients\\['0.weight'\\] has shape"),
    ],
    ids=["steps-str", "skipped-negative", "rounding-seed-str", "engine-key-missing", "torch-rng", "python-rng", "sched-type", "sched-key",
         "opt-state-shape", "opt-setting-type", "model-entry", "pending-grad-shape"],
)
@pytest.mark.parametrize("reader_steps", [0, 3], ids=["fresh-reader", "trained-reader"])
def test_a_malformed_entry_is_refused_before_anything_changes(tmp_path, change, match, reader_steps):
    path = _tampered(tmp_path, change)
    engine, _ = _run(seed=1, steps=reader_steps)
    _refused(engine, path, match)


class _Fragile(nn.Module):
    """Loads its own state last and refuses it: a failure that only shows while applying."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _net(1)
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        if self.fail:
            raise RuntimeError("refusing to load")
        super()._load_from_state_dict(*args, **kwargs)


def _fragile_run(steps: int) -> tuple[Engine, _Fragile]:
    model = _Fragile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine = Engine("16-mixed", accumulate=2)
    engine.setup(model, opt, schedulers=torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5))
    x = torch.randn(8, 6)
    for _ in range(steps):  # optimizer state, a pending gradient and a moved scale to lose
        with engine.autocast():
            engine.backward(model(x).float().pow(2).mean())
        engine.step()
    return engine, model


def test_a_failure_part_way_through_applying_puts_everything_back(tmp_path):
    writer, _ = _fragile_run(5)
    writer.save(tmp_path / "c.pt")
    reader, model = _fragile_run(3)
    model.fail = True
    before = _everything(reader)
    with pytest.raises(CheckpointError, match="failed part-way.*refusing to load.*was restored"):
        reader.load(tmp_path / "c.pt")
    _assert_same(before, _everything(reader))
    model.fail = False
    reader.load(tmp_path / "c.pt")  # and the same file loads once the module accepts it
    assert (reader.steps, reader.step_state.micro) == (writer.steps, writer.step_state.micro)


def test_engine_load_state_dict_validates_too():
    engine, _ = _run()
    state = engine.state_dict()
    state["micro"] = None
    other, _ = _run(seed=1)
    before = _everything(other)
    with pytest.raises(CheckpointError, match="micro=None"):
        other.load_state_dict(state)
    _assert_same(before, _everything(other))


def test_a_load_keeps_the_kernel_guards_whatever_fused_flags_the_checkpoint_carries(tmp_path):
    def sgd_run() -> tuple[Engine, torch.optim.Optimizer]:
        model = _net(0)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, fused=True)
        engine = Engine("bf16-true")
        engine.setup(model, opt)
        return engine, opt

    engine, opt = sgd_run()
    if opt.param_groups[0]["fused"]:
        pytest.skip("no kernel guard switches fused SGD on bf16 parameters on this torch and device")
    engine.save(tmp_path / "c.pt")
    payload = load_checkpoint(tmp_path / "c.pt")
    payload["optimizers"][0]["param_groups"][0]["fused"] = True  # as saved where the kernel is sound
    save_checkpoint(payload, tmp_path / "c.pt")
    reader, reader_opt = sgd_run()
    reader.load(tmp_path / "c.pt")
    assert reader_opt.param_groups[0]["fused"] is False and not reader_opt._step_supports_amp_scaling


class _Pair(NamedTuple):
    step: int
    loss: float


class _Phase(enum.IntEnum):
    WARMUP = 1


@pytest.mark.parametrize(
    "value, fix",
    [
        (np.float64(0.5), r"float\(value\)"),  # what a metric computed with numpy is
        (np.int64(3), r"int\(value\)"),
        (torch.__version__, r"str\(value\)"),  # a str subclass (TorchVersion)
        (_Phase.WARMUP, r"int\(value\)"),
        (_Pair(1, 0.5), r"tuple\(value\)"),
        (collections.defaultdict(list), r"dict\(value\)"),
    ],
    ids=["numpy-float", "numpy-int", "torch-version", "int-enum", "namedtuple", "defaultdict"],
)
def test_an_extra_that_a_load_would_refuse_is_refused_at_save_naming_the_conversion(tmp_path: Path, value: object, fix: str) -> None:
    """Only what torch.load(weights_only=True) reads back may be saved: a subclass of a number, a string, a tuple or a
    dict pickles as its own class, which the load refuses, and the run could never be resumed from that file."""
    engine, _ = _run(steps=1)
    with pytest.raises(CheckpointError, match=rf"extra\['v'\] holds .*; store {fix}"):
        engine.save(tmp_path / "c.pt", extra={"v": value})
    assert not (tmp_path / "c.pt").exists()


def test_plain_numbers_strings_and_containers_in_extra_round_trip(tmp_path: Path) -> None:
    extra = {"epoch": 3, "loss": 0.25, "done": False, "name": "run", "none": None, "seen": [1, (2, 3)], "t": torch.ones(2), "nested": {"k": [1.5]}}
    engine, _ = _run(steps=1)
    engine.save(tmp_path / "c.pt", extra=extra)
    back = engine.load(tmp_path / "c.pt")
    assert back.keys() == extra.keys() and torch.equal(back.pop("t"), extra.pop("t")) and back == extra
