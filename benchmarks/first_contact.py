"""What a fresh process pays before it measures anything: the first contact with each library, timed one by one.

Every step of the GPU suite is its own process, and each pays these once: importing torch, creating the CUDA
context, cuBLAS's handle and workspace (the first matmul of each dtype), cuDNN's handle (the first convolution,
forward and backward), and torch.compile's first compile (dynamo, inductor and, on a GPU, Triton's compiler
workers), then a second compile of another function (what a later compile in the same process costs). The suite's
step budgets count them: a step's budget is this fixed cost plus its own work. Each row is printed the moment it is
measured; on a CPU the CUDA rows say they do not apply.

    python benchmarks/first_contact.py --device cuda --json first_contact.json
    python benchmarks/first_contact.py --device cpu            # the CI smoke: the same rows on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_STARTED = time.perf_counter()
import torch  # here, not at the top: its import is the first row

IMPORT_S = time.perf_counter() - _STARTED

from measured_rows import Printer, attempt

HEAD = "| first contact | seconds | note |\n|---|---:|---|"


def _line(r: dict[str, Any]) -> str:
    seconds = f"{r['seconds']:.2f}" if r["status"] == "ok" else r["status"]
    return f"| {r['what']} | {seconds} | {r.get('reason', r.get('note', ''))} |"


def _timed(device: torch.device, work: Callable[[], object]) -> dict[str, Any]:
    start = time.perf_counter()
    work()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"seconds": time.perf_counter() - start}


def _matmul(device: torch.device, dtype: torch.dtype) -> Callable[[], object]:
    def run() -> object:
        a = torch.ones(256, 256, device=device, dtype=dtype)
        return a @ a

    return run


def _conv(device: torch.device) -> Callable[[], object]:
    def run() -> object:
        conv = torch.nn.Conv2d(8, 8, 3, padding=1, device=device)
        conv(torch.ones(2, 8, 16, 16, device=device)).sum().backward()
        return conv

    return run


def _compile(device: torch.device, scale: float) -> Callable[[], object]:
    def run() -> object:
        fn = torch.compile(lambda x: torch.nn.functional.gelu(x * scale) + x, dynamic=False)
        return fn(torch.ones(1024, device=device))

    return run


def measure(device: torch.device, emit: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Each first contact in order, emitted as measured; a CUDA-only row on the CPU says so."""
    cuda = device.type == "cuda"
    steps: list[tuple[str, Callable[[], object] | None, str]] = [
        ("CUDA context", (lambda: torch.cuda.init() or torch.empty(1, device=device)) if cuda else None, "torch.cuda.init and a first allocation"),
        ("first matmul, fp32", _matmul(device, torch.float32), "cuBLAS handle and workspace on a GPU"),
        ("first matmul, bf16", _matmul(device, torch.bfloat16), "cuBLASLt for 16-bit on a GPU"),
        ("first conv, forward + backward", _conv(device), "cuDNN handle on a GPU"),
        ("first torch.compile", _compile(device, 2.0), "dynamo, inductor, and Triton's compiler workers on a GPU"),
        ("second torch.compile", _compile(device, 3.0), "a later compile in the same process"),
    ]
    rows = [{"what": "import torch", "status": "ok", "seconds": IMPORT_S, "note": f"torch {torch.__version__}"}]
    emit(rows[0])
    for what, work, note in steps:
        row = {"what": what, "status": "n/a", "reason": "a CUDA-only cost"} if work is None else {"what": what, "note": note, **attempt(functools.partial(_timed, device, work), device)}
        rows.append(row)
        emit(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"first_contact: --device {args.device}: torch {torch.__version__} sees no CUDA device; use --device cpu.", file=sys.stderr)
        return 2
    print(f"# first contact  torch {torch.__version__}  device {device}")
    print(f"# command: python benchmarks/first_contact.py {' '.join(sys.argv[1:] if argv is None else argv)}", flush=True)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        rows = measure(device, Printer().table(HEAD, _line))
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "device": str(device), "rows": rows}, indent=1))
    return 0 if all(r["status"] != "failed" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
