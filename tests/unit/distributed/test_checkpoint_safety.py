"""Sharded checkpoints as an attacker and a crash would leave them: crafted metadata runs nothing, a missing,
truncated or garbled shard changes nothing, a save killed between its two renames is found again, and the
next save removes what killed saves left behind. The checkpoints are written on the pass's ranks (two gloo ranks on
the CPU, one NCCL rank on CUDA) and loaded in this process on the same device."""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit import CheckpointError, Engine, checkpoint_exists
from ampkit.checkpoint._safe_dcp import _RestrictedUnpickler
from ampkit.checkpoint._sharded_dir import ENGINE_FILE, find_checkpoint
from ampkit.distributed import _strategy as strategy_module


def _model(seed: int, width: int, device: torch.device) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, width), nn.LayerNorm(width), nn.Linear(width, 3)).to(device)



def _fsdp_compared_with_fsdp_only() -> None:
    # Every FSDP run here is compared with another FSDP run or with its own checkpoint. On a torch whose gloo sums
    # where FSDP averages (ampkit refuses FSDP on the CPU there), both sides see the same too-large gradients, so
    # what is tested still holds, and the checkpoint code keeps its coverage on the oldest torch. This rank only.
    strategy_module.fsdp_problem = lambda device_type, world_size: None

def _setup(strategy: str | None, seed: int, device: torch.device, width: int = 16) -> tuple[nn.Module, Engine]:
    if strategy == "fsdp":
        _fsdp_compared_with_fsdp_only()
    model = _model(seed, width, device)
    engine = Engine(strategy=strategy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, _ = engine.setup(model, opt)
    return model, engine


def _train(model: nn.Module, engine: Engine, rank: int, steps: int) -> None:
    g = torch.Generator().manual_seed(rank)  # drawn on the CPU: every device sees the same values
    for _ in range(steps):
        x, y = torch.randn(8, 6, generator=g).to(engine.device), torch.randint(0, 3, (8,), generator=g).to(engine.device)
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        engine.backward(loss)
        engine.step()


def _full(engine: Engine) -> dict[str, torch.Tensor]:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in engine.models[0].named_parameters()}


def _save_twice(rank: int, device: torch.device, first: str, second: str) -> dict:
    """Saves at step 2 and step 4; before the second save, rank 0 plants what killed saves leave behind."""
    model, engine = _setup("fsdp", 0, device)
    _train(model, engine, rank, 2)
    engine.save(first)
    at_first = _full(engine)
    _train(model, engine, rank, 2)
    if rank == 0:  # an earlier ampkit's names (no writer in them), nothing written in them for two hours
        for leftover in (f"{second}.0badc0ffee00.tmp", f"{second}.0badc0ffee01.old"):
            os.makedirs(leftover)
            Path(leftover, "__0_0.distcp").write_bytes(b"cut off")
            for path in (Path(leftover, "__0_0.distcp"), Path(leftover)):
                os.utime(path, (time.time() - 7200,) * 2)
    engine.save(second)
    return {"first": at_first, "second": _full(engine)}


@pytest.fixture
def saved(run_ranks, tmp_path) -> tuple[Path, Path, dict]:
    first, second = tmp_path / "step2", tmp_path / "step4"
    r0 = run_ranks(_save_twice, str(first), str(second))[0]
    return first, second, r0


def _pickle_global(module: str, name: str, args: tuple[str, ...]) -> bytes:
    """Protocol-4 bytes of ``module.name(*args)``: what a crafted .metadata holds."""
    def text(s: str) -> bytes:
        raw = s.encode()
        return pickle.SHORT_BINUNICODE + bytes([len(raw)]) + raw

    body = text(module) + text(name) + pickle.STACK_GLOBAL + pickle.MARK + b"".join(text(a) for a in args) + pickle.TUPLE + pickle.REDUCE
    data = pickle.PROTO + bytes([4]) + body + pickle.STOP
    pickletools.dis(data, out=io.StringIO())  # well-formed
    return data


def _assert_refused_and_unchanged(path: Path, match: str, device: torch.device) -> None:
    model, engine = _setup(None, 9, device)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(CheckpointError, match=match):
        engine.load(path)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    assert not engine.optimizers[0].state  # a load that initialised the optimizer's state undid that too


def test_crafted_metadata_runs_nothing_and_damaged_shards_change_nothing(saved, tmp_path, device, world, monkeypatch):
    first, _, r0 = saved
    # The checksums would refuse every copy below first; an attacker rewrites them too (a CRC is no signature), and
    # a directory saved before them has none: the allow-list and the shard checks must hold on their own.
    from ampkit.checkpoint import _sharded_load

    monkeypatch.setattr(_sharded_load, "verify_shards", lambda *args: None)

    def copy(name: str) -> Path:
        return Path(shutil.copytree(first, tmp_path / name))

    # 1. A dotted name resolved through a module DCP's reader imports: FileIO would create this file.
    victim = tmp_path / "written-by-the-checkpoint"
    for module, name, args in [
        ("torch.distributed.checkpoint.filesystem", "io.FileIO", (str(victim), "w")),
        ("torch.distributed.checkpoint.filesystem", "operator.methodcaller", ("system", "true")),
        ("torch.distributed.checkpoint.metadata", "os.system", ("true",)),
    ]:
        crafted = copy(f"crafted-{name}")
        (crafted / ".metadata").write_bytes(_pickle_global(module, name, args))
        _assert_refused_and_unchanged(crafted, f"refers to {module}.{name}, which a safe load refuses", device)
    assert not victim.exists()

    # 2. Metadata that sends the reader outside the directory.
    escaping = copy("escaping")
    with open(escaping / ".metadata", "rb") as f:
        metadata = _RestrictedUnpickler(f).load()
    next(iter(metadata.storage_data.values())).relative_path = "../step4/__0_0.distcp"
    with open(escaping / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    _assert_refused_and_unchanged(escaping, "not a file inside the checkpoint directory", device)

    # 3. A shard missing, cut short, or garbled at its full length.
    missing, last = copy("missing"), f"__{world - 1}_0.distcp"  # the last rank's shards
    (missing / last).unlink()
    _assert_refused_and_unchanged(missing, rf"{last} \(missing\)", device)
    truncated = copy("truncated")
    shard = truncated / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    _assert_refused_and_unchanged(truncated, r"__0_0.distcp \(\d+ of at least \d+ bytes\)", device)
    garbled = copy("garbled")
    shard = garbled / "__0_0.distcp"
    shard.write_bytes(bytes(shard.stat().st_size))
    _assert_refused_and_unchanged(garbled, "reading the shards failed.*nothing was changed", device)

    # 4. A sharded checkpoint of another model: checked against the metadata before anything is read.
    model, engine = _setup(None, 9, device, width=8)
    with pytest.raises(CheckpointError, match=r"the model does not match the checkpoint.*shape mismatch \[.*'model.0.0.weight \(16, 6\) vs \(8, 6\)'"):
        engine.load(first)

    # The undamaged directory still loads, resharded from the pass's ranks to one process.
    model, engine = _setup(None, 9, device)
    engine.load(first)
    for n, p in model.named_parameters():
        assert torch.equal(p, r0["first"][n]), n


def test_damage_anywhere_in_a_sharded_directory_is_refused_naming_the_file_or_changes_nothing(saved, tmp_path, device):
    import random

    first, _, r0 = saved  # one 2-rank save for both kinds of damage: the fixture is the expensive part
    rng = random.Random(38)
    files = sorted(f.name for f in first.iterdir())
    refused, named = 0, set()
    for i in range(40):
        damage = ("flip-one-bit", "overwrite-8-bytes")[i % 2]
        copy = Path(shutil.copytree(first, tmp_path / f"damaged{i}"))
        name = rng.choice(files)
        data = bytearray((copy / name).read_bytes())
        at = rng.randrange(max(1, len(data) - 8))
        if damage == "flip-one-bit":
            data[at] ^= 1 << rng.randrange(8)
        else:
            data[at:at + 8] = rng.randbytes(8)
        (copy / name).write_bytes(bytes(data))
        model, engine = _setup(None, 9, device)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        try:
            engine.load(copy)
        except CheckpointError as exc:
            refused += 1
            assert str(copy) in str(exc) and all(torch.equal(p, before[n]) for n, p in model.named_parameters())
            named.update(f for f in files if f"{f} (" in str(exc) or ("record archive" in str(exc) and f == ENGINE_FILE))
            continue
        for n, p in model.named_parameters():
            assert torch.equal(p, r0["first"][n]), f"{name} byte {at} damaged: {n} loaded silently changed"
    assert refused >= 30 and any(f.endswith(".distcp") for f in named), (refused, named)


def test_a_save_killed_between_its_renames_is_found_and_the_next_save_cleans_up(saved, tmp_path, device):
    first, second, r0 = saved
    # The second save removed the leftovers planted before it; only the two checkpoints remain.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step")) == ["step2", "step4"]

    # What a kill between the two renames leaves: the old checkpoint moved aside, the new one not yet in place.
    target = tmp_path / "ckpt"
    old, new = target.with_name("ckpt.5eed5eed5eed.old"), target.with_name("ckpt.5eed5eed5eed.tmp")
    shutil.copytree(first, old)
    shutil.copytree(second, new)
    os.utime(old / ENGINE_FILE, ns=(1, 1))  # the new one's engine file is written later
    assert not target.exists() and checkpoint_exists(target)
    model, engine = _setup(None, 9, device)
    engine.load(target)
    assert all(torch.equal(p, r0["second"][n]) for n, p in model.named_parameters())

    # Killed before the new one was complete: the old one is the checkpoint.
    (new / ENGINE_FILE).unlink()
    model, engine = _setup(None, 9, device)
    engine.load(target)
    assert all(torch.equal(p, r0["first"][n]) for n, p in model.named_parameters())


_KILL_BETWEEN_RENAMES = """
import os, signal, sys, pathlib
from ampkit.checkpoint import _sharded_dir
_sharded_dir._exchange = lambda a, b: False  # a filesystem without an atomic exchange (a real kill with one: the slow
# test_sharded_dir.py::test_a_save_killed_before_any_filesystem_operation_leaves_a_complete_checkpoint_at_the_path)
real, calls = os.replace, []
def replace(a, b):
    calls.append(a)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    real(a, b)
_sharded_dir.os.replace = replace
root = pathlib.Path(sys.argv[1])
_sharded_dir.swap_into_place(root / "ckpt.70c3e070c3e0.tmp", root / "ckpt", "70c3e070c3e0")
"""


def test_a_real_kill_between_the_renames_leaves_what_the_loader_recovers(tmp_path):
    for name, stamp in (("ckpt", 1), ("ckpt.70c3e070c3e0.tmp", 2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / ".metadata").write_text(name)
        (tmp_path / name / ENGINE_FILE).write_text(name)
        os.utime(tmp_path / name / ENGINE_FILE, ns=(stamp, stamp))
    done = subprocess.run([sys.executable, "-c", _KILL_BETWEEN_RENAMES, str(tmp_path)], capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    assert not (tmp_path / "ckpt").exists()  # the gap where the filesystem has no exchange: nothing at the path
    assert find_checkpoint(tmp_path / "ckpt") == tmp_path / "ckpt.70c3e070c3e0.tmp"  # the newer complete one
