"""What ``ampkit tune`` can change, and what it knows before it changes anything: candidates and facts.

A :class:`Candidate` is one training configuration: the precision policy, torch.compile (off, each repeated block,
or the whole model), the fused master step, the micro-batch and accumulation (the global batch stays the user's),
activation checkpointing, the memory format (channels_last for convolutional models), the DataLoader's settings
and torch's CPU threads. :class:`Facts` is what was learnt
about the model and the device before any trial (which policies the device runs fast, the predicted memory of
each configuration against the memory there is, fp8's layer plan, the doctor's fp16 overflow, the loader's share
of the step); the rules of :mod:`ampkit.tuning._prune` read only these two, so they are pure functions, tested
without a model.

The search is staged (:data:`STAGES`): each stage varies one lever of the best configuration so far (the
*incumbent*), so the levers that interact (a policy frees memory a larger micro-batch can use) are measured
together, on top of each other, instead of each on the starting point alone.

    >>> start = Candidate(policy="32-true", micro_batch=32, accumulate=1)
    >>> facts = Facts(device="cpu", rows=32, policies={"32-true": PolicyFacts(True, True, "runs everywhere"),
    ...     "bf16-mixed": PolicyFacts(True, True, "AMX")})
    >>> [c.describe(start) for c in stage_candidates("precision", start, facts)]
    ['precision bf16-mixed']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SCHEDULING_STAGES", "STAGES", "Candidate", "Facts", "PolicyFacts", "micro_batches", "stage_candidates"]

STAGES = ("fit", "loader", "channels_last", "precision", "compile", "fused_step", "micro_batch", "threads")
"""The levers, one stage each. ``fit``: the micro-batch and recompute that make the step fit at all (only when the
user's batch does not); ``loader``: the DataLoader's workers, pinning and prefetch (only with a DataLoader);
``channels_last``: the model and its 4-D inputs in NHWC (only for a model with Conv2d). TF32 is a policy
(``tf32``), tried in the precision stage where the device has it."""

SCHEDULING_STAGES = ("loader", "threads")
"""The levers that change when the work runs, not what it computes (:attr:`Candidate.numerics_key` leaves them
out): a configuration that differs from the start only in these needs no accuracy guard."""


@dataclass(frozen=True)
class Candidate:
    """One training configuration. ``micro_batch`` rows go through the model at once, ``accumulate`` of them per
    optimizer step: ``micro_batch * accumulate`` is the global batch, the same for every candidate of a tune."""

    policy: str
    micro_batch: int
    accumulate: int
    compile: str | None = None
    """``None`` (eager), ``"regional"`` (each repeated block) or ``"model"`` (the whole model): ``Engine(compile=...)``."""
    fused_step: bool | None = None
    """``Engine(fused_step=...)``; None: the engine's default (on with compile where the policy has masters)."""
    recompute: bool = False
    """Checkpoint the model's repeated blocks (:func:`ampkit.memory.recompute`)."""
    threads: int | None = None
    """``torch.set_num_threads`` (CPU); None: as the process has it."""
    loader: tuple[tuple[str, Any], ...] = ()
    """DataLoader keyword arguments that differ from the user's loader, as sorted pairs (hashable)."""
    channels_last: bool = False
    """The model and its 4-D floating inputs in ``torch.channels_last`` (NHWC), as the bench's workloads convert
    them: the layout the 16-bit convolution kernels want (oneDNN on a CPU, tensor cores on CUDA)."""
    keep_fp32: tuple[str, ...] = ()
    """Modules the policy runs in fp32 (``Engine(keep_fp32=...)``): the doctor's fix for an fp16 policy whose
    activations overflow there (:attr:`Facts.fp16_keep_fp32`)."""

    @property
    def key(self) -> str:
        """A stable text naming this configuration: what trials are stored under, and resumed by."""
        parts = [self.policy, f"mb{self.micro_batch}x{self.accumulate}", f"compile={self.compile or 'off'}"]
        parts += [f"fused={self.fused_step}"] if self.fused_step is not None else []
        parts += ["recompute"] if self.recompute else []
        parts += [f"threads={self.threads}"] if self.threads is not None else []
        parts += [f"{k}={v}" for k, v in self.loader]
        parts += ["channels_last"] if self.channels_last else []
        parts += [f"keep_fp32={','.join(self.keep_fp32)}"] if self.keep_fp32 else []
        return " ".join(parts)

    @property
    def numerics_key(self) -> str:
        """The settings that can change what training computes (threads and the loader change only its speed; the
        memory format changes the kernels' summation order): the accuracy guard judges each such configuration once."""
        return dataclasses.replace(self, threads=None, loader=()).key

    def describe(self, base: Candidate) -> str:
        """What differs from ``base``, in words; ``as given`` when nothing does.

        >>> a = Candidate(policy="32-true", micro_batch=32, accumulate=1)
        >>> dataclasses.replace(a, policy="bf16-mixed", compile="regional").describe(a)
        'precision bf16-mixed, compile regional'
        """
        out = []
        if self.policy != base.policy:
            out.append(f"precision {self.policy}")
        if self.keep_fp32 != base.keep_fp32:
            out.append(f"{', '.join(self.keep_fp32)} kept in fp32" if self.keep_fp32 else "no module kept in fp32")
        if self.compile != base.compile:
            out.append(f"compile {self.compile or 'off'}")
        if self.fused_step != base.fused_step:
            out.append(f"fused step {'on' if self.fused_step else 'off'}")
        if (self.micro_batch, self.accumulate) != (base.micro_batch, base.accumulate):
            out.append(f"micro-batch {self.micro_batch} x {self.accumulate}")
        if self.recompute != base.recompute:
            out.append("recompute" if self.recompute else "no recompute")
        if self.threads != base.threads:
            out.append(f"{self.threads} threads")
        if self.loader != base.loader:
            out.append(", ".join(f"{k}={v}" for k, v in self.loader) or "loader as given")
        if self.channels_last != base.channels_last:
            out.append("channels_last" if self.channels_last else "contiguous")
        return ", ".join(out) or "as given"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "loader": dict(self.loader), "keep_fp32": list(self.keep_fp32)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        return cls(**{**data, "loader": tuple(sorted(dict(data.get("loader") or {}).items())), "keep_fp32": tuple(data.get("keep_fp32") or ())})


@dataclass(frozen=True)
class PolicyFacts:
    """What :meth:`ampkit.policy.Policy.support` says of one policy on the device, and the policy's kind."""

    supported: bool
    fast: bool
    reason: str
    masters: bool = False
    """It keeps fp32 master weights: the fused master step applies."""
    needs_compile: bool = False
    """It pays only under torch.compile (fp8)."""


@dataclass
class Facts:
    """What the rules may read, gathered before any trial (:func:`ampkit.tuning._facts.gather_facts`)."""

    device: str
    """``cpu`` or ``cuda``."""
    rows: int
    """Rows of one batch as the user gives it (one micro-batch of the starting configuration)."""
    policies: dict[str, PolicyFacts]
    accumulate: int = 1
    """The user's accumulation: the global batch is ``rows * accumulate``."""
    unsplittable: str | None = None
    """Why the batch cannot be cut into micro-batches (its tensors do not share a first dimension: targets flattened
    to ``[B*T]`` beside inputs ``[B, T]``, say); None: it can. ``rows`` is then its first tensor's first dimension."""
    memory_budget: int | None = None
    """Bytes a training step may hold on the device; None: not known (nothing is ruled out for memory)."""
    predicted_peak: dict[str, int] = field(default_factory=dict)
    """Predicted peak bytes by :func:`memory_key` (policy, micro-batch, recompute), where predicted."""
    fp8_layers: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per fp8 policy: (Linear layers the roofline says pay, Linear layers in all)."""
    fp16_overflow: list[str] = field(default_factory=list)
    """Modules whose activations overflow fp16 (the doctor's numerics); empty when none do or fp16 was not checked."""
    fp16_keep_fp32: list[str] = field(default_factory=list)
    """The doctor's fix for that overflow: the modules 16-mixed keeps in fp32 so that its step is finite and agrees
    with fp32's (:func:`ampkit.numerics.diagnose` tailored for 16-mixed); empty when it found none."""
    data_share: float | None = None
    """The share of a step spent waiting for the DataLoader as given; None: no DataLoader (the data is in memory)."""
    loader_variants: list[dict[str, Any]] = field(default_factory=list)
    """The DataLoader settings worth trying (:func:`ampkit.profile.candidate_settings` and its refinements), each
    as the keyword arguments that differ from the user's loader."""
    blocks: int = 0
    """Repeated blocks of the model (what regional compile and recompute work on)."""
    convs: int = 0
    """Conv2d modules of the model (what channels_last changes the layout of)."""
    cores: int = 1
    threads: int = 1
    """torch's intra-op threads as the process has them."""
    compiler: bool = True
    """torch.compile can build kernels here (on a CPU inductor needs a C++ compiler)."""
    step_s: float | None = None
    """The incumbent's step, seconds (the start's probe, then each adopted configuration's measured median): what a
    compile's cost is weighed against. None: not measured yet (no compile is ruled out for its cost)."""
    run_steps: int | None = None
    """The steps the user's run trains (``--run-steps``), over which compile time is amortised."""
    compile_s: Callable[[Candidate], float] | None = None
    """A candidate's estimated compile seconds (the tune's budget: by the model's size, calibrated by the compiles
    measured so far); None: not estimated."""


def memory_key(policy: str, micro_batch: int, recompute: bool) -> str:
    """The key of :attr:`Facts.predicted_peak` for a configuration's memory (compile and threads do not change it
    in the prediction)."""
    return f"{policy}|{micro_batch}|{int(recompute)}"


def micro_batches(rows: int) -> list[int]:
    """The micro-batch sizes that split ``rows`` evenly, largest first (so the global batch is unchanged).

    >>> micro_batches(12)
    [12, 6, 4, 3, 2, 1]
    """
    return [m for m in range(rows, 0, -1) if rows % m == 0]


def stage_candidates(stage: str, incumbent: Candidate, facts: Facts) -> list[Candidate]:
    """The configurations stage ``stage`` tries: ``incumbent`` with that one lever changed (before pruning)."""
    replace = dataclasses.replace
    global_rows = incumbent.micro_batch * incumbent.accumulate
    if stage == "precision":
        out = [replace(incumbent, policy=name) for name in facts.policies if name != incumbent.policy]
        # fp16 where the doctor saw its activations overflow: the plain policy is pruned for it (fp16_overflow), and
        # 16-mixed is tried as the doctor tailored it, with the modules its fix keeps in fp32.
        if facts.fp16_overflow and facts.fp16_keep_fp32 and "16-mixed" in facts.policies:
            out.append(replace(incumbent, policy="16-mixed", keep_fp32=tuple(facts.fp16_keep_fp32)))
        return out
    if stage == "compile":
        out = [replace(incumbent, compile=mode) for mode in ("regional", "model") if mode != incumbent.compile]
        # The policies that pay only compiled (fp8) are tried here, compiled, where the device runs them at all (the
        # precision stage already named why a device cannot).
        compiled = incumbent.compile or "model"
        out += [replace(incumbent, policy=name, compile=compiled) for name, p in facts.policies.items()
                if p.needs_compile and p.supported and name != incumbent.policy]
        return out
    if stage == "fused_step":
        masters = facts.policies.get(incumbent.policy, PolicyFacts(True, True, "")).masters
        return [replace(incumbent, fused_step=True)] if masters and incumbent.fused_step is None and incumbent.compile is None else []
    if stage in ("fit", "micro_batch"):
        # fit: every split, with and without recompute, to find the largest micro-batch that fits; micro_batch
        # (the step fits already): the next smaller split only, which pays only where a smaller working set
        # runs faster (caches), so one try says whether the direction is worth anything.
        sizes = [m for m in micro_batches(global_rows) if m < incumbent.micro_batch]
        if stage == "micro_batch":
            return [replace(incumbent, micro_batch=m, accumulate=global_rows // m) for m in sizes[:1]]
        out = [replace(incumbent, recompute=True)] if not incumbent.recompute else []
        for m in sizes:
            out += [replace(incumbent, micro_batch=m, accumulate=global_rows // m, recompute=r) for r in (False, True)]
        return out
    if stage == "threads":
        if facts.device != "cpu":
            return []
        options = sorted({1, max(1, facts.cores // 2), facts.cores} - {incumbent.threads or facts.threads})
        return [replace(incumbent, threads=n) for n in options]
    if stage == "loader":
        return [replace(incumbent, loader=tuple(sorted(v.items()))) for v in facts.loader_variants]
    if stage == "channels_last":
        # One direction only: a model given channels_last (the bench's conv workloads) keeps the layout it was given.
        return [] if incumbent.channels_last else [replace(incumbent, channels_last=True)]
    raise ValueError(f"unknown tune stage {stage!r}; the stages are {', '.join(STAGES)}.")
