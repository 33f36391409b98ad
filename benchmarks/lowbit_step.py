"""The optimizer step alone under the 16-bit-weight remedies: bf16-true-kahan and bf16-true-sr against the masters'.

``bf16-true-kahan`` (optimi, ``kahan_sum=True``) and ``bf16-true-sr`` (torchao's ``_AdamW``,
``bf16_stochastic_round=True``) exist to give the masters' accuracy for less memory; their step must not cost more
than ``bf16-true-masters``'. This script times ``engine.step()`` alone - unscale-free bf16 gradients, clipping at the
workload's norm, the update, zero_grad - with the parameters of a built-in workload's model (gpt by default, its
AdamW settings), each engine given the same saved gradients before every timed step. Engines take turns in
interleaved rounds; medians are compared side by side.

Rows (each an ``ampkit.Engine`` over its own copy of the model), by the name ``--rows`` takes (a policy's name takes
all its rows):

- ``bf16-true-masters`` and ``bf16-true-masters:fused``: fp32 masters, unfused (foreach copies, fused AdamW on the
  masters) and as one compiled region (``fused_step=True``). The remedies are measured against both.
- ``bf16-true-sr:torchao-step``: torchao's own step, one compiled call per parameter (``fused_step=False``): before.
  ``bf16-true-sr:region``: ampkit's compiled region over every parameter (the default now).
- ``bf16-true-kahan:foreach``: the path ampkit chose on the CPU before (it forced ``foreach=True`` off CUDA).
  ``bf16-true-kahan:default``: what it runs now: the for-loop on the CPU, optimi's Triton kernels on CUDA.
- ``bf16-true``: torch's fused AdamW on the bf16 weights: the floor, what no remedy can beat.

The rows are measured a group at a time, so that a run cut at its limit keeps what it measured: first the masters'
step (and the fused one when chosen), then each remedy's rows, then bf16-true's; the masters' steps are timed beside
every group, in its interleaved rounds, and each group's rows are printed the moment its rounds are done, before
the next group's engines are built (and compiled).

Per row: median step time (CUDA events on a GPU, through :class:`ampkit.workloads._timing.StepTimer`), the host time of
the call (on a GPU, how long the CPU took to enqueue it: a host time near the step time means launch-bound), the
ratio to each masters' step, and the compile time of a compiled row (its first compiled step less a median step).
Control: the weights after the run against the row's twin (same gradients, same number of steps).

Per row: median step time over its rounds (CUDA events on a GPU, through :class:`ampkit.workloads._timing.StepTimer`), the
host time of the call (on a GPU, how long the CPU took to enqueue it: a host time near the step time means
launch-bound), the ratio to each masters' median step in the same rounds, and the compile time of a compiled row
(its first compiled step less a median step). Control: the weights after the run against the row's twin (the same
gradients, the same number of steps: twins are measured in the same group).

``--time-limit S`` stops starting new groups, engines or rounds after S seconds (the first round of a group's engines
always runs) and reports what was not started as skipped.

    python benchmarks/lowbit_step.py --sizes small
    python benchmarks/lowbit_step.py --sizes small --rows bf16-true-sr:region   # the masters' step and that row
    python benchmarks/lowbit_step.py --device cuda --sizes large --json lowbit_step.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import date
from typing import Any

import torch

import ampkit
from ampkit.bench._runner import to_device
from ampkit.policy._device import cpu_name
from ampkit.policy._lowbit_optimizers import (
    lowbit_twin,
    missing_library,
    quiet_library_logs,
)
from ampkit.workloads import get_workload
from ampkit.workloads._timing import StepTimer
from ampkit.workloads._workload import call_model, output_as_float
from measured_rows import Deadline, add_time_limit

DEFAULTS = {"sizes": None, "rounds": 6, "steps": 10, "warmup": 3, "backend": None}
SMOKE = {"sizes": "tiny", "rounds": 2, "steps": 2, "warmup": 2, "backend": "aot_eager"}
"""What ``--smoke`` runs unless told otherwise: seconds on a CPU, every row's code path (aot_eager: no C++
compilation; torchao's own step runs eagerly, as its per-shape inductor compiles would take longer than the rest of
the run). Timings mean nothing."""


class StepOnly:
    """One engine whose ``engine.step()`` is timed on gradients restored from a saved copy before each step."""

    def __init__(self, label: str, twin: str | None, policy: str, fused_step: Any, workload: Any, model: torch.nn.Module,
                 batch: Any, device: torch.device, optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer] | None = None,
                 eager: bool = False) -> None:
        self.label, self.twin, self.policy = label, twin, policy
        self.name = label  # its --rows name, set by run_size
        self.engine = ampkit.Engine(policy, clip_grad_norm=workload.clip_grad_norm, fused_step=fused_step)
        opt = optimizer(model) if optimizer is not None else workload.optimizer(model.parameters())
        with quiet_library_logs("torchao", "torch.utils._pytree"):
            self.model, self.opt = self.engine.setup(model, opt)
        self.eager = eager  # torchao's own step without its per-shape compiles (the smoke run only)
        with self.engine.autocast():
            loss = workload.loss_fn(output_as_float(call_model(self.model, batch[0])), batch[1])
        self.engine.backward(loss)
        self.params = [p for p in self.model.parameters() if p.grad is not None]
        self.grads = [p.grad.detach().clone() for p in self.params]  # optimi uses the gradients as scratch: restored each step
        self.timer = StepTimer(device)
        self.sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        self.times: list[float] = []
        self.host: list[float] = []
        self.first_compiled_s: float | None = None

    def step(self, timed: bool = True) -> float:
        """One step on the saved gradients; returns its host time (seconds)."""
        for p, g in zip(self.params, self.grads):
            p.grad = g.clone()
        with self._stance(), (self.timer.step() if timed else contextlib.nullcontext()):
            start = time.perf_counter()
            self.engine.step()
            host = time.perf_counter() - start
        if timed:
            self.host.append(host)
        return host

    def warm_up(self, steps: int) -> None:
        """The first step builds the optimizer state (unfused everywhere); the next compiles a compiled row."""
        self.step(timed=False)
        self.sync()
        start = time.perf_counter()
        self.step(timed=False)
        self.sync()
        if self.compiled_calls() > 0:
            self.first_compiled_s = time.perf_counter() - start
        for _ in range(max(0, steps - 2)):
            self.step(timed=False)
        self.sync()

    def flush(self) -> None:
        self.times.extend(self.timer.flush())

    def compiled_calls(self) -> int:
        region = self.engine.fused_step or self.engine.library_step
        return region.calls if region is not None else 0

    def weights(self) -> list[torch.Tensor]:
        return [p.detach() for p in self.model.parameters()]

    def _stance(self) -> contextlib.AbstractContextManager[Any]:
        return torch.compiler.set_stance("force_eager") if self.eager else contextlib.nullcontext()


def _kahan_foreach(workload: Any) -> Callable[[torch.nn.Module], torch.optim.Optimizer]:
    """ampkit's Kahan twin of the workload's optimizer, on optimi's foreach path (what ampkit ran off CUDA before)."""

    def build(model: torch.nn.Module) -> torch.optim.Optimizer:
        twin = lowbit_twin(workload.optimizer(model.parameters()), "kahan")
        for group in twin.param_groups:
            group["foreach"], group["triton"] = True, False
        return twin

    return build


ROW_NAMES = ("bf16-true-masters", "bf16-true-masters:fused", "bf16-true-sr:torchao-step", "bf16-true-sr:region",
             "bf16-true-kahan:foreach", "bf16-true-kahan:default", "bf16-true")
"""Every row's ``--rows`` name: no commas (a label's ``bf16-true-sr, one region`` split in two), a policy's rows
sharing its name before the colon."""
MASTERS, MASTERS_FUSED = "bf16-true-masters", "bf16-true-masters:fused"
REFERENCES = (MASTERS, MASTERS_FUSED)
"""The steps every other row is measured against: built first, and timed beside every group."""


def variants(device: torch.device, spec: Any, smoke: bool, only: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows in the order they are measured: the references (the masters' step, the fused one), then each remedy's
    before and now (most telling first, should the time limit cut the rest), then the floor. With ``only``: the
    masters' step, and the rows named there, by name or by their policy (the name before the colon)."""
    kahan_now = "optimi Triton" if device.type == "cuda" else "optimi for-loop"
    rows: list[dict[str, Any]] = [
        {"name": MASTERS, "label": "bf16-true-masters", "policy": "bf16-true-masters", "fused_step": False},
        {"name": MASTERS_FUSED, "label": "bf16-true-masters fused", "policy": "bf16-true-masters", "fused_step": spec, "twin": MASTERS},
    ]
    if missing_library("sr") is None:
        rows += [
            {"name": "bf16-true-sr:torchao-step", "label": "bf16-true-sr, torchao's step", "policy": "bf16-true-sr", "fused_step": False,
             "eager": smoke, "twin": "bf16-true-sr:region"},
            {"name": "bf16-true-sr:region", "label": "bf16-true-sr, one region", "policy": "bf16-true-sr", "fused_step": spec},
        ]
    if missing_library("kahan") is None:
        rows += [
            {"name": "bf16-true-kahan:foreach", "label": "bf16-true-kahan, optimi foreach", "policy": "bf16-true-kahan", "fused_step": None,
             "optimizer": "kahan-foreach", "twin": "bf16-true-kahan:default"},
            {"name": "bf16-true-kahan:default", "label": f"bf16-true-kahan, {kahan_now}", "policy": "bf16-true-kahan", "fused_step": None},
        ]
    rows.append({"name": "bf16-true", "label": "bf16-true", "policy": "bf16-true", "fused_step": None})
    if only:
        rows = [r for r in rows if r["name"] == MASTERS or r["name"] in only or r["name"].split(":")[0] in only]
    return rows


def groups(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The rows measured together: the references, then each policy's rows (a twin beside its row).

    >>> [[r["name"] for r in g] for g in groups(variants(torch.device("cpu"), True, False, ["bf16-true"]))]
    [['bf16-true-masters'], ['bf16-true']]
    """
    out: list[list[dict[str, Any]]] = []
    for r in rows:
        key = "references" if r["name"] in REFERENCES else r["name"].split(":")[0]
        if out and out[-1][0].get("_group") == key:
            out[-1].append(r | {"_group": key})
        else:
            out.append([r | {"_group": key}])
    return out


def _skipped(size: str, v: dict[str, Any], reason: str) -> dict[str, Any]:
    return {"size": size, "row": v["name"], "engine": v["label"], "status": "skipped", "reason": reason}


def run_size(workload_name: str, size: str, args: argparse.Namespace, device: torch.device, deadline: Deadline,
             emit: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Every row of one workload size, a group at a time: build (and compile) the group's engines, time them beside
    the references in interleaved rounds, emit the group's rows."""
    spec: Any = {"backend": args.backend} if args.backend else True
    late = deadline.passed()
    if late:
        rows = [_skipped(size, v, late) for v in variants(device, spec, args.smoke, args.only)]
        for row in rows:
            emit(row)
        return rows
    w = get_workload(workload_name, size=size)
    batch = to_device(w.train_batches[0], device, w.channels_last)
    base = w.model.to(device)
    params = sum(p.numel() for p in w.model.parameters())
    references: list[StepOnly] = []
    rows: list[dict[str, Any]] = []
    for group in groups(variants(device, spec, args.smoke, args.only)):
        built: list[StepOnly] = []
        skipped: list[dict[str, Any]] = []
        for v in group:
            late = deadline.passed()
            if late:
                skipped.append(_skipped(size, v, late))
                continue
            optimizer = _kahan_foreach(w) if v.get("optimizer") == "kahan-foreach" else None
            e = StepOnly(v["label"], v.get("twin"), v["policy"], v["fused_step"], w, copy.deepcopy(base), batch, device, optimizer, v.get("eager", False))
            e.name = v["name"]
            e.warm_up(args.warmup)
            built.append(e)
        is_references = group[0]["_group"] == "references"
        timed = built if is_references else [*references, *built]
        if built:
            marks = {id(e): (len(e.times), len(e.host)) for e in timed}
            for r in range(args.rounds):
                if r > 0 and deadline.passed():  # the first round of what was built always runs
                    break
                for e in timed if r % 2 == 0 else reversed(timed):
                    for _ in range(args.steps):
                        e.step()
                    e.flush()
            rounds = {id(e): (e.times[marks[id(e)][0]:], e.host[marks[id(e)][1]:]) for e in timed}
            group_rows = _rows(size, params, built, timed, rounds)
        else:
            group_rows = []
        if is_references:
            references = built
        for row in group_rows + skipped:
            emit(row)
        rows += group_rows + skipped
    return rows


def _rows(size: str, params: int, built: list[StepOnly], timed: list[StepOnly], rounds: dict[int, tuple[list[float], list[float]]]) -> list[dict[str, Any]]:
    """The rows of ``built``, each from the steps it took in these rounds, against the references' in the same rounds."""
    medians = {e.name: statistics.median(rounds[id(e)][0]) for e in timed}
    masters, fused = medians.get(MASTERS), medians.get(MASTERS_FUSED)
    by_name = {e.name: e for e in timed}
    rows = []
    for e in built:
        times, host = rounds[id(e)]
        m = medians[e.name]
        row: dict[str, Any] = {
            "size": size, "row": e.name, "engine": e.label, "status": "ok", "params": params, "tensors": len(e.params), "steps": len(times),
            "step_s": m, "host_s": statistics.median(host), "masters_s": masters, "vs_masters": m / masters if masters else None,
            "masters_fused_s": fused, "vs_masters_fused": m / fused if fused else None, "compiled_calls": e.compiled_calls(),
        }
        if e.first_compiled_s is not None:
            row["compile_s"] = max(0.0, e.first_compiled_s - m)
        twin = by_name.get(e.twin) if e.twin else None
        if twin is not None and len(twin.times) == len(e.times):
            row["control"] = _control(e, twin)
        rows.append(row)
    return rows


def _control(e: StepOnly, twin: StepOnly) -> dict[str, Any]:
    """How the row's weights differ from its twin's after the same steps on the same gradients."""
    a, b = e.weights(), twin.weights()
    differing = sum(int((x != y).sum()) for x, y in zip(a, b))
    total = sum(x.numel() for x in a)
    scale = max(float(y.float().abs().max()) for y in b)
    return {"twin": twin.name, "differing_share": differing / total, "max_abs_diff": max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b)),
            "weight_scale": scale, "stochastic": "sr" in e.policy}


HEAD = ("| size | row (--rows) | optimizer step | median | host | / masters (same rounds) | / masters fused (same rounds) | compile "
        "| weights vs twin |\n| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")


def line(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return f"| {r['size']} | {r['row']} | {r['engine']} | {r['status']}: {r['reason']} | | | | | |"
    ratio = lambda v: f"{v:.2f}x" if v is not None else "—"
    control = ""
    if "control" in r:
        c = r["control"]
        if c["stochastic"]:
            control = f"{c['differing_share']:.0%} differ (other random bits, by design)"
        else:
            control = f"{c['differing_share']:.1%} differ, max {c['max_abs_diff']:.2g}"
    compile_s = f"{r['compile_s']:.1f} s" if "compile_s" in r else ""
    return (f"| {r['size']} | {r['row']} | {r['engine']} | {r['step_s'] * 1e3:.2f} ms | {r['host_s'] * 1e3:.2f} ms | {ratio(r['vs_masters'])} | "
            f"{ratio(r['vs_masters_fused'])} | {compile_s} | {control} |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="gpt")
    p.add_argument("--sizes", default=None, help="comma-separated workload sizes (default: small on the CPU, large on CUDA)")
    p.add_argument("--backend", default=None, help="torch.compile backend of the compiled rows (default: inductor)")
    p.add_argument("--rounds", type=int, default=None, help=f"interleaved rounds (default {DEFAULTS['rounds']})")
    p.add_argument("--steps", type=int, default=None, help=f"timed steps per round per engine (default {DEFAULTS['steps']})")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"untimed steps per engine first, at least 2: the state, the compile (default {DEFAULTS['warmup']})")
    p.add_argument("--rows", default=None, help=f"rows to run, by name or by policy, comma-separated (the masters' step always runs): {', '.join(ROW_NAMES)}")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads; default: torch's)")
    add_time_limit(p)
    p.add_argument("--smoke", action="store_true", help=f"a tiny run that checks the script works: {SMOKE}")
    p.add_argument("--json", help="also write the run's facts and every row here")
    args = p.parse_args(argv)
    args.only = [r.strip() for r in args.rows.split(",") if r.strip()] if args.rows else None
    known = {*ROW_NAMES, *(name.split(":")[0] for name in ROW_NAMES)}
    unknown = [r for r in args.only or [] if r not in known]
    if unknown:
        p.error(f"--rows: no row named {', '.join(map(repr, unknown))}; name rows or policies, comma-separated: {', '.join(ROW_NAMES)} "
                "(e.g. --rows bf16-true-sr:region,bf16-true-kahan)")
    for name, value in (SMOKE if args.smoke else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"lowbit_step: --device {args.device}: torch {torch.__version__} sees no CUDA device; on a CPU run --smoke.", file=sys.stderr)
        return 2
    sizes = [s.strip() for s in (args.sizes or ("large" if device.type == "cuda" else "small")).split(",") if s.strip()]
    where = cpu_name() if device.type == "cpu" else torch.cuda.get_device_name(device)
    command = f"python benchmarks/lowbit_step.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    libraries = {name: _version(name) for name in ("torchao", "torch-optimi")}
    print(f"# lowbit optimizer step  {date.today()}  torch {torch.__version__}  {libraries}  device {device} ({where}), {torch.get_num_threads()} threads")
    print(f"# command: {command}")
    print(f"# {args.workload} {','.join(sizes)}; {args.warmup} warm-up steps, then {args.rounds} interleaved rounds of {args.steps} steps per engine; "
          f"compiled rows: {args.backend or 'inductor'}" + ("; smoke: the timings mean nothing" if args.smoke else ""))
    for name, lib in (("bf16-true-sr", "sr"), ("bf16-true-kahan", "kahan")):
        if missing_library(lib):  # type: ignore[arg-type]
            print(f"# {name}: no rows, it {missing_library(lib)}")  # type: ignore[arg-type]
    print(HEAD, flush=True)
    deadline = Deadline(args.time_limit)
    rows: list[dict[str, Any]] = []
    with _quiet():
        for size in sizes:
            rows += run_size(args.workload, size, args, device, deadline, lambda r: print(line(r), flush=True))
    if args.json:
        facts = {"device": str(device), "device_name": where, "torch": torch.__version__, **libraries, "command": command,
                 "workload": args.workload, "smoke": args.smoke, "backend": args.backend or "inductor", "rounds": args.rounds,
                 "steps": args.steps, "warmup": args.warmup, "threads": torch.get_num_threads()}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**facts, "rows": rows}, f, indent=1)
    return 0


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # The foreach row asks optimi for its deprecated path on purpose: its deprecation warning is no news here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Parameter `foreach` is deprecated", category=DeprecationWarning)
        yield


if __name__ == "__main__":
    raise SystemExit(main())
