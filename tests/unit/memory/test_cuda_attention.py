"""A CUDA prediction made on this CPU keeps what CUDA's fused attention keeps, not the CPU math path's T x T tensors.

The control is the CPU's own flash kernel: with dropout off, the CPU runs fused attention that keeps the output and
a B x H x T logsumexp, exactly what CUDA's flash / memory-efficient kernels keep. With dropout on, the CPU falls back
to the math path (scores, softmax, dropout mask: B x H x T x T each, per layer); the CUDA prediction must not.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ampkit.memory import estimate, measure
from ampkit.memory._cuda_attention import CudaAttention, cuda_kernel

simulated = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: a cuda prediction runs CUDA's own kernels")

B, H, T, D, LAYERS, VOCAB = 4, 4, 128, 16, 2, 64


class SdpaAttention(nn.Module):
    def __init__(self, dropout: float, hand_written: bool = False) -> None:
        super().__init__()
        self.dropout, self.hand_written = dropout, hand_written
        self.qkv, self.proj = nn.Linear(H * D, 3 * H * D), nn.Linear(H * D, H * D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, H, D).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        p = self.dropout if self.training else 0.0
        if self.hand_written:  # keeps its scores on a GPU too: nothing to model
            scores = (q @ k.transpose(-2, -1)) / D**0.5
            y = F.dropout(scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1), p) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class TinyGPT(nn.Module):
    def __init__(self, dropout: float, hand_written: bool = False) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(VOCAB, H * D), nn.Linear(H * D, VOCAB)
        self.blocks = nn.ModuleList(SdpaAttention(dropout, hand_written) for _ in range(LAYERS))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x).transpose(1, 2)  # (B, vocab, T) for cross_entropy


def _models(hand_written: bool = False) -> tuple[nn.Module, nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The same weights with attention dropout on and off, and one batch."""
    torch.manual_seed(0)
    with_dropout = TinyGPT(0.1, hand_written)
    without = copy.deepcopy(with_dropout)
    for block in without.blocks:
        block.dropout = 0.0
    tokens = torch.randint(0, VOCAB, (B, T))
    return with_dropout, without, (tokens, torch.randint(0, VOCAB, (B, T)))


@simulated
@pytest.mark.parametrize(("policy", "kernel"), [("32-true", "efficient"), ("bf16-mixed", "flash")])
def test_cuda_prediction_drops_the_attention_matrices_the_cpu_math_path_keeps(policy: str, kernel: str):
    model, no_dropout, batch = _models()
    cpu, cuda = estimate(model, batch, policy=policy, device="cpu"), estimate(model, batch, policy=policy, device="cuda")
    assert (cuda.simulated_on, cuda.attention, cpu.attention) == ("cpu", kernel, None)
    # The math path keeps at least the softmax and the dropped-out copy of it (fp32: it runs outside autocast).
    math_path = 2 * B * H * T * T * 4 * LAYERS
    assert cpu.activations - cuda.activations >= math_path
    assert cpu.peak - cuda.peak >= math_path
    # Control: the CPU's fused kernel keeps exactly what CUDA's keep, up to CUDA's two RNG-state scalars per call.
    fused = estimate(no_dropout, batch, policy=policy, device="cpu")
    assert abs(cuda.activations - fused.activations) <= 64 * LAYERS
    assert abs(cuda.peak - fused.peak) <= 64 * LAYERS


def test_cpu_prediction_is_unchanged_and_agrees_with_a_real_run():
    model, _, batch = _models()
    e, m = estimate(model, batch, policy="bf16-mixed", device="cpu"), measure(model, batch, policy="bf16-mixed", device="cpu")
    assert (e.activations, e.peak, e.attention) == (m.activations, m.peak, None)


@simulated
def test_hand_written_attention_is_left_as_it_is():
    model, _, batch = _models(hand_written=True)
    cpu, cuda = estimate(model, batch, device="cpu"), estimate(model, batch, device="cuda")
    assert (cuda.activations, cuda.peak, cuda.attention) == (cpu.activations, cpu.peak, None)


@pytest.mark.parametrize(
    ("dtype", "head", "mask", "expected"),
    [
        (torch.bfloat16, 64, False, "flash"),
        (torch.float16, 256, False, "flash"),
        (torch.bfloat16, 320, False, "efficient"),  # flash stops at 256
        (torch.bfloat16, 64, True, "efficient"),  # flash takes no arbitrary mask
        (torch.float32, 64, False, "efficient"),  # flash has no fp32
        (torch.float32, 6, False, "math"),  # rows not 16-byte aligned for the efficient kernel's GEMMs
        (torch.float64, 64, False, "math"),
    ],
)
def test_the_kernel_torch_picks_on_cuda(dtype: torch.dtype, head: int, mask: bool, expected: str):
    q = torch.empty(2, 3, 8, head, dtype=dtype, device="meta")
    assert cuda_kernel(q, q, q, torch.ones(8, 8, dtype=torch.bool, device="meta") if mask else None) == expected


@pytest.mark.parametrize("head", [36, 64])  # 36: flash pads the head dim to 40 and slices the output back
@pytest.mark.parametrize(("dtype", "masked", "kernel"), [(torch.bfloat16, False, "flash"), (torch.float32, True, "efficient"), (torch.float64, False, "math")])
def test_every_kernel_gives_sdpa_s_output_and_gradient_shapes(head: int, dtype: torch.dtype, masked: bool, kernel: str):
    """CUDA's kernels have no CPU implementation, only fake ones: shapes and dtypes are what is checked."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = (torch.empty(2, 3, 16, head, dtype=dtype, requires_grad=True) for _ in range(3))
        mask = torch.ones(16, 16, dtype=torch.bool) if masked else None
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not masked)
        with CudaAttention() as cuda:
            got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not masked)
        grads = torch.autograd.grad(got.sum(), (q, k, v))
    assert cuda.kernels == {kernel: 1}
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    assert [(g.shape, g.dtype) for g in grads] == [(t.shape, t.dtype) for t in (q, k, v)]


@simulated
def test_hugging_face_gpt2_takes_the_sdpa_path():
    transformers = pytest.importorskip("transformers", reason="Requires: transformers (pip install -e '.[hf]')")
    config = transformers.GPT2Config(n_layer=LAYERS, n_embd=H * D, n_head=H, n_positions=T, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")  # random init, nothing downloaded
    tokens = torch.randint(0, VOCAB, (B, T))

    def loss_fn(output: object, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.logits.flatten(0, 1).float(), targets.flatten())

    cpu, cuda = (estimate(model, (tokens, tokens), policy="32-true", device=d, loss_fn=loss_fn) for d in ("cpu", "cuda"))
    assert cuda.attention == "efficient"
    assert cpu.activations - cuda.activations >= 2 * B * H * T * T * 4 * LAYERS  # attn_pdrop=0.1: the CPU's math path


@pytest.mark.parametrize(("dtype", "kernel"), [(torch.float32, "flash"), (torch.float64, "math")])
def test_autocast_casts_as_cuda_s_autocast_does(dtype: torch.dtype, kernel: str):
    """Attention is on autocast's 16-bit list: fp32 inputs reach flash in bf16; autocast never casts fp64."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), torch.autocast("cpu", dtype=torch.bfloat16), CudaAttention() as cuda:
        q = torch.empty(2, 3, 16, 64, dtype=dtype)
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert cuda.kernels == {kernel: 1} and out.dtype == (torch.bfloat16 if kernel == "flash" else dtype)
