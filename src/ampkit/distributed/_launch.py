"""Start a command again under torchrun, one process per rank: how ``ampkit bench --nproc N`` gets its ranks.

The command re-runs as ``python -m torch.distributed.run --standalone --nproc-per-node N -m ampkit ...`` with
the same interpreter, so it needs nothing on ``PATH`` and finds the same ampkit. ``--standalone`` picks a free
local port, so two runs on one machine do not collide.

    >>> torchrun_command(2, ["bench", "-w", "digits"], python="python")  # doctest: +NORMALIZE_WHITESPACE
    ['python', '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2',
     '-m', 'ampkit', 'bench', '-w', 'digits']
    >>> strip_option(["bench", "--nproc", "2", "-w", "digits", "--nproc=4"], "--nproc")
    ['bench', '-w', 'digits']

Worker threads: torchrun sets ``OMP_NUM_THREADS=1`` for every worker unless it is set already;
:func:`relaunch` sets it to the cores this process may use divided by N (at least 1), so the workers share the
cores instead of each spawning a thread per core. An ``OMP_NUM_THREADS`` of your own is kept.

Exit code: torchrun turns any non-zero worker exit into its own failure report (a Python traceback of the
launcher). :func:`relaunch` therefore names a file in ``AMPKIT_EXIT_CODE_FILE``; a worker that finished its
work writes its exit code there through :func:`report_exit_code` (rank 0 only) and exits 0, and
:func:`relaunch` returns that code (1 when a bench run failed, say) without the launcher's traceback. A worker
that crashes still exits non-zero, and torchrun's report stays.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["torchrun_command", "strip_option", "worker_threads", "relaunch", "report_exit_code", "EXIT_CODE_FILE"]

EXIT_CODE_FILE = "AMPKIT_EXIT_CODE_FILE"
"""Environment variable naming the file where rank 0 of a relaunched command leaves its exit code."""


def torchrun_command(nproc: int, module_args: Sequence[str], *, module: str = "ampkit", python: str | None = None) -> list[str]:
    """The argv that runs ``python -m <module> <module_args>`` in ``nproc`` processes on this machine.

    >>> torchrun_command(4, ["bench"], python="py")[-4:]
    ['4', '-m', 'ampkit', 'bench']
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive int (the processes to start), got {nproc!r}.")
    return [
        python or sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
        "-m", module, *module_args,
    ]


def strip_option(argv: Sequence[str], option: str, *, min_prefix: int = 4) -> list[str]:
    """``argv`` without ``option`` and its value (``--opt V`` or ``--opt=V``), abbreviations included.

    argparse accepts any unambiguous prefix of a long option (``--npr 2`` for ``--nproc 2``), so every prefix of
    at least ``min_prefix`` characters counts.

    >>> strip_option(["bench", "--npr", "2", "--no-progress"], "--nproc")
    ['bench', '--no-progress']
    """
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name, eq, _ = arg.partition("=")
        if name.startswith("--") and len(name) >= min_prefix and option.startswith(name):
            skip = not eq  # "--opt V": the value is the next argument
            continue
        out.append(arg)
    return out


def worker_threads(nproc: int, cores: int | None = None) -> int:
    """Intra-op threads per worker so ``nproc`` workers share the usable cores (at least 1 each).

    >>> worker_threads(2, cores=16), worker_threads(4, cores=2)
    (8, 1)
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // nproc)


def relaunch(nproc: int, module_args: Sequence[str], *, module: str = "ampkit", env: Mapping[str, str] | None = None) -> int:
    """Run ``python -m <module> <module_args>`` under torchrun in ``nproc`` processes; return the command's exit code.

    The workers inherit stdin/stdout/stderr, so rank 0's output appears as if the command ran here.
    """
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("OMP_NUM_THREADS", str(worker_threads(nproc)))
    with tempfile.TemporaryDirectory(prefix="ampkit-launch-") as tmp:
        code_file = Path(tmp) / "exit_code"
        child_env[EXIT_CODE_FILE] = str(code_file)
        rc = subprocess.run(torchrun_command(nproc, module_args, module=module), env=child_env, check=False).returncode
        text = code_file.read_text(encoding="utf-8").strip() if code_file.exists() else ""
    code = int(text) if text.lstrip("-").isdigit() else rc
    return code if code != 0 else rc  # rank 0 finished cleanly but another worker crashed: torchrun's code


def report_exit_code(code: int, rank: int) -> int:
    """The code a worker should exit with: 0 after leaving ``code`` for :func:`relaunch` (rank 0 writes it).

    Outside :func:`relaunch` (plain ``torchrun ... -m ampkit bench``) ``code`` is returned unchanged.

    >>> report_exit_code(1, rank=0) if EXIT_CODE_FILE not in os.environ else 1
    1
    """
    path = os.environ.get(EXIT_CODE_FILE)
    if not path:
        return code
    if rank == 0:
        Path(path).write_text(f"{code}\n", encoding="utf-8")
    return 0
