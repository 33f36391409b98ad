"""Run Apex's own L0 amp tests (``tests/L0/run_amp``) against ``ampkit.apex`` on a CPU, and tabulate the results.

Apex's tests are not part of this repository and are never copied into it: the runner takes an exported
``tests/L0/run_amp`` directory, copies it to a temporary directory outside the repository, adapts the copy to
a CPU mechanically (the rewrites in ``REWRITES``, each printed with its count), writes a ``conftest.py`` there
that makes ``import apex`` resolve to ``ampkit.apex``, and runs each test file in its own pytest process (so a
test that leaves amp patched cannot change the next file's results). The 16-bit type is fp16
(``AMPKIT_APEX_HALF_DTYPE=float16``) because Apex's assertions compare against ``HalfTensor``.

Get the tests from the last Apex commit that still had ``apex/amp`` (its child, cb65b8ed, deleted it)::

    git clone https://github.com/NVIDIA/apex /tmp/apex && mkdir -p /tmp/apexl0
    git -C /tmp/apex archive e13873debc4699d39c6861074b9a3b2a02327f92 tests/L0/run_amp | tar -x -C /tmp/apexl0

then, from the ampkit checkout (``ampkit`` is whatever ``import ampkit`` finds, e.g. via PYTHONPATH=src)::

    python scripts/run_apex_l0.py --apex-tests /tmp/apexl0/tests/L0/run_amp --out /tmp/apexl0-results

``--out`` receives ``results.md`` (the per-test table and the counts), ``results.json`` and one JUnit XML file
per test file. Tests that Apex itself skips without its CUDA extension (``amp_C``) or without several GPUs, and
the tests in ``CUDA_ONLY`` (whose subject a CPU does not have), are counted as "not applicable", with the
reason, apart from passes, failures and errors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (pattern, replacement, why). Applied to every .py file of the copy; nothing else in Apex's code changes.
REWRITES: list[tuple[str, str, str]] = [
    (r"torch\.cuda\.(Half|Float|Double|BFloat16|Long|Int|Short|Char|Byte|Bool)Tensor", r"torch.\1Tensor",
     "CUDA tensor types and their .type() strings -> the CPU ones"),
    (r"""device=(['"])cuda\1""", r"device=\1cpu\1", "device='cuda' -> 'cpu'"),
    (r"""\.to\((['"])cuda\1\)""", r".to(\1cpu\1)", ".to('cuda') -> .to('cpu')"),
    (r"\.cuda\(\)", r".cpu()", ".cuda() -> .cpu()"),
    # test_fused_sgd gates FusedSGD on `import amp_C`, Apex's kernels; ampkit's FusedSGD is torch's fused SGD
    # and needs no amp_C, so the gate is dropped there (files that call amp_C's kernels keep theirs).
    (r"( *)import amp_C\n(\s*disabled = False\n\s*from apex\.optimizers import FusedSGD)", r"\1pass\n\2",
     "FusedSGD's amp_C gate -> none (ampkit's FusedSGD needs no amp_C)"),
]

# The conftest written beside the copied tests: runs before collection, so `from apex import amp` at the top of
# each test module already finds ampkit's modules.
CONFTEST = '''\
import os
import sys

import pytest
import torch

# Apex ran these tests from their own directory, where `from utils import ...` finds utils.py.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ampkit.apex

# force=True: measure ampkit's modules even if a real Apex is importable.
ampkit.apex.install(force=True)


CUDA_ONLY = {cuda_only!r}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.nodeid in CUDA_ONLY:
            item.add_marker(pytest.mark.skip(reason="tests CUDA-only behaviour: " + CUDA_ONLY[item.nodeid]))


# Some tests draw unseeded data whose outcome depends on the draw (test_loss_scale_decrease overflows its
# input only when a random parameter is not too small; test_state_dict fails when a step overflows at the
# first scale); torch's seed differs per process, so fix it per test.
@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed({seed})
'''

# Tests whose subject exists only on a CUDA device, with why; the conftest skips them and they count as not
# applicable. Apex cast only CUDA tensors (apex/amp/utils.py: maybe_float returns CPU tensors unchanged).
CUDA_ONLY: dict[str, str] = {
    "test_basic_casts.py::TestTensorCasts::test_cpu_is_float": (
        "Apex's fp32 cast of Tensor.cpu() is for the CUDA-to-host copy; on a CPU .cpu() copies nothing and "
        "Apex itself left CPU tensors uncast"
    ),
}

# A skip whose reason matches one of these needs hardware or a compiled extension a CPU run cannot have.
NOT_APPLICABLE: list[tuple[re.Pattern[str], str | None]] = [
    (re.compile(r"amp_C|fused kernels|cuda extension|_cuda\b", re.IGNORECASE), "needs Apex's CUDA extension (amp_C)"),
    (re.compile(r"gpus?\b|world.?size|multi.?gpu|device_count", re.IGNORECASE), "needs several GPUs"),
    (re.compile(r"^tests CUDA-only behaviour: "), None),  # CUDA_ONLY, reason already said
]


@dataclass
class Result:
    file: str
    test: str
    outcome: str  # passed | failed | error | skipped | n/a
    reason: str
    seconds: float


def adapt(src: Path, dst: Path, seed: int) -> dict[str, int]:
    """Copy Apex's tests from ``src`` to ``dst`` with ``REWRITES`` applied; return how often each one matched."""
    shutil.copytree(src, dst)
    counts = {why: 0 for _, _, why in REWRITES}
    for path in sorted(dst.rglob("*.py")):
        text = path.read_text()
        for pattern, replacement, why in REWRITES:
            text, n = re.subn(pattern, replacement, text)
            counts[why] += n
        path.write_text(text)
    (dst / "conftest.py").write_text(CONFTEST.format(seed=seed, cuda_only=CUDA_ONLY))
    # Our own config file makes `dst` pytest's rootdir, so no ampkit setting (filterwarnings=error, ...) applies.
    (dst / "pytest.ini").write_text("[pytest]\n")
    return counts


def _first_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0][:200] if lines else ""


def _not_applicable(reason: str) -> str | None:
    for pattern, label in NOT_APPLICABLE:
        if pattern.search(reason):
            return reason if label is None else f"{label}: {reason}"
    return None


def parse_junit(xml_path: Path, file: str) -> list[Result]:
    """One :class:`Result` per ``<testcase>`` of a pytest JUnit XML report."""
    results = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                # The exception line ("E   AssertionError: ...") says more than pytest's short message.
                exc = [line[1:].strip() for line in (node.text or "").splitlines() if line.startswith("E ")]
                reason = _first_line(exc[0] if exc else node.get("message") or node.text)
                break
        if outcome == "skipped":
            label = _not_applicable(reason)
            if label is not None:
                outcome, reason = "n/a", label
        results.append(Result(file, name, outcome, reason, float(case.get("time", 0.0))))
    return results


def _pytest(workdir: Path, target: str, xml_path: Path, log_path: Path, env: dict[str, str],
            timeout: float) -> tuple[list[Result] | None, str]:
    """Run pytest on ``target`` (a file or a node id); the results, or None and why when no report came back."""
    file = target.split("::")[0]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rN", f"--junitxml={xml_path}", target]
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout, check=False)  # failing tests are results
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    log_path.write_text(proc.stdout + proc.stderr)
    if not xml_path.exists():
        # The process died before pytest wrote its report: a crash in native code, or an import-time error.
        return None, f"exit status {proc.returncode}: {_first_line(proc.stderr) or _first_line(proc.stdout)}"
    return parse_junit(xml_path, file), ""


def run_file(workdir: Path, test_file: Path, out: Path, half_dtype: str, timeout: float) -> list[Result]:
    """Run one test file in a fresh pytest process inside ``workdir``.

    If that process dies without a report (a segfault in a kernel would take every test of the file with it),
    each test runs again in its own process, so that only the one that crashes is counted as an error.
    """
    env = dict(os.environ, AMPKIT_APEX_HALF_DTYPE=half_dtype)
    stem = test_file.stem
    rows, why = _pytest(workdir, test_file.name, out / f"{stem}.xml", out / f"{stem}.log", env, timeout)
    if rows is not None:
        return rows
    listed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                             test_file.name], cwd=workdir, env=env, capture_output=True, text=True, check=False)
    node_ids = [line for line in listed.stdout.splitlines() if line.startswith(f"{test_file.name}::")]
    if not node_ids:
        return [Result(test_file.name, "(whole file)", "error", why, 0.0)]
    rows = []
    for i, node_id in enumerate(node_ids):
        one, why = _pytest(workdir, node_id, out / f"{stem}.{i}.xml", out / f"{stem}.{i}.log", env, timeout)
        test = ".".join(node_id.split("::")[1:])
        rows += one if one is not None else [Result(test_file.name, test, "error", why, 0.0)]
    return rows


def summarize(results: list[Result]) -> dict[str, int]:
    counts = {k: 0 for k in ("passed", "failed", "error", "skipped", "n/a")}
    for r in results:
        counts[r.outcome] += 1
    counts["total"] = len(results)
    return counts


def write_report(out: Path, results: list[Result], counts: dict[str, int], rewrites: dict[str, int],
                 meta: dict[str, str]) -> None:
    lines = ["# Apex L0 amp tests against ampkit.apex (CPU)", ""]
    lines += [f"- {k}: `{v}`" for k, v in meta.items()]
    lines += ["- CPU rewrites applied to the copy: " + "; ".join(f"{why} ({n}x)" for why, n in rewrites.items()), ""]
    applicable = counts["total"] - counts["n/a"]
    lines += [(f"**{counts['passed']} passed / {counts['failed']} failed / {counts['error']} errors / "
               f"{counts['skipped']} skipped of {applicable} applicable; {counts['n/a']} not applicable; "
               f"{counts['total']} in all.**"), ""]
    lines += ["| file | test | result | reason (first line) | s |", "|---|---|---|---|---|"]
    for r in results:
        reason = r.reason.replace("|", "\\|")
        lines.append(f"| {r.file} | {r.test} | {r.outcome} | {reason} | {r.seconds:.1f} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(
        {"meta": meta, "counts": counts, "rewrites": rewrites, "results": [asdict(r) for r in results]}, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apex-tests", type=Path, required=True, help="an exported Apex tests/L0/run_amp directory")
    parser.add_argument("--out", type=Path, required=True, help="where results.md, results.json and logs go")
    parser.add_argument("--half-dtype", default="float16", help="AMPKIT_APEX_HALF_DTYPE for the run (default float16)")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed before each test (default 0)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these test files (e.g. test_cache.py)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per test file")
    parser.add_argument("--keep", action="store_true", help="keep the adapted copy (its path is printed)")
    args = parser.parse_args(argv)

    src = args.apex_tests.resolve()
    if not (src / "utils.py").is_file() or not list(src.glob("test_*.py")):
        parser.error(f"--apex-tests {src} is not Apex's tests/L0/run_amp (no utils.py / test_*.py); export it with "
                     "`git archive <commit> tests/L0/run_amp | tar -x -C DIR` and pass DIR/tests/L0/run_amp.")
    if src.is_relative_to(REPO):
        parser.error(f"--apex-tests {src} is inside this repository; keep Apex's tests outside it.")
    import ampkit  # the ampkit under test: whatever the tests' processes will import too

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="apex_l0_"))
    workdir = tmp / "run_amp"
    try:
        rewrites = adapt(src, workdir, args.seed)
        files = sorted(workdir.glob("test_*.py"))
        if args.only:
            unknown = set(args.only) - {f.name for f in files}
            if unknown:
                parser.error(f"--only {' '.join(sorted(unknown))}: no such test file in {src}")
            files = [f for f in files if f.name in set(args.only)]
        results: list[Result] = []
        for test_file in files:
            start = time.perf_counter()
            rows = run_file(workdir, test_file, out, args.half_dtype, args.timeout)
            counts = summarize(rows)
            print(f"{test_file.name:45s} " + " ".join(f"{k}={v}" for k, v in counts.items() if v) +
                  f"  ({time.perf_counter() - start:.0f} s)", flush=True)
            results += rows
    finally:
        if args.keep:
            print(f"adapted copy kept at {workdir}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    counts = summarize(results)
    meta = {"apex tests": str(src), "ampkit": _describe(Path(ampkit.__file__).parent), "torch": _torch_version(),
            "AMPKIT_APEX_HALF_DTYPE": args.half_dtype, "seed per test": str(args.seed)}
    write_report(out, results, counts, rewrites, meta)
    print(" ".join(f"{k}={v}" for k, v in counts.items()) + f"; table in {out / 'results.md'}")
    return 0


def _describe(package: Path) -> str:
    """The package's path and, when it lives in a git checkout, the commit (``+ changes`` if uncommitted)."""
    def git(*cmd: str) -> str:
        proc = subprocess.run(["git", "-C", str(package), *cmd], capture_output=True, text=True, check=False)  # not a checkout: ""
        return proc.stdout.strip() if proc.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return str(package)
    dirty = " + changes" if git("status", "--porcelain", "--", ".") else ""
    return f"{package} (git {commit}{dirty})"


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    sys.exit(main())
