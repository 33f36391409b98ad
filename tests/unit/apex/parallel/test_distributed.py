"""apex.parallel.DistributedDataParallel on torch's DDP, in a one-process group (gloo on the CPU; NCCL on CUDA for
the device-generic tests)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ampkit.apex.parallel import DistributedDataParallel
from ampkit.apex.parallel.distributed import bucket_cap_mb, infer_device_ids

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch built without torch.distributed")


def _model(device: torch.device | str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)


def test_trains_and_equals_a_plain_model_step(device_process_group: None, device: torch.device):
    plain = _model(device)
    wrapped = DistributedDataParallel(copy.deepcopy(plain), message_size=1000)
    assert isinstance(wrapped, nn.parallel.DistributedDataParallel)
    assert wrapped.device_ids == ([device.index] if device.type == "cuda" else None)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (plain, wrapped)]
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1)).to(device)
    y = torch.randn(16, 2, generator=torch.Generator().manual_seed(2)).to(device)
    losses = []
    for _ in range(3):
        for model, opt in zip((plain, wrapped), opts):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    for a, b in zip(plain.parameters(), wrapped.module.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Apex's DDP was a module holding .module too: the same state_dict keys.
    assert list(wrapped.state_dict()) == [f"module.{k}" for k in plain.state_dict()]


def test_message_size_maps_to_bucket_cap(process_group: None):
    wrapped = DistributedDataParallel(_model(), message_size=2**20)
    assert wrapped.message_size == 2**20
    assert bucket_cap_mb(_model(), 2**20) == 4.0  # fp32: 4 bytes per element
    assert bucket_cap_mb(_model().half(), 2**20) == 2.0
    assert bucket_cap_mb(nn.Module(), 2**20) == 4.0


def test_device_ids_inferred():
    assert infer_device_ids(_model()) is None
    assert infer_device_ids(_model().to("meta")) is None


@pytest.mark.gpu
def test_device_ids_for_a_cuda_module():
    assert infer_device_ids(_model().cuda()) == [torch.cuda.current_device()]


def test_performance_knobs_are_accepted_and_logged(process_group: None, caplog: pytest.LogCaptureFixture):
    model = _model()
    with caplog.at_level(logging.DEBUG, logger="ampkit"):
        DistributedDataParallel(
            model,
            delay_allreduce=True,
            allreduce_trigger_params=[next(model.parameters())],
            retain_allreduce_buffers=True,
            num_allreduce_streams=2,
            allreduce_communicators=object(),
            prof=True,
            gradient_average_split_factor=1.0,
        )
    text = caplog.text
    for knob in ("delay_allreduce", "allreduce_trigger_params", "retain_allreduce_buffers", "num_allreduce_streams", "allreduce_communicators", "prof"):
        assert f"{knob} is performance-only" in text
    assert "bucket_cap_mb" in text


def test_enable_disable_allreduce_toggle_sync(device_process_group: None, device: torch.device):
    wrapped = DistributedDataParallel(_model(device))
    wrapped.disable_allreduce()
    assert wrapped.require_backward_grad_sync is False
    wrapped(torch.randn(2, 4, device=device)).sum().backward()  # a local-only backward, as inside no_sync()
    wrapped.enable_allreduce()
    assert wrapped.require_backward_grad_sync is True
    wrapped(torch.randn(2, 4, device=device)).sum().backward()


def test_needs_an_initialised_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match=r"needs torch.distributed initialised: launch with torchrun.*init_process_group"):
        DistributedDataParallel(_model())


@pytest.mark.parametrize(
    ("kwargs", "error", "fix"),
    [
        ({"gradient_average": False}, NotImplementedError, r"always averages\. Multiply the loss by torch\.distributed\.get_world_size\(\)"),
        ({"allreduce_always_fp32": True}, NotImplementedError, r"Keep the parameters in fp32.*register_comm_hook"),
        ({"gradient_predivide_factor": 8.0}, NotImplementedError, r"gradient_predivide_factor=8\.0 .*Drop gradient_predivide_factor"),
        ({"gradient_average_split_factor": 4.0}, NotImplementedError, r"Drop gradient_average_split_factor"),
        ({"shared_param": True}, ValueError, r"Remove the shared_param argument"),
    ],
)
def test_numerics_changing_knobs_raise_with_the_fix(process_group: None, kwargs: dict, error: type, fix: str):
    with pytest.raises(error, match=fix):
        DistributedDataParallel(_model(), **kwargs)


def test_sync_batchnorm_in_a_cpu_module_is_refused_with_the_fix(process_group: None):
    from ampkit.apex.parallel import convert_syncbn_model

    model = convert_syncbn_model(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    with pytest.raises(ValueError, match=r"SyncBatchNorm layers \(1\) in a CPU module.*keep plain BatchNorm"):
        DistributedDataParallel(model)
    # The same model with plain BatchNorm wraps fine.
    DistributedDataParallel(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))


def test_numerics_errors_come_before_the_process_group_check():
    # A script with a refused option learns that first, even before torchrun is set up.
    with pytest.raises(NotImplementedError, match="gradient_average=False"):
        DistributedDataParallel(_model(), gradient_average=False)


def test_importable_under_apex_names(process_group: None):
    from ampkit.apex import install, uninstall

    install()
    try:
        from apex.parallel import DistributedDataParallel as DDP
        from apex.parallel.distributed import DistributedDataParallel as DDP2

        assert DDP is DistributedDataParallel is DDP2
        assert isinstance(DDP(_model()), nn.parallel.DistributedDataParallel)
    finally:
        uninstall()


def _cnn(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3)).to(device)


def test_apex_imagenet_recipe_sync_bn_ddp_and_amp_equals_plain_batchnorm(device_process_group: None, device: torch.device, apex_step, torch_amp_step):
    """Apex's ImageNet example: convert_syncbn_model, amp.initialize, then DDP; at world size 1 it is the plain run."""
    if device.type == "cpu":
        pytest.skip("torch's DDP refuses SyncBatchNorm in CPU modules (the refusal is tested above); runs on CUDA")
    from ampkit.apex import amp
    from ampkit.apex.parallel import convert_syncbn_model

    model, plain = convert_syncbn_model(_cnn(device)), _cnn(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    model = DistributedDataParallel(model)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**16, growth_interval=2000)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 3, 10, 10, generator=g).to(device), torch.randint(0, 3, (8,), generator=g).to(device)
        apex_step(model, opt, x, y)
        torch_amp_step(plain, plain_opt, scaler, x, y)
    for a, b in zip(model.module.state_dict().values(), plain.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
