"""Engine(compile=...): compiled in place (plain checkpoint keys), the policies' hooks inside one graph, regional
compilation per block, a user-compiled model recognised; each compiled run checked against its eager twin."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit._compat import module_instances_share_compiled_code
from ampkit.training._compile import CompilePlan, compile_plan

STEPS = 3

# Dynamo reads .grad of the block inputs it traces (non-leaf tensors) and torch warns about it: torch's chatter,
# not ampkit's, and made an error by the suite's filterwarnings.
pytestmark = pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(self.norm(x)))


def model(seed: int = 0, width: int = 16) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, width), Block(width), Block(width), nn.LayerNorm(width), nn.Linear(width, 3))


class GraphCounter:
    """A torch.compile backend that runs the captured graph as it is and counts the graphs it was given."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        self.graphs += 1
        return gm.forward


def train(engine: Engine, net: nn.Module, steps: int = STEPS, sgd: bool = False) -> nn.Module:
    opt = torch.optim.SGD(net.parameters(), lr=0.1) if sgd else torch.optim.AdamW(net.parameters(), lr=1e-2)
    net, _ = engine.setup(net, opt)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
        with engine.autocast():
            loss = nn.functional.cross_entropy(net(x).float(), y)
        engine.backward(loss)
        engine.step()
    return net


def params(engine: Engine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.named_parameters()}


# ------------------------------------------------------------------------------------------ the option
@pytest.mark.parametrize(
    "spec, plan",
    [
        (None, None),
        (False, None),
        (True, CompilePlan()),
        ("regional", CompilePlan(regional=True)),
        ({"mode": "max-autotune"}, CompilePlan(options={"mode": "max-autotune"})),
        ({"regional": True, "dynamic": False}, CompilePlan(regional=True, options={"dynamic": False})),
    ],
)
def test_compile_option_forms(spec: Any, plan: CompilePlan | None) -> None:
    assert compile_plan(spec) == plan


@pytest.mark.parametrize("spec", ["yes", 1, {"regional": "yes"}, ["regional"]])
def test_a_bad_compile_option_names_the_accepted_forms(spec: Any) -> None:
    with pytest.raises(ValueError, match=r"compile="):
        Engine(compile=spec)


# ------------------------------------------------------------------------------------------ correctness
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true", "bf16-true-masters"])
def test_every_policy_compiles_into_one_graph_without_a_break(precision: str) -> None:
    """fullgraph=True raises on any graph break: the policy's input/output casts and fp32 islands trace. A counting
    backend proves a graph was captured at all (torch skips nn.Sequential's own frames when given _call_impl)."""
    counter = GraphCounter()
    engine = Engine(precision, compile={"backend": counter, "fullgraph": True})
    train(engine, model(), steps=1)
    assert engine.compiled == [""] and counter.graphs == 1


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true-masters"])
def test_a_compiled_run_matches_its_eager_twin(precision: str) -> None:
    """Control: the same weights and batches, eager. aot_eager traces forward and backward through AOTAutograd
    (what inductor compiles) and runs the captured aten graph unfused, so every update must be bitwise equal. (The
    masters policies' fused step, which compile brings, is off here: test_fused_master_step checks it.)"""
    eager, compiled = Engine(precision), Engine(precision, compile={"backend": "aot_eager"}, fused_step=False)
    train(eager, model())
    train(compiled, model())
    want, got = params(eager), params(compiled)
    assert list(got) == list(want)
    assert all(torch.equal(got[name], want[name]) for name in want)


def test_inductor_compiles_a_run_that_matches_eager() -> None:
    """The default backend (inductor: C++ on the CPU), once: a bf16-mixed run against its eager twin. SGD, whose
    update is proportional to the gradient: Adam's first steps move a weight by about lr whatever its gradient's
    size, so a near-zero gradient that rounds to the other sign would differ by 2 lr and say nothing."""
    eager, compiled = Engine("bf16-mixed"), Engine("bf16-mixed", compile=True)
    train(eager, model(), sgd=True)
    train(compiled, model(), sgd=True)
    want, got = params(eager), params(compiled)
    moved = max(float((want[n] - p.detach()).abs().max()) for n, p in model().named_parameters())
    assert moved > 1e-2  # the run trained: a difference below means something
    for name in want:  # inductor fuses and reorders bf16 arithmetic: close, not bitwise
        torch.testing.assert_close(got[name], want[name], rtol=1e-2, atol=1e-3)


def test_regional_compiles_each_repeated_block_and_refuses_a_model_without_any() -> None:
    counter = GraphCounter()
    engine = Engine("bf16-mixed", compile={"backend": counter, "regional": True})
    train(engine, model(), steps=2)
    assert engine.compiled == ["1", "2"]
    assert 1 <= counter.graphs <= 2  # the second block reuses the first one's code (at most one recompile)
    plain = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"no repeated blocks in Linear.*compile=True"):
        Engine("bf16-true", compile="regional").setup(plain)
    assert plain.weight.dtype == torch.float32 and not plain._forward_pre_hooks  # refused before the policy touched it


class Residual(nn.Module):
    """A ResNet block in miniature: a projection shortcut where the width changes, so blocks differ in shape."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.fc = nn.Linear(cin, cout)
        self.norm = nn.LayerNorm(cout)
        self.shortcut: nn.Module = nn.Identity() if cin == cout else nn.Linear(cin, cout, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shortcut(x) + torch.relu(self.norm(self.fc(x)))


def resnet_like() -> nn.Module:
    """Five blocks of three shapes: 8->8 twice, 8->16 once (a stage's first block), 16->16 twice."""
    torch.manual_seed(0)
    blocks = nn.Sequential(Residual(8, 8), Residual(8, 8), Residual(8, 16), Residual(16, 16), Residual(16, 16))
    return nn.Sequential(nn.Linear(8, 8), blocks, nn.Linear(16, 3))


def test_regional_compiles_each_distinct_block_shape_once_and_never_recompiles() -> None:
    """Blocks of different shapes compiled through one shared code object recompiled it once per shape (seven
    times on a ResNet-18), each call checking every earlier graph's guards, and past the recompile limit ran
    eagerly. error_on_recompile raises on any recompile; the counting backend sees one graph per distinct shape."""
    counter = GraphCounter()
    engine = Engine("32-true", compile={"backend": counter, "regional": True})
    with torch._dynamo.config.patch(error_on_recompile=True):
        train(engine, resnet_like(), steps=2, sgd=True)
    assert engine.compiled == ["1.0", "1.1", "1.2", "1.3", "1.4"]
    # On a torch whose dynamo guards each block's call by identity (2.7), each block compiles once, on its own code.
    assert counter.graphs == (3 if module_instances_share_compiled_code() else 5)


def test_regional_shares_one_compile_among_blocks_that_differ_only_in_attributes_forward_never_reads() -> None:
    """A transformer's layers often record their index (transformers' layer_idx), which forward reads only with a
    KV cache: dynamo then never guards on it, and one compile serves every layer. Only torch's own layers' settings
    (a conv's stride, a dropout's p) split blocks by shape."""
    if not module_instances_share_compiled_code():
        pytest.skip(f"torch {torch.__version__} guards each block's call by identity: blocks never share a compile")
    net = model()
    for i, block in enumerate([net[1], net[2]]):
        block.layer_idx = i
    counter = GraphCounter()
    engine = Engine("32-true", compile={"backend": counter, "regional": True})
    with torch._dynamo.config.patch(error_on_recompile=True):
        train(engine, net, steps=1, sgd=True)
    assert engine.compiled == ["1", "2"] and counter.graphs == 1


def test_regional_names_the_blocks_that_compile_on_their_own(caplog: pytest.LogCaptureFixture) -> None:
    """A block whose shape no other block has gains nothing from regional compilation: said at setup, by name;
    blocks that all share their shape get no warning."""
    if not module_instances_share_compiled_code():
        with caplog.at_level(logging.WARNING, logger="ampkit"):
            Engine("32-true", compile={"backend": GraphCounter(), "regional": True}).setup(resnet_like())
        (said,) = [r.message for r in caplog.records if "compile='regional'" in r.message]
        assert "each of the 5 blocks of Sequential compiles on its own (5 compiles)" in said
        return
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        Engine("32-true", compile={"backend": GraphCounter(), "regional": True}).setup(resnet_like())
    lone = [r.message for r in caplog.records if "compile='regional'" in r.message]
    assert len(lone) == 1 and "block 1.2 of Sequential" in lone[0] and "3 compiles for 5 blocks" in lone[0]
    assert "1.0 with 1.1; 1.3 with 1.4" in lone[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        Engine("32-true", compile={"backend": GraphCounter(), "regional": True}).setup(model())
    assert not [r for r in caplog.records if "compile='regional'" in r.message]


# ------------------------------------------------------------------------------------------ checkpoints
def test_checkpoints_keep_plain_keys_and_move_between_compiled_and_eager_runs(tmp_path: Path) -> None:
    compiled = Engine("bf16-mixed", compile={"backend": "aot_eager"})
    net = train(compiled, model())
    assert not any("_orig_mod" in k for k in net.state_dict())
    compiled.save(tmp_path / "compiled.pt")

    eager = Engine("bf16-mixed")
    eager_net = model(seed=5)
    eager.setup(eager_net, torch.optim.AdamW(eager_net.parameters(), lr=1e-2))
    eager.load(tmp_path / "compiled.pt")
    assert all(torch.equal(p, params(compiled)[n]) for n, p in params(eager).items())
    eager.save(tmp_path / "eager.pt")

    again = Engine("bf16-mixed", compile={"backend": "aot_eager"})
    again_net = model(seed=7)
    again.setup(again_net, torch.optim.AdamW(again_net.parameters(), lr=1e-2))
    again.load(tmp_path / "eager.pt")
    assert all(torch.equal(p, params(compiled)[n]) for n, p in params(again).items())


def test_a_model_the_user_compiled_is_trained_through_the_module_inside_it() -> None:
    inner = model()
    reference = copy.deepcopy(inner)
    # The wrapper's own options are private to torch: the engine compiles with its own (here aot_eager, for bitwise).
    engine = Engine("bf16-mixed", compile={"backend": "aot_eager"})
    net = train(engine, torch.compile(inner))
    assert net is inner and engine.models[0] is inner and engine.compiled == [""]
    assert not any("_orig_mod" in n for n, _ in engine.named_parameters())
    control = Engine("bf16-mixed")
    train(control, reference)
    got = params(engine)
    assert all(torch.equal(got[name], p) for name, p in params(control).items())  # aot_eager: bitwise


@pytest.mark.parametrize("regional", [False, True], ids=["whole", "regional"])
def test_recomputed_blocks_compile_and_train_as_they_do_eagerly(regional: bool) -> None:
    """Recompute runs each Block under torch.utils.checkpoint; dynamo traces the checkpointed call, and the run
    (aot_eager) ends bitwise where the same recomputed run does eagerly."""
    from ampkit.memory._recompute import recompute, recomputed_modules

    eager_net, compiled_net = model(), model()
    for net in (eager_net, compiled_net):
        recompute(net, [Block])
        assert recomputed_modules(net) == ["1", "2"]
    eager = Engine("bf16-mixed")
    compiled = Engine("bf16-mixed", compile={"backend": "aot_eager", "regional": regional})
    train(eager, eager_net)
    train(compiled, compiled_net)
    want, got = params(eager), params(compiled)
    assert all(torch.equal(got[name], want[name]) for name in want)


def test_every_engine_of_a_process_compiles_past_dynamos_recompile_limit() -> None:
    # Dynamo keeps at most 8 compiled entries per code object and then runs that code eagerly for good. Engines
    # whose models differ (here in width) must each get their own entries, the ninth as the first.
    limit = torch._dynamo.config.recompile_limit
    for width in range(4, 4 + limit + 2):
        counter = GraphCounter()
        net = model(width=width)
        engine = Engine("32-true", compile={"backend": counter})
        net = engine.setup(net)
        net(torch.randn(2, 8))
        assert counter.graphs == 1, f"engine {width - 3} ran eagerly"
