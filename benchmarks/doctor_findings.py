"""What ``ampkit doctor`` finds on every built-in workload: the classic fp16 gradient-underflow figure and more.

For each workload, :func:`ampkit.numerics.diagnose` runs its fp32 reference steps and then tailors ``16-mixed``
(``--precision``), so the fp16 figures are shown even on a CPU where the doctor itself would pick bf16. Printed
per workload: the largest gradient, the recommended loss scale, the share of gradient values (weight gradients
and activation gradients together) below fp16's 2^-24 without scaling and at that scale, the share left
subnormal, and one step under the policy against fp32 (lowest module cosine, and the largest ratio of a
module's 16-bit gradient error to its fp32 sampling noise: below 1 means the rounding is smaller than the
noise SGD already lives with). Then the same step under ``bf16-mixed`` without tailoring, for comparison, and
the doctor's own run time.

    python benchmarks/doctor_findings.py                          # CPU, size small, every workload
    python benchmarks/doctor_findings.py --size tiny --workloads gpt,digits
    python benchmarks/doctor_findings.py --device cuda --size large --workloads gpt
    python benchmarks/doctor_findings.py --smoke --json rows.json   # tiny gpt, 1 step: checks the script runs

On a GPU without bf16 (compute capability below 8.0) the bf16-mixed column says why it was not run. ``--json``
writes the run's facts and the rows (non-finite figures as null); each row of the Markdown table is printed when
it is measured. ``--time-limit S``: the bf16-mixed comparison and workloads not started by then are reported skipped.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from datetime import date
from typing import Any

import torch

from ampkit.bench._format import fmt_share
from ampkit.bench._runner import to_device
from ampkit.numerics import diagnose
from ampkit.policy import get_policy
from ampkit.policy._device import cpu_name
from ampkit.workloads import get_workload, workload_names
from measured_rows import Deadline, Printer, add_time_limit, attempt

SMOKE = {"size": "tiny", "workloads": "gpt", "steps": 1}
"""What ``--smoke`` runs: seconds on a CPU, every code path of the script."""


def worst_ratio(comparison: dict[str, Any]) -> float:
    ratios = [m["rel_error"] / m["noise"] for m in comparison["modules"].values() if m.get("noise") and m["rel_error"] is not None]
    return max(ratios, default=float("nan"))


def lowest_cosine(comparison: dict[str, Any]) -> float:
    return min((m["cosine"] for m in comparison["modules"].values() if m["cosine"] is not None), default=float("nan"))


def one(name: str, size: str, device: torch.device, steps: int, precision: str, deadline: Deadline | None = None) -> dict[str, Any]:
    """One workload's row: the doctor tailoring ``precision`` (printed as a comment the moment it ends), then the
    same step under bf16-mixed, unless the deadline has passed by then."""
    w = get_workload(name, size=size)
    batches = [to_device(b, device, w.channels_last) for b in w.train_batches[: steps + 1]]
    model = w.model.to(device)
    if w.channels_last:
        model = model.to(memory_format=torch.channels_last)
    start = time.perf_counter()
    fp16 = diagnose(model, batches, w.loss_fn, steps=steps, target=precision, optimizer=w.optimizer).to_dict()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    rec = next(c for c in fp16["comparisons"] if c["label"] == "recommended")
    default = next(c for c in fp16["comparisons"] if c["label"] == "default")
    print(f"# {name} {precision}: diagnosed in {seconds:.1f} s; largest gradient {fp16['gradient_max_abs']:.3g}, "
          f"scale 2^{fp16['loss_scale_log2']}, keep fp32: {', '.join(fp16['keep_fp32']) or 'nothing'}", flush=True)
    bf16_support = get_policy("bf16-mixed").support(device)
    late = deadline.passed() if deadline is not None else None
    if late:
        bf16_row = {"bf16_cos": math.nan, "bf16_ratio": math.nan, "bf16_diverging": [], "bf16_skipped": late}
    elif bf16_support.supported:  # a GPU below sm80 has no bf16: the column says so instead of failing the run
        bf16 = diagnose(model, batches, w.loss_fn, steps=steps, target="bf16-mixed", optimizer=w.optimizer).to_dict()
        bf = next(c for c in bf16["comparisons"] if c["label"] == "default")
        bf16_row = {"bf16_cos": lowest_cosine(bf), "bf16_ratio": worst_ratio(bf), "bf16_diverging": bf["diverging"], "bf16_skipped": None}
    else:
        bf16_row = {"bf16_cos": math.nan, "bf16_ratio": math.nan, "bf16_diverging": [], "bf16_skipped": bf16_support.reason}
    k = fp16["loss_scale_log2"]
    return {
        "workload": name, "status": "ok", "description": w.description, "seconds": seconds, "max_grad": fp16["gradient_max_abs"], "scale_log2": k,
        "under_unscaled": fp16["underflow_share_unscaled"], "under_scaled": fp16["underflow_share_scaled"],
        "weights_unscaled": fp16["gradient_underflow"]["weights"]["unscaled"], "acts_unscaled": fp16["gradient_underflow"]["activations"]["unscaled"],
        "keep_fp32": fp16["keep_fp32"],
        "fp16_default_diverging": default["diverging"], "fp16_cos": lowest_cosine(rec), "fp16_ratio": worst_ratio(rec),
        "fp16_diverging": rec["diverging"], **bf16_row,
    }


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, so the JSON file is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # digits-aug is digits behind a slow DataLoader (the profile's workload): the same model, nothing new here.
    p.add_argument("--workloads", "--workload", default=",".join(n for n in workload_names() if n != "digits-aug"))
    p.add_argument("--size", default="small")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--precision", default="16-mixed")
    p.add_argument("--device", default="cpu")
    p.add_argument("--smoke", action="store_true", help=f"a tiny run that checks the script works: {SMOKE}")
    p.add_argument("--json", help="also write the run's facts and the rows here")
    add_time_limit(p)
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    where = cpu_name() if device.type == "cpu" else torch.cuda.get_device_name(device)
    command = f"python benchmarks/doctor_findings.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    print(f"# doctor findings  {date.today()}  torch {torch.__version__}  device {device} ({where}), {torch.get_num_threads()} threads")
    print(f"# command: {command}")
    print(f"# size {args.size}, {args.steps} fp32 reference steps; fp16 figures for {args.precision}; gradients = weight + activation gradients")
    deadline = Deadline(args.time_limit)
    emit = Printer().table(HEAD, row_line)
    rows = []
    for name in (n.strip() for n in args.workloads.split(",") if n.strip()):
        late = deadline.passed()
        row = {"workload": name, "status": "skipped", "reason": late} if late else attempt(functools.partial(one, name, args.size, device, args.steps, args.precision, deadline), device)
        row.setdefault("workload", name)
        rows.append(row)
        emit(row)
    if args.json:
        facts = {"device": str(device), "device_name": where, "torch": torch.__version__, "command": command, "size": args.size,
                 "steps": args.steps, "precision": args.precision}  # fmt: skip
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(finite_or_none({**facts, "rows": rows}), f, indent=1, allow_nan=False)
    return 0 if all(r["status"] != "failed" for r in rows) else 1


HEAD = (
    "| workload | max grad | scale | < 2^-24 unscaled (weights / activations) | < 2^-24 at scale | fp16 as it comes (2^16) "
    "| fp16 tailored: min cos, max err/noise | bf16-mixed: min cos, max err/noise | doctor time |\n"
    "| --- | ---: | ---: | ---: | ---: | --- | --- | --- | ---: |"
)


def row_line(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return f"| {r['workload']} | {r['status']}: {r['reason']} | | | | | | | |"
    default = "diverges: " + ", ".join(r["fp16_default_diverging"]) if r["fp16_default_diverging"] else "agrees"
    bf16 = f"{r['bf16_cos']:.5f}, {r['bf16_ratio']:.3f}" if r["bf16_skipped"] is None else f"not run: {r['bf16_skipped']}"
    return (
        f"| {r['workload']} | {r['max_grad']:.3g} | 2^{r['scale_log2']} | {fmt_share(r['under_unscaled'])} "
        f"({fmt_share(r['weights_unscaled'])} / {fmt_share(r['acts_unscaled'])}) | {fmt_share(r['under_scaled'])} | {default} "
        f"| {r['fp16_cos']:.5f}, {r['fp16_ratio']:.3f} | {bf16} | {r['seconds']:.1f} s |"
    )


if __name__ == "__main__":
    raise SystemExit(main())
