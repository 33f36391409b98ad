"""The workload registry, and the contract every registered builder honours at ``tiny`` size.

The contract (determinism, the caller's RNG left alone, a tiny run that learns, the Workload fields the runner
relies on) is checked here once for all the workloads; each module's own test file checks what is particular
to it (shapes, the model, the data).
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

import ampkit
from ampkit.workloads import WORKLOADS, get_workload, workload_names
from ampkit.workloads._workload import SIZES, Workload

NAMES = ["digits", "digits-aug", "segment", "gpt", "resnet"]


@pytest.fixture(scope="module")
def tiny() -> dict[tuple[str, int], Workload]:
    """Built once per module: (name, seed) -> tiny workload. Tests must not mutate them."""
    return {(name, seed): get_workload(name, "tiny", seed) for name in NAMES for seed in (0, 1)}


def _flat(batches) -> list[torch.Tensor]:
    return [t for batch in batches for t in batch]


# --------------------------------------------------------------------------------------------- registry


def test_names() -> None:
    assert workload_names() == sorted(NAMES)
    assert set(WORKLOADS) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_registry_entry_builds_the_named_workload(name: str, tiny) -> None:
    w = WORKLOADS[name](size="tiny", seed=0)
    assert isinstance(w, Workload) and w.name == name
    assert torch.equal(_flat(w.train_batches)[0], _flat(tiny[name, 0].train_batches)[0])


def test_unknown_name_suggests_the_closest() -> None:
    with pytest.raises(ValueError) as info:
        get_workload("segmnet")
    message = str(info.value)
    assert "\n" not in message
    assert "'segmnet'" in message and "did you mean 'segment'?" in message
    for name in NAMES:
        assert name in message


def test_unknown_name_without_a_close_match() -> None:
    with pytest.raises(ValueError, match=r"^unknown workload 'bert'; choose one of digits, digits-aug, gpt, resnet, segment\.$"):
        get_workload("bert")


@pytest.mark.parametrize("name", NAMES)
def test_unknown_size_lists_the_sizes(name: str) -> None:
    with pytest.raises(ValueError) as info:
        get_workload(name, size="medium")
    message = str(info.value)
    assert "\n" not in message and "'medium'" in message and ", ".join(SIZES) in message


@pytest.mark.parametrize("name", NAMES)
def test_builders_reject_an_unknown_size_too(name: str) -> None:
    module = __import__(f"ampkit.workloads._{name.replace('-', '_')}", fromlist=["build"])  # the module itself, not its moved alias
    with pytest.raises(ValueError, match="tiny, small, large"):
        module.build("huge")


def test_importing_the_registry_and_building_gpt_does_not_import_sklearn() -> None:
    # Only digits needs scikit-learn; `ampkit bench -w gpt` must work without it.
    code = (
        "import sys; from ampkit.workloads import get_workload; get_workload('gpt', 'tiny'); "
        "print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------------------------- contract


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_weights_and_batches(name: str, tiny) -> None:
    again = get_workload(name, "tiny", 0)
    first = tiny[name, 0]
    a, b = first.model.state_dict(), again.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for x, y in zip(_flat(first.train_batches) + _flat(first.eval_batches), _flat(again.train_batches) + _flat(again.eval_batches)):
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert len(first.train_batches) == len(again.train_batches) and len(first.eval_batches) == len(again.eval_batches)


@pytest.mark.parametrize("name", NAMES)
def test_another_seed_other_weights_and_batches(name: str, tiny) -> None:
    a, b = tiny[name, 0], tiny[name, 1]
    wa, wb = a.model.state_dict(), b.model.state_dict()
    assert any(not torch.equal(wa[k], wb[k]) for k in wa if wa[k].is_floating_point())
    assert not torch.equal(_flat(a.train_batches)[0], _flat(b.train_batches)[0])


@pytest.mark.parametrize("name", NAMES)
def test_caller_rng_untouched(name: str) -> None:
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    get_workload(name, "tiny", seed=7)
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("name", NAMES)
def test_workload_fields(name: str, tiny) -> None:
    w = tiny[name, 0]
    assert w.steps <= 10 and 0 < w.warmup < w.steps  # tiny: a handful of steps
    assert w.description and "\n" not in w.description
    assert w.extra["parameters"] == sum(p.numel() for p in w.model.parameters())
    x, y = w.batch(0)
    assert x.device.type == "cpu" and y.device.type == "cpu"
    assert w.items_per_batch == (y.numel() if w.unit == "tokens" else y.shape[0])
    assert (w.metric is None) == (len(w.eval_batches) == 0)
    for step in range(w.steps):  # the runner walks train_batches[step % len]: every batch has one shape
        assert w.batch(step)[0].shape == x.shape


def _loss_on(model: torch.nn.Module, w: Workload, batch) -> float:
    # Train mode, as the step that produced the batch's loss; a fixed seed gives both calls the same dropout.
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return w.loss_fn(model(batch[0]).float(), batch[1]).item()


@pytest.mark.parametrize("name", NAMES)
def test_tiny_run_learns(name: str, tiny) -> None:
    w = tiny[name, 0]
    model = copy.deepcopy(w.model)
    if w.channels_last:
        model = model.to(memory_format=torch.channels_last)
    engine = ampkit.Engine("32-true", clip_grad_norm=w.clip_grad_norm)
    model, _optimizer = engine.setup(model, w.optimizer(model.parameters()))
    before = _loss_on(model, w, w.batch(0))
    with torch.random.fork_rng(devices=[]):
        for step in range(w.steps):
            x, y = w.batch(step)
            with engine.autocast():
                loss = w.loss_fn(model(x).float(), y)
            engine.backward(loss)
            engine.step()
    assert _loss_on(model, w, w.batch(0)) < before
    if w.metric is not None:  # the eval path the runner takes works on the tiny model
        model.eval()
        metric = w.metric()
        with torch.no_grad():
            for x, y in w.eval_batches:
                metric.update(model(x).float(), y)
        values = metric.compute()
        assert metric.name in values and values[metric.name] == values[metric.name]  # not NaN


@pytest.mark.parametrize("name", NAMES)
def test_batch_size_replaces_the_sizes_batch_and_the_items_it_counts(name: str, tiny: dict[tuple[str, int], Workload]) -> None:
    if name.startswith("digits"):
        pytest.importorskip("sklearn", reason="Requires: scikit-learn (pip install -e '.[bench]')")
    default = tiny[(name, 0)]
    rows = len(default.batch(0)[1])
    wider = get_workload(name, "tiny", batch_size=2 * rows)
    assert len(wider.batch(0)[1]) == 2 * rows and wider.items_per_batch == 2 * default.items_per_batch
    assert wider.extra["batch_size"] == 2 * rows
    if wider.eval_batches:  # the eval set is the size's own: the verdict judges the same samples
        assert sum(len(b[1]) for b in wider.eval_batches) == sum(len(b[1]) for b in default.eval_batches)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_a_batch_size_that_is_not_a_row_count_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="--batch-size .*an int >= 1"):
        get_workload("resnet", "tiny", batch_size=bad)  # type: ignore[arg-type]
