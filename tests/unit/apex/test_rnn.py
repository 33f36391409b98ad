"""RNN modules and cells under O1 run in 16 bits, as Apex's O1 cast them (its tests/L0/run_amp/test_rnn.py)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from ampkit.apex import amp

H, B, T = 8, 3, 5
HALF = torch.bfloat16  # the CPU default
MODULES = {
    "LSTM": lambda: nn.LSTM(H, H, num_layers=2, bidirectional=True),
    "GRU": lambda: nn.GRU(H, H, num_layers=2),
    "RNN": lambda: nn.RNN(H, H, nonlinearity="relu"),
    "LSTMCell": lambda: nn.LSTMCell(H, H),
    "GRUCell": lambda: nn.GRUCell(H, H),
    "RNNCell": lambda: nn.RNNCell(H, H),
}


def _hidden(name: str, module: nn.Module, dtype: torch.dtype):
    if "Cell" in name:
        shape = (B, H)
    else:
        shape = (module.num_layers * (2 if module.bidirectional else 1), B, H)
    h = torch.randn(shape).to(dtype)
    return (h, torch.randn(shape).to(dtype)) if name.startswith("LSTM") else h


def _run(name: str, module: nn.Module, x: torch.Tensor, hidden) -> torch.Tensor:
    if "Cell" in name:
        for step in x:
            hidden = module(step, hidden)
        return hidden[0] if isinstance(hidden, tuple) else hidden
    return module(x, hidden)[0]


@pytest.mark.parametrize("name", MODULES)
@pytest.mark.parametrize("in_dtype", [torch.float32, HALF])
def test_rnn_runs_in_16_bits_under_init(name, in_dtype):
    torch.manual_seed(0)
    module = MODULES[name]()
    x = torch.randn(T, B, H).to(in_dtype).requires_grad_()
    hidden = _hidden(name, module, in_dtype)
    # Control: the same weights, inputs and hidden state cast to 16 bits by hand, without amp.
    ref_module = copy.deepcopy(module).to(HALF)
    ref = _run(name, ref_module, x.detach().to(HALF), tuple(h.to(HALF) for h in hidden) if isinstance(hidden, tuple) else hidden.to(HALF))
    ref.float().sum().backward()
    handle = amp.init()
    try:
        out = _run(name, module, x, hidden)
        out.float().sum().backward()
    finally:
        handle._deactivate()
    assert out.dtype == HALF
    assert torch.equal(out, ref)
    assert x.grad.dtype == in_dtype  # the gradient comes back in the input's own type
    # fp32 weights get fp32 gradients, the 16-bit control's (the casts are differentiable copies). A cell is
    # called once per step, and its per-step gradients add up in fp32 here but in 16 bits in the control.
    for p, q in zip(module.parameters(), ref_module.parameters()):
        assert p.grad.dtype == torch.float32
        if "Cell" in name:
            torch.testing.assert_close(p.grad, q.grad.float(), rtol=2e-2, atol=2e-2)
        else:
            assert torch.equal(p.grad, q.grad.float())


def test_packed_sequence_rnn_is_half():
    rnn = nn.RNN(H, H, num_layers=2)
    x = torch.randn(T, B, H, requires_grad=True)
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([T, T - 1, 2]))
    handle = amp.init()
    try:
        out, _ = rnn(packed, torch.zeros(2, B, H))
        out.data.float().sum().backward()
    finally:
        handle._deactivate()
    assert out.data.dtype == HALF and x.grad.dtype == torch.float32


@pytest.mark.parametrize("name", ["LSTM", "GRU", "LSTMCell"])
def test_rnn_is_16_bit_inside_an_o1_forward(name):
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = MODULES[name]()
            self.seen: torch.dtype | None = None

        def forward(self, x):
            out = _run(name, self.rnn, x, _hidden(name, self.rnn, torch.float32))
            self.seen = out.dtype
            return out

    net = Net()
    net, _ = amp.initialize(net, torch.optim.SGD(net.parameters(), lr=0.1), opt_level="O1", verbosity=0)
    assert net(torch.randn(T, B, H)).dtype == torch.float32  # the model's output leaves in fp32
    assert net.seen == HALF


# nn.LSTM under CPU autocast in fp16 reached oneDNN's fp16 LSTM, which this CPU lacks (a RuntimeError here; a
# crash is possible elsewhere), so the O1 model runs in a child process.
_FP16_LSTM = textwrap.dedent(
    """
    import copy, torch
    from torch import nn
    from ampkit.apex import amp

    torch.manual_seed(0)
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 8)
            self.head = nn.Linear(8, 1)
        def forward(self, x):
            return self.head(self.lstm(x)[0]).mean()

    net = Net()
    ref = copy.deepcopy(net).half()
    x = torch.randn(5, 3, 8)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net, opt = amp.initialize(net, opt, opt_level="O1", verbosity=0)
    for _ in range(2):
        loss = net(x)
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step(); opt.zero_grad()
    print(net.lstm.weight_ih_l0.dtype, net.lstm.weight_ih_l0.grad is None)
    with torch.no_grad():
        ref.load_state_dict({k: v.half() for k, v in net.state_dict().items()})
        print("match", float(net(x)) == float(ref(x.half()).float()))
    """
)


def test_fp16_lstm_under_o1_on_cpu_runs_and_matches_its_fp16_control():
    env = {**os.environ, "AMPKIT_APEX_HALF_DTYPE": "float16"}
    proc = subprocess.run([sys.executable, "-c", _FP16_LSTM], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torch.float32 True" in proc.stdout and "match True" in proc.stdout, proc.stdout
