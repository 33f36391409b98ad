"""estimate() (fake tensors, nothing allocated) against measure() (the same steps on real tensors), on the CPU.

The control is the real run: on the CPU every part of the breakdown and the peak of live bytes must agree to
the byte, for every policy, with optimizers that keep different state, with clipping, with tied weights.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ampkit
from ampkit.memory import MemoryEstimate, estimate, measure
from ampkit.policy import policy_names

CPU_POLICIES = [p for p in policy_names() if ampkit.get_policy(p).support("cpu").supported]


def mlp() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.LayerNorm(64), nn.Linear(64, 10))
    return model, (torch.randn(32, 64), torch.randint(0, 10, (32,)))


def cnn() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    ).to(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 8, 8).to(memory_format=torch.channels_last)
    return model, (x, torch.randint(0, 5, (4,)))


class TinyLM(nn.Module):
    """Embedding tied to the output head, one attention block: tied weights must be counted once."""

    def __init__(self, vocab: int = 50, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.block = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.block(self.embed(tokens)))).transpose(1, 2)  # (B, vocab, T) for cross_entropy


def lm() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (2, 12))
    return TinyLM(), (tokens, torch.randint(0, 50, (2, 12)))


def adamw(params: object) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, fused=True)


def sgd(params: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True)


def _same(e: MemoryEstimate, m: MemoryEstimate) -> None:
    assert (e.method, m.method) == ("estimate", "measure")
    for field in ("parameters", "gradients", "optimizer_state", "master_weights", "activations", "batch", "peak", "total"):
        assert getattr(e, field) == getattr(m, field), field


@pytest.mark.parametrize("policy", CPU_POLICIES)
def test_mlp_estimate_equals_measurement_for_every_policy(policy: str):
    model, batch = mlp()
    opt = adamw(model.parameters())
    _same(estimate(model, batch, opt, policy=policy, clip_grad_norm=1.0), measure(model, batch, opt, policy=policy, clip_grad_norm=1.0))


@pytest.mark.parametrize("policy", ["32-true", "bf16-mixed", "bf16-true-masters"])
@pytest.mark.parametrize("build", [cnn, lm], ids=["cnn-channels-last", "tied-lm"])
def test_other_models_estimate_equals_measurement(build, policy: str):
    model, batch = build()
    _same(estimate(model, batch, sgd, policy=policy), measure(model, batch, sgd, policy=policy))


def test_the_parts_are_what_the_policy_stores():
    model, batch = mlp()
    n = sum(p.numel() for p in model.parameters())
    fp32 = estimate(model, batch, adamw, policy="32-true")
    assert fp32.parameters == fp32.gradients == 4 * n
    assert fp32.optimizer_state == 2 * 4 * n + 4 * len(list(model.parameters()))  # exp_avg, exp_avg_sq, step
    assert fp32.master_weights == 0
    masters = estimate(model, batch, adamw, policy="bf16-true-masters")
    # bf16 model (LayerNorm stays fp32), fp32 masters plus their gradient buffers, state kept for the masters.
    ln = sum(p.numel() for p in model[3].parameters())
    assert masters.parameters == masters.gradients == 2 * (n - ln) + 4 * ln
    assert masters.master_weights == 2 * 4 * (n - ln)
    assert masters.optimizer_state == fp32.optimizer_state
    assert fp32.total == sum(getattr(fp32, k) for k in ("parameters", "gradients", "optimizer_state", "master_weights", "activations"))
    assert fp32.peak >= fp32.parameters + fp32.optimizer_state + fp32.batch


def test_bf16_mixed_halves_the_saved_activations_of_an_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    # A batch large enough that activations dwarf the bf16 weight copies autocast saves (0.5 MiB per layer).
    batch = (torch.empty(8192, 512, device="meta"), torch.zeros(8192, dtype=torch.long, device="meta"))
    ratio = estimate(model, batch, policy="bf16-mixed", device="cpu").activations / estimate(model, batch, policy="32-true", device="cpu").activations
    assert 0.5 <= ratio < 0.53  # the physical limit is 0.5


def test_a_meta_model_is_estimated_like_the_real_one():
    model, batch = mlp()
    meta_model = copy.deepcopy(model).to("meta")
    meta_batch = tuple(t.to("meta") for t in batch)
    for policy in ("32-true", "bf16-true-masters"):
        assert estimate(meta_model, meta_batch, adamw, policy=policy, device="cpu") == estimate(model, batch, adamw, policy=policy)


def test_activations_grow_linearly_with_the_batch():
    model, (x, y) = mlp()
    a1 = estimate(model, (x, y), policy="bf16-mixed").activations
    a2 = estimate(model, (torch.cat([x, x]), torch.cat([y, y])), policy="bf16-mixed").activations
    a4 = estimate(model, (torch.cat([x] * 4), torch.cat([y] * 4)), policy="bf16-mixed").activations
    assert a4 - a2 == 2 * (a2 - a1) > 0


def test_nothing_is_allocated_and_the_model_is_untouched():
    model, batch = mlp()
    opt = adamw(model.parameters())
    before = copy.deepcopy(model.state_dict())
    with torch.device("meta"):
        huge = nn.Sequential(*[nn.Linear(8192, 8192) for _ in range(8)])  # 2 GiB of fp32 weights
    e = estimate(huge, (torch.empty(8, 8192, device="meta"), torch.zeros(8, dtype=torch.long, device="meta")), adamw, policy="32-true", device="cpu")
    assert e.parameters == 8 * (8192 * 8192 + 8192) * 4
    estimate(model, batch, opt, policy="16-true-masters")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(p.grad is None for p in model.parameters()) and not opt.state
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_a_cuda_target_is_simulated_on_the_cpu_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: the estimate runs on fake CUDA tensors instead")
    model, batch = mlp()
    e = estimate(model, batch, adamw, policy="tf32", device="cuda")
    assert (e.device, e.simulated_on, e.precision) == ("cuda", "cpu", "tf32")
    assert e.total == estimate(model, batch, adamw, policy="32-true").total


def test_fp16_overflow_reads_answer_no_overflow():
    # 16-mixed reads the overflow flag every step; on fake tensors that read must not fail or skip the step.
    model, batch = mlp()
    e = estimate(model, batch, adamw, policy="16-mixed")
    assert e.optimizer_state > 0  # the optimizer stepped (its state exists): the step was not skipped


def test_bad_input_gets_a_clear_error():
    model, batch = mlp()
    with pytest.raises(ampkit.PolicyError, match="bf17"):
        estimate(model, batch, policy="bf17-mixed")
    stranger = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="optimizer=lambda params"):
        estimate(model, batch, stranger)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="use estimate"):
            measure(model, batch, device="cuda")
    with pytest.raises(ValueError, match="Use estimate"):
        measure(model.to("meta"), batch)


def test_a_plain_tensor_attribute_is_copied_as_a_fake_too():
    """A module holding a tensor that is neither a parameter nor a buffer (a cached mask) is estimated as measured."""

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.mask = torch.tril(torch.ones(16, 16))  # plain attribute, as some attention code keeps it

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) @ self.mask

    torch.manual_seed(0)
    model, batch = Masked(), (torch.randn(8, 16), torch.randint(0, 16, (8,)))
    e, m = estimate(model, batch, policy="bf16-mixed"), measure(model, batch, policy="bf16-mixed")
    assert (e.total, e.peak) == (m.total, m.peak)


@pytest.mark.parametrize("fn", [estimate, measure])
@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("model", (torch.randn(2, 4), torch.tensor([0, 1]))), {}, "takes the model (an nn.Module) first, got str 'model'"),
        ((nn.Linear(4, 2), None, None), {}, "needs example_batch=(inputs, targets)"),
        ((nn.Linear(4, 2), torch.randn(2, 4)), {}, "needs example_batch=(inputs, targets)"),
        ((nn.Linear(4, 2), ("x", torch.tensor([0, 1]))), {}, "the inputs of example_batch hold no tensor"),
        ((nn.Linear(4, 2), (torch.randn(2, 4), torch.tensor([0, 1]))), {"loss_fn": "ce"}, "loss_fn must be a callable"),
    ],
)
def test_bad_arguments_are_named_before_any_work(fn, args, kwargs, message):
    with pytest.raises(TypeError) as info:
        fn(*args, **kwargs)
    assert message in str(info.value) and str(info.value).startswith(f"{fn.__name__}()")


def test_estimate_against_measure_and_the_allocator_on_the_device(device: torch.device, mixed_policy: str):
    """The prediction (fake tensors) against the same two steps on real tensors, and on CUDA against the allocator.

    CPU: every part agrees to the byte. CUDA: the training state and the batch agree to the byte (they follow from
    shapes and dtypes); activations and the peak within 1% (a fake kernel may size a saved tensor, such as a
    kernel's reserve space, unlike CUDA's). ``torch.cuda.max_memory_allocated`` is at least the exact peak and at most
    5% + 64 MiB above it: the allocator rounds every block up (to 512 B, large blocks to their segment split), and
    holds what no tensor holds, the cuBLAS/cuBLASLt workspaces (32 MiB on Hopper) and cuDNN's.
    """
    cuda = device.type == "cuda"
    width, rows = (1024, 8192) if cuda else (64, 32)  # on CUDA a step whose ~0.5 GiB peak dwarfs the allocator's slack
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.LayerNorm(width), nn.Linear(width, 10))
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(rows, width, generator=g), torch.randint(0, 10, (rows,), generator=g))
    e = estimate(model, batch, adamw, policy=mixed_policy, device=device, clip_grad_norm=1.0)
    m = measure(model, batch, adamw, policy=mixed_policy, device=device, clip_grad_norm=1.0)
    assert (e.device, e.simulated_on, m.device) == (str(device), None, str(device))
    if not cuda:
        _same(e, m)
        assert m.allocator_peak is None
        return
    for field in ("parameters", "gradients", "optimizer_state", "master_weights", "batch"):
        assert getattr(e, field) == getattr(m, field), field
    for field in ("activations", "peak"):
        assert abs(getattr(e, field) - getattr(m, field)) <= 0.01 * getattr(m, field), field
    assert m.peak <= m.allocator_peak <= 1.05 * m.peak + 64 * 2**20


def test_a_cuda_estimate_allocates_nothing_on_the_gpu(device: torch.device, mixed_policy: str):
    if device.type != "cuda":
        pytest.skip("a CPU estimate's allocations are checked by test_nothing_is_allocated_and_the_model_is_untouched")
    model, batch = mlp()  # LayerNorm included: its fake output dtypes are learnt from a real kernel, on the CPU
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    e = estimate(model, batch, adamw, policy=mixed_policy, device=device)
    torch.cuda.synchronize(device)
    assert (e.device, e.simulated_on) == (str(device), None) and e.total > 0
    assert torch.cuda.max_memory_allocated(device) == torch.cuda.memory_allocated(device) == before


def test_kahan_costs_2_bytes_per_bf16_parameter_and_stochastic_rounding_none() -> None:
    pytest.importorskip("optimi", reason="Requires: torch-optimi (pip install -e '.[lowbit]')")
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[lowbit]')")
    model, batch = mlp()
    n = sum(p.numel() for p in model.parameters())
    est = {p: estimate(model, batch, torch.optim.AdamW, policy=p) for p in ("bf16-true", "bf16-true-kahan", "bf16-true-sr")}
    # The moments stay bf16 under all three; Kahan adds its bf16 compensation buffer, and optimi keeps its step
    # counter per group where torch and torchao keep one per parameter tensor (4 bytes each).
    counters = 4 * len(list(model.parameters()))
    assert est["bf16-true-kahan"].optimizer_state == est["bf16-true"].optimizer_state - counters + 2 * n
    assert est["bf16-true-sr"].optimizer_state == est["bf16-true"].optimizer_state
    assert {e.master_weights for e in est.values()} == {0}
