"""The doctor's update-precision check against control runs written here in plain torch.

A model built to lose updates: weights of magnitude 1 to 2 under AdamW at lr 1e-3, so each step moves a weight
by about 1e-3, below bf16's half-gap there (2^-9 to 2^-8 of it), while eight fp32 steps add up to more than a gap.
The controls train the same weights on the same batches with the same dropout masks: fp32, and bf16 weights
stepped directly; the remedy prescribed must meet the bound against them and bf16 must not.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.numerics import diagnose
from ampkit.numerics._compare import seeded
from ampkit.numerics._update_audit import REMEDIES
from ampkit.numerics._update_remedy import RECOVERED_SHARE, check_update_precision
from ampkit.policy import policy_names

STEPS = 8


def losing_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 2))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.where(torch.rand_like(p) < 0.5, -1.0, 1.0) * (1 + torch.rand_like(p)))
    return model


def data(n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 8, generator=g), torch.randn(16, 2, generator=g)) for _ in range(n)]


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


def held_out_loss(model: nn.Module, batch) -> float:
    with torch.no_grad(), seeded(0, torch.device("cpu")):
        return float(nn.functional.mse_loss(model.float().train()(batch[0]), batch[1]))


def control_run(model: nn.Module, batches, dtype: torch.dtype) -> nn.Module:
    """Plain torch: ``STEPS`` AdamW steps of the weights in ``dtype``, step ``i`` with dropout seeded ``i``."""
    work = copy.deepcopy(model).to(dtype)
    opt = adamw(work.parameters())
    for i in range(STEPS):
        x, y = batches[i % len(batches)]
        with seeded(i, torch.device("cpu")):
            nn.functional.mse_loss(work(x.to(dtype)).float(), y).backward()
        opt.step()
        opt.zero_grad()
    return work


def test_lost_updates_get_the_cheapest_remedy_that_meets_the_bound_against_controls() -> None:
    model, (*train, held) = losing_model(), data()
    check = check_update_precision(model, train, held, nn.functional.mse_loss, adamw, steps=STEPS)

    initial = held_out_loss(copy.deepcopy(model), held)
    fp32 = held_out_loss(control_run(model, train, torch.float32), held)
    bf16 = held_out_loss(control_run(model, train, torch.bfloat16), held)
    assert check.initial_loss == pytest.approx(initial, rel=1e-6) and check.fp32_loss == pytest.approx(fp32, rel=1e-6)
    assert fp32 < initial and initial - bf16 < RECOVERED_SHARE * (initial - fp32), "the control must lose what fp32 gains"

    assert check.lost and check.params["0.weight"]["lost_share"] == 1.0 and check.params["0.weight"]["decay_lost_share"] == 1.0
    registered = [name for name, _ in REMEDIES if name in policy_names()]
    assert check.skipped == {name: "not in this ampkit's policy registry" for name, _ in REMEDIES if name not in policy_names()}
    assert check.trials[0].policy == "bf16-true" and not check.trials[0].recovered
    # Tried in order of cost until one recovers: every cheaper remedy was tried and failed the bound.
    tried = [t.policy for t in check.trials[1:]]
    assert tried == registered[: len(tried)] and check.prescribed == tried[-1]
    assert all(not t.recovered for t in check.trials[1:-1]) and check.trials[-1].recovered
    # The prescription, retrained here through the Engine and judged by the control's bound.
    engine = Engine(check.prescribed)
    work = copy.deepcopy(model)
    work, _ = engine.setup(work, adamw(work.parameters()))
    with seeded(0, torch.device("cpu")):  # stochastic rounding draws from this stream, as in the doctor's trial
        for i in range(STEPS):
            x, y = train[i % len(train)]
            with seeded(i, torch.device("cpu")), engine.autocast():
                loss = nn.functional.mse_loss(work(x).float(), y)
            engine.backward(loss)
            engine.step()
    trained = copy.deepcopy(model)
    weights = {k: v.float() for k, v in work.state_dict().items()}
    trained.load_state_dict({**weights, **(engine.masters.state_dict() if engine.masters is not None else {})})
    assert initial - held_out_loss(trained, held) >= RECOVERED_SHARE * (initial - fp32)
    assert held_out_loss(trained, held) == pytest.approx(check.trials[-1].loss, rel=1e-6)


def test_a_few_losing_gains_are_kept_in_fp32_before_any_policy_is_tried() -> None:
    # Gains at 1.0 (bf16's half-gap there is 2^-8) under AdamW at lr 1e-3 never move; the linear weights (|w| < 0.07,
    # half-gaps under 1.3e-4) do. The LayerNorm holds 0.8% of the parameters: under TARGETED_SHARE.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.LayerNorm(512), nn.Tanh(), nn.Linear(512, 2))
    g = torch.Generator().manual_seed(1)
    *train, held = [(torch.randn(16, 256, generator=g), torch.randn(16, 2, generator=g)) for _ in range(4)]
    opt = lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.0)
    check = check_update_precision(model, train, held, nn.functional.mse_loss, opt, steps=4)
    assert check.lost and check.params["1.weight"]["lost_share"] == 1.0 and check.params["0.weight"]["lost_share"] < 0.25
    assert check.prescribed == "bf16-true" and check.keep_fp32 == ["1"]
    assert check.engine_kwargs() == {"precision": "bf16-true", "keep_fp32": ["1"]}
    assert check.trials[1].policy.startswith("bf16-true, keep_fp32=") and check.trials[1].recovered
    assert check.trials[1].bytes_per_param == pytest.approx(8 * 1024 / sum(p.numel() for p in model.parameters()))
    # The control: the prescription moves the gains that plain bf16-true leaves at exactly 1.
    gains = {}
    for kwargs in ({"precision": "bf16-true"}, check.engine_kwargs()):
        engine = Engine(**kwargs)
        work = copy.deepcopy(model)
        work, _ = engine.setup(work, opt(work.parameters()))
        for x, y in train:
            engine.backward(nn.functional.mse_loss(work(x).float(), y))
            engine.step()
        gains[kwargs.get("keep_fp32") is not None] = work[1].weight.detach().float()
    assert torch.equal(gains[False], torch.ones(512)) and not torch.equal(gains[True], torch.ones(512))


def test_a_remedy_that_refuses_the_optimizer_is_skipped_with_its_reason() -> None:
    model, (*train, held) = losing_model(), data()
    sgd = lambda ps: torch.optim.SGD(ps, lr=1e-3)
    check = check_update_precision(model, train, held, nn.functional.mse_loss, sgd, steps=4)
    assert check.lost and "bf16-true-sr" not in [t.policy for t in check.trials]
    assert "bf16-true-kahan" in check.skipped.get("bf16-true-sr", "")  # stochastic rounding takes Adam(W): names the fix
    assert check.prescribed is not None and check.prescribed != "bf16-true-sr"


def test_a_stochastic_remedy_must_recover_with_every_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    import ampkit.numerics._update_remedy as remedy

    model, (*train, held) = losing_model(), data()
    streams: list[int | None] = []
    real = remedy.train_copy

    def lucky_once(model, batches, loss_fn, optimizer, precision, steps, seed, *, audit=False, stream=None, **kwargs):  # type: ignore[no-untyped-def]
        if precision != "bf16-true-sr":
            return real(model, batches, loss_fn, optimizer, precision, steps, seed, audit=audit, stream=stream, **kwargs)
        streams.append(stream)
        if stream == seed:  # the first stream lands on fp32's trajectory, the next stays where it started
            return real(model, batches, loss_fn, optimizer, "32-true", steps, seed)
        return {k: v.detach().float() for k, v in model.state_dict().items()}, []

    monkeypatch.setattr(remedy, "train_copy", lucky_once)
    check = check_update_precision(model, train, held, nn.functional.mse_loss, adamw, steps=STEPS, seed=3)
    sr = next(t for t in check.trials if t.policy == "bf16-true-sr")
    assert streams == [3, 4] and not sr.recovered and check.prescribed not in (None, "bf16-true-sr")


def test_updates_that_land_prescribe_nothing() -> None:
    model, (*train, held) = losing_model(), data()
    check = check_update_precision(model, train, held, nn.functional.mse_loss, lambda ps: torch.optim.SGD(ps, lr=0.05), steps=4)
    assert not check.lost and check.prescribed is None and [t.policy for t in check.trials] == ["bf16-true"]
    assert check.trials[0].recovered and check.params and not check.problems


def test_diagnose_carries_the_check_to_doctor_json_only_with_an_optimizer() -> None:
    batches = data()
    with_opt = diagnose(losing_model(), batches, nn.functional.mse_loss, steps=2, target="bf16-mixed", optimizer=adamw, update_steps=2)
    assert with_opt.update_precision is not None and with_opt.to_dict()["update_precision"]["steps"] == 2
    without = diagnose(losing_model(), batches, nn.functional.mse_loss, steps=2, target="bf16-mixed")
    assert without.update_precision is None and without.to_dict()["update_precision"] is None


@pytest.mark.parametrize("offsets", [(-0.5, -0.5), (0.5, -0.2)], ids=["fp32 rises", "fp32 falls within its noise"])
def test_a_reference_that_does_not_improve_judges_no_remedy(offsets: tuple[float, float]) -> None:
    # Training pulls the outputs up (targets 3 above them). A held-out batch that wants them 0.5 lower sees fp32's
    # loss rise; one whose halves want them 0.5 higher and 0.2 lower sees it fall a little, while its halves' falls
    # differ by more than that: no trajectory to recover either way.
    from ampkit.numerics._table import update_lines

    g = torch.Generator().manual_seed(1)
    start = losing_model()

    def outputs(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), seeded(0, torch.device("cpu")):
            return start.train()(x)

    train = [(x, outputs(x) + 3.0) for x in (torch.randn(16, 8, generator=g) for _ in range(3))]
    x = torch.randn(16, 8, generator=g)
    held = (x, outputs(x) + torch.tensor([offsets[0]] * 8 + [offsets[1]] * 8).unsqueeze(1))
    check = check_update_precision(losing_model(), train, held, nn.functional.mse_loss, adamw, steps=STEPS)
    # The control: fp32's held-out fall on the whole batch and on each half, from plain torch.
    fp32 = control_run(losing_model(), train, torch.float32)
    fall = held_out_loss(losing_model(), held) - held_out_loss(fp32, held)
    a, b = (held_out_loss(losing_model(), (x[rows], held[1][rows])) - held_out_loss(fp32, (x[rows], held[1][rows])) for rows in (slice(0, 8), slice(8, 16)))
    assert fall == pytest.approx(check.initial_loss - check.fp32_loss, rel=1e-4)
    assert (fall < 0) if offsets[0] < 0 else (0 < fall <= abs(a - b) / 2)  # each case is what its name says

    assert check.problems and check.lost  # the audit still sees bf16-true lose its updates
    assert check.prescribed is None and [t.policy for t in check.trials] == ["bf16-true"]  # no remedy judged by noise
    assert not check.judged and check.fp32_noise == pytest.approx(abs(a - b) / 2, rel=1e-4)
    text = "\n".join(update_lines(check.to_dict()))
    assert "recover" not in text and "cannot judge any remedy" in text and f"--update-steps {4 * STEPS}" in text
