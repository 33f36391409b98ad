"""fp8 against bf16-mixed: per Linear shape, predicted vs measured, then end to end on a 1B-class GPT and gpt large.

Per layer (first: it says which layers pay, and each shape is a short measurement): every distinct
``(tokens, in, out)`` Linear shape of both models, forward and backward of one compiled Linear under bf16 autocast
against torchao's ``Float8Linear`` (tensorwise for every shape, rowwise where the filter converts), medians over
repetitions, beside the roofline's prediction (:func:`ampkit.policy._fp8_roofline.predict_linear` with this GPU's
spec): which shapes the ``"auto"`` filter converts, and whether the measurement agrees (pays / does not pay). The
table may take :data:`LAYER_SHARE` of ``--time-limit``.

End to end: each model trains under ``bf16-mixed``, ``fp8-tensorwise`` and ``fp8-rowwise`` (the policies' default
``layers="auto"``, with ``tokens`` set to the rows each Linear really multiplies per micro-batch; for gpt large also
``layers="all"``, so the filter's choice is visible against converting everything), all through
``Engine(compile="regional")``: each transformer block compiled once and reused (fp8 without compile is slow; a
whole-model compile per policy would not fit the GPU suite's time), the embedding and the head eager. Same
weights, same batches (the gpt workload's stdlib text) for every policy; the policies run back to back in one
process. Per row: median step time after warm-up (CUDA events, one synchronize after the timed steps), tokens/s,
speed-up over bf16-mixed, the loss averaged over the last third of the timed steps, the **gap** to bf16-mixed's (the
control, step by step on the same batches) with its noise (2 standard errors of the per-step differences: a gap
inside it is not told apart from rounding at this length) and the same gap over the first steps (whether the runs
drift apart or come together), peak memory, and how many Linear layers run in fp8. An ``"auto"`` policy that
converts no layer trains exactly as bf16-mixed: it is reported as such, not run again.

Last, where the end-to-end gain goes (:func:`gain_accounting`): what the converted layers save per step by the
roofline, measured one layer at a time, and in the whole step; the rest is what converting costs around them.

A recipe the device cannot run (rowwise below sm90) is reported as skipped with the reason. Without torchao the
script says how to bring it and exits 3. ``--smoke`` runs tiny models on the CPU in torchao's emulation (seconds;
timings mean nothing there, the losses are still a check of fp8 against bf16).

    python benchmarks/fp8_training.py --device cuda --json fp8.json
    python benchmarks/fp8_training.py --smoke
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from typing import Any

import torch
from torch import nn

import ampkit
from ampkit._compat import compile_in_place
from ampkit.policy._device import cpu_name
from ampkit.policy._fp8 import FP8Rowwise, FP8Tensorwise, missing_torchao
from ampkit.policy._fp8_roofline import measure_linear_tokens, predict_linear
from ampkit.policy._lowbit_optimizers import quiet_library_logs
from ampkit.workloads._gpt import GPT, VOCAB, build, lm_cross_entropy, stdlib_corpus
from measured_rows import Deadline, Printer, add_time_limit, attempt

SMOKE = {"steps": 2, "warmup": 1, "reps": 2}
"""What ``--smoke`` changes: tiny models (below), 1 warm-up and 2 timed steps, no compile unless ``--backend`` names
one (tracing costs more than the rest of the smoke run: CI passes ``--backend eager`` in the suite's slow test)."""

BRING_TORCHAO = (
    "On a lent GPU machine (torch 2.11, no network) carry torchao's wheel: in the repository root "
    "`python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
    "--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl torchao==0.17.0`, name '.whl' in the "
    "run's carry; benchmarks/gpu_suite.py installs .whl/*.whl before its steps (see DEVELOPERS.md)."
)

FP8_POLICIES = (FP8Tensorwise, FP8Rowwise)


@dataclass(frozen=True)
class ModelSpec:
    """One model of the comparison: how to build it, its batch, and whether ``layers="all"`` rows are added."""

    name: str
    build: Callable[[torch.device], nn.Module]
    """Builds the model on a device: the GPU (fast initialisation), or ``meta`` (shapes only)."""
    batch: int
    seq_len: int
    lr: float
    with_all: bool

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len


def gpt_large(device: torch.device) -> nn.Module:
    return build("large").model.to(device)  # the bench workload's own weights


def gpt_1b(device: torch.device) -> nn.Module:
    # 20 blocks of 12 * 2048^2 parameters: 1.01 B, initialised where it is built (on a GPU: seconds, not a minute).
    with torch.device(device):
        return GPT(VOCAB, seq_len=1024, d_model=2048, heads=16, layers=20)


def gpt_tiny(device: torch.device) -> nn.Module:
    with torch.device(device):  # two blocks: compile="regional" compiles repeated ones
        return GPT(VOCAB, seq_len=32, d_model=32, heads=2, layers=2)


def gpt_tiny_deep(device: torch.device) -> nn.Module:
    with torch.device(device):  # gpt tiny's shapes: the per-layer table measures each shape once for both
        return GPT(VOCAB, seq_len=32, d_model=32, heads=2, layers=3)


# 1B: 16 x 1024 tokens a step: about 16 GB of fp32 weights, gradients and AdamW state plus ~25 GB of activations
# in bf16-mixed, well within an 80 GB H100.
FULL_MODELS = (
    ModelSpec("gpt 1B", gpt_1b, batch=16, seq_len=1024, lr=3e-4, with_all=False),
    ModelSpec("gpt large", gpt_large, batch=32, seq_len=256, lr=3e-4, with_all=True),
)
SMOKE_MODELS = (
    ModelSpec("gpt tiny-deep", gpt_tiny_deep, batch=4, seq_len=32, lr=3e-3, with_all=False),
    ModelSpec("gpt tiny", gpt_tiny, batch=4, seq_len=32, lr=3e-3, with_all=True),
)


def corpus_batches(seq_len: int, batch: int, count: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches of ``batch`` windows of the gpt workload's stdlib text (inputs, targets shifted by one)."""
    text, _ = stdlib_corpus(6_000_000)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - seq_len - 1, (count, batch), generator=generator)
    windows = data[starts.unsqueeze(-1) + torch.arange(seq_len + 1)].long()
    return [(w[:, :-1], w[:, 1:]) for w in windows]


class Timer:
    """Times calls on the device: CUDA events around each call and one synchronize after all (no sync between
    calls, so the host keeps queueing as in training); wall clock on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def run(self, fn: Callable[[], Any], n: int) -> tuple[list[float], list[Any]]:
        """Call ``fn`` ``n`` times: the seconds each took and what each returned."""
        results = []
        if not self.cuda:
            seconds = []
            for _ in range(n):
                start = time.perf_counter()
                results.append(fn())
                seconds.append(time.perf_counter() - start)
            return seconds, results
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in events:
            start.record()
            results.append(fn())
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in events], results


# ---------------------------------------------------------------------------------------------- end to end


def policies_for(spec: ModelSpec, emulate: bool) -> list[tuple[str, ampkit.Policy]]:
    """The rows of one model: bf16-mixed, then each fp8 recipe with the filter (and converting every layer)."""
    rows: list[tuple[str, ampkit.Policy]] = [("bf16-mixed", ampkit.get_policy("bf16-mixed"))]
    for cls in FP8_POLICIES:
        rows.append((cls.name, cls(tokens=spec.tokens, emulate=emulate)))
        if spec.with_all:
            rows.append((f"{cls.name} all", cls(layers="all", tokens=spec.tokens, emulate=emulate)))
    return rows


def compile_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"backend": args.backend} if args.backend else {}


def loss_window(steps: int) -> int:
    """How many of the last timed steps a row's loss is averaged over: a third of them, 5 to 20."""
    return max(1, min(20, max(5, steps // 3), steps))


def loss_gap(losses: list[float], control: list[float], window: int) -> dict[str, Any]:
    """The loss gap to the control (same weights, same batches, step by step) and its noise.

    The gap is the mean of the per-step differences over the last ``window`` steps; its noise is their standard
    error (the differences' standard deviation over sqrt(window)), so a gap within 2 standard errors of zero is
    not told apart from rounding at this length. The same gap over the first ``window`` steps says whether the
    runs drift apart or come together as training goes on.

    >>> g = loss_gap([3.0, 2.6, 2.2, 2.1, 2.08, 1.92], [3.0, 2.5, 2.2, 2.0, 2.0, 1.8], window=3)
    >>> round(g["loss_diff_vs_bf16"], 4), round(2 * g["loss_diff_se"], 4), g["gap_within_noise"], round(g["loss_diff_early"], 4), g["gap_trend"]
    (0.1, 0.0231, False, 0.0333, 'widens')
    """
    diffs = [a - b for a, b in zip(losses, control)]
    late, early = diffs[-window:], diffs[:window]
    se = statistics.stdev(late) / math.sqrt(len(late)) if len(late) > 1 else math.nan
    gap = statistics.fmean(late)
    early_gap = statistics.fmean(early)
    noise = 2 * se if math.isfinite(se) else 0.0
    trend = "closes" if abs(gap) < abs(early_gap) - noise else "widens" if abs(gap) > abs(early_gap) + noise else "steady"
    return {
        "loss_diff_vs_bf16": gap,
        "loss_diff_se": se,
        "gap_within_noise": bool(abs(gap) <= 2 * se) if math.isfinite(se) else None,
        "loss_diff_early": early_gap,
        "gap_trend": trend,  # the last steps' gap against the first steps', beyond its noise
        "loss_window": len(late),
    }


def count_fp8(model: nn.Module) -> int:
    return sum(type(m).__name__ == "Float8Linear" for m in model.modules())


def train_case(base: nn.Module, policy: ampkit.Policy, spec: ModelSpec, batches: list[Any], args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """One policy on a copy of ``base`` (held on the CPU, so the peak memory is the run's own): warm-up (compiles),
    then the timed steps."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = copy.deepcopy(base).to(device)
    engine = ampkit.Engine(policy, compile=None if args.backend == "none" else {"regional": True, **compile_options(args)})
    with quiet_library_logs("torchao", "torchao.kernel.intmm", "torch.utils._pytree"):
        model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01, fused=True))
    model.train()
    feed = iter(batches)

    def step() -> torch.Tensor:
        x, y = next(feed)
        with engine.autocast():
            loss = lm_cross_entropy(model(x).float(), y)
        engine.backward(loss)
        engine.step()
        return loss.detach()

    timer = Timer(device)
    warm_s, warm_losses = timer.run(step, args.warmup)
    step_s, losses = timer.run(step, args.steps)
    median = statistics.median(step_s)
    curve = [float(v) for v in torch.stack([*warm_losses, *losses]).cpu()]  # one read-back, after the timed steps
    row = {
        "step_s": median,
        "tokens_per_s": spec.tokens / median,
        "losses": curve,
        "loss": statistics.fmean(curve[-loss_window(args.steps):]),
        "compile_s": max(0.0, warm_s[0] - median),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "fp8_layers": count_fp8(model),
        "linear_layers": sum(isinstance(m, nn.Linear) for m in model.modules()),
    }
    return row


def run_model(spec: ModelSpec, args: argparse.Namespace, device: torch.device, deadline: Deadline, emit: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Every policy's row for one model, printed as each finishes."""
    torch.manual_seed(0)
    base = spec.build(device).to("cpu")
    batches = [(x.to(device), y.to(device)) for x, y in corpus_batches(spec.seq_len, spec.batch, args.warmup + args.steps)]
    rows: list[dict[str, Any]] = []
    reference: dict[str, Any] | None = None
    for label, policy in policies_for(spec, args.emulate):
        row: dict[str, Any] = {"model": spec.name, "policy": label, "tokens": spec.tokens, "status": "ok", "reason": ""}
        support = policy.support(device)
        plans = policy.plan_layers(base, device.type) if isinstance(policy, FP8_POLICIES) else []
        late = deadline.passed()
        if late:
            row |= {"status": "skipped", "reason": late}
        elif not support.supported:
            row |= {"status": "skipped", "reason": support.reason}
        elif plans and not any(p.convert for p in plans):
            row |= {"status": "skipped", "reason": f"the filter converts no layer at {spec.tokens} tokens: trains as bf16-mixed",
                    "fp8_layers": 0, "linear_layers": len(plans)}
        else:
            row |= attempt(functools.partial(train_case, base, policy, spec, batches, args, device), device)
        if reference is None and row["status"] == "ok":
            reference = row  # bf16-mixed: the control
        if row["status"] == "ok" and reference is not None:
            row["speedup_vs_bf16"] = reference["step_s"] / row["step_s"]
            if row is not reference:
                row |= loss_gap(row["losses"], reference["losses"], loss_window(args.steps))
        rows.append(row)
        emit(row)
    return rows


# ---------------------------------------------------------------------------------------------- per layer


def linear_shapes(spec: ModelSpec) -> dict[tuple[int, int, int], list[str]]:
    """Each distinct ``(tokens, in, out)`` of the model's Linear layers, with the layers of that shape (a forward on
    the meta device: shapes without memory or time)."""
    model = spec.build(torch.device("meta"))
    x = torch.zeros(spec.batch, spec.seq_len, dtype=torch.long, device="meta")
    rows = measure_linear_tokens(model, lambda: model(x))
    shapes: dict[tuple[int, int, int], list[str]] = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and name in rows:
            shapes.setdefault((rows[name], m.in_features, m.out_features), []).append(name)
    return shapes


def time_linear(layer: nn.Module, tokens: int, device: torch.device, args: argparse.Namespace) -> float:
    """Median seconds of one compiled Linear's forward (bf16 autocast) and backward (input and weight gradients)."""
    if args.backend != "none":
        compile_in_place(layer, compile_options(args))  # a dynamo cache of its own
    x = torch.randn(tokens, layer.in_features, device=device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(tokens, layer.out_features, device=device, dtype=torch.bfloat16)
    params = [p for p in layer.parameters() if p.requires_grad]

    def once() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            y = layer(x)
        torch.autograd.grad(y, [x, *params], grad)

    timer = Timer(device)
    timer.run(once, args.warmup)  # compiles, then settles
    seconds, _ = timer.run(once, args.reps)
    return statistics.median(seconds)


def measure_shape(tokens: int, k: int, n: int, recipes: list[tuple[str, Any]], args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """One shape's measured times: bf16, then each fp8 recipe the device runs (the others: why not)."""
    torch.manual_seed(0)
    linear = nn.Linear(k, n, device=device)
    row: dict[str, Any] = {"measured_bf16_s": time_linear(copy.deepcopy(linear), tokens, device, args)}
    for name, policy in recipes:
        support = policy.support(device)
        if not support.supported:
            row[f"{name}_skipped"] = support.reason
            continue
        row[f"measured_{name}_s"] = time_linear(float8_layer(copy.deepcopy(linear), policy), tokens, device, args)
        row[f"measured_{name}_speedup"] = row["measured_bf16_s"] / row[f"measured_{name}_s"]
    return row


def float8_layer(linear: nn.Module, policy: Any) -> nn.Module:
    with quiet_library_logs("torchao", "torchao.kernel.intmm", "torch.utils._pytree"):
        from torchao.float8 import convert_to_float8_training

        wrapper = nn.Sequential(linear)
        convert_to_float8_training(wrapper, config=policy.float8_config())
    return wrapper[0]


def measure_layers(models: tuple[ModelSpec, ...], args: argparse.Namespace, device: torch.device, deadline: Deadline, emit: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Per distinct Linear shape: the roofline's prediction, the filter's choice, and the measured times."""
    tensorwise = FP8Tensorwise(emulate=args.emulate)
    target = tensorwise.planning_spec(device.type)
    recipes = [(cls.name, cls(emulate=args.emulate)) for cls in FP8_POLICIES]
    shapes: dict[tuple[int, int, int], list[str]] = {}
    by_model: dict[tuple[int, int, int], dict[str, int]] = {}
    for spec in models:
        for key, names in linear_shapes(spec).items():
            shapes.setdefault(key, []).extend(f"{spec.name}: {n}" for n in names)
            by_model.setdefault(key, {})[spec.name] = len(names)
    rows = []
    for (tokens, k, n), names in shapes.items():
        cost = predict_linear(target, tokens, k, n)
        plan = FP8Tensorwise(tokens=tokens, emulate=args.emulate).plan_layers(nn.Sequential(nn.Linear(k, n, device="meta")), device.type)[0]
        row: dict[str, Any] = {
            "tokens": tokens, "in": k, "out": n, "layers": len(names), "layers_by_model": by_model[(tokens, k, n)], "examples": names[:3],
            "planned_for": target.name, "predicted_bf16_s": cost.bf16_s, "predicted_fp8_s": cost.fp8_s,
            "predicted_speedup": cost.speedup, "filter_converts": plan.convert, "filter_reason": plan.reason,
        }
        late = deadline.passed()
        if late:
            row |= {"status": "skipped", "reason": late}
            rows.append(row)
            emit(row)
            continue
        # Rowwise only where the filter converts: a shape it keeps in bf16 is the filter's call to check, and
        # tensorwise (the cheaper recipe) checks it; each measured recipe is one more compile.
        chosen = [(name, policy) for name, policy in recipes if plan.convert or name == "fp8-tensorwise"]
        row |= attempt(functools.partial(measure_shape, tokens, k, n, chosen, args, device), device)
        if not plan.convert:
            row["fp8-rowwise_skipped"] = "not measured: the filter keeps this shape in bf16"
        measured = row.get("measured_fp8-tensorwise_speedup")
        if measured is not None:
            row["measured_pays"] = measured > 1.0
            row["agrees"] = row["measured_pays"] == plan.convert
        rows.append(row)
        emit(row)
    return rows


LAYER_SHARE = 0.4
"""The share of ``--time-limit`` the per-layer table may take before the end-to-end runs start."""


def gain_accounting(model: str, policy: str, runs: list[dict[str, Any]], layers: list[dict[str, Any]]) -> dict[str, Any]:
    """Where ``policy``'s end-to-end gain on ``model`` goes: what the roofline predicted the converted layers would
    save per step, what they saved measured one at a time, and what the whole step saved. The difference between
    the last two is what converting costs outside the layers' own forward and backward (the casts and scale
    reductions around them inside the compiled blocks, the weights' fp8 copies) or what the layers lose inside a
    block. Shapes measured slower than predicted are named.

    >>> runs = [{"model": "m", "policy": "bf16-mixed", "status": "ok", "step_s": 0.2}, {"model": "m", "policy": "fp8-tensorwise", "status": "ok", "step_s": 0.18}]
    >>> layers = [{"status": "ok", "filter_converts": True, "layers_by_model": {"m": 10}, "tokens": 8, "in": 4, "out": 4, "predicted_bf16_s": 0.004,
    ...            "predicted_fp8_s": 0.003, "predicted_speedup": 1.33, "measured_bf16_s": 0.004, "measured_fp8-tensorwise_s": 0.0035, "measured_fp8-tensorwise_speedup": 1.14}]
    >>> a = gain_accounting("m", "fp8-tensorwise", runs, layers)
    >>> round(a["predicted_saving_s"], 4), round(a["layers_saving_s"], 4), round(a["step_saving_s"], 4)
    (0.01, 0.005, 0.02)
    """
    rows = {r["policy"]: r for r in runs if r["model"] == model and r["status"] == "ok"}
    converted = [r for r in layers if r.get("filter_converts") and r.get("layers_by_model", {}).get(model)]
    measured = [r for r in converted if r["status"] == "ok" and f"measured_{policy}_s" in r]
    out: dict[str, Any] = {"model": model, "policy": policy}
    if "bf16-mixed" not in rows or policy not in rows or not converted:
        out["text"] = f"{policy} on {model}: nothing to account for (no layer converted, or no end-to-end row beside bf16-mixed's)."
        return out
    n = {id(r): r["layers_by_model"][model] for r in converted}
    out["predicted_saving_s"] = sum(n[id(r)] * (r["predicted_bf16_s"] - r["predicted_fp8_s"]) for r in converted)
    out["layers_saving_s"] = sum(n[id(r)] * (r["measured_bf16_s"] - r[f"measured_{policy}_s"]) for r in measured) if len(measured) == len(converted) else None
    out["step_saving_s"] = rows["bf16-mixed"]["step_s"] - rows[policy]["step_s"]
    slow = [f"{r['tokens']}x{r['in']}x{r['out']} ({r[f'measured_{policy}_speedup']:.2f}x measured, {r['predicted_speedup']:.2f}x predicted)"
            for r in measured if r[f"measured_{policy}_speedup"] < r["predicted_speedup"]]
    layers_text = "not measured for every converted shape" if out["layers_saving_s"] is None else f"{1e3 * out['layers_saving_s']:.2f} ms measured one layer at a time"
    out["text"] = (
        f"{policy} on {model}: the converted layers' forward and backward save {1e3 * out['predicted_saving_s']:.2f} ms a step by the roofline, "
        f"{layers_text}; the whole step saves {1e3 * out['step_saving_s']:.2f} ms "
        f"({rows['bf16-mixed']['step_s'] / rows[policy]['step_s']:.2f}x). "
        + (f"Slower than predicted: {'; '.join(slow)}." if slow else "No converted shape measured slower than predicted.")
    )
    return out


# ---------------------------------------------------------------------------------------------- output


def _f(value: Any, pattern: str, scale: float = 1.0) -> str:
    return pattern.format(value * scale) if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"


RUN_HEAD = (
    "| model | policy | status | step (ms) | tokens/s | vs bf16-mixed | loss (last steps) | gap to bf16 ± 2 SE | gap, first steps (then) | "
    "peak memory (GiB) | fp8 layers | note |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
)
LAYER_HEAD = (
    "| tokens x in x out | layers | predicted bf16 / fp8 (ms) | predicted speed-up | filter | measured bf16 (ms) | "
    "measured tensorwise (ms) | measured speed-up tw / rw | tensorwise, measured | filter agrees |\n|---|---:|---:|---:|---|---:|---:|---:|---|---|"
)


def run_line(r: dict[str, Any]) -> str:
    fp8 = f"{r['fp8_layers']} / {r['linear_layers']}" if "linear_layers" in r else "—"
    return (
        f"| {r['model']} | {r['policy']} | {r['status']} | {_f(r.get('step_s'), '{:.2f}', 1e3)} | {_f(r.get('tokens_per_s'), '{:,.0f}')} | "
        f"{_f(r.get('speedup_vs_bf16'), '{:.2f}x')} | {_f(r.get('loss'), '{:.4f}')} | {_gap(r)} | {_f(r.get('loss_diff_early'), '{:+.4f}')}"
        f"{' (' + r['gap_trend'] + ')' if 'gap_trend' in r else ''} | "
        f"{_f(r.get('peak_memory_bytes'), '{:.1f}', 2**-30)} | {fp8} | {r['reason'].replace('|', '/')} |"
    )


def _gap(r: dict[str, Any]) -> str:
    if "loss_diff_vs_bf16" not in r:
        return "—"
    noise = "" if not math.isfinite(r["loss_diff_se"]) else f" ± {2 * r['loss_diff_se']:.4f}"
    within = {True: " (within noise)", False: "", None: ""}[r["gap_within_noise"]]
    return f"{r['loss_diff_vs_bf16']:+.4f}{noise}{within}"


def layer_line(r: dict[str, Any]) -> str:
    tw, rw = r.get("measured_fp8-tensorwise_speedup"), r.get("measured_fp8-rowwise_speedup")
    speedups = f"{_f(tw, '{:.2f}x')} / {_f(rw, '{:.2f}x') if 'fp8-rowwise_skipped' not in r else 'skipped'}"
    measured = "—" if "measured_pays" not in r else ("pays" if r["measured_pays"] else "does not pay")
    agrees = "—" if "agrees" not in r else ("yes" if r["agrees"] else "**no**")
    if r["status"] != "ok":
        measured = r["reason"]
    return (
        f"| {r['tokens']} x {r['in']} x {r['out']} | {r['layers']} | {_f(r['predicted_bf16_s'], '{:.3g}', 1e3)} / {_f(r['predicted_fp8_s'], '{:.3g}', 1e3)} | "
        f"{r['predicted_speedup']:.2f}x | {'converts' if r['filter_converts'] else 'keeps bf16'} | {_f(r.get('measured_bf16_s'), '{:.3f}', 1e3)} | "
        f"{_f(r.get('measured_fp8-tensorwise_s'), '{:.3f}', 1e3)} | {speedups} | {measured} | {agrees} |"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=30, help="timed training steps per policy (after the warm-up); the loss gap is read over the last third")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (the first compiles)")
    p.add_argument("--reps", type=int, default=20, help="timed forward+backward calls per layer shape and variant")
    p.add_argument("--backend", default=None, help="torch.compile backend (default: inductor; 'none': no compile, the smoke's default)")
    add_time_limit(p)
    p.add_argument("--smoke", action="store_true", help="tiny models on the CPU in torchao's emulation: checks the script works")
    p.add_argument("--json", help="also write the run's facts and every row here")
    args = p.parse_args(argv)
    args.emulate = args.smoke
    if args.smoke:
        vars(args).update(SMOKE)
        args.backend = args.backend or "none"
        if args.device == "cuda" and not torch.cuda.is_available():
            args.device = "cpu"
        if args.device == "cpu":
            torch.set_num_threads(1)  # tensors of a few KiB: more threads only contend on a shared machine
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    missing = missing_torchao()
    if missing:
        print(f"fp8_training: {missing}.\n{BRING_TORCHAO}", file=sys.stderr)
        return 3
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"fp8_training: --device {args.device}: torch {torch.__version__} sees no CUDA device; on a CPU run --smoke.", file=sys.stderr)
        return 2
    from importlib.metadata import version

    where = cpu_name() if device.type == "cpu" else torch.cuda.get_device_name(device)
    command = f"python benchmarks/fp8_training.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    print(f"# fp8 training  {date.today()}  torch {torch.__version__}  torchao {version('torchao')}  device {device} ({where})")
    print(f"# command: {command}")
    if args.smoke:
        print("# smoke: tiny models, torchao's fp8 emulation: the timings mean nothing")
    compiled = "no compile" if args.backend == "none" else f"Engine(compile='regional'), backend {args.backend or 'inductor'}"
    print(f"# end to end: {compiled}, AdamW, {args.warmup} warm-up + {args.steps} timed steps per policy, same weights and batches")
    print(f"# per layer: {'' if args.backend == 'none' else 'compiled '}nn.Linear under bf16 autocast vs Float8Linear, forward + backward, median of {args.reps}")
    deadline = Deadline(args.time_limit)
    # The per-layer table first: it is what says which layers pay, and each shape is a short measurement. Its own
    # share of the limit keeps its compiles (one per shape and recipe) from starving the end-to-end runs.
    layer_deadline = Deadline(None if args.time_limit is None else LAYER_SHARE * args.time_limit)
    printer = Printer()
    emit_run, emit_layer = printer.table(RUN_HEAD, run_line), printer.table(LAYER_HEAD, layer_line)
    first, second = SMOKE_MODELS if args.smoke else FULL_MODELS
    # Then the 1B model end to end (where fp8 should pay), then gpt large (where the filter converts nothing).
    layers = measure_layers((first, second), args, device, layer_deadline, emit_layer)
    runs = run_model(first, args, device, deadline, emit_run)
    runs += run_model(second, args, device, deadline, emit_run)
    print("\n## End to end\n")
    print(RUN_HEAD, *map(run_line, runs), sep="\n")
    print("\n## Per Linear shape: the roofline's prediction against the measurement\n")
    print(LAYER_HEAD, *map(layer_line, layers), sep="\n")
    print("\n## Where the end-to-end gain goes\n")
    accounting = [gain_accounting(first.name, label, runs, layers) for label in ("fp8-tensorwise", "fp8-rowwise")]
    print(*(a["text"] for a in accounting), sep="\n\n")
    failed = [r for r in runs + layers if r["status"] == "failed"]
    if args.json:
        facts = {"device": str(device), "device_name": where, "torch": torch.__version__, "torchao": version("torchao"),
                 "command": command, "smoke": args.smoke, "backend": args.backend or "inductor", "steps": args.steps, "warmup": args.warmup, "reps": args.reps}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**facts, "runs": runs, "layers": layers, "accounting": accounting}, f, indent=1)
    if failed:
        print(f"\nfp8_training: {len(failed)} row(s) failed (their errors are above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
