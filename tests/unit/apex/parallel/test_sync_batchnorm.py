"""apex.parallel.SyncBatchNorm and convert_syncbn_model on torch's SyncBatchNorm, checked against BatchNorm."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ampkit.apex.parallel import SyncBatchNorm, convert_syncbn_model


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4, affine=False)), nn.InstanceNorm2d(4))


def _x(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(seed))


def _assert_same_bn(a: nn.Module, b: nn.Module) -> None:
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb
        torch.testing.assert_close(va, vb, rtol=0, atol=0)


def _check_equals_batchnorm() -> None:
    bn, sbn = nn.BatchNorm1d(5), SyncBatchNorm(5)
    x = torch.randn(8, 5)
    for _ in range(2):
        torch.testing.assert_close(sbn(x), bn(x), rtol=0, atol=0)
    _assert_same_bn(bn, sbn)
    bn.eval(), sbn.eval()
    torch.testing.assert_close(sbn(x), bn(x), rtol=0, atol=0)


def test_is_torch_syncbatchnorm_and_equals_batchnorm_outside_a_group():
    assert isinstance(SyncBatchNorm(3), nn.SyncBatchNorm)
    _check_equals_batchnorm()


def test_runs_on_cpu_in_a_one_process_group(process_group: None):
    # torch.nn.SyncBatchNorm itself refuses CPU input once a group exists, even of one process.
    with pytest.raises(ValueError, match="expected input tensor to be on GPU"):
        nn.SyncBatchNorm(5)(torch.randn(8, 5))
    _check_equals_batchnorm()


def test_apex_only_options_raise_with_the_fix():
    with pytest.raises(NotImplementedError, match=r"channel_last=True .*permute the input to \(N, C, H, W\)"):
        SyncBatchNorm(4, channel_last=True)
    with pytest.raises(NotImplementedError, match=r"fuse_relu=True .*apply torch.relu"):
        SyncBatchNorm(4, fuse_relu=True)
    with pytest.raises(NotImplementedError, match=r"compute bn\(x\) \+ z instead"):
        SyncBatchNorm(4)(torch.randn(2, 4), z=torch.randn(2, 4))
    with pytest.raises(NotImplementedError, match="channel_last=True"):
        convert_syncbn_model(_net(), channel_last=True)


def test_convert_keeps_parameters_and_outputs():
    original = _net()
    reference = copy.deepcopy(original)
    params_before = {name: p for name, p in original.named_parameters()}
    converted = convert_syncbn_model(original)
    kinds = [type(m) for m in converted.modules()]
    assert kinds.count(SyncBatchNorm) == 2 and nn.BatchNorm2d not in kinds and nn.InstanceNorm2d in kinds
    assert all(isinstance(m, nn.SyncBatchNorm) for m in converted.modules() if isinstance(m, SyncBatchNorm))
    # The same Parameter objects: an optimizer built on the original model stays valid.
    assert all(p is params_before[name] for name, p in converted.named_parameters())
    # Runs on the CPU outside a process group, as plain batch norm, training and eval.
    torch.testing.assert_close(converted(_x()), reference(_x()), rtol=0, atol=0)
    _assert_same_bn(converted, reference)
    converted.eval(), reference.eval()
    torch.testing.assert_close(converted(_x(2)), reference(_x(2)), rtol=0, atol=0)


def test_convert_a_bare_batchnorm_and_a_process_group_argument():
    bn = nn.BatchNorm1d(3)
    converted = convert_syncbn_model(bn, process_group="group-handle")
    assert type(converted) is SyncBatchNorm and converted.process_group == "group-handle" and converted.weight is bn.weight


def test_importable_under_apex_names():
    from ampkit.apex import install, uninstall

    install()
    try:
        from apex.parallel import SyncBatchNorm as by_package, convert_syncbn_model as convert
        from apex.parallel.sync_batchnorm import SyncBatchNorm as by_module

        assert by_package is SyncBatchNorm is by_module and convert is convert_syncbn_model
    finally:
        uninstall()


# ------------------------------------------------------------------------------ create_syncbn_process_group
def test_syncbn_process_group_in_a_one_process_group(process_group: None):
    from ampkit.apex.parallel import create_syncbn_process_group

    assert create_syncbn_process_group(0) is None  # Apex: 0 means the whole world, i.e. the default group
    group = create_syncbn_process_group(1)
    assert group is not None and torch.distributed.get_world_size(group) == 1
    # The group it returns is one SyncBatchNorm accepts, and a one-process group runs as plain batch norm.
    sbn, bn = convert_syncbn_model(nn.BatchNorm1d(5), process_group=group), nn.BatchNorm1d(5)
    x = torch.randn(8, 5)
    torch.testing.assert_close(sbn(x), bn(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"group_size=2 does not divide the world size 1: pass a divisor of it \(1\)"):
        create_syncbn_process_group(2)
    with pytest.raises(ValueError, match="group_size must be an int >= 0"):
        create_syncbn_process_group(-1)


def test_syncbn_process_group_needs_an_initialized_group():
    from ampkit.apex.parallel import create_syncbn_process_group

    with pytest.raises(RuntimeError, match=r"init_process_group"):
        create_syncbn_process_group(2)


@pytest.mark.parametrize("rank", [0, 1, 2, 3, 4, 5])
def test_every_rank_creates_every_group_in_the_same_order(monkeypatch: pytest.MonkeyPatch, rank: int):
    # new_group is collective: a rank that skipped or reordered one would hang the job, so the calls are
    # checked on each rank of a world of 6 split into groups of 2 (the dist calls recorded, not run).
    from ampkit.apex.parallel import create_syncbn_process_group

    dist = torch.distributed
    calls: list[list[int]] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 6)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
    monkeypatch.setattr(dist, "new_group", lambda ranks=None, **kw: calls.append(list(ranks)) or tuple(ranks))
    group = create_syncbn_process_group(2)
    assert calls == [[0, 1], [2, 3], [4, 5]]
    assert rank in group and len(group) == 2


def _group_sums(rank: int) -> dict:
    from ampkit.apex.parallel import create_syncbn_process_group

    out = {}
    for size in (1, 2):
        group = create_syncbn_process_group(size)
        value = torch.tensor([rank + 1.0])
        torch.distributed.all_reduce(value, group=group)
        out[size] = value.item()
    return out


def _entry(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        torch.save(_group_sums(rank), f"{out}/rank{rank}.pt")
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow  # two spawned ranks (~5 s on 2 cores); the call order is checked above without processes
def test_syncbn_process_groups_on_two_ranks(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_entry, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    # Groups of 1: each rank reduces with itself; a group of 2: both ranks' values (1 + 2).
    assert (r0[1], r1[1]) == (1.0, 2.0)
    assert r0[2] == r1[2] == 3.0
