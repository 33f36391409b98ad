"""DynamicLossScaler: parity with torch.amp.GradScaler (control vs treatment), hysteresis, floor, ceiling,
collapse detection and checkpointing. Device-generic: the scaler and each step's found_inf live on ``device``
(test_gradscaler_parity.py holds the long mixed-precision run against GradScaler)."""

from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ampkit.scaling import DynamicLossScaler, ScalerConfig, StaticLossScaler
from ampkit.scaling._kernels import grads_of

INF = float("inf")
O, C = 1.0, 0.0  # one step's found_inf: overflow, clean


def run(scaler: DynamicLossScaler, schedule) -> list[float]:
    """Feed ``schedule`` (found_inf values) to ``scaler``; the scale after each update."""
    out = []
    for found in schedule:
        scaler.update(torch.tensor(float(found), device=scaler.device))
        out.append(scaler.get_scale())
    return out


def dyn(device, **kwargs) -> DynamicLossScaler:
    return DynamicLossScaler(ScalerConfig(**kwargs), device)


def flag(value: float, device) -> torch.Tensor:
    """One step's found_inf on ``device``, as the engine hands it over."""
    return torch.tensor(float(value), device=device)


# --- control vs treatment: torch.amp.GradScaler vs ampkit, same model, same data ------------------------


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4), nn.Tanh(), nn.Linear(4, 1))


def _expected_final_scale(init, growth, backoff, interval, steps, overflow_steps) -> float:
    """Independent of both scalers: count growths (``interval`` clean steps in a row) and skips."""
    growths, run_len = 0, 0
    for step in range(steps):
        if step in overflow_steps:
            run_len = 0
        else:
            run_len += 1
            if run_len == interval:
                growths, run_len = growths + 1, 0
    return init * growth**growths * backoff ** len(overflow_steps)


def _train_control_and_treatment(device, overflow_steps, steps=30, init=2.0**10, interval=3, growth=2.0, backoff=0.5):
    control = _model().to(device)
    treatment = copy.deepcopy(control)
    opt_c = torch.optim.SGD(control.parameters(), lr=0.05, momentum=0.9)
    opt_t = torch.optim.SGD(treatment.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    xs = torch.randn(steps, 8, 6, generator=gen).to(device)
    ys = torch.randn(steps, 8, 1, generator=gen).to(device)

    gs = torch.amp.GradScaler(device.type, init_scale=init, growth_factor=growth, backoff_factor=backoff, growth_interval=interval)
    ours = DynamicLossScaler(
        ScalerConfig(init_scale=init, growth_factor=growth, backoff_factor=backoff, growth_interval=interval, min_scale=2.0**-30), device
    )
    control_scales, treatment_scales = [], []
    for step in range(steps):
        before = [p.detach().clone() for p in treatment.parameters()]
        inject = step in overflow_steps

        # Control: torch's standard loop.
        opt_c.zero_grad()
        gs.scale(F.mse_loss(control(xs[step]), ys[step])).backward()
        if inject:
            with torch.no_grad():
                control[2].weight.grad[1, 3] = INF
        gs.unscale_(opt_c)
        gs.step(opt_c)
        gs.update()

        # Treatment: ampkit's manual loop.
        opt_t.zero_grad()
        ours.scale(F.mse_loss(treatment(xs[step]), ys[step])).backward()
        if inject:
            with torch.no_grad():
                treatment[2].weight.grad[1, 3] = INF
        found = torch.zeros((), device=device)
        ours.unscale_(grads_of(treatment.parameters()), found)
        assert found.item() == (1.0 if inject else 0.0), step
        if found.item() == 0:
            opt_t.step()
        ours.update(found)

        control_scales.append(gs.get_scale())
        treatment_scales.append(ours.get_scale())
        assert gs.get_scale() == ours.get_scale(), step
        for pc, pt in zip(control.parameters(), treatment.parameters()):
            assert torch.equal(pc, pt), step
            if not inject:
                assert torch.equal(pc.grad, pt.grad), step  # unscaled grads are bitwise equal too
        # A skipped step leaves the weights alone; a clean one moves them.
        unchanged = all(torch.equal(pt, pb) for pt, pb in zip(treatment.parameters(), before))
        assert unchanged == inject, step
    return control_scales, treatment_scales, ours


@pytest.mark.parametrize(
    "overflow_steps",
    [
        (4, 5, 11),
        (0, 1, 2),  # overflows before any growth
        (2, 27, 28, 29),  # overflow exactly when a growth was due, and at the very end
        tuple(sorted(random.Random(7).sample(range(30), 8))),
    ],
)
def test_matches_torch_gradscaler_bitwise(device, overflow_steps):
    control, treatment, ours = _train_control_and_treatment(device, set(overflow_steps))
    assert control == treatment
    expected = _expected_final_scale(2.0**10, 2.0, 0.5, 3, 30, set(overflow_steps))
    assert ours.get_scale() == expected
    assert control[-1] == expected


def test_expected_final_scale_for_the_documented_schedule():
    # Steps 0-3 clean (one growth), 4-5 overflow, 6-10 clean (one growth), 11 overflow, 12-29 clean (six).
    assert _expected_final_scale(2.0**10, 2.0, 0.5, 3, 30, {4, 5, 11}) == 2.0 ** (10 + 8 - 3)


def test_matches_torch_gradscaler_with_non_power_of_two_factors(device):
    control, treatment, _ = _train_control_and_treatment(device, {4, 5, 11}, growth=3.0, backoff=0.3)
    assert control == treatment


# --- an independent reference model ------------------------------------------------------------------


class Reference:
    """The documented rules, in plain Python floats (exact for the power-of-two factors used with it)."""

    def __init__(self, c: ScalerConfig) -> None:
        self.c, self.scale, self.tracker, self.budget = c, c.init_scale, 0, c.hysteresis
        self.skips, self.blocked = 0, False

    def update(self, overflow: bool) -> None:
        c = self.c
        self.blocked = False
        if overflow:
            self.skips += 1
            self.tracker = 0
            self.budget -= 1
            if self.budget <= 0:
                self.budget = 0
                self.blocked = self.scale <= c.min_scale
                self.scale = max(self.scale * c.backoff_factor, c.min_scale)
        else:
            self.skips = 0
            self.tracker += 1
            if self.tracker == c.growth_interval:
                self.tracker = 0
                self.scale = min(self.scale * c.growth_factor, c.max_scale)
                self.budget = c.hysteresis
            elif c.consecutive_hysteresis:
                self.budget = c.hysteresis

    @property
    def collapsed(self) -> bool:
        return self.blocked or self.skips >= self.c.max_consecutive_skips


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(init_scale=2.0**4, growth_interval=2, min_scale=2.0**-2, max_scale=2.0**7),
        dict(init_scale=2.0**4, growth_interval=3, hysteresis=2, min_scale=2.0**1, max_scale=2.0**8),
        dict(init_scale=2.0**4, growth_interval=3, hysteresis=3, consecutive_hysteresis=True, min_scale=1.0, max_scale=2.0**6),
        dict(init_scale=2.0**4, growth_factor=4.0, backoff_factor=0.25, growth_interval=1, hysteresis=2, min_scale=2.0**-4, max_scale=2.0**10, max_consecutive_skips=4),
        dict(init_scale=1.0, growth_interval=5, hysteresis=2, consecutive_hysteresis=True, min_scale=1.0, max_scale=1.0, max_consecutive_skips=3),
    ],
)
@pytest.mark.parametrize("p_overflow", [0.2, 0.5, 0.8])
def test_matches_reference_model_on_random_schedules(device, kwargs, p_overflow):
    cfg = ScalerConfig(**kwargs)
    ours, ref = DynamicLossScaler(cfg, device), Reference(cfg)
    rng = random.Random(hash((tuple(sorted(kwargs)), p_overflow)) & 0xFFFF)
    seen_collapse = seen_floor = seen_ceiling = False
    for step in range(300):
        overflow = rng.random() < p_overflow
        ours.update(flag(O if overflow else C, device))
        ref.update(overflow)
        assert ours.get_scale() == ref.scale, step
        assert ours.consecutive_skips == ref.skips, step
        assert (ours.collapse_reason() is not None) == ref.collapsed, step
        assert cfg.min_scale <= ours.get_scale() <= cfg.max_scale
        seen_collapse |= ref.collapsed
        seen_floor |= ref.scale == cfg.min_scale
        seen_ceiling |= ref.scale == cfg.max_scale
    if p_overflow == 0.8:
        assert seen_collapse and seen_floor  # the schedule did exercise the floor
    if p_overflow == 0.2:
        assert seen_ceiling


def test_found_inf_is_any_positive_value(device):
    a, b = dyn(device, init_scale=8.0), dyn(device, init_scale=8.0)
    a.update(flag(1.0, device))
    b.update(flag(3.0, device))  # e.g. found_inf summed over devices
    assert a.get_scale() == b.get_scale() == 4.0


# --- hysteresis ----------------------------------------------------------------------------------------

S = 2.0**10


@pytest.mark.parametrize("consecutive", [False, True])
@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        ([O], [S]),  # the first overflow only spends the budget
        ([O, O], [S, S / 2]),  # the second backs off
        ([O, O, O, O], [S, S / 2, S / 4, S / 8]),  # a spent budget stays spent
    ],
)
def test_hysteresis_two_overflows_in_a_row(device, consecutive, schedule, expected):
    s = dyn(device, init_scale=S, hysteresis=2, consecutive_hysteresis=consecutive, growth_interval=1000)
    assert run(s, schedule) == expected


@pytest.mark.parametrize(
    ("consecutive", "expected"),
    [
        (True, [S] * 7),  # a clean step refills: overflows separated by clean steps never back off
        (False, [S, S, S / 2, S / 2, S / 4, S / 4, S / 8]),  # only growth refills
    ],
)
def test_hysteresis_overflows_separated_by_clean_steps(device, consecutive, expected):
    s = dyn(device, init_scale=S, hysteresis=2, consecutive_hysteresis=consecutive, growth_interval=1000)
    assert run(s, [O, C, O, C, O, C, O]) == expected


def test_consecutive_hysteresis_refill_after_spent_budget(device):
    s = dyn(device, init_scale=S, hysteresis=2, consecutive_hysteresis=True, growth_interval=1000)
    assert run(s, [O, O, O, C, O, O]) == [S, S / 2, S / 4, S / 4, S / 4, S / 8]


def test_hysteresis_budget_refills_on_growth(device):
    # hysteresis=2, no consecutive refill: O spends one; three clean steps grow the scale and refill,
    # so the next single overflow is tolerated again.
    s = dyn(device, init_scale=S, hysteresis=2, growth_interval=3)
    assert run(s, [O, C, C, C, O, O]) == [S, S, S, 2 * S, 2 * S, S]
    # Control: the same overflows without the growth in between back off on the second one.
    s = dyn(device, init_scale=S, hysteresis=2, growth_interval=3)
    assert run(s, [O, C, C, O]) == [S, S, S, S / 2]


@pytest.mark.parametrize("hysteresis", [1, 2, 3])
def test_hysteresis_n_backs_off_on_the_nth_overflow(device, hysteresis):
    s = dyn(device, init_scale=S, hysteresis=hysteresis, growth_interval=1000)
    scales = run(s, [O] * (hysteresis + 2))
    assert scales == [S] * (hysteresis - 1) + [S / 2, S / 4, S / 8]


@pytest.mark.parametrize("hysteresis", [1, 2])
def test_growth_tracker_resets_on_every_overflow(device, hysteresis):
    # With hysteresis=2 the overflow does not back off, but growth still waits growth_interval clean steps
    # counted from that overflow.
    s = dyn(device, init_scale=S, hysteresis=hysteresis, growth_interval=3)
    after_overflow = S if hysteresis == 2 else S / 2
    assert run(s, [C, C, O, C, C, C]) == [S, S, after_overflow, after_overflow, after_overflow, 2 * after_overflow]


@pytest.mark.parametrize("growth_interval", [1, 2, 5])
def test_growth_every_interval(device, growth_interval):
    s = dyn(device, init_scale=1.0, growth_interval=growth_interval)
    scales = run(s, [C] * (3 * growth_interval))
    assert scales == [2.0 ** ((i + 1) // growth_interval) for i in range(3 * growth_interval)]


# --- floor, ceiling, collapse -----------------------------------------------------------------------------


@pytest.mark.parametrize("hysteresis", [1, 2])
def test_floor_and_collapse_at_floor(device, hysteresis):
    s = dyn(device, init_scale=1.0, min_scale=0.25, hysteresis=hysteresis, growth_interval=1000)
    assert s.collapse_reason() is None
    # Spend the budget and back off down to the floor.
    for _ in range(hysteresis - 1):
        s.update(flag(O, device))
        assert s.get_scale() == 1.0 and s.collapse_reason() is None
    for expected in (0.5, 0.25):
        s.update(flag(O, device))
        assert s.get_scale() == expected
        assert s.collapse_reason() is None  # reaching the floor is not yet a collapse
    s.update(flag(O, device))  # an overflow that wants to back off below the floor
    assert s.get_scale() == 0.25
    reason = s.collapse_reason()
    assert reason is not None and "floor" in reason and "min_scale=0.25" in reason
    s.update(flag(C, device))
    assert s.collapse_reason() is None
    assert s.get_scale() == 0.25


def test_no_floor_collapse_while_hysteresis_budget_remains_at_floor(device):
    s = dyn(device, init_scale=0.25, min_scale=0.25, hysteresis=2, consecutive_hysteresis=True, growth_interval=1000)
    s.update(flag(O, device))  # spends one unit, does not want to back off
    assert s.collapse_reason() is None
    s.update(flag(O, device))  # wants to back off, cannot
    assert "floor" in s.collapse_reason()


def test_floor_with_non_power_of_two_values(device):
    s = dyn(device, init_scale=1.0, backoff_factor=0.3, min_scale=0.1, growth_interval=1000)
    scales = run(s, [O, O])
    assert scales[0] == pytest.approx(0.3, rel=1e-6)
    assert scales[1] == pytest.approx(0.1, rel=1e-6)  # 0.09 clamped to the floor (fp32 0.1)
    assert s.collapse_reason() is None
    s.update(flag(O, device))
    assert s.get_scale() == scales[1]
    assert "floor" in s.collapse_reason()


@pytest.mark.parametrize(("growth_factor", "expected"), [(2.0, [2.0, 4.0, 8.0, 8.0, 8.0]), (3.0, [3.0, 8.0, 8.0, 8.0, 8.0])])
def test_ceiling(device, growth_factor, expected):
    s = dyn(device, init_scale=1.0, growth_factor=growth_factor, growth_interval=1, max_scale=8.0)
    assert run(s, [C] * 5) == expected
    assert s.collapse_reason() is None
    s.update(flag(O, device))
    assert s.get_scale() == 4.0  # back-off from the ceiling


def test_max_consecutive_skips(device):
    s = dyn(device, init_scale=2.0**10, min_scale=2.0**-10, max_consecutive_skips=3, growth_interval=1000)
    for n in (1, 2):
        s.update(flag(O, device))
        assert s.consecutive_skips == n
        assert s.collapse_reason() is None
    s.update(flag(O, device))
    reason = s.collapse_reason()
    assert reason is not None
    assert "3 steps in a row" in reason and "max_consecutive_skips=3" in reason
    assert "floor" not in reason  # far above the floor: this is the skip-count collapse
    s.update(flag(O, device))
    assert "4 steps in a row" in s.collapse_reason()
    s.update(flag(C, device))
    assert s.consecutive_skips == 0
    assert s.collapse_reason() is None
    s.update(flag(O, device))
    assert s.consecutive_skips == 1
    assert s.collapse_reason() is None


@pytest.mark.parametrize("hysteresis", [1, 2])
def test_a_found_inf_above_one_counts_one_skip_and_moving_the_scaler_keeps_its_counters_joined(device, hysteresis):
    # found_inf > 0 means an overflow, whatever its value (flags added over devices can reach 2). The skip count and
    # the floor flag share one tensor; moving the scaler must keep both views on the moved tensor.
    s = dyn("cpu", init_scale=2.0, min_scale=1.0, hysteresis=hysteresis, growth_interval=1000).to(device)
    for _ in range(hysteresis + 1):
        s.update(flag(2.0, device))
    assert s.consecutive_skips == hysteresis + 1 and s.get_scale() == 1.0
    s.update(flag(2.0, device))  # at the floor: blocked
    assert s.state_dict()["blocked_at_floor"] == 1 and "floor" in s.collapse_reason()
    s.update(flag(C, device))
    assert s.consecutive_skips == 0 and s.state_dict()["blocked_at_floor"] == 0 and s.collapse_reason() is None


def test_skips_absorbed_by_hysteresis_still_count(device):
    s = dyn(device, init_scale=S, hysteresis=5, max_consecutive_skips=2, growth_interval=1000)
    run(s, [O, O])
    assert s.get_scale() == S  # no back-off yet ...
    assert "2 steps in a row" in s.collapse_reason()  # ... but two skipped steps


def test_floor_below_fp32_range_is_rejected():
    # A floor fp32 cannot hold would round to 0 in the scale tensor, and a zero scale zeroes every loss.
    with pytest.raises(ValueError, match="min_scale must be at least"):
        ScalerConfig(init_scale=1.0, min_scale=1e-50)


def test_smallest_accepted_floor_holds(device):
    cfg = ScalerConfig(init_scale=1.0, min_scale=2.0**-126, max_consecutive_skips=10**6)
    s = DynamicLossScaler(cfg, device)
    run(s, [O] * 200)
    assert s.get_scale() == 2.0**-126


# --- identity of the scale tensor -------------------------------------------------------------------------


def test_scale_tensor_is_updated_in_place(device):
    s = dyn(device, init_scale=8.0, growth_interval=1)
    held = s.scale_tensor
    s.update(flag(C, device))
    assert held is s.scale_tensor and held.item() == 16.0
    s.update(flag(O, device))
    assert held.item() == 8.0
    s.load_state_dict(dyn(device, init_scale=2.0).state_dict())
    assert held is s.scale_tensor and held.item() == 2.0


def test_scale_and_unscale_use_the_current_scale(device):
    s = dyn(device, init_scale=8.0, growth_interval=1)
    s.update(flag(C, device))
    assert torch.equal(s.scale(torch.tensor([1.0, 3.0], device=device)), torch.tensor([16.0, 48.0], device=device))
    g = [torch.tensor([16.0, 48.0], device=device)]
    found = torch.zeros((), device=device)
    s.unscale_(g, found)
    assert torch.equal(g[0], torch.tensor([1.0, 3.0], device=device)) and found.item() == 0.0


# --- state_dict -------------------------------------------------------------------------------------------

CKPT_CFG = dict(init_scale=2.0**3, growth_interval=3, hysteresis=2, min_scale=1.0, max_scale=2.0**5, max_consecutive_skips=4)
CKPT_SCHEDULE = [C, C, O, C, O, O, O, O, O, C, C, C, C, O, C, C, C, C, C, C, C, O, O, C, O, C, C]


@pytest.mark.parametrize("split", range(len(CKPT_SCHEDULE) + 1))
def test_state_dict_round_trip_resumes_exactly(device, split):
    cfg = ScalerConfig(**CKPT_CFG)
    original = DynamicLossScaler(cfg, device)
    run(original, CKPT_SCHEDULE[:split])
    state = original.state_dict()
    assert state["kind"] == "dynamic" and state["config"] == cfg.to_dict()
    resumed = DynamicLossScaler(ScalerConfig(**CKPT_CFG), device)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert resumed.get_scale() == original.get_scale()
    assert resumed.collapse_reason() == original.collapse_reason()
    for found in CKPT_SCHEDULE[split:] + [C, C, C, O, O]:
        original.update(flag(found, device))
        resumed.update(flag(found, device))
        assert resumed.get_scale() == original.get_scale()
        assert resumed.consecutive_skips == original.consecutive_skips
        assert resumed.collapse_reason() == original.collapse_reason()


def test_state_dict_carries_the_counters(device):
    s = dyn(device, **CKPT_CFG)
    run(s, [C, C, O])  # tracker back to 0 by the overflow, budget 1, one skip
    run(s, [C])
    state = s.state_dict()
    assert state["scale"] == 8.0
    assert state["growth_tracker"] == 1
    assert state["hysteresis_left"] == 1
    assert state["consecutive_skips"] == 0


def test_state_dict_survives_torch_save(device, tmp_path):
    s = dyn(device, **CKPT_CFG)
    run(s, CKPT_SCHEDULE[:8])
    torch.save(s.state_dict(), tmp_path / "scaler.pt")
    resumed = dyn(device, **CKPT_CFG)
    resumed.load_state_dict(torch.load(tmp_path / "scaler.pt", weights_only=True))  # plain floats: any device
    assert run(resumed, CKPT_SCHEDULE[8:]) == run(s, CKPT_SCHEDULE[8:])


def test_loading_static_state_into_dynamic_raises(device):
    s = dyn(device, init_scale=8.0)
    with pytest.raises(ValueError, match="static"):
        s.load_state_dict(StaticLossScaler(4.0).state_dict())
    assert s.get_scale() == 8.0


def _back_off_once(rank: int, scaler: DynamicLossScaler, out: torch.multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    scaler.update(torch.ones(()))  # this rank's overflow
    out.put(scaler.get_scale())


@pytest.mark.parametrize("hysteresis", [1, 2])
def test_each_spawned_process_owns_the_scaler_it_was_handed(hysteresis):
    """torch.multiprocessing hands CPU tensors to spawned processes as shared memory; a scaler pickled to two ranks
    (Lightning's ddp_spawn pickles its precision plugin) must still keep one scale per rank, each backed off once."""
    ctx = torch.multiprocessing.get_context("spawn")
    out = ctx.Queue()
    scaler = DynamicLossScaler(ScalerConfig(hysteresis=hysteresis))
    procs = [ctx.Process(target=_back_off_once, args=(rank, scaler, out)) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    control = DynamicLossScaler(ScalerConfig(hysteresis=hysteresis))
    control.update(torch.ones(()))
    assert [out.get(timeout=5), out.get(timeout=5)] == [control.get_scale()] * 2
    assert scaler.get_scale() == 65536.0  # the parent's own is untouched
