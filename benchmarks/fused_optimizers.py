"""Fused optimizers under loss scaling: does each fused kernel skip an overflowed step exactly as its unfused twin?

For every fused optimizer torch offers on the device (Adam, AdamW, SGD with momentum, Adagrad; found by trying one
step, and listed as unsupported where the kernel is missing) and every parameter dtype its kernel accepts (fp32,
fp16, bf16), the fused optimizer and its unfused twin (``foreach=True``) train the same weights on the same
gradients through ``torch.amp.GradScaler``, with an inf in the gradients on the very first step and again
mid-run. Reported per row: steps each skipped, the largest |parameter difference| fused vs unfused, whether the
optimizer state (step counts, momentum / exp_avg / exp_avg_sq / sum) matches, and a verdict: match when both
skipped the same steps, the state matches and the largest parameter difference is a small fraction of the twin's
own movement (``/ movement``; a few ulps of the dtype). The same fused optimizer then runs through ampkit's
Engine (with its kernel guards) against the same twin, so the table shows where ampkit's path is right and torch's
fused kernel is not.

GradScaler refuses to unscale fp16 gradients for an unfused optimizer, and torch's CUDA unscale kernel has no
bfloat16: where GradScaler refuses, the twin unscales by hand (same reciprocal, same skip rule), and a fused row
torch cannot run says so.

    python benchmarks/fused_optimizers.py --device cpu --smoke     # seconds; CI runs it
    python benchmarks/fused_optimizers.py --device cuda --json fused.json

Mismatches are findings: the exit status is 0 with them, and non-zero only when a run crashes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import date
from typing import Any

import torch
from torch import nn

import ampkit

Make = Callable[..., torch.optim.Optimizer]

# Learning rates that move 16-bit weights by many ulps over the run, so rounding cannot pass for a real difference.
OPTIMIZERS: dict[str, Make] = {
    "Adam": lambda ps, **k: torch.optim.Adam(ps, lr=1e-2, **k),
    "AdamW": lambda ps, **k: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01, **k),
    "SGD momentum": lambda ps, **k: torch.optim.SGD(ps, lr=0.1, momentum=0.9, **k),
    "Adagrad": lambda ps, **k: torch.optim.Adagrad(ps, lr=0.1, **k),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ENGINE_POLICY = {torch.float32: "32-true", torch.float16: "16-true", torch.bfloat16: "bf16-true"}
# Two correct kernels differ by rounding (fused computes in fp32 and rounds once, foreach rounds per op): the largest
# difference, relative to the largest value it is a difference of, stays within a few ulps of the dtype.
REL_TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}
INIT_SCALE = 2.0**16  # GradScaler's default; growth is kept out of the run so a backoff means a skip
STEPS = 12


@dataclass
class Row:
    optimizer: str
    dtype: str
    verdict: str
    fused_skipped: int | None = None
    unfused_skipped: int | None = None
    max_dparam: float | None = None
    dparam_vs_movement: float | None = None
    state_match: str = ""
    ampkit_skipped: int | None = None
    ampkit_max_dparam: float | None = None
    ampkit_dparam_vs_movement: float | None = None
    ampkit_verdict: str = ""
    note: str = ""


def first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:160]


def fused_missing(make: Make, dtype: torch.dtype, device: torch.device) -> str | None:
    """Why torch has no fused kernel for this optimizer and dtype on ``device`` (one tried step), or None."""
    p = nn.Parameter(torch.zeros(8, dtype=dtype, device=device))
    p.grad = torch.ones(8, dtype=dtype, device=device)
    try:
        make([p], fused=True).step()
    except (RuntimeError, NotImplementedError, ValueError) as error:
        return first_line(error)
    return None


def make_data(sizes: list[int], device: torch.device) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Initial weights and per-step unscaled gradients, drawn on the CPU (the same on every device)."""
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, generator=gen) * 0.1 for n in sizes]  # a network's init scale
    grads = []
    for step in range(STEPS):
        # Bounded away from 0: squares of tiny gradients underflow 16-bit optimizer state in foreach's arithmetic
        # and would make two correct kernels differ for reasons of their own.
        step_grads = [(torch.rand(n, generator=gen) + 0.5) * torch.randn(n, generator=gen).sign() * 0.1 for n in sizes]
        if step in (0, STEPS // 2):
            step_grads[0][len(step_grads[0]) // 3] = float("inf")  # an overflow: on the very first step, and mid-run
        grads.append(step_grads)
    return [w.to(device) for w in weights], [[g.to(device) for g in gs] for gs in grads]


class _Params(nn.Module):
    """The parameters as a model whose loss has the given gradients: d(sum(p * g))/dp = g."""

    def __init__(self, weights: list[torch.Tensor], dtype: torch.dtype) -> None:
        super().__init__()
        self.ps = nn.ParameterList(nn.Parameter(w.to(dtype).clone()) for w in weights)

    def loss(self, grads: list[torch.Tensor]) -> torch.Tensor:
        # In fp32, so the scaled loss's gradient reaches each parameter as scale * g rounded once to its dtype,
        # exactly what GradScaler's scale(g) gives the other runs.
        return sum((p.float() * g.float()).sum() for p, g in zip(self.ps, grads))  # type: ignore[return-value]


def run_torch(make: Make, kernel: dict[str, bool], weights, grads, dtype: torch.dtype, device: torch.device) -> tuple[list[torch.Tensor], torch.optim.Optimizer, int, str]:
    """Train through GradScaler; returns parameters, optimizer, steps skipped and a note. Raises where torch refuses."""
    params = [nn.Parameter(w.to(dtype).clone()) for w in weights]
    opt = make(params, **kernel)
    scaler = torch.amp.GradScaler(device.type, init_scale=INIT_SCALE, growth_interval=10 * STEPS)
    skipped, note = 0, ""
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = scaler.scale(g.to(dtype))
        before = scaler.get_scale()
        try:
            scaler.step(opt)
            scaler.update()
        except (ValueError, NotImplementedError) as error:
            if kernel.get("fused"):
                raise
            # The twin only: GradScaler.unscale_ refuses fp16 gradients, and CUDA's kernel bf16 ones.
            note = f"twin unscaled by hand (GradScaler: {first_line(error)})"
            return (*_hand_twin(make, weights, grads, dtype), note)
        skipped += scaler.get_scale() < before
    return params, opt, skipped, note


def _hand_twin(make: Make, weights, grads, dtype: torch.dtype) -> tuple[list[torch.Tensor], torch.optim.Optimizer, int]:
    """GradScaler's rules by hand: unscale by the fp32 reciprocal of the scale, skip and halve on a non-finite grad."""
    params = [nn.Parameter(w.to(dtype).clone()) for w in weights]
    opt = make(params, foreach=True)
    scale, skipped = INIT_SCALE, 0
    for step_grads in grads:
        scaled = [g.to(dtype) * scale for g in step_grads]
        if all(bool(torch.isfinite(s).all()) for s in scaled):
            inv = torch.tensor(scale, dtype=torch.float64).reciprocal().float().item()
            for p, s in zip(params, scaled):
                p.grad = (s.float() * inv).to(dtype)
            opt.step()
        else:
            skipped, scale = skipped + 1, scale * 0.5
    return params, opt, skipped


def run_engine(make: Make, weights, grads, dtype: torch.dtype, device: torch.device) -> tuple[list[torch.Tensor], torch.optim.Optimizer, int]:
    model = _Params(weights, dtype)
    engine = ampkit.Engine(ENGINE_POLICY[dtype], scaler=ampkit.ScalerConfig(init_scale=INIT_SCALE, growth_interval=10 * STEPS))
    model, opt = engine.setup(model, make(model.parameters(), fused=True))
    for step_grads in grads:
        engine.backward(model.loss([g.to(dtype) for g in step_grads]))
        engine.step()
    return list(model.parameters()), opt, engine.skipped_steps


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Largest |a - b| over every element; nan if any difference is (Python's max would drop a nan it meets second)."""
    diffs = [float((x.detach().double() - y.detach().double()).abs().max()) for x, y in zip(a, b)]
    return float("nan") if any(math.isnan(d) for d in diffs) else max(diffs)


def relative(diff: float, reference: float) -> float:
    return diff / reference if reference > 0 else (0.0 if diff == 0 else float("inf"))


def state_match(opt_a: torch.optim.Optimizer, pa: list[torch.Tensor], opt_b: torch.optim.Optimizer, pb: list[torch.Tensor], dtype: torch.dtype) -> str:
    """'yes', or which state differs: step counts exactly, buffers within the dtype's relative tolerance."""
    for x, y in zip(pa, pb):
        sa, sb = opt_a.state.get(x, {}), opt_b.state.get(y, {})
        if sa.keys() != sb.keys():
            return f"no (keys {sorted(sa)} vs {sorted(sb)})"
        for key in sa:
            va, vb = torch.as_tensor(sa[key]).double().cpu(), torch.as_tensor(sb[key]).double().cpu()
            if key == "step":
                if not torch.equal(va, vb):
                    return f"no (step {va.item():g} vs {vb.item():g})"
            elif not relative(float((va - vb).abs().max()), float(vb.abs().max())) <= REL_TOL[dtype]:
                return f"no ({key})"
    return "yes"


def compare(params, opt, skipped: int, twin, twin_opt, twin_skipped: int, weights, dtype) -> tuple[float, float, str, bool]:
    """Max |dparam| against the twin, that over the twin's own movement, state match, and whether all agree."""
    diff = max_abs_diff(params, twin)
    rel = relative(diff, max_abs_diff(twin, [w.to(dtype) for w in weights]))
    state = state_match(opt, params, twin_opt, twin, dtype)
    return diff, rel, state, skipped == twin_skipped and rel <= REL_TOL[dtype] and state == "yes"


def one_row(name: str, dtype_name: str, weights, grads, device: torch.device) -> Row:
    make, dtype = OPTIMIZERS[name], DTYPES[dtype_name]
    missing = fused_missing(make, dtype, device)
    if missing is not None:
        return Row(name, dtype_name, "unsupported", note=f"no fused kernel: {missing}")
    twin, twin_opt, twin_skipped, note = run_torch(make, {"foreach": True}, weights, grads, dtype, device)
    row = Row(name, dtype_name, "", unfused_skipped=twin_skipped, note=note)
    try:
        fused, fused_opt, row.fused_skipped, _ = run_torch(make, {"fused": True}, weights, grads, dtype, device)
    except (ValueError, NotImplementedError, RuntimeError) as error:
        row.verdict = "torch refuses"
        row.note = "; ".join(filter(None, [row.note, f"GradScaler with the fused kernel: {first_line(error)}"]))
    else:
        row.max_dparam, row.dparam_vs_movement, row.state_match, ok = compare(fused, fused_opt, row.fused_skipped, twin, twin_opt, twin_skipped, weights, dtype)
        row.verdict = "match" if ok else "MISMATCH"
    ours, ours_opt, row.ampkit_skipped = run_engine(make, weights, grads, dtype, device)
    row.ampkit_max_dparam, row.ampkit_dparam_vs_movement, state, ok = compare(ours, ours_opt, row.ampkit_skipped, twin, twin_opt, twin_skipped, weights, dtype)
    row.ampkit_verdict = "match" if ok else f"MISMATCH (state match: {state})"
    return row


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def table(rows: list[Row]) -> str:
    head = [
        "optimizer", "params", "fused skipped", "unfused skipped", "max abs dparam fused vs unfused", "/ movement",
        "state match", "torch fused", "ampkit skipped", "max abs dparam ampkit vs unfused", "/ movement", "ampkit Engine", "note",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for r in rows:
        cells = [
            r.optimizer, r.dtype, r.fused_skipped, r.unfused_skipped, r.max_dparam, r.dparam_vs_movement, r.state_match, r.verdict,
            r.ampkit_skipped, r.ampkit_max_dparam, r.ampkit_dparam_vs_movement, r.ampkit_verdict, r.note,
        ]  # fmt: skip
        lines.append("| " + " | ".join(fmt(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu, cuda or cuda:N (default: cuda if present)")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--smoke", action="store_true", help="small parameters (seconds on a CPU; what CI runs)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    # Several parameters of 1e5-1e6 elements, and odd sizes that leave a scalar tail after the vector blocks.
    sizes = [4099, 1600, 257] if args.smoke else [1_000_000, 512 * 512, 100_003, 4099]
    weights, grads = make_data(sizes, device)
    start, threads = time.perf_counter(), torch.get_num_threads()
    if args.smoke and device.type == "cpu":
        torch.set_num_threads(1)  # tiny tensors: more threads only contend with each other on a busy machine
    rows, crashed = [], False
    try:
        for name in OPTIMIZERS:
            for dtype_name in DTYPES:
                try:
                    rows.append(one_row(name, dtype_name, weights, grads, device))
                except Exception as error:  # noqa: BLE001 - a crash of ours, not a finding: reported in the row and the exit status
                    crashed = True
                    rows.append(Row(name, dtype_name, "ERROR", note=first_line(error)))
    finally:
        torch.set_num_threads(threads)
    print(f"# fused optimizers under GradScaler  {date.today()}  torch {torch.__version__}  device {device}")
    print(f"# command: python benchmarks/fused_optimizers.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"# parameter sizes {sizes}, {STEPS} steps, inf gradients on steps 0 and {STEPS // 2}, init scale {INIT_SCALE:g}; {time.perf_counter() - start:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "torch": torch.__version__, "sizes": sizes, "rows": [asdict(r) for r in rows]}, f, indent=1)
    print(table(rows))
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
