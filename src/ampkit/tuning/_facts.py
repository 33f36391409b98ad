"""What ``ampkit tune`` learns before its first trial, from the tools that already know it.

- **Policies**: :meth:`ampkit.policy.Policy.support` on the device (which run at all, which run fast).
- **Memory**: :func:`ampkit.memory.estimate` predicts each policy's peak at the user's batch on fake tensors,
  against the memory the device has (CUDA: the free memory; CPU: ``MemAvailable``); where the batch does not fit,
  the smaller micro-batches, with and without recompute, are predicted too.
- **fp8**: :func:`ampkit.memory.fp8_layer_plan`'s roofline, per fp8 policy the device runs.
- **fp16**: the doctor (:func:`ampkit.numerics.diagnose`) records one fp32 step and names the modules whose
  activations exceed fp16's range, where an fp16 policy is in play (CUDA), with its fix: the modules 16-mixed
  keeps in fp32 so that its step is finite and agrees with fp32's, which the precision stage then tries.
- **The loader**: with a DataLoader, the wait for a batch as the loader is given, against the step's own time:
  the share of a step spent waiting for data, as ``ampkit profile``'s data phase measures it in a loop without
  workers (the loader then runs in the step's own thread, one batch after the other).

A prediction that fails (an op without a fake kernel) rules nothing out: the note says so.

    >>> available_memory(torch.device("cpu")) > 0
    True
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from .._compat import tree_flatten
from .._errors import one_line
from ..memory import MemoryEstimate, estimate, fp8_layer_plan, recompute, repeated_blocks
from ..policy import get_policy, policy_names
from ..profile import candidate_settings, loader_settings, usable_cores
from ..workloads import Workload
from ._space import Facts, PolicyFacts, memory_key, micro_batches

__all__ = ["add_loader_facts", "available_memory", "compiler_available", "data_wait_s", "fp16_overflow_and_fix", "gather_facts", "loader_variants", "predict_peak", "rows_of"]

log = logging.getLogger("ampkit")


def available_memory(device: torch.device) -> int | None:
    """Bytes a training step may use on ``device``: CUDA's free memory, or the host's ``MemAvailable`` (Linux)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None  # not known here (macOS, Windows): nothing is ruled out for memory


def compiler_available(device: torch.device) -> bool:
    """Whether torch.compile's inductor can build kernels for ``device``: Triton on CUDA, a C++ compiler on a CPU."""
    if device.type == "cuda":
        return importlib.util.find_spec("triton") is not None
    return any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "clang++", "c++"))


def _policy_facts(device: torch.device, names: Sequence[str] | None = None) -> dict[str, PolicyFacts]:
    """Each policy's facts on ``device``: every policy, or the reference and ``names`` (names or aliases)."""
    out = {}
    chosen = policy_names() if names is None else list(dict.fromkeys(["32-true", *(get_policy(n).name for n in names)]))
    for name in chosen:
        policy = get_policy(name)
        support = policy.support(device)
        out[name] = PolicyFacts(
            support.supported, support.fast, support.reason, masters=policy.master_weights, needs_compile=policy.needs_compile,
        )
    return out


def rows_of(batch: Any) -> tuple[int, str | None]:
    """The batch's rows and, where it cannot be cut into micro-batches, why: its tensors then do not share a first
    dimension, and its rows are its first tensor's (the model's input, as the user passes it).

    >>> rows_of((torch.zeros(4, 8), torch.zeros(4)))
    (4, None)
    >>> rows, why = rows_of((torch.zeros(4, 8, dtype=torch.long), torch.zeros(32, dtype=torch.long))); rows, why[:38]
    (4, "its tensors' first dimensions differ (")
    """
    from ..workloads import batch_rows

    try:
        return batch_rows(batch), None
    except ValueError:
        first = [t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor) and t.dim() > 0]
        if not first:
            raise ValueError("the training batch holds no tensor with a batch dimension: give the batch as a tensor, tuple, "
                             "list or dict of [N, ...] tensors.") from None
        dims = sorted({t.shape[0] for t in first})
        return first[0].shape[0], (f"its tensors' first dimensions differ ({' and '.join(map(str, dims))}: targets flattened to one row "
                                   "per token beside batch-first inputs, say)")


def predict_peak(workload: Workload, policy: str, micro_batch: int, device: torch.device, *, recomputed: bool = False) -> MemoryEstimate:
    """The predicted memory of one training step of ``workload`` under ``policy`` at ``micro_batch`` rows (its first
    batch cut to them), with the model's repeated blocks recomputed when ``recomputed``; nothing is allocated."""
    from ..workloads import split_batch

    model = workload.model
    if recomputed:
        model = copy.deepcopy(model)
        recompute(model, repeated_blocks(model))
    first = workload.train_batches[0]
    rows, unsplittable = rows_of(first)
    batch = first if micro_batch >= rows or unsplittable else split_batch(first, 0, micro_batch)
    return estimate(model, batch, workload.optimizer, policy, device, loss_fn=workload.loss_fn, clip_grad_norm=workload.clip_grad_norm)


def _predictions(workload: Workload, facts: Facts, device: torch.device, notes: list[str]) -> None:
    """Fill ``facts.predicted_peak``: every fast policy at the user's batch; where one does not fit, its smaller
    micro-batches with and without recompute (largest first, until one fits each way)."""
    names = [n for n, p in facts.policies.items() if p.supported and p.fast]
    for name in names:
        try:
            peak = predict_peak(workload, name, facts.rows, device).peak
        except Exception as exc:  # noqa: BLE001 - a model fake tensors cannot run: nothing is ruled out for memory
            notes.append(f"memory not predicted ({one_line(exc, with_type=True)}): no configuration ruled out for memory")
            facts.predicted_peak.clear()
            return
        facts.predicted_peak[memory_key(name, facts.rows, False)] = peak
        if facts.memory_budget is None or peak <= facts.memory_budget:
            continue
        for recomputed in (False, True) if facts.blocks else (False,):
            for m in micro_batches(facts.rows):
                key = memory_key(name, m, recomputed)
                if key not in facts.predicted_peak:
                    facts.predicted_peak[key] = predict_peak(workload, name, m, device, recomputed=recomputed).peak
                if facts.predicted_peak[key] <= facts.memory_budget:
                    break


def data_wait_s(loader: Iterable[Any], batches: int = 5) -> float:
    """Mean seconds the loop waits for one batch of ``loader`` as given (its first batch, a worker pool's start,
    left out): what the profile's data phase is in a loop without workers."""
    times = []
    iterator = iter(loader)
    next(iterator, None)
    for _ in range(batches):
        t0 = time.perf_counter()
        if next(iterator, None) is None:
            break
        times.append(time.perf_counter() - t0)
    return sum(times) / len(times) if times else 0.0


def loader_variants(loader: torch.utils.data.DataLoader[Any], device: torch.device) -> list[dict[str, Any]]:
    """The DataLoader settings the profile's search starts from (:func:`ampkit.profile.candidate_settings`: worker
    counts, on a CPU each also with torch's threads cut to the cores the workers leave), each as the fields that
    differ from the loader as given; the search then refines the fastest (persistent workers, prefetch, pinning)."""
    base = loader_settings(loader)
    given = dataclasses.asdict(base)
    return [{k: v for k, v in dataclasses.asdict(s).items() if given[k] != v} for s in candidate_settings(base, device)]


def gather_facts(
    workload: Workload,
    device: torch.device,
    *,
    step_s: float | None = None,
    memory_budget: int | None = None,
    loader: torch.utils.data.DataLoader[Any] | None = None,
    check_fp16: bool | None = None,
    precisions: Sequence[str] | None = None,
    notes: list[str] | None = None,
    measure_wait: Callable[[Iterable[Any]], float] = data_wait_s,
) -> Facts:
    """The :class:`~ampkit.tuning._space.Facts` of ``workload`` on ``device``.

    ``step_s``: the starting configuration's step time (for the loader's share); ``memory_budget``: bytes a step
    may use (default: :func:`available_memory`); ``loader``: the DataLoader the user trains from, if any;
    ``check_fp16``: run the doctor for fp16 overflow (default: where an fp16 policy runs fast, i.e. on CUDA).
    ``precisions``: the policies the tune may choose from (default: every policy; the reference is always in).
    ``notes`` collects what could not be learnt and why.
    """
    notes = notes if notes is not None else []
    rows, unsplittable = rows_of(workload.train_batches[0])
    facts = Facts(
        device=device.type, rows=rows, unsplittable=unsplittable, policies=_policy_facts(device, precisions), accumulate=workload.accumulate,
        memory_budget=memory_budget if memory_budget is not None else available_memory(device),
        blocks=len(repeated_blocks(workload.model)), convs=sum(isinstance(m, torch.nn.Conv2d) for m in workload.model.modules()),
        cores=usable_cores(), threads=torch.get_num_threads(),
        compiler=compiler_available(device),
    )
    _predictions(workload, facts, device, notes)
    for name, p in facts.policies.items():
        if p.supported and p.needs_compile:
            try:
                plan = fp8_layer_plan(workload.model, workload.train_batches[0], name)
                facts.fp8_layers[name] = (sum(1 for layer in plan.layers if layer.convert), len(plan.layers))
            except Exception as exc:  # noqa: BLE001 - no plan: the policy is tried as it comes
                notes.append(f"{name}: no fp8 layer plan ({one_line(exc, with_type=True)})")
    fp16 = [n for n, p in facts.policies.items() if n.startswith("16-") and p.supported and p.fast]
    if check_fp16 if check_fp16 is not None else bool(fp16):
        facts.fp16_overflow, facts.fp16_keep_fp32 = fp16_overflow_and_fix(workload, device, notes)
    if loader is not None and step_s:
        add_loader_facts(facts, loader, step_s, device, measure_wait)
    return facts


def add_loader_facts(
    facts: Facts, loader: torch.utils.data.DataLoader[Any], step_s: float, device: torch.device,
    measure_wait: Callable[[Iterable[Any]], float] = data_wait_s,
) -> None:
    """Set the loader's share of a ``step_s`` step (its wait for a batch over the wait and the step) and the loader
    settings worth a trial."""
    wait = measure_wait(loader)
    facts.data_share = wait / (wait + step_s)
    facts.loader_variants = loader_variants(loader, device)


def fp16_overflow_and_fix(workload: Workload, device: torch.device, notes: list[str]) -> tuple[list[str], list[str]]:
    """The doctor's numerics for fp16, from one recorded fp32 step (:func:`ampkit.numerics.diagnose` tailored for
    16-mixed): the modules whose outputs exceed fp16's range, and its fix, the modules 16-mixed keeps in fp32 so that
    its step is finite and agrees with fp32's (empty when its tailored step does not agree: no fix to try)."""
    from ..numerics import diagnose

    try:
        diagnosis = diagnose(
            workload.model, list(workload.train_batches[:2]), workload.loss_fn, steps=1, target="16-mixed", device=device,
            update_steps=0, fp8_recipe=None,
        )
    except Exception as exc:  # noqa: BLE001 - no diagnosis: fp16 is tried, and the guard judges it
        notes.append(f"fp16 overflow not checked ({one_line(exc, with_type=True)})")
        return [], []
    overflowing = [m["name"] or "(the model)" for m in diagnosis.modules if any("outputs overflow fp16" in p for p in m.get("problems", []))]
    agrees = diagnosis.recommended_precision == "16-mixed" and any(
        c.label == "recommended" and c.finite and not c.diverging for c in diagnosis.comparisons
    )
    fix = list(diagnosis.keep_fp32) if agrees and overflowing else []
    if overflowing and not fix:
        notes.append(f"fp16 overflows in {', '.join(overflowing[:3])} and the doctor found no modules to keep in fp32 that make its step agree with fp32's")
    return overflowing, fix
