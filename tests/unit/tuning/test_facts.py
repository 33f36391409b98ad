"""What the tune learns before its first trial, each fact against the tool that knows it."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ampkit.memory import estimate
from ampkit.tuning._facts import fp16_overflow_and_fix, gather_facts, loader_variants, predict_peak
from ampkit.tuning._space import memory_key
from ampkit.workloads import Workload

ROWS = 8


def _workload(model: nn.Module | None = None, scale: float = 1.0) -> Workload:
    g = torch.Generator().manual_seed(0)
    batches = [(scale * torch.randn(ROWS, 8, generator=g), torch.randint(0, 3, (ROWS,), generator=g)) for _ in range(2)]
    torch.manual_seed(0)
    # Blocks that widen inside: checkpointing one frees its inner activations (a block's output is kept either way).
    model = model or nn.Sequential(*[nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 8)) for _ in range(2)], nn.Linear(8, 3))
    return Workload(name="mlp", model=model, train_batches=batches, items_per_batch=ROWS, steps=4, warmup=1)


CPU = torch.device("cpu")


def test_predicted_peaks_are_ampkit_memorys_estimates_of_the_users_step() -> None:
    w = _workload()
    facts = gather_facts(w, CPU, memory_budget=2**40, precisions=["bf16-mixed"])
    assert set(facts.policies) == {"32-true", "bf16-mixed"} and facts.blocks == 2
    for policy in ("32-true", "bf16-mixed"):
        control = estimate(w.model, w.train_batches[0], w.optimizer, policy, CPU, loss_fn=w.loss_fn, clip_grad_norm=w.clip_grad_norm)
        assert facts.predicted_peak[memory_key(policy, ROWS, False)] == control.peak


def test_where_the_batch_does_not_fit_the_smaller_micro_batches_are_predicted_until_one_fits() -> None:
    w = _workload()
    full = predict_peak(w, "32-true", ROWS, CPU).peak
    quarter = predict_peak(w, "32-true", 2, CPU).peak
    facts = gather_facts(w, CPU, memory_budget=quarter, precisions=[])
    predicted = {k for k in facts.predicted_peak if not k.endswith("|1")}
    assert predicted == {memory_key("32-true", m, False) for m in (8, 4, 2)}  # 2 fits: no smaller one is predicted
    assert facts.predicted_peak[memory_key("32-true", 8, False)] == full > quarter
    recomputed = predict_peak(w, "32-true", ROWS, CPU, recomputed=True)
    assert recomputed.activations < predict_peak(w, "32-true", ROWS, CPU).activations
    assert facts.predicted_peak[memory_key("32-true", 8, True)] == recomputed.peak


def test_the_doctor_names_the_modules_whose_activations_overflow_fp16() -> None:
    class Loud(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.head = nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.up(x) * 1e6)  # far above 65504 whatever the init: the head's input overflows fp16, and its output too

    notes: list[str] = []
    # The overflow is in the model's own forward (x * 1e6), which no module kept in fp32 can fix: named, no fix.
    overflowing, fix = fp16_overflow_and_fix(_workload(Loud()), CPU, notes)
    assert sorted(overflowing) == ["(the model)", "head"] and fix == []  # in the doctor's table order, which is its own
    assert notes and "found no modules to keep in fp32" in notes[0]
    notes.clear()
    assert fp16_overflow_and_fix(_workload(), CPU, notes) == ([], []) and not notes


class _Fixable(nn.Module):
    """A block whose first layer's outputs are far above 65504 and normalised back before they leave it: keeping
    that layer in fp32 makes an fp16 step finite."""

    def __init__(self) -> None:
        super().__init__()
        self.big, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)
        with torch.no_grad():
            self.big.weight.mul_(1e6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.big(x))


def _fixable() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), _Fixable(), nn.Linear(8, 3))


def test_where_keeping_the_overflowing_module_in_fp32_fixes_fp16_the_doctors_fix_is_a_fact() -> None:
    notes: list[str] = []
    assert fp16_overflow_and_fix(_workload(_fixable()), CPU, notes) == (["1.big"], ["1.big"]) and not notes


def test_the_doctors_fix_joins_the_precision_stage_where_fp16_runs_fast(device: torch.device) -> None:
    from ampkit.tuning._prune import plan_stage
    from ampkit.tuning._space import Candidate

    w = _workload(_fixable().to(device))
    w.train_batches = [tuple(t.to(device) for t in b) for b in w.train_batches]
    facts = gather_facts(w, device, check_fp16=True, precisions=["16-mixed", "bf16-mixed"])
    assert (facts.fp16_overflow, facts.fp16_keep_fp32) == (["1.big"], ["1.big"])
    kept = plan_stage("precision", Candidate(policy="32-true", micro_batch=ROWS, accumulate=1), facts).kept
    fixed = [c for c in kept if c.policy == "16-mixed"]
    # Where fp16 runs fast (CUDA) 16-mixed is tried with the doctor's fix only; on a CPU it is pruned as slow.
    assert [c.keep_fp32 for c in fixed] == ([("1.big",)] if facts.policies["16-mixed"].fast else [])


def test_the_loaders_share_of_the_step_is_its_wait_against_the_step() -> None:
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.zeros(64, dtype=torch.long)), batch_size=ROWS)
    facts = gather_facts(_workload(), CPU, step_s=0.03, loader=loader, precisions=[], measure_wait=lambda _: 0.01)
    assert abs(facts.data_share - 0.25) < 1e-12  # type: ignore[operator]
    assert facts.loader_variants == loader_variants(loader, CPU)
    assert gather_facts(_workload(), CPU, precisions=[]).data_share is None  # no DataLoader: the data is in memory


def test_loader_variants_are_the_profiles_worker_counts() -> None:
    from ampkit.profile import LoaderSettings, candidate_settings

    loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=ROWS)
    control = [dataclasses.asdict(s) for s in candidate_settings(LoaderSettings(), CPU)]
    assert [{**dataclasses.asdict(LoaderSettings()), **v} for v in loader_variants(loader, CPU)] == control


def test_a_convolutional_workload_gets_the_channels_last_candidate_and_an_mlp_does_not() -> None:
    from ampkit.tuning import Candidate
    from ampkit.tuning._prune import plan_stage

    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 8 * 8, 3))
    images = [(torch.randn(ROWS, 3, 8, 8), torch.randint(0, 3, (ROWS,))) for _ in range(2)]
    w = Workload(name="conv", model=conv, train_batches=images, items_per_batch=ROWS, steps=4, warmup=1)
    facts = gather_facts(w, CPU, precisions=[], memory_budget=1 << 40)
    start = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)
    assert facts.convs == 2
    assert plan_stage("channels_last", start, facts).kept == [dataclasses.replace(start, channels_last=True)]
    mlp = gather_facts(_workload(), CPU, precisions=[], memory_budget=1 << 40)
    assert mlp.convs == 0 and plan_stage("channels_last", start, mlp).kept == []


def test_tf32_is_the_precision_stages_tf32_policy_tried_where_the_device_has_it_else_pruned_with_its_reason(device: torch.device) -> None:
    # TF32 (fp32 matmuls on tensor cores) is the `tf32` policy: the precision stage tries it on CUDA sm80+ and prunes
    # it elsewhere with the policy's own reason; no lever of its own (under a 16-bit policy the matmuls are 16-bit).
    from ampkit.policy import get_policy
    from ampkit.tuning import Candidate
    from ampkit.tuning._prune import plan_stage

    facts = gather_facts(_workload(), device, precisions=["tf32"], memory_budget=1 << 40)
    start = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)
    support = get_policy("tf32").support(device)
    plan = plan_stage("precision", start, facts)
    tf32 = dataclasses.replace(start, policy="tf32")
    if support.supported and support.fast:
        assert plan.kept == [tf32]
    else:
        assert plan.kept == [] and plan.pruned == [(tf32, f"not supported on {device.type}: {support.reason}")]
        assert device.type != "cpu" or "TF32 is a CUDA tensor-core mode" in support.reason
