"""Profiler against controls: the same loop with its slow part removed, and with its per-step read-back removed."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ampkit import Engine
from ampkit.profile import Profiler

DELAY = 0.002  # seconds per sample: 32 ms per batch of 16, far above the phases' own few milliseconds
# The attribution test's delay: 160 ms per batch of 16 (a sleep: the same on a loaded machine), far above the phases'
# noise when another process shares the cores (at DELAY, under pytest -n 2 on 2 cores, the optimizer phase of one
# loop once came out 20 ms slower than the other's).
ATTRIBUTION_DELAY = 0.01


class SlowSquares(Dataset):
    """Sample i is a fixed input row; ``delay`` seconds of per-sample work in ``__getitem__`` (a slow dataset)."""

    def __init__(self, n: int, delay: float) -> None:
        self.x = torch.randn(n, 32, generator=torch.Generator().manual_seed(0))
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return self.x[i]


def _profile(delay: float, *, read_back: bool, steps: int = 6, batches: int | None = None, **sizes: int) -> dict:
    torch.manual_seed(0)
    engine = Engine()
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
    # fused: the engine skips a non-finite step on the device; a plain AdamW would have it read its flag each step
    # (test_syncs.py names that read).
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), fused=True))
    windows = {"warmup": 2, "plain_steps": 3, "timed": steps, "sync_steps": 3, "trace_steps": 2, **sizes}
    loader = DataLoader(SlowSquares(16 * (batches or sum(windows.values())), delay), batch_size=16)
    with Profiler(engine, **windows) as profiler:
        for x in profiler.batches(loader):
            with engine.autocast():
                loss = model(x).pow(2).mean()
            engine.backward(loss)
            engine.step()
            if read_back:
                print(f"loss {loss.item():.3f}", end="\r")  # the per-step read-back under test
    return profiler.result()


def test_a_slow_dataset_is_attributed_to_data_and_nothing_else() -> None:
    slow, fast = _profile(ATTRIBUTION_DELAY, read_back=False), _profile(0.0, read_back=False)
    extra = slow["phases"]["data"]["median_s"] - fast["phases"]["data"]["median_s"]
    assert extra == pytest.approx(16 * ATTRIBUTION_DELAY, rel=0.4)  # the control: the same loop with the slow part removed
    for phase in ("copy", "forward", "backward", "optimizer", "other"):
        assert abs(slow["phases"][phase]["median_s"] - fast["phases"][phase]["median_s"]) < 0.25 * 16 * ATTRIBUTION_DELAY, phase
    assert slow["phases"]["data"]["share"] > 0.5 > fast["phases"]["data"]["share"]
    assert sum(p["share"] for p in slow["phases"].values()) == pytest.approx(1.0)


def test_a_per_step_read_back_is_found_at_its_line_and_only_with_it() -> None:
    with_item, without = _profile(0.0, read_back=True), _profile(0.0, read_back=False)
    assert without["syncs"]["sites"] == [] and without["syncs"]["per_step"] == 0
    (site,) = with_item["syncs"]["sites"]
    assert site["op"] == "item" and site["per_step"] == 1 and site["count"] == 3  # the sync window's 3 steps
    assert site["code"] == 'print(f"loss {loss.item():.3f}", end="\\r")  # the per-step read-back under test'
    assert site["where"].startswith(f"{__file__}:") and site["where"].endswith("in _profile")


def test_each_window_measures_its_own_steps() -> None:
    data = _profile(0.0, read_back=False, steps=4)
    assert data["steps"] == len(data["per_step"]) == 4
    assert data["syncs"]["steps"] == 3
    assert data["ops"] is not None and data["ops"]["steps"] == 2 and data["ops"]["optimizer_ops_per_step"] > 0
    assert data["device_idle"] is None  # a CPU trace has no device activity
    overhead = data["overhead"]
    assert all(overhead[k] > 0 for k in ("plain_step_s", "profiled_step_s", "sync_step_s", "trace_step_s"))
    assert overhead["ratio"] == pytest.approx(overhead["profiled_step_s"] / overhead["plain_step_s"])


def test_a_loop_shorter_than_the_windows_is_read_as_far_as_it_went() -> None:
    data = _profile(0.0, read_back=True, steps=4, batches=16, sync_steps=20, trace_steps=0)
    assert data["steps"] == 4 and data["ops"] is None
    assert data["syncs"]["steps"] == 16 - 2 - 3 - 4  # the loader ran out inside the sync window
    assert data["syncs"]["sites"][0]["per_step"] == 1


def test_a_loop_that_ends_in_the_warm_up_is_refused_with_the_fix() -> None:
    engine = Engine()
    model = nn.Linear(2, 1)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with Profiler(engine, warmup=3) as profiler:
        for x in profiler.batches(torch.ones(1, 2) for _ in range(2)):  # no len(): known short only at its end
            engine.backward(model(x).sum())
            engine.step()
    with pytest.raises(ValueError, match="run more steps, or lower warmup and plain_steps"):
        profiler.result()


def test_a_loader_too_short_for_the_windows_is_refused_before_the_first_step() -> None:
    """The windows count optimizer steps: with accumulate=4 each takes 4 batches. A loader of 10 batches cannot
    time warmup 1 + plain 1 + timed 3 = 5 steps (20 batches): refused at the loop's start, not at result()."""
    engine = Engine(accumulate=4)
    model = nn.Linear(2, 1)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with Profiler(engine, warmup=1, plain_steps=1, timed=3, sync_steps=2, trace_steps=0) as profiler, pytest.raises(ValueError) as refused:
        for x in profiler.batches([torch.ones(1, 2)] * 10):
            engine.backward(model(x).sum())
            engine.step()
    assert engine.steps == 0 and model.weight.grad is None  # nothing ran
    message = str(refused.value)
    assert "optimizer steps" in message and "accumulate=4" in message
    assert "20 batches" in message and "the loader gives 10" in message and "28 batches" in message  # 28: the sync window too
    assert "timed=" in message  # the fix: more batches, or smaller windows


def test_result_inside_the_block_and_bad_windows_are_refused() -> None:
    engine = Engine()
    with pytest.raises(ValueError, match="timed >= 1"):
        Profiler(engine, timed=0)
    with Profiler(engine) as profiler, pytest.raises(RuntimeError, match="after the `with Profiler"):
        profiler.result()


def test_the_trace_window_writes_a_chrome_trace(tmp_path) -> None:
    engine = Engine("bf16-mixed")
    model = nn.Linear(8, 8)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with Profiler(engine, warmup=1, plain_steps=0, timed=2, sync_steps=0, trace_steps=2, trace_dir=tmp_path / "t") as profiler:
        for x in profiler.batches([torch.ones(4, 8)] * 5):
            with engine.autocast():
                loss = model(x).float().sum()
            engine.backward(loss)
            engine.step()
    data = profiler.result()
    assert data["trace"] == "trace.json"
    import json

    events = json.loads((tmp_path / "t" / "trace.json").read_text())["traceEvents"]
    assert any(e.get("name") == "ampkit::forward" for e in events)
    assert data["ops"]["casts_per_step"] > 0  # bf16-mixed casts the Linear's fp32 weight and input


def test_only_the_timed_window_is_timed_and_nothing_is_kept_after_the_windows() -> None:
    engine = Engine()
    model = nn.Linear(4, 1)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with Profiler(engine, warmup=1, plain_steps=2, timed=3, sync_steps=0, trace_steps=0) as profiler:
        for i, x in enumerate(profiler.batches([torch.ones(2, 4)] * 30)):
            if i == 2:  # a slow step in the plain window: it must not reach the timed steps
                time.sleep(0.05)
            engine.backward(model(x).sum())
            engine.step()
    marks, ends = len(profiler.timer._marks), len(profiler._step_ends)
    for _ in range(5):  # after the block: not counted, nothing kept
        engine.backward(model(torch.ones(2, 4)).sum())
        engine.step()
    data = profiler.result()
    assert data["steps"] == 3 and max(r["total"] for r in data["per_step"]) < 0.05
    assert marks <= 1 + 3 * 8  # the resume, then the timed steps' stamps: none of the 24 steps after them
    assert len(profiler.timer._marks) == marks and len(profiler._step_ends) == ends == 1 + 1 + 2 + 3


def test_a_compiled_model_keeps_its_compiled_code_through_the_sync_window() -> None:
    # torch.compile gives up for good on a frame first met under a dispatch mode: the window must not cause that.
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    engine = Engine("bf16-mixed", compile={"backend": "eager"})
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 1))
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with Profiler(engine, warmup=1, plain_steps=0, timed=1, sync_steps=2, trace_steps=2) as profiler:
        for x in profiler.batches([torch.ones(4, 8)] * 8):
            with engine.autocast():
                loss = model(x).float().sum()
            engine.backward(loss)
            engine.step()
    compiled_frames = counters["frames"]["ok"]
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with engine.autocast():
            loss = model(torch.ones(4, 8)).float().sum()
        engine.backward(loss)
        engine.step()
    assert any(e.name.startswith("Torch-Compiled Region") for e in prof.events())  # the compiled code still runs
    assert counters["frames"]["ok"] == compiled_frames  # and nothing was compiled again


def test_the_api_round_trip_trials_advice_and_files(tmp_path) -> None:
    from ampkit.profile import LoaderSettings, save_profile, try_loader_settings

    torch.manual_seed(0)
    engine = Engine()
    model = nn.Linear(32, 1)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = DataLoader(SlowSquares(16 * 40, DELAY), batch_size=16)  # a sleeping dataset: workers overlap it

    def step(x: torch.Tensor) -> None:
        time.sleep(16 * DELAY)  # as long as the data: a worker hides it whole
        engine.backward(model(x).pow(2).mean())
        engine.step()

    with Profiler(engine, warmup=1, plain_steps=1, timed=3, sync_steps=0, trace_steps=0) as profiler:
        for x in profiler.batches(loader):
            step(x)
    trials = try_loader_settings(loader, step, engine.device, settings=[LoaderSettings(num_workers=1)])
    data = profiler.result(trials=trials)
    assert [t["name"] for t in data["trials"]] == ["as given", "num_workers=1"] and data["parameter_tensors"] == 2
    (advice,) = data["advice"]
    assert advice["topic"] == "input pipeline" and advice["change"] == "DataLoader(..., num_workers=1)"
    assert data["compile"] is False
    json_path, report = save_profile(data, tmp_path / "prof")
    assert json_path.name == "profile.json" and "num\\_workers=1" in report.read_text()
    assert (tmp_path / "prof" / "trials.png").exists()
