"""``python -m ampkit.apex [--force] [--half-dtype T] SCRIPT [ARGS]``: run a legacy Apex script unchanged.

``-m MODULE`` runs a module instead of a script, as ``python -m`` does. The script runs as ``__main__`` with
its own directory first on ``sys.path`` and ``sys.argv`` set to ``[SCRIPT, *ARGS]``, exactly as
``python SCRIPT ARGS`` would, except that ``import apex`` resolves to ampkit.apex. Under torchrun:
``torchrun --nproc-per-node 2 -m ampkit.apex train.py``.

The script's directory (the current directory for ``-m``) goes on ``sys.path`` *before* the finder is installed:
a real Apex vendored beside the script is then found, kept, and only filled in (``apex.amp``), as
:func:`~ampkit.apex.install` promises; ``--force`` still puts ampkit's modules in front of it, and keeps the real
package's others (``apex.contrib``, ...). A real Apex that fails to import (its CUDA extensions were never built, so
its ``import amp_C`` raises) stops the script with its own error, chained to one that names ``--force``: the way to
run the script on ampkit's apex in its place.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from .install import install


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ampkit.apex",
        description="Run a script written for NVIDIA Apex (from apex import amp, ...) unchanged on native PyTorch.",
    )
    parser.add_argument("--force", action="store_true", help="use ampkit's modules even where a real apex provides them")
    parser.add_argument("--half-dtype", choices=["float16", "bfloat16"], help="16-bit type of O1-O3 (default: float16 on CUDA, bfloat16 on CPU)")
    parser.add_argument("-m", dest="module", help="run a module as a script, like python -m")
    parser.add_argument("target", nargs=argparse.REMAINDER, help="SCRIPT [ARGS...] (or ARGS for -m)")
    args = parser.parse_args(argv)
    if args.module is None and not args.target:
        parser.error("give the script to run: python -m ampkit.apex train.py [ARGS]")
    if args.module is None and not os.path.isfile(args.target[0]):
        parser.error(f"no such script: {args.target[0]}")
    if args.half_dtype:
        os.environ["AMPKIT_APEX_HALF_DTYPE"] = args.half_dtype
    # The script's own import path first, then install(): install() looks for a real Apex on sys.path, and one
    # vendored beside the script must be seen there, or ampkit's modules would silently replace it.
    home = os.getcwd() if args.module is not None else os.path.dirname(os.path.abspath(args.target[0]))
    if not sys.path or os.path.abspath(sys.path[0]) != home:
        sys.path.insert(0, home)
    install(force=args.force)
    if args.module is not None:
        sys.argv = [args.module, *args.target]
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        return
    script, *rest = args.target
    sys.argv = [script, *rest]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
