"""Prune before running: the rules that rule a configuration out, each with its reason, and the order of trials.

Every rule is a pure function of a :class:`~ampkit.tuning.Candidate`, the incumbent it varies and the
:class:`~ampkit.tuning._space.Facts`; it returns the reason the candidate is not worth a trial, or None. The
reasons are printed in the report beside the candidates they removed, so every configuration the space holds is
either measured, pruned with its reason, or listed as not tried for the budget.

The order of trials follows the expected gain: the stages by their best candidate's, and the candidates of a
stage by theirs, so a short ``--budget`` still finds the big wins first. The gains are **priors** for ordering
only (:data:`PRIORS`), never reported as findings: what the report says of a configuration is what its trial
measured. The one gain that is measured before any trial is the loader's: a step that waits for its data a
share ``s`` of its time can get at most ``1 / (1 - s)`` faster from the loader (Amdahl's bound); when the loader
is the bottleneck (:data:`LOADER_BOTTLENECK`), its stage runs first, since no other lever's gain would show.

    >>> from ampkit.tuning._space import Candidate, Facts, PolicyFacts
    >>> start = Candidate(policy="32-true", micro_batch=8, accumulate=1)
    >>> facts = Facts(device="cpu", rows=8, policies={"32-true": PolicyFacts(True, True, "runs everywhere"),
    ...     "16-mixed": PolicyFacts(True, False, "CPU fp16 is no faster than fp32")})
    >>> plan = plan_stage("precision", start, facts)
    >>> plan.kept, plan.pruned[0][1]
    ([], 'slow on cpu: CPU fp16 is no faster than fp32')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ._format import fmt_bytes
from ._space import STAGES, Candidate, Facts, PolicyFacts, memory_key, stage_candidates

__all__ = ["LOADER_BOTTLENECK", "MAX_GAIN", "PRIORS", "RULES", "compile_cannot_pay", "StagePlan", "expected_gain", "plan_stage", "stage_order"]

LOADER_BOTTLENECK = 0.5
"""A step that waits for its data at least this share of its time is loader-bound: a faster step would wait as
long, so the loader is tuned before anything else."""

PRIORS: dict[str, float] = {
    "policy-fast": 1.5,  # a 16-bit policy the device runs fast: 1.3-2.3x in this repository's benches (CPU AMX, GPU tensor cores)
    "policy-true": 1.05,  # 16-bit weights beyond that: no casts in the forward, less memory to read
    "compile-regional": 1.2,  # fuses the elementwise ops of each block; compiles one block, so starts sooner
    "compile-model": 1.25,  # fuses across blocks too; compiles the whole model
    "fused_step": 1.05,  # the master step as one region instead of a loop of per-tensor kernels
    "micro_batch": 0.95,  # smaller micro-batches mostly add per-step overhead
    "threads": 1.02,  # a thread count other than torch's default rarely helps, but costs a cheap trial
    "channels_last": 1.1,  # fp32 convolutions gain little from NHWC; 16-bit ones need it (see stage_order)
}
"""The gain each lever is expected to give, used only to order trials (never reported as a measurement)."""


def _policy(facts: Facts, name: str) -> PolicyFacts:
    return facts.policies.get(name, PolicyFacts(False, False, f"{name} is not a policy of this tune"))


def unsupported(c: Candidate, incumbent: Candidate, facts: Facts) -> str | None:
    """The device cannot run the policy (:meth:`ampkit.policy.Policy.support`)."""
    p = _policy(facts, c.policy)
    return None if p.supported else f"not supported on {facts.device}: {p.reason}"


def slow(c: Candidate, incumbent: Candidate, facts: Facts) -> str | None:
    """The device runs the policy, but no faster than fp32 (fp16 on a CPU): not worth a trial."""
    p = _policy(facts, c.policy)
    return f"slow on {facts.device}: {p.reason}" if p.supported and not p.fast else None


def needs_compile(c: Candidate, incumbent: Candidate, facts: Facts) -> str | None:
    """fp8 pays only compiled: its casts are separate kernels in eager mode."""
    if _policy(facts, c.policy).needs_compile and c.compile is None:
        return "pays only under torch.compile (its casts are separate kernels eagerly): tried in the compile stage"
    return None


def fp8_roofline(c: Candidate, incumbent: Candidate, facts: Facts) -> str | None:
    """The fp8 roofline (:func:`ampkit.memory.fp8_layer_plan`) says no Linear layer pays at this batch's rows."""
    paying, total = facts.fp8_layers.get(c.policy, (1, 1))
    if _policy(facts, c.policy).needs_compile and paying == 0:
        return f"the fp8 roofline predicts none of the {total} Linear layers pays at the batch's {facts.rows} rows"
    return None


def fp16_overflow(c: Candidate, incumbent: Candidate, facts: Facts) -> str | None:
    """The doctor found activations above fp16's largest value (65504): an fp16 policy would overflow there. The
    candidate that applies the doctor's fix (those modules kept in fp32) is not ruled out: the trial and the
    accuracy guard judge it."""
    if c.policy.startswith("16-") and facts.fp16_overflow and not c.keep_fp32:
        shown = ", ".join(facts.fp16_overflow[:3]) + (f" and {len(facts.fp16_overflow) - 3} more" if len(facts.fp16_overflow) > 3 else "")
        fixed = c.policy == "16-mixed" and facts.fp16_keep_fp32 and "16-mixed" in facts.policies
        remedy = (f"tried with the doctor's fix instead, keep_fp32={list(facts.fp16_keep_fp32)}" if fixed
                  else "the doctor found no fix that keeps its step finite and in line with fp32's: use a bf16 policy")
        return f"activations overflow fp16 (above 65504) in {shown} (ampkit doctor): {remedy}"
    return None


def no_compiler(c: Candidate, incumbent: Candidate, facts: Facts) -> str | None:
    """torch.compile cannot build kernels here (no C++ compiler for inductor on a CPU)."""
    if (c.compile is not None or c.fused_step) and not facts.compiler:
        return "torch.compile cannot build kernels here (inductor needs a C++ compiler on the CPU: install gcc or clang)"
    return None


def no_blocks(c: Candidate, incumbent: Candidate, facts: Facts) -> str | None:
    """Regional compile and recompute work on repeated blocks; a model without them has nothing to apply them to."""
    if c.compile == "regional" and facts.blocks == 0:
        return "the model has no repeated blocks to compile one by one: compile model covers it"
    if c.recompute and facts.blocks == 0:
        return "the model has no repeated blocks to recompute"
    return None


def unsplittable(c: Candidate, incumbent: Candidate, facts: Facts) -> str | None:
    """Micro-batches cut every tensor of the batch alike: a batch whose tensors do not share a first dimension
    cannot be cut (the rest of the tune goes on without this lever)."""
    if facts.unsplittable and c.micro_batch != facts.rows:
        return f"the batch cannot be cut into micro-batches: {facts.unsplittable}"
    return None


def too_big(c: Candidate, incumbent: Candidate, facts: Facts) -> str | None:
    """The predicted peak (:func:`ampkit.memory.estimate`) exceeds the memory the device has for the step."""
    peak = facts.predicted_peak.get(memory_key(c.policy, c.micro_batch, c.recompute))
    if facts.memory_budget is not None and peak is not None and peak > facts.memory_budget:
        return f"predicted peak {fmt_bytes(peak)} exceeds the {fmt_bytes(facts.memory_budget)} available (ampkit memory)"
    return None


def _fits(facts: Facts, policy: str, micro_batch: int, recompute: bool) -> bool:
    peak = facts.predicted_peak.get(memory_key(policy, micro_batch, recompute))
    return facts.memory_budget is None or peak is None or peak <= facts.memory_budget


def needless_recompute(c: Candidate, incumbent: Candidate, facts: Facts) -> str | None:
    """Recompute costs a forward's worth of work per step: it is not tried where the configuration fits without it."""
    if c.recompute and not incumbent.recompute and _fits(facts, c.policy, c.micro_batch, False):
        return "fits without recomputing: recompute would add a forward's worth of work to every step"
    return None


def no_convolutions(c: Candidate, incumbent: Candidate, facts: Facts) -> str | None:
    """channels_last changes the layout of 4-D convolution inputs and weights: a model without Conv2d has none."""
    if c.channels_last and not incumbent.channels_last and facts.convs == 0:
        return "the model has no Conv2d: channels_last changes only the layout of convolutions' 4-D inputs and weights"
    return None


MAX_GAIN = 3.0
"""No lever is assumed to make a step more than this much faster: the largest single-lever gain in this repository's
benches is 2.3x (bf16 on a CPU's AMX), so 3x is a generous bound. A compile whose cost, spread over the run, would
not be repaid even at this gain is not tried (:func:`compile_cannot_pay`)."""


def compile_cost_per_step(c: Candidate, facts: Facts) -> float:
    """``c``'s estimated compile time spread over the user's run, seconds per step; 0 where nothing is estimated."""
    if facts.compile_s is None or not facts.run_steps:
        return 0.0
    return facts.compile_s(c) / facts.run_steps


def compile_cannot_pay(c: Candidate, incumbent: Candidate, facts: Facts) -> str | None:
    """The candidate compiles more than the incumbent, and that compile's estimated time spread over the run adds
    more to each step than even a :data:`MAX_GAIN` faster step would save: it cannot pay within ``--run-steps``."""
    extra = compile_cost_per_step(c, facts) - compile_cost_per_step(incumbent, facts)
    if facts.step_s is None or extra <= 0:
        return None
    saved = facts.step_s * (1 - 1 / MAX_GAIN)
    if extra < saved:
        return None
    total = facts.compile_s(c) if facts.compile_s else 0.0
    return (f"its compile (about {total:.0f} s, estimated) spread over the run's {facts.run_steps} steps (--run-steps) adds "
            f"{extra * 1e3:.1f} ms a step, more than a {MAX_GAIN:g}x faster step would save ({saved * 1e3:.1f} ms of "
            f"{facts.step_s * 1e3:.1f} ms): it pays only over a longer run")


RULES: tuple[Callable[[Candidate, Candidate, Facts], str | None], ...] = (
    unsupported, slow, needs_compile, fp8_roofline, fp16_overflow, no_compiler, no_blocks, unsplittable, too_big, needless_recompute,
    no_convolutions, compile_cannot_pay,
)
"""Applied in this order; the first that gives a reason prunes the candidate."""


def expected_gain(c: Candidate, incumbent: Candidate, facts: Facts) -> float:
    """The gain a trial of ``c`` over ``incumbent`` is expected to show, for ordering (see :data:`PRIORS`)."""
    gain = 1.0
    if c.policy != incumbent.policy and c.policy != "32-true":
        gain *= PRIORS["policy-fast"] * (PRIORS["policy-true"] if "-true" in c.policy else 1.0)
        gain /= 1.02 if _policy(facts, c.policy).masters else 1.0  # the masters' copy-back and their memory
    if c.compile != incumbent.compile and c.compile is not None:
        gain *= PRIORS[f"compile-{c.compile}"]
    if c.fused_step and not incumbent.fused_step:
        gain *= PRIORS["fused_step"]
    if c.micro_batch != incumbent.micro_batch:
        gain *= PRIORS["micro_batch"] ** (1 if c.micro_batch < incumbent.micro_batch else -1)
    if c.recompute and not incumbent.recompute:
        gain *= 0.75  # about a third more work per step (a second forward of the recomputed blocks)
    if c.threads != incumbent.threads:
        gain *= PRIORS["threads"]
    if c.loader != incumbent.loader:
        gain *= loader_bound(facts)
    if c.channels_last and not incumbent.channels_last:
        gain *= PRIORS["channels_last"]
    extra = compile_cost_per_step(c, facts) - compile_cost_per_step(incumbent, facts)
    if facts.step_s and extra > 0:  # the compile, amortised over the run, as the trial will rank it
        gain = 1.0 / (1.0 / gain + extra / facts.step_s)
    return gain


def loader_bound(facts: Facts) -> float:
    """The most a faster loader can give, measured: ``1 / (1 - s)`` for a step waiting for data a share ``s``."""
    share = facts.data_share or 0.0
    return 1.0 / max(1e-3, 1.0 - min(share, 0.999))


@dataclass
class StagePlan:
    """A stage's candidates after pruning: ``kept`` in the order of trials, ``pruned`` with each one's reason."""

    stage: str
    kept: list[Candidate] = field(default_factory=list)
    pruned: list[tuple[Candidate, str]] = field(default_factory=list)
    reason: str | None = None
    """Why the stage has nothing to try (its candidates were all pruned, or it applies to no such model)."""


_EMPTY_STAGE = {
    "fit": "the user's batch fits: no smaller micro-batch or recompute needed",
    "loader": "the data is in memory, not read through a DataLoader: no loader settings to try",
    "fused_step": "the policy keeps no fp32 master weights, or the step is compiled already (fused by default there)",
    "threads": "not a CPU run: the thread count is the host's, not the device's",
    "compile": "the configuration is compiled already",
    "micro_batch": "the global batch does not split further",
    "channels_last": "the model and its inputs are channels_last already (as given)",
}


def plan_stage(stage: str, incumbent: Candidate, facts: Facts) -> StagePlan:
    """Stage ``stage``'s candidates on top of ``incumbent``: pruned by :data:`RULES`, the rest by expected gain."""
    plan = StagePlan(stage)
    for c in stage_candidates(stage, incumbent, facts):
        reason = next((r for r in (rule(c, incumbent, facts) for rule in RULES) if r is not None), None)
        if reason is None:
            plan.kept.append(c)
        else:
            plan.pruned.append((c, reason))
    if stage == "fit":
        plan.kept, smaller = _fit_choices(plan.kept)
        plan.pruned += smaller
    plan.kept.sort(key=lambda c: -expected_gain(c, incumbent, facts))
    if not plan.kept and not plan.pruned:
        plan.reason = _EMPTY_STAGE.get(stage, "nothing to try")
    elif not plan.kept:
        plan.reason = "every candidate was pruned"
    return plan


def _fit_choices(kept: list[Candidate]) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """Of the configurations that fit, the largest micro-batch without recompute and, when recompute lets a larger
    one fit, that one too (the trial decides between fewer steps and less work); the smaller ones, with why not."""
    plain = [c for c in kept if not c.recompute]
    recomputed = [c for c in kept if c.recompute]
    chosen = [max(plain, key=lambda c: c.micro_batch)] if plain else []
    if recomputed:
        best = max(recomputed, key=lambda c: c.micro_batch)
        if not chosen or best.micro_batch > chosen[0].micro_batch:
            chosen.append(best)
    dropped = []
    for c in kept:
        if c not in chosen:
            larger = max((k.micro_batch for k in chosen if k.recompute == c.recompute or not k.recompute), default=None)
            dropped.append((c, f"a micro-batch of {larger} fits{'' if not c.recompute else ' (with recompute)'}: a smaller one only adds steps"))
    return chosen, dropped


def stage_order(facts: Facts, start_fits: bool = True) -> list[str]:
    """The stages in the order they run: ``fit`` first when the user's batch does not fit (nothing runs until it
    does), the loader next when it is the bottleneck (:data:`LOADER_BOTTLENECK`), channels_last just before the
    precision stage, the rest by expected gain.

    channels_last goes before the policies whatever its own prior: 16-bit convolutions run fast only in NHWC
    (oneDNN's bf16 kernels on a CPU, tensor cores on CUDA), so measured the other way round a bf16 policy of a
    convolutional model would be judged in a layout that hides its gain. The stage is empty (no trial) for a
    model without Conv2d or one given channels_last already.

    >>> from ampkit.tuning._space import Facts
    >>> stage_order(Facts(device="cpu", rows=8, policies={}, data_share=0.7))[:3]
    ['loader', 'channels_last', 'precision']
    """
    best = {
        "precision": PRIORS["policy-fast"], "compile": PRIORS["compile-model"], "fused_step": PRIORS["fused_step"],
        "micro_batch": PRIORS["micro_batch"], "threads": PRIORS["threads"], "loader": loader_bound(facts),
    }
    rest = sorted((s for s in STAGES if s in best), key=lambda s: -best[s])
    rest.insert(rest.index("precision"), "channels_last")
    first = [] if start_fits else ["fit"]
    if facts.data_share is not None and facts.data_share >= LOADER_BOTTLENECK:
        first.append("loader")
        rest.remove("loader")
    return first + rest

