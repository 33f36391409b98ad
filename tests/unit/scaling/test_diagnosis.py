"""Collapse diagnosis: which parameters have non-finite gradients (device-generic), and the message built from them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.scaling._diagnosis import collapse_message, nonfinite_parameters

INF = float("inf")
NAN = float("nan")


def _sparse(indices, values, size):
    # check_invariants given explicitly: torch warns (an error under our filterwarnings) when left implicit.
    return torch.sparse_coo_tensor(indices, values, size, check_invariants=True)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3, sparse=True)
        self.enc = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
        self.head = nn.Linear(3, 2)
        self.unused = nn.Linear(3, 3)  # never gets a grad

    def forward(self, idx):
        return self.head(self.enc(self.emb(idx)))


def _net_with_grads(device):
    torch.manual_seed(0)
    net = Net().to(device)
    net(torch.tensor([0, 2, 2], device=device)).sum().backward()
    assert net.emb.weight.grad.is_sparse
    assert net.unused.weight.grad is None
    return net


def test_all_finite_gives_no_names(device):
    assert nonfinite_parameters(_net_with_grads(device).named_parameters()) == []


def test_names_exactly_the_nonfinite_dense_and_sparse_grads_in_order(device):
    net = _net_with_grads(device)
    net.enc[0].weight.grad[1, 2] = INF
    net.head.bias.grad[0] = NAN
    net.emb.weight.grad._values()[0, 1] = -INF
    assert nonfinite_parameters(net.named_parameters()) == ["emb.weight", "enc.0.weight", "head.bias"]


@pytest.mark.parametrize("bad", [INF, -INF, NAN])
def test_each_kind_of_nonfinite_is_named(device, bad):
    net = _net_with_grads(device)
    net.enc[1].bias.grad[2] = bad
    assert nonfinite_parameters(net.named_parameters()) == ["enc.1.bias"]


def test_uncoalesced_sparse_overflow_is_named(device):
    # Every stored value is a finite fp16, but the two entries at index 1 sum past fp16's max.
    p = nn.Parameter(torch.zeros(3, dtype=torch.float16, device=device))
    p.grad = _sparse(torch.tensor([[1, 1]]), torch.tensor([40000.0, 40000.0], dtype=torch.float16), (3,)).to(device)
    q = nn.Parameter(torch.zeros(3, dtype=torch.float16, device=device))
    q.grad = _sparse(torch.tensor([[1, 1]]), torch.tensor([1.0, 2.0], dtype=torch.float16), (3,)).to(device)
    assert nonfinite_parameters([("big", p), ("small", q)]) == ["big"]


def test_grad_none_is_skipped_even_with_nonfinite_weights():
    w = nn.Parameter(torch.tensor([INF, NAN]))  # the weight itself, not its grad
    assert w.grad is None
    assert nonfinite_parameters([("w", w)]) == []


REASON = "gradients overflowed with the loss scale already at its floor min_scale=1"


def test_collapse_message_with_offenders():
    offenders = ["enc.layers.3.attn.weight", "enc.layers.3.attn.bias", "head.weight"]
    msg = collapse_message(REASON, offenders, "16-mixed")
    assert REASON in msg
    assert "'16-mixed'" in msg
    for name in offenders:
        assert name in msg
    # One entry per module, sorted, in a keep_fp32 suggestion a user can paste.
    assert "keep_fp32=['enc.layers.3.attn', 'head']" in msg
    assert "bf16-mixed" in msg
    assert "No gradient is non-finite" not in msg


def test_collapse_message_without_offenders_says_so():
    msg = collapse_message(REASON, [], "16-mixed")
    assert REASON in msg
    assert "No gradient is non-finite" in msg
    assert "keep_fp32" not in msg


def test_collapse_message_truncates_long_offender_lists():
    offenders = [f"blocks.{i}.mlp.weight" for i in range(13)]
    msg = collapse_message(REASON, offenders, "16-mixed")
    for name in offenders[:10]:
        assert name in msg
    for name in offenders[10:]:
        assert name not in msg
    assert "and 3 more" in msg
    # The keep_fp32 suggestion still covers every offending module, not only the ten shown.
    assert "'blocks.12.mlp'" in msg


def test_diagnosis_end_to_end(device):
    net = _net_with_grads(device)
    net.enc[1].weight.grad.fill_(NAN)
    msg = collapse_message(REASON, nonfinite_parameters(net.named_parameters()), "fp16-mixed")
    assert "enc.1.weight" in msg
    assert "keep_fp32=['enc.1']" in msg
