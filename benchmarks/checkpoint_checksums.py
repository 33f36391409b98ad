"""What checkpoint checksums cost: save and load with and without them, side by side in one run.

Single file: ampkit's save with torch's per-record CRC-32 on (ampkit's default) against the same save with it off,
and ampkit's load with the records verified (:func:`ampkit.fileio._checksums.verify_zip_records`) against the same
load without. Sharded (DCP, one process): ``dcp.save`` alone against ``dcp.save`` plus the CRC-32 of every file it
wrote (what a sharded save adds), and ``dcp.load`` alone against the files verified first. The state is float32
tensors of ``--mib`` MiB in all (``--tensors`` of them). Contenders alternate within each round, the order rotating
per round; each row is the median over ``--rounds`` of one operation's wall time, the ratio is with / without.
The page cache is warm (the file was just written), as it is for a save and a resume on one machine; from a cold
network filesystem the load's read dominates both sides.

    python benchmarks/checkpoint_checksums.py                 # 256 MiB, 7 rounds
    python benchmarks/checkpoint_checksums.py --mib 8 --rounds 3   # seconds
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

import ampkit.fileio._checkpoint_files as files
from ampkit.checkpoint._dcp_state import single_process_intended
from ampkit.checkpoint._sharded_load import verify_shards
from ampkit.fileio._checksums import file_crc32


@contextlib.contextmanager
def _no_crc() -> Iterator[None]:
    from torch.utils.serialization import config

    previous, config.save.compute_crc32 = config.save.compute_crc32, False
    try:
        yield
    finally:
        config.save.compute_crc32 = previous


@contextlib.contextmanager
def _patched(name: str, value: object) -> Iterator[None]:
    previous = getattr(files, name)
    setattr(files, name, value)
    try:
        yield
    finally:
        setattr(files, name, previous)


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    n = args.mib * (1 << 20) // 4 // args.tensors
    state = {f"t{i}": torch.randn(n) for i in range(args.tensors)}
    root = Path(tempfile.mkdtemp())
    on, off = root / "crc.pt", root / "nocrc.pt"

    def save_dcp(path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)
        with single_process_intended():
            dcp.save(state, checkpoint_id=path, no_dist=True)

    def save_dcp_hashed(path: Path) -> dict[str, int]:
        save_dcp(path)
        return {f.name: file_crc32(f) for f in path.iterdir()}

    fresh = {k: torch.empty_like(v) for k, v in state.items()}

    def load_dcp(path: Path) -> None:
        with single_process_intended():
            dcp.load(fresh, checkpoint_id=path, no_dist=True)

    sums = save_dcp_hashed(root / "dcp-loaded")  # the directory the loads read; the saves write others
    cases: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "file save": (lambda: files.save_checkpoint(state, on), lambda: _save_without(state, off)),
        "file load": (lambda: files.load_checkpoint(on), lambda: _load_without(on)),
        "sharded save": (lambda: save_dcp_hashed(root / "dcp"), lambda: save_dcp(root / "dcp2")),
        "sharded load": (lambda: (verify_shards(root / "dcp-loaded", sums), load_dcp(root / "dcp-loaded")), lambda: load_dcp(root / "dcp-loaded")),
    }
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in cases}
    for r in range(args.rounds):
        for name, (with_, without) in cases.items():
            pair = [(0, with_), (1, without)]
            for side, fn in pair if r % 2 == 0 else pair[::-1]:
                times[name][side].append(_timed(fn))
    print(f"checkpoint checksums: {args.mib} MiB of float32 in {args.tensors} tensors, {args.rounds} rounds, median wall time per operation")
    print(f"{'operation':<14} {'with (ms)':>10} {'without (ms)':>13} {'ratio':>7}")
    for name, (with_t, without_t) in times.items():
        a, b = statistics.median(with_t), statistics.median(without_t)
        print(f"{name:<14} {a * 1e3:>10.1f} {b * 1e3:>13.1f} {a / b:>7.2f}")
    print("ratio: with checksums / without (1.00 = free). with: ampkit as shipped; without: torch's CRC off at save, no verification at load.")
    shutil.rmtree(root, ignore_errors=True)


def _save_without(state: dict[str, torch.Tensor], path: Path) -> None:
    with _no_crc(), _patched("crc32_on", contextlib.nullcontext):
        files.save_checkpoint(state, path)


def _load_without(path: Path) -> None:
    with _patched("verify_zip_records", lambda p: False):
        files.load_checkpoint(path)


if __name__ == "__main__":
    main()
