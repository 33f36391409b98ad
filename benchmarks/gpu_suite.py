"""GPU proof in one command: the CUDA test pass, then the measurements a GPU user asks for, in one folder.

    python benchmarks/gpu_suite.py --out benchmarks/results/h100-2026-11-24      # on a GPU machine, within 9 minutes
    python benchmarks/gpu_suite.py --device cpu --smoke --out /tmp/suite          # CI: every step, tiny, < 1 minute
    python benchmarks/gpu_suite.py --out DIR --only tests,bench                   # some steps (``--list`` names them)

Each step is its own process (``python -m pytest``, ``python -m ampkit bench``, ``python benchmarks/<script>.py``) with
a time limit, run from this checkout's ``src`` (nothing is installed; the machine is used as it is). Packages the
machine lacks travel as wheels in ``.whl/`` at the repository root (torchao for the fp8 step): the suite installs
them, without the network or dependencies, into a temporary folder on the steps' ``PYTHONPATH``. A step that
fails or runs out of time is recorded and the suite goes on. The folder gets ``env.json`` (device, driver, torch,
CUDA, cuDNN and Triton versions, the commit), one ``<step>.log`` per step (the exact command first, then its raw
output), the JSON each benchmark writes, the test pass's failures as they were reported (``tests-failures.txt``)
and its junit XML, the bench's own results folder, and ``summary.md``: the environment, a table of steps (status,
seconds, command) and each step's figures. The suite exits 1 when a step failed or timed
out, so a wrapper knows; DEVELOPERS.md says how to run it on a lent GPU and where its folder is committed.

Nothing here asserts GPU results: it records them. The CPU smoke mode only proves every step still starts, runs
and reports, so the suite does not rot between GPU windows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
WHEELS = REPO / ".whl"  # packages the GPU machine lacks, carried as wheels (ignored by git; DEVELOPERS.md)

# Within 9 minutes on an H100/H200: the run command's timeout is 600 s (this, the carried wheels' install, the
# tarball), and a GPU window of 15 minutes holds the machine's start (about 30 s on 2026-11-28), that call and a short
# rerun of what failed. The steps' budgets and the suite's own work (SUITE_OWN_S) add up to it.
DEFAULT_BUDGET_S = 540.0
SUITE_OWN_S = 8.0
"""What the suite does itself inside its budget: install the carried wheels, read the environment, write the summary."""

# What every step's process pays before its first row, measured on the H200 on 2026-11-28
# (benchmarks/results/h200-2026-11-28/): each step's budget includes them, and a script's own --time-limit, which
# runs from its start (torch imported), leaves the first out.
PROCESS_START_S = 5.0
"""import torch 3.3 s, the CUDA context 0.1 s, cuBLAS's and cuDNN's handles 0.8 s (01-first_contact.log), importing
ampkit: rounded up."""
FIRST_COMPILE_S = 11.6
"""A process's first torch.compile: gpt large's blocks, regional (11-compile.log); first_contact's own compile rows
were cut by its 12 s budget."""

TEST_TIMEOUT_S = 30
"""pytest-timeout's limit per test in the tests step: a hung test is reported as a failure, and a test running when
the session timeout passes ends within it (the step's margin holds it and the workers' exit)."""
FAILURE_LOG = "tests-failures.txt"
"""The tests step's failures, a line each, written the moment pytest reports them (benchmarks/failure_log.py)."""
JUNIT_XML = "tests-junit.xml"
"""The tests step's junit XML (every test's outcome), written when the pass ends."""


@dataclass(frozen=True)
class Step:
    """One command of the suite: what it measures, how to run it fully and in smoke mode, and its time limit."""

    name: str
    title: str
    full: tuple[str, ...]
    smoke: tuple[str, ...]
    budget_s: float
    smoke_budget_s: float = 60.0
    writes_json: bool = True  # the command takes --json PATH (added by the suite)
    tables: int = 1  # how many of the last Markdown tables of its output the summary shows
    # The command takes --time-limit S and reports the work it did not start as skipped: the suite passes the step's
    # limit less the process's start and this margin (its longest unit of work), so the step ends on its own with
    # every row it has.
    time_limit_margin_s: float | None = None
    compiles: bool = False  # the process runs torch.compile: its budget holds a first compile (FIRST_COMPILE_S)
    limit_flag: str = "--time-limit"  # how the command is told its own limit (ampkit tune: --budget)


@dataclass
class StepResult:
    step: Step
    command: list[str]
    status: str  # ok | failed | timeout | not run
    seconds: float = 0.0
    returncode: int | None = None
    log: Path | None = None
    figures: str = ""  # Markdown: the step's own table, or a digest
    notes: list[str] = field(default_factory=list)


def _script(name: str, *args: str) -> tuple[str, ...]:
    return (str(BENCHMARKS / name), *args)


# Budgets, re-derived from the second GPU run (H200, 2026-11-28, benchmarks/results/h200-2026-11-28/), where 11 of
# 14 steps were killed at their limits (the first run's, 2026-11-27, likewise). A step's budget is
#
#     PROCESS_START_S (5 s: import torch, the CUDA handles) + FIRST_COMPILE_S (11.6 s) if its process compiles
#     + its core rows' work, as that run's log times it (or its parts, where the step was cut before the rest),
#
# at least enough for its longest unit of work (its margin) to run; where that did not fit the 540 s, the step
# measures less (fewer rounds, rows, sizes), its most informative rows
# first. Every step with more than half a minute of its own work but the bench keeps to a time limit of its own:
# --time-limit is the suite's limit for the step less PROCESS_START_S (the script's clock starts after it) and the
# step's margin, its longest unit of work. Scripts report the work they did not start as skipped and print each row
# the moment it is measured; the test pass stops at its session timeout and its failures are on disk as they are
# reported (FAILURE_LOG); the bench is sized to fit (a cut would leave its interleaved policies unequal). A step
# that ends early leaves its time to the later ones (step_limit). Per step, from the 2026-11-28 logs:
#
#   first_contact   5 s of imports and handles, then two compiles (a first compile is 11.6 s at most): 20 s
#   tests           96% of the pass at about 75 s at -n 8: session timeout 86 s, 30 s per test, 35 s margin: 126 s
#   fused_optimizers  finished in 10 s (12 s on 2026-11-27): 13 s
#   bench           11 policies x 150 steps did not fit 130 s (bf16-true-sr's region compile alone > 80 s): the
#                   policies below, about 50 s of steps on the 2026-11-28 step times, 1 s each measuring, evals: 72 s
#   cnn             AMP bf16's first step (cuDNN search) 13.2 s; another search per dtype; 2 rounds of 6: 44 s
#   engine_overhead 5 of 6 rows in 21 s with 6 rounds of 15; 4 rounds: a 20 ms row about 4 s: 24 s
#   memory_prediction  a row 1.3-4.5 s (gpt's estimate 3.7 s): resnet and segment first (gpt was exact twice): 22 s
#   doctor          nothing of gpt large in 15 s: size small (the CPU's table, the same weights: a control): 16 s
#   numerics_sampler  no row in 9 s (gpt large's build, then 2 x 25 steps a round): a round after the first: 18 s
#   apex            finished in 12 s on both runs: 13 s
#   tune            in the compile step's place and budget (it measures that step's two forms on the same model and
#                   policy, against the same eager twin): gpt large built 2 s; the tune's facts (memory predicted for
#                   32-true and bf16-mixed, 3.7 s each: 07-memory_prediction.log's gpt estimate), its fp32 probe, the
#                   precision wave (13 steps each) and the guard (10 fp32 steps twice, at about 0.17 s a step) about
#                   20 s; a compile form 11.6 s (regional) to about 20 s (the whole model), which the tune tries only
#                   where its estimate fits what is left (before one is measured: 0.2 s a leaf module, at least 10 s:
#                   regional 10 s, the whole model's 88 modules 18 s; then scaled by the compiles measured): the time the steps before
#                   it save (the tests step's 35 s margin, most of the time) runs them; margin 12 s (the build, the
#                   files, the compile workers' exit): 46 s
#   optimizer_steps no row in 20 s: torchao's per-shape compiles, the sr region's, gpt small; kahan's if time allows: 50 s
#   profile         attribution and syncs in 15 s, the advice's A/B cut: 20 steps, 2 rounds: 32 s
#   fp8             1 of 10 shapes in its 18 s, the 1B bf16-mixed row (197 ms a step, 9 s compile), nothing more in
#                   44 s: 12 timed steps; last, it takes what earlier steps saved: 36 s (DEVELOPERS.md: run it
#                   alone after the suite when it skips rows)
#
# (The compile step, 46 s, measured compile='regional' and compile=True on gpt large bf16-mixed against eager; the tune
# step took its place and its budget: no step had time to spare for both.) The compile step's second form took 14 s, and no step had that to spare: the 2026-11-28 logs show a second or two
# at most (fused_optimizers 10 s of 13, apex 12 of 13), the other steps were cut. It comes from fp8, which is last so
# that it measures what the steps before it leave: its own 36 s still hold a process start, a first compile and its
# longest row (the 1B model's), and what the steps before it leave (the tests step's margin, 35 s for a test in
# flight at the session timeout, is most of that when the pass ends or stops as it should) runs its 1B row and more.
STEPS: tuple[Step, ...] = (
    Step(
        "first_contact",
        "What a fresh process pays first: import torch, the CUDA context, cuBLAS and cuDNN handles, the first compiles",
        _script("first_contact.py"),
        _script("first_contact.py"),
        budget_s=20,
        compiles=True,
    ),
    Step(
        "tests",
        "The test suite's device-generic tests on the device (pytest --device), under the GPU image's plugins",
        ("-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", "-rfE"),
        # The smoke pass runs a few device-generic files the way the GPU pass runs them (-n, the timeouts), under the
        # same plugins (the dev extra installs them): a clash between plugins fails CI, not a GPU window.
        ("-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "tests/test_device_option.py", "tests/unit/scaling/test_dynamic.py"),
        budget_s=126,
        smoke_budget_s=90,
        writes_json=False,
        time_limit_margin_s=TEST_TIMEOUT_S + 5,  # the test running at the session timeout, and the workers' exit
        compiles=True,
    ),
    Step(
        "fused_optimizers",
        "Each fused optimizer against its unfused twin through GradScaler, a skip on the first step included",
        _script("fused_optimizers.py"),
        _script("fused_optimizers.py", "--smoke"),
        budget_s=13,
    ),
    Step(
        "bench",
        "ampkit bench on the default workload (gpt large: GPT-2 small's shape, on a GPU), its steady policies: step time, tokens/s, MFU, memory, quality",
        # The default's 150 steps and rounds, so each row is the default run's, with progress lines in the log (the
        # bench prints them when its output is not a terminal). Not here: bf16-true-sr, whose compiled optimizer step
        # took more than 80 s to compile (twice per bench: its memory run and its timed run each build an engine), is
        # timed alone by optimizer_steps; tf32 (1.34x fp32 on 2026-11-27), 16-true (diverges), bf16-true-remainder
        # and 16-true-masters (within a few % of bf16-true-masters) for time. The README's command stays the default.
        ("-m", "ampkit", "bench", "--precision", "bf16-mixed,16-mixed,bf16-true,bf16-true-masters,bf16-true-kahan"),
        ("-m", "ampkit", "bench", "-w", "gpt", "--size", "tiny", "--precision", "bf16", "--steps", "4", "--warmup", "1", "--rounds", "1"),
        budget_s=72,
        writes_json=False,
    ),
    Step(
        "cnn",
        "ResNet-50, channels_last: AMP fp16/bf16 vs TF32 vs FP32 throughput, hand-written and through the Engine",
        _script("cnn_throughput.py", "--batch", "128", "--rounds", "2", "--steps", "6", "--warmup", "2"),
        _script("cnn_throughput.py", "--smoke"),
        budget_s=44,
        time_limit_margin_s=14,  # a contender's first step with cuDNN's search: 13.2 s for AMP bf16
    ),
    Step(
        "engine_overhead",
        "Engine vs the hand-written torch.amp loop (fused AdamW, clipping) at a 2 ms and a 20 ms step",
        _script("engine_overhead.py", "--step-ms", "2,20", "--calibrate-s", "3", "--rounds", "4", "--steps", "15"),
        _script("engine_overhead.py", "--smoke"),
        budget_s=24,
        time_limit_margin_s=5,  # a 20 ms row: 3 s of calibration at most, 120 timed steps
    ),
    Step(
        "memory_prediction",
        "Memory prediction error per policy against measure() and the allocator's peak, bench workloads",
        # The convolutional workloads first: never measured on a GPU; gpt's prediction was exact on both runs.
        _script("memory_prediction.py", "--size", "large", "--workloads", "resnet,segment,gpt", "--precision", "32-true,16-mixed,bf16-mixed"),
        _script("memory_prediction.py", "--smoke", "--workloads", "gpt"),
        budget_s=22,
        time_limit_margin_s=5,  # gpt's first row: estimate 3.7 s, measure 0.8 s
    ),
    Step(
        "doctor",
        "What ampkit doctor costs and finds on gpt, resnet and segment, size small (BENCHMARKS.md's CPU table: the same weights and data)",
        _script("doctor_findings.py", "--size", "small", "--workloads", "gpt,resnet,segment", "--steps", "3"),
        _script("doctor_findings.py", "--smoke"),
        budget_s=16,
        time_limit_margin_s=5,  # resnet's row: 7.8 s on the 2-core CPU
    ),
    Step(
        "numerics_sampler",
        "What the numerics sampler costs per step on gpt large",
        _script("numerics_sampler.py", "--workload", "gpt", "--size", "large", "--rounds", "4", "--every", "25"),
        _script("numerics_sampler.py", "--smoke"),
        budget_s=18,
        time_limit_margin_s=3,  # a round: 2 x 25 steps of about 35 ms, one sampled (the first round always runs)
    ),
    Step(
        "apex",
        "ampkit.apex O1/O2 (fp16 on CUDA) against the native loops they stand for",
        _script("apex_overhead.py", "--width", "2048", "--batch", "512"),
        _script("apex_overhead.py", "--smoke"),
        budget_s=13,  # 12 s on both runs
    ),
    Step(
        "tune",
        "ampkit tune on gpt large (GPT-2 small's shape, batch 8 x 1024): fp32, then bf16-mixed, then compile='regional' and compile=True on it, each against fp32 in interleaved rounds, the winner guarded against fp32: throughput, speed-up, MFU, compile time",
        # It holds what the compile step measured (regional and the whole model against their eager twin on gpt large,
        # bf16-mixed, compile time apart), now with a 95% interval, the accuracy guard and MFU, from the fp32 start the
        # issue's 40% MFU target is about. --budget is the step's limit less the process's start and its margin; the
        # tune starts no trial its estimate says would not end in time, and lists those it did not try.
        ("-m", "ampkit", "tune", "-w", "gpt", "--size", "large", "--precision", "bf16-mixed", "--stages", "precision,compile",
         "--guard-steps", "10", "--rounds", "3"),
        ("-m", "ampkit", "tune", "-w", "gpt", "--size", "tiny", "--precision", "bf16-mixed", "--stages", "precision",
         "--guard-steps", "4", "--rounds", "3", "--chunk", "2"),
        budget_s=46,
        writes_json=False,
        # gpt large's build before the tune's clock starts (2 s), an estimate's overrun, writing its files, and the exit
        # of inductor's compile workers (more than 7 s after compile_speed's JSON on 2026-11-28).
        time_limit_margin_s=12,
        compiles=True,
        limit_flag="--budget",
    ),
    Step(
        "optimizer_steps",
        "The optimizer step alone: bf16-true-sr through torchao's own step and through ampkit's one compiled region, against the masters' (then bf16-true-kahan's as time allows)",
        # gpt small: the sr region's compile grows with the tensors it steps over (gpt large's took more than 80 s in
        # the bench), and what made bf16-true-sr slow on the first run (a compiled call per parameter) shows at any
        # size. The rows are measured a group at a time, each group printed when measured (the masters', sr before
        # and now, then kahan's): the limit leaves room for the region's compile after torchao's per-shape ones.
        # The bench times the other policies' whole steps.
        _script("lowbit_step.py", "--sizes", "small", "--rows", "bf16-true-sr,bf16-true-kahan", "--rounds", "4", "--steps", "10"),
        _script("lowbit_step.py", "--smoke"),
        budget_s=50,
        time_limit_margin_s=18,  # the sr region's compile, then the rounds and the rows
        compiles=True,
    ),
    Step(
        "profile",
        "ampkit profile against controls on digits-aug: attribution, the advised DataLoader applied, a per-step .item(), device idle, overhead",
        _script("profile_advice.py", "--size", "small", "--steps", "10", "--ab-steps", "20", "--rounds", "2"),
        _script("profile_advice.py", "--smoke"),
        budget_s=32,
        time_limit_margin_s=18,  # the advice: the profile with its loader trials, then the A/B over fresh epochs
    ),
    Step(
        "fp8",
        "fp8 per Linear shape (predicted vs measured), then bf16-mixed vs fp8-tensorwise/-rowwise on a 1B GPT and gpt large",
        _script("fp8_training.py", "--steps", "12", "--warmup", "2", "--reps", "10"),
        _script("fp8_training.py", "--smoke", "--backend", "eager"),
        # Last: it takes whatever the steps before it saved, and stops starting work at its limit.
        budget_s=36,
        tables=3,
        time_limit_margin_s=18,  # a 1B row: copies of 4 GB of weights, its 9 s compile, 14 steps of 197 ms
        compiles=True,
    ),
)
STEP_NAMES = tuple(step.name for step in STEPS)


def command_for(step: Step, device: str, smoke: bool, out: Path) -> list[str]:
    """The full argv of ``step`` for this run: the device, and where its JSON or results go.

    >>> cmd = command_for(next(s for s in STEPS if s.name == "bench"), "cuda", False, Path("/tmp/s"))
    >>> cmd[1:4], cmd[-4:]
    (['-m', 'ampkit', 'bench'], ['--device', 'cuda', '--out', '/tmp/s/bench'])
    """
    argv = [sys.executable, *(step.smoke if smoke else step.full), "--device", device]
    if step.name in ("bench", "tune"):
        argv += ["--out", str(out / step.name)]
    elif step.name == "tests":  # each failure on disk as it is reported, whatever ends the pass (see failure_log.py)
        argv += ["-p", "benchmarks.failure_log", "--failure-log", str(out / FAILURE_LOG), "--junitxml", str(out / JUNIT_XML)]
    elif step.writes_json:
        argv += ["--json", str(out / f"{step.name}.json")]
    return argv


def with_time_limit(step: Step, command: list[str], limit_s: float, smoke: bool = False) -> list[str]:
    """``command`` told its time limit when the step keeps to one of its own; the test pass gets its workers and
    timeouts (:func:`_pytest_extras`). See :func:`own_limit`.

    >>> step = Step("x", "x", (), (), budget_s=60, time_limit_margin_s=20)
    >>> with_time_limit(step, ["python", "x.py"], 90.4)
    ['python', 'x.py', '--time-limit', '65']
    """
    if step.name == "tests":
        return [*command, *_pytest_extras(step, smoke, limit_s)]
    if step.time_limit_margin_s is None:
        return command
    return [*command, step.limit_flag, f"{own_limit(step, limit_s):.0f}"]


def own_limit(step: Step, limit_s: float) -> float:
    """The time limit a step's command keeps to on its own clock: the suite's limit for the step, less the process's
    start (the command's clock starts after it: torch imported) and the step's margin (the longest unit of work it
    may start just before its limit), at least 1 s.

    >>> own_limit(Step("x", "x", (), (), budget_s=60, time_limit_margin_s=20), 60)
    35.0
    """
    return max(limit_s - PROCESS_START_S - (step.time_limit_margin_s or 0.0), 1.0)


def _pytest_extras(step: Step, smoke: bool, limit_s: float) -> list[str]:
    """Parallel workers and time limits when the plugins are installed (the GPU image has them; so has the dev extra,
    so the CPU smoke pass runs under them too): a per-test timeout, and a session timeout that stops the pass in
    time to print its summary (what ran, what failed) rather than be killed with nothing. Its failures are named
    even when it is killed: the failure file (:data:`FAILURE_LOG`) has them as they were reported."""
    extras = []
    if _importable("xdist"):
        extras += ["-n", "2" if smoke else "8"]  # 8 processes share one GPU; the GPU pass is mostly launch- and host-bound
    if _importable("pytest_timeout"):
        extras += ["--timeout", str(TEST_TIMEOUT_S)]
        if step.time_limit_margin_s is not None:
            extras += ["--session-timeout", f"{own_limit(step, limit_s):.0f}"]
    return extras


def _importable(module: str) -> bool:
    from importlib.util import find_spec

    return find_spec(module) is not None


def shown_command(command: list[str]) -> str:
    """``command`` as a reader would type it from the repository root.

    >>> shown_command([sys.executable, str(BENCHMARKS / "x.py"), "--device", "cuda"])
    'python benchmarks/x.py --device cuda'
    """
    return shlex.join(["python", *command[1:]]).replace(str(REPO) + "/", "")


def child_environment(site: Path | None = None) -> dict[str, str]:
    """The steps' environment: this checkout's ``src`` first on the path (nothing installed), then ``site`` (the
    carried wheels), unbuffered output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), str(site) if site else None, env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def step_limit(own_s: float, later_s: float, remaining_s: float) -> float:
    """A step's time limit: its own budget, plus whatever earlier steps left unused beyond what the later steps
    are budgeted, never past the suite's deadline. So the whole suite keeps to its budget, and a slow step (the
    bench on a slower GPU) can use the time a fast one saved.

    >>> step_limit(100, 200, 400)   # 100 s saved earlier: this step may take 200
    200
    >>> step_limit(100, 200, 250)   # behind: its own budget, no more
    100
    >>> step_limit(100, 200, 60)    # never past the deadline
    60
    """
    return min(max(own_s, remaining_s - later_s), remaining_s)


def install_wheels(folder: Path, target: Path) -> list[str]:
    """Install the wheels in ``folder`` (``.whl/``: packages the GPU machine lacks) into ``target``, offline and
    without dependencies, as DEVELOPERS.md describes; their file names ([] when there are none). A package this
    Python already has is left as it is: the wheels are for a machine without it (the lent GPU's torch 2.11), and
    must not replace a development machine's own (torchao 0.18 for torch 2.13)."""
    wheels = [w for w in sorted(folder.glob("*.whl")) if _version(w.name.split("-")[0]) is None]
    if wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target), *map(str, wheels)],
            check=True, capture_output=True, text=True, timeout=300,
        )
    return [w.name for w in wheels]


def run_step(step: Step, command: list[str], log: Path, timeout_s: float, site: Path | None = None) -> StepResult:
    """Run one step in its own process group, its output written straight to ``log`` (so a step killed at its limit
    still leaves what it printed); the group is killed at the limit, workers included."""
    result = StepResult(step, command, status="ok", log=log)
    start = time.perf_counter()
    with log.open("w") as sink:
        sink.write(f"$ {shlex.join(command)}\n\n")
        sink.flush()
        proc = subprocess.Popen(
            command, cwd=REPO, env=child_environment(site), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            result.returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            result.status = "timeout"
            result.notes.append(f"killed at its limit of {timeout_s:.0f} s")
    result.seconds = time.perf_counter() - start
    if result.status == "ok" and result.returncode != 0:
        result.status = "failed"
    return result


# ---------------------------------------------------------------------------------------------- the environment


def environment(device: str) -> dict[str, object]:
    """What the figures were measured on: host, Python, torch/CUDA/cuDNN/Triton versions, the GPU and its driver,
    and the commit. Read in this process; nothing is written to the device."""
    import torch

    env: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": _version("triton"),
        "numpy": _version("numpy"),
        "transformers": _version("transformers"),
        "torchao": _version("torchao"),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "device": device,
    }
    if torch.device(device).type == "cuda":
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        env |= {
            "gpu": props.name,
            "capability": f"{props.major}.{props.minor}",
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
            "driver": _nvidia_smi("driver_version"),
            "gpu_clocks_max_sm_mhz": _nvidia_smi("clocks.max.sm"),
        }
    return env


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else platform.processor()


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _nvidia_smi(query: str) -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


# ---------------------------------------------------------------------------------------------- the figures


def last_markdown_table(text: str, count: int = 1) -> str:
    """The last ``count`` Markdown tables in ``text`` (consecutive lines starting with ``|``), blank-line separated;
    "" when there is none.

    >>> last_markdown_table("x\\n| a |\\n|---|\\n| 1 |\\ny\\n| b |\\n|---|\\n| 2 |\\n")
    '| b |\\n|---|\\n| 2 |'
    >>> last_markdown_table("| a |\\n|---|\\nx\\n| b |\\n|---|\\n", count=2)
    '| a |\\n|---|\\n\\n| b |\\n|---|'

    Rows printed after other lines (a script's progress notes, a warning on stderr between rows) still belong to the
    table above them: a table starts only at a header followed by its separator.

    >>> last_markdown_table("| a |\\n|---|\\n| 1 |\\n# probe\\n| 2 |\\n")
    '| a |\\n|---|\\n| 1 |\\n| 2 |'
    """
    blocks: list[list[str]] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            current.append(line.strip())
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    tables: list[list[str]] = []
    for block in blocks:
        starts_a_table = len(block) > 1 and set(block[1].replace("|", "").replace(" ", "")) <= set("-:") and "-" in block[1]
        if tables and not starts_a_table:
            tables[-1].extend(block)  # rows of the table above, after a line that is not one
        else:
            tables.append(block)
    return "\n\n".join("\n".join(table) for table in tables[-count:])


def pytest_digest(text: str, recorded: list[str] | None = None, killed: bool = False) -> str:
    """The pytest summary line and the failing tests, as Markdown. ``recorded``: the failure file's lines
    (:data:`FAILURE_LOG`, each failure as it was reported), which name the failures even when the pass ended before
    its summary (``killed`` at its limit, or crashed); without them, the log's short-summary lines.

    >>> print(pytest_digest("..F\\nFAILED tests/a.py::test_x - boom\\n1 failed, 2 passed, 3 skipped in 4.0s\\n"))
    **1 failed, 2 passed, 3 skipped in 4.0s**
    <BLANKLINE>
    - FAILED tests/a.py::test_x - boom
    >>> print(pytest_digest("..F.s [ 40%]\\n..", ["FAILED tests/a.py::test_x - boom"], killed=True))
    **no pytest summary line: killed at 40% of the tests**
    <BLANKLINE>
    - FAILED tests/a.py::test_x - boom
    """
    counts = re.findall(r"^=*\s*(\d+ (?:passed|failed|error|errors|skipped|deselected|xfailed|xpassed|warnings?).*?)\s*=*$", text, re.MULTILINE)
    reached = re.findall(r"\[\s*(\d+)%\]", text)  # pytest's progress, at the end of each line of dots
    if counts:
        lines = [f"**{counts[-1]}**"]
    else:
        where = f" at {reached[-1]}% of the tests" if reached else ""
        lines = [f"**no pytest summary line: {'killed' if killed else 'ended'}{where}**" if where or killed else "**no pytest summary line (see the log)**"]
    if re.search(r"session-timeout: [\d.]+ sec exceeded", text):  # pytest-timeout's message, not the command's flag
        lines.append("")
        lines.append("- stopped at its session timeout: the tests after it did not run (the counts are of those that did)")
    failures = recorded or [line for line in text.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    if failures:
        lines.append("")
        lines += [f"- {line[:300]}" for line in failures]
    return "\n".join(lines)


def bench_digest(folder: Path) -> str:
    """A table of the bench's results.json: per policy, step time, throughput, speed-up, MFU, peak memory, verdict."""
    path = folder / "results.json"
    if not path.exists():
        return ""
    data = json.loads(path.read_text())
    rows = [
        "| policy | status | step (ms, median) | throughput | speed-up vs 32-true | MFU | peak memory (MiB) | eval | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in data.get("runs", []):
        rows.append(
            "| {p} | {s} | {t} | {thr} | {sp} | {mfu} | {mem} | {ev} | {v} |".format(
                p=run.get("precision"),
                s=run.get("status"),
                t=_fmt(run.get("step_time_median_s"), 1e3, "{:.2f}"),
                thr=f"{_fmt(run.get('throughput'), 1, '{:,.0f}')} {run.get('throughput_unit') or 'items'}/s",
                sp=_fmt(run.get("speedup_vs_fp32"), 1, "{:.2f}x"),
                mfu=_fmt(run.get("mfu"), 100, "{:.1f}%"),
                mem=_fmt(run.get("peak_memory_bytes"), 2**-20, "{:,.0f}"),
                ev=f"{run.get('eval_metric_name') or ''} {_fmt(run.get('eval_metric'), 1, '{:.4g}')}".strip(),
                v=(run.get("verdict") or "").replace("|", "/")[:160],
            )
        )
    device = data.get("device") or {}
    where = device.get("name", device.get("type")) if isinstance(device, dict) else device
    head = f"`{data.get('command') or 'ampkit bench'}`: {data.get('workload')} on {where}, torch {data.get('torch')}"
    return f"{head}\n\n" + "\n".join(rows)


def tune_digest(folder: Path) -> str:
    """The tune's ranked table as its report.md has it, the MFU column's definition from there, then the winner and the
    MFU of the start and of the winner (tune.json's rows); "" when the tune wrote no tune.json."""
    path = folder / "tune.json"
    if not path.exists():
        return ""
    data = json.loads(path.read_text())
    report = (folder / "report.md").read_text() if (folder / "report.md").exists() else ""
    rows = data.get("rows", [])
    start = next((r for r in rows if r.get("verdict") == "start"), None)
    winner = next((r for r in rows if r.get("verdict") == "winner"), start)

    def mfu(row: dict[str, object] | None) -> str:
        if row is None:
            return "not measured"
        return _fmt(row.get("mfu"), 100, "{:.1f}%") if row.get("mfu") is not None else f"— ({row.get('mfu_note') or 'not counted'})"

    device = data.get("device") or {}
    head = (f"`{data.get('command') or 'ampkit tune'}`: {data.get('workload')} on {device.get('name', device.get('type'))}, "
            f"torch {data.get('torch')}, {data.get('elapsed_s', 0):.0f} s of a {data.get('budget_s', 0):.0f} s budget")
    lines = [head, ""]
    lines.append(last_markdown_table(report))
    lines += ["", *[line for line in report.splitlines() if line.startswith("- MFU:")]]
    lines += ["", f"**Winner**: {winner['configuration'] if winner else 'the start'}: {data.get('winner_reason', '')}",
              "", f"MFU: start {mfu(start)}, winner {mfu(winner)}"]
    lines += [f"- not tried: {p['change']}: {p['reason']}" for p in data.get("not_tried", [])]
    return "\n".join(lines)


def _fmt(value: object, scale: float, pattern: str) -> str:
    return pattern.format(value * scale) if isinstance(value, (int, float)) else "—"


def figures_of(result: StepResult, out: Path) -> str:
    text = result.log.read_text(errors="replace") if result.log and result.log.exists() else ""
    if result.step.name == "tests":
        recorded = out / FAILURE_LOG
        lines = recorded.read_text(errors="replace").splitlines() if recorded.exists() else None
        return pytest_digest(text, lines, killed=result.status == "timeout")
    if result.step.name == "bench":
        return bench_digest(out / "bench") or last_markdown_table(text)
    if result.step.name == "tune":
        return tune_digest(out / "tune") or last_markdown_table(text)
    return last_markdown_table(text, result.step.tables)


def summary_markdown(env: dict[str, object], results: list[StepResult], smoke: bool, budget_s: float, wall_s: float) -> str:
    """summary.md: where it ran, a table of the steps, then each step's figures and the tail of a failing log."""
    title = "ampkit GPU suite" + (" (smoke mode: tiny sizes, proves the steps run, figures mean nothing)" if smoke else "")
    gpu = env.get("gpu") or env.get("device")
    lines = [
        f"# {title}",
        "",
        f"- Device: {gpu}" + (f" (capability {env['capability']}, {env['gpu_memory_gib']} GiB, driver {env['driver']})" if "gpu" in env else ""),
        f"- Host: {env['cpu']}, {env['cpu_count']} CPUs; Python {env['python']}",
        f"- torch {env['torch']} (CUDA {env['torch_cuda']}, cuDNN {env['cudnn']}), Triton {env['triton']}, transformers {env['transformers']}, torchao {env.get('torchao')}",
        (f"- ampkit commit {env['commit'] or 'unknown (no .git here: pass --commit)'}"
         f"{' (with uncommitted changes)' if env['dirty'] else ''}; {env['date']}"),
        f"- Wall time {wall_s:.0f} s of a {budget_s:.0f} s budget",
        "",
        "| step | status | seconds | command |",
        "|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r.step.name} | {r.status} | {r.seconds:.0f} | `{shown_command(r.command)}` |")
    for r in results:
        lines += ["", f"## {r.step.name}: {r.step.title}", "", f"Status: **{r.status}**" + "".join(f"; {n}" for n in r.notes)]
        if r.figures:
            lines += ["", r.figures]
        if r.status in ("failed", "timeout") and r.log and r.log.exists():
            tail = r.log.read_text(errors="replace").splitlines()[-25:]
            lines += ["", f"Last lines of {r.log.name}:", "", "```", *tail, "```"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- the command


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="the folder to write (created; must be empty or new)")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (with --smoke, for CI)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: proves every step runs (CI), figures mean nothing")
    p.add_argument("--only", help=f"comma-separated steps to run (default: all): {', '.join(STEP_NAMES)}")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="wall-clock budget of the whole suite")
    p.add_argument("--list", action="store_true", help="print the steps and their commands, run nothing")
    p.add_argument("--commit", help="the ampkit commit measured, when the machine's copy has no .git (a lent GPU's has none)")
    args = p.parse_args(argv)
    if args.only:
        unknown = sorted(set(args.only.split(",")) - set(STEP_NAMES))
        if unknown:
            p.error(f"--only: unknown step(s) {', '.join(unknown)}; the steps are {', '.join(STEP_NAMES)}")
    if not args.list and args.out is None:
        p.error("--out DIR is required: the folder the results are written to")
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        p.error(f"--out {args.out}: the folder is not empty; name a new one so no earlier results are mixed in")
    return args


def _check_device(device: str) -> str | None:
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as error:
        return f"--device {device!r}: {error}"
    if dev.type == "cuda" and not torch.cuda.is_available():
        return (
            f"--device {device}: torch {torch.__version__} sees no CUDA device. On a CPU machine run "
            "`python benchmarks/gpu_suite.py --device cpu --smoke --out DIR` (what CI runs)."
        )
    if dev.type not in ("cpu", "cuda"):
        return f"--device {device}: the suite runs on cuda (or cpu with --smoke), not {dev.type}"
    return None


def _carried_wheels() -> tuple[Path | None, list[str], str | None]:
    """Install ``.whl/*.whl`` for the steps (and for this process's version probe): the folder, the wheels, an error."""
    if not any(WHEELS.glob("*.whl")):
        return None, [], None
    site = Path(tempfile.mkdtemp(prefix="ampkit-wheels-"))
    try:
        wheels = install_wheels(WHEELS, site)
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", None) or str(error)
        return None, sorted(w.name for w in WHEELS.glob("*.whl")), detail.strip().splitlines()[-1] if detail.strip() else repr(error)
    if not wheels:  # this Python has every package they carry
        return None, [], None
    sys.path.insert(0, str(site))
    return site, wheels, None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = [s for s in STEPS if not args.only or s.name in args.only.split(",")]
    if args.list:
        for step in chosen:  # as run when the step gets its own budget as its limit
            budget = step.smoke_budget_s if args.smoke else step.budget_s
            command = with_time_limit(step, command_for(step, args.device, args.smoke, Path("OUT")), budget, args.smoke)
            print(f"{step.name:18s} {budget:4.0f} s  {shown_command(command)}")
        return 0
    problem = _check_device(args.device)
    if problem:
        print(f"gpu_suite: {problem}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    deadline = start + args.budget_s
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    site, wheels, wheel_error = _carried_wheels()
    env = environment(args.device) | {"wheels": wheels}
    if wheel_error:
        env["wheels_error"] = wheel_error
    if args.commit:
        env["commit"], env["dirty"] = args.commit, False
    (out / "env.json").write_text(json.dumps(env, indent=2) + "\n")
    print(f"gpu_suite: {env.get('gpu') or args.device}, torch {env['torch']}, {len(chosen)} steps, budget {args.budget_s:.0f} s", flush=True)
    if wheels or wheel_error:
        print(f"gpu_suite: carried wheels {', '.join(wheels)}: " + (f"NOT installed: {wheel_error}" if wheel_error else f"installed in {site}"), flush=True)

    budgets = [step.smoke_budget_s if args.smoke else step.budget_s for step in chosen]
    results = []
    for index, step in enumerate(chosen, 1):
        limit = step_limit(budgets[index - 1], sum(budgets[index:]), deadline - time.perf_counter())
        command = with_time_limit(step, command_for(step, args.device, args.smoke, out), limit, args.smoke)
        if limit < 5:
            results.append(StepResult(step, command, status="not run", notes=["the suite's budget was spent"]))
        else:
            results.append(run_step(step, command, out / f"{index:02d}-{step.name}.log", limit, site))
        results[-1].figures = figures_of(results[-1], out)
        last = results[-1]
        print(f"gpu_suite: {step.name:18s} {last.status:8s} {last.seconds:6.1f} s", flush=True)

    wall = time.perf_counter() - start
    summary = summary_markdown(env, results, args.smoke, args.budget_s, wall)
    (out / "summary.md").write_text(summary)
    print(f"\n{summary}")
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
