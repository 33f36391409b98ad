"""recompute(): checkpointed blocks give the same gradients, hold less for backward, and the figures are honest.

Controls, independent of the code under test: gradients and running statistics of an untouched copy of the
model; the bytes held between forward and backward counted by hand from the ops' saving rules; the same bytes
measured here on real tensors with a LiveBytes harness written in this file.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import ampkit
from ampkit.memory._accounting import LiveBytes, tensor_bytes
from ampkit.memory._recompute import (
    RecomputeReport,
    recompute,
    recomputed_modules,
    unrecompute,
)
from ampkit.workloads._gpt import GPT, Block as GPTBlock, lm_cross_entropy
from ampkit.workloads._resnet import BasicBlock, ResNet18

D, H, B = 32, 128, 16  # width, hidden width, batch of the hand-counted model


class MLPBlock(nn.Module):
    """``x + fc2(relu(fc1(x)))``: saves fc1's input (B x D) and relu's output (B x H, which fc2 reads too)."""

    def __init__(self, d: int = D, h: int = H, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if scale is not None:
            h = h * scale
        return x + self.drop(self.fc2(h))


class Net(nn.Module):
    def __init__(self, n: int = 4, dropout: float = 0.0, kwarg: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(D, D)
        self.blocks = nn.ModuleList(MLPBlock(dropout=dropout) for _ in range(n))
        self.head = nn.Linear(D, 10)
        self.kwarg = kwarg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        # A tensor made in the forward and handed to every block by keyword: checkpoint must keep it.
        scale = torch.sigmoid(x.mean(1, keepdim=True)).expand(-1, H).contiguous() if self.kwarg else None
        for block in self.blocks:
            x = block(x, scale=scale) if self.kwarg else block(x)
        return self.head(x)


def net(n: int = 4, dropout: float = 0.0, kwarg: bool = False, seed: int = 0) -> tuple[Net, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(seed)
    return Net(n, dropout, kwarg), (torch.randn(B, D), torch.randint(0, 10, (B,)))


def held_for_backward(model: nn.Module, batch, loss_fn=F.cross_entropy, autocast: bool = False) -> int:
    """The control: bytes live between forward and backward of a real step, weights and batch left out."""
    x, y = batch
    with LiveBytes() as live:
        live.track([*model.parameters(), *model.buffers(), x, y])
        base = live.current
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(model(x).float(), y)
        held = live.current - base - tensor_bytes([loss])
        loss.backward()
    model.zero_grad(set_to_none=True)
    return held


def grads_after_step(model: nn.Module, batch, loss_fn=F.cross_entropy, autocast: bool = False) -> dict[str, torch.Tensor]:
    x, y = batch
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(model(x).float(), y)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k, value in a.items():
        assert torch.equal(value, b[k]), k  # bitwise: recomputation runs the very same ops again


# --------------------------------------------------------------------------------------------- gradients


def gpt_case(seed: int = 0):
    torch.manual_seed(seed)
    model = GPT(vocab=64, seq_len=16, d_model=32, heads=4, layers=3)
    tokens = torch.randint(0, 64, (4, 17))
    return model, (tokens[:, :-1], tokens[:, 1:])


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_gradients_equal_without_recompute(autocast: bool):
    model, batch = gpt_case()
    twin = copy.deepcopy(model)
    report = recompute(twin, (GPTBlock,))
    assert report.modules == ("blocks.0", "blocks.1", "blocks.2")
    assert_same(grads_after_step(model, batch, lm_cross_entropy, autocast), grads_after_step(twin, batch, lm_cross_entropy, autocast))


def test_dropout_draws_the_same_masks_when_recomputed():
    model, batch = net(dropout=0.5)
    twin = copy.deepcopy(model)
    recompute(twin, "auto", example_batch=batch)
    assert recomputed_modules(twin) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    torch.manual_seed(1)
    plain = grads_after_step(model, batch)
    after_plain = torch.rand(3)
    torch.manual_seed(1)
    checkpointed = grads_after_step(twin, batch)
    after_checkpointed = torch.rand(3)
    assert_same(plain, checkpointed)
    # The recomputation restores the RNG it borrowed: the next draws are those of the run without it.
    assert torch.equal(after_plain, after_checkpointed)


def test_batchnorm_running_statistics_are_updated_once():
    torch.manual_seed(0)
    model = ResNet18(width=4, classes=5)
    batch = (torch.randn(4, 3, 16, 16), torch.randint(0, 5, (4,)))
    twin = copy.deepcopy(model)
    report = recompute(twin, (BasicBlock,))
    assert len(report.modules) == 8
    for _ in range(2):
        assert_same(grads_after_step(model, batch), grads_after_step(twin, batch))
        model.zero_grad(), twin.zero_grad()
    state, twin_state = model.state_dict(), twin.state_dict()
    assert state.keys() == twin_state.keys()
    for k in state:  # running_mean, running_var, num_batches_tracked: one update per forward, not two
        assert torch.equal(state[k], twin_state[k]), k


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true-masters"])
def test_training_with_the_engine_matches(precision: str):
    """Through ampkit.Engine: autocast, 16-bit weights with fp32 LayerNorm islands inside the blocks, clipping."""
    results = []
    for checkpointed in (False, True):
        model, batch = gpt_case()
        if checkpointed:
            recompute(model, (GPTBlock,))
        engine = ampkit.Engine(precision, clip_grad_norm=1.0)
        model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        for _ in range(3):
            with engine.autocast():
                loss = lm_cross_entropy(model(batch[0]).float(), batch[1])
            engine.backward(loss)
            engine.step()
        results.append({k: v.clone() for k, v in model.state_dict().items()})
    assert_same(*results)


def test_no_grad_and_eval_run_the_plain_forward():
    model, (x, _) = net()
    twin = copy.deepcopy(model)
    recompute(twin, (MLPBlock,))
    with torch.no_grad():
        assert torch.equal(model(x), twin(x))
    out = twin.eval()(x)
    assert torch.equal(out, model.eval()(x)) and out.requires_grad


# ------------------------------------------------------------------------------------------------- bytes


def test_saved_bytes_match_the_hand_count_and_a_real_measurement():
    model, batch = net(n=4)
    f4, n_blocks = 4, 4
    ce = B * 10 * f4 + 4  # log_softmax's output and nll_loss's total_weight (the target is the batch's)
    # Without: embed's output (input of fc1 of block 0) and every block's output feed an fc1 or the head; each
    # block's relu output is saved once (relu and fc2 share it).
    before = (n_blocks + 1) * B * D * f4 + n_blocks * B * H * f4 + ce
    # With: each block keeps its input only (the checkpoint's), the head still saves the last block's output.
    after = (n_blocks + 1) * B * D * f4 + ce
    real_before = held_for_backward(model, batch)
    report = recompute(model, (MLPBlock,), example_batch=batch)
    assert (report.activations_before, report.activations_after) == (before, after) == (real_before, held_for_backward(model, batch))
    assert report.saved == n_blocks * B * H * f4 and report.ratio == pytest.approx(after / before)
    assert report.method == "fake" and report.peak_after <= report.peak_before
    unrecompute(model)
    real = recompute(model, (MLPBlock,), example_batch=batch, fake=False)  # the same figures on real tensors
    assert (real.activations_before, real.activations_after, real.peak_before, real.peak_after) == (
        report.activations_before, report.activations_after, report.peak_before, report.peak_after)


def test_tensors_passed_by_keyword_are_counted():
    """Keyword tensors ride in the checkpoint: the report must count them, as the live-bytes control does."""
    model, batch = net(n=3, kwarg=True)
    report = recompute(model, [f"blocks.{i}" for i in range(3)], example_batch=batch)
    assert report.activations_after == held_for_backward(model, batch)
    assert report.activations_after >= 4 * B * D * 4 + B * H * 4  # block inputs, head input, the shared scale
    unrecompute(model)
    assert report.activations_before == held_for_backward(model, batch)


def test_under_bf16_the_report_matches_the_real_step():
    model, batch = gpt_case()
    report = recompute(model, "auto", example_batch=batch, loss_fn=lm_cross_entropy, policy="bf16-mixed")
    assert report.activations_after == held_for_backward(model, batch, lm_cross_entropy, autocast=True)
    assert report.activations_after < report.activations_before
    report.undo()
    assert report.activations_before == held_for_backward(model, batch, lm_cross_entropy, autocast=True)


def test_state_dict_copies_pickles_and_undo():
    model, batch = net()
    keys, plain_out = list(model.state_dict()), model(batch[0])
    report = recompute(model, (MLPBlock,))
    assert list(model.state_dict()) == keys and report.activations_before is None and "not measured" in str(report)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in net()[0].named_parameters()]
    # A copy (deepcopy, pickle, torch.save) is checkpointed too, and its wrapper runs the copy, not the original.
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert recomputed_modules(twin) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
        with torch.no_grad():
            twin.blocks[0].fc1.weight.zero_()
        assert not torch.equal(twin(batch[0]), model(batch[0]))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    assert recomputed_modules(torch.load(buf, weights_only=False)) == recomputed_modules(model)
    assert report.undo() == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert recomputed_modules(model) == [] and all("forward" not in b.__dict__ for b in model.blocks)
    assert torch.equal(model(batch[0]), plain_out)


def test_an_instance_forward_is_kept_and_given_back():
    model, (x, _) = net(n=2)
    block = model.blocks[0]
    patched = block.forward = lambda x, scale=None: 2 * MLPBlock.forward(block, x, scale)
    expected = model(x)
    recompute(model, ["blocks.0", model.blocks[1]])
    assert torch.equal(model(x), expected)
    assert unrecompute(model) == ["blocks.0", "blocks.1"] and block.forward is patched


# ------------------------------------------------------------------------------------------------- auto


def test_auto_picks_the_fewest_blocks_that_fit_the_budget():
    model, batch = net(n=4)
    full = recompute(model, "auto", example_batch=batch)
    assert full.modules == ("blocks.0", "blocks.1", "blocks.2", "blocks.3")
    per_block = B * H * 4
    assert full.savings == {f"blocks.{i}": per_block for i in range(4)}
    full.undo()
    budget = full.activations_before - 2 * per_block - 1  # two blocks are one byte short, three fit
    report = recompute(model, "auto", example_batch=batch, budget=budget)
    assert len(report.modules) == 3 and report.fits
    assert report.activations_after == held_for_backward(model, batch) <= budget
    report.undo()
    two = recompute(model, ["blocks.0", "blocks.1"], example_batch=batch)
    assert two.activations_after > budget


class StashingBlock(MLPBlock):
    """Keeps its hidden activation on itself (as a debugging hook might): checkpointing it frees nothing."""

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        self.seen = h.detach()  # same storage: still held
        return x + self.fc2(h)


def test_auto_measures_and_adds_blocks_when_the_attribution_is_optimistic():
    model, batch = net(n=4)
    model.blocks[0] = StashingBlock()
    model.blocks[1] = StashingBlock()
    before = held_for_backward(model, batch)
    budget = before - 2 * B * H * 4  # the two plain blocks must go; the stashing ones look as good but free nothing
    report = recompute(model, "auto", example_batch=batch, budget=budget)
    assert report.savings["blocks.0"] == report.savings["blocks.2"] == B * H * 4  # what one forward can see
    assert report.activations_after == held_for_backward(model, batch) <= budget
    assert {"blocks.2", "blocks.3"} <= set(report.modules)


def test_auto_budget_as_a_size_string_and_an_already_fitting_budget():
    model, batch = net(n=4)
    report = recompute(model, "auto", example_batch=batch, budget="1GiB")
    assert report.modules == () and report.budget == 2**30 and report.activations_after == report.activations_before
    assert report.fits and "none" in str(report)


def test_auto_on_the_gpt_and_resnet_workload_models():
    model, batch = gpt_case()
    r = recompute(model, "auto", example_batch=batch, loss_fn=lm_cross_entropy)
    assert r.modules == ("blocks.0", "blocks.1", "blocks.2") and r.ratio < 0.5
    torch.manual_seed(0)
    resnet = ResNet18(width=4, classes=5)
    r = recompute(resnet, "auto", example_batch=(torch.randn(4, 3, 16, 16), torch.randint(0, 5, (4,))))
    assert r.modules == tuple(f"stages.{i}" for i in range(8))  # not the stem's or a shortcut's Sequential
    assert isinstance(r, RecomputeReport) and "activations held for backward" in str(r)


def test_a_meta_model_is_measured_on_fake_tensors():
    with torch.device("meta"):
        model = Net(n=3)
    batch = (torch.empty(B, D, device="meta"), torch.zeros(B, dtype=torch.long, device="meta"))
    real_model, real_batch = net(n=3)
    assert recompute(model, "auto", example_batch=batch).to_dict()["activations_after"] == \
        recompute(real_model, "auto", example_batch=real_batch).activations_after


def test_an_impossible_budget_raises_with_the_numbers_and_leaves_the_model_alone():
    model, batch = net(n=4)
    with pytest.raises(ValueError, match=r"exceed the budget of 1\.00 KiB .*smaller batch.*bf16-mixed"):
        recompute(model, "auto", example_batch=batch, budget=1024)
    assert recomputed_modules(model) == []
    with pytest.raises(ValueError, match="exceed the budget"):
        recompute(model, (MLPBlock,), example_batch=batch, budget="1KiB")
    assert recomputed_modules(model) == []


# ------------------------------------------------------------------------------------------------ errors


def test_types_names_and_modules_select_what_to_wrap():
    model, _ = net()
    assert recompute(model, MLPBlock).modules == ("blocks.0", "blocks.1", "blocks.2", "blocks.3")
    unrecompute(model)
    assert recompute(model, [nn.Linear]).modules == (
        "embed", *[f"blocks.{i}.fc{j}" for i in range(4) for j in (1, 2)], "head")
    unrecompute(model)
    assert recompute(model, ["head", model.blocks[2], "blocks.2"]).modules == ("blocks.2", "head")


@pytest.mark.parametrize(
    ("modules", "kwargs", "error", "match"),
    [
        ("auto", {}, ValueError, r"needs example_batch=\(inputs, targets\)"),
        ((MLPBlock,), {"budget": "1GiB"}, ValueError, "needs example_batch"),
        ("blocks.9", {}, ValueError, r"no submodule 'blocks.9' \(did you mean 'blocks\."),
        ((nn.Conv2d,), {}, ValueError, "no Conv2d submodule to recompute. Its repeated blocks are of type MLPBlock"),
        (("",), {}, ValueError, "cannot checkpoint the model itself"),
        (["blocks.0", "blocks.0.fc1"], {}, ValueError, "'blocks.0' contains 'blocks.0.fc1'"),
        ([], {}, ValueError, "modules is empty"),
        ((int,), {}, TypeError, "int is not an nn.Module type"),
        ((3,), {}, TypeError, "got int"),
        ((nn.Linear(2, 2),), {}, ValueError, "not a submodule of this model"),
        ((MLPBlock,), {"budget": -5}, ValueError, "budget must be a positive number"),
        ((MLPBlock,), {"budget": "lots"}, ValueError, "is not a memory size"),
        ((MLPBlock,), {"policy": "bf17"}, ValueError, "Unknown precision"),
    ],
)
def test_bad_input_names_the_fix(modules, kwargs, error, match):
    model, _ = net()
    with pytest.raises(error, match=match):
        recompute(model, modules, **kwargs)
    assert recomputed_modules(model) == []


def test_wrapping_twice_and_auto_without_blocks_are_refused():
    model, batch = net()
    recompute(model, (MLPBlock,))
    with pytest.raises(ValueError, match=r"already recomputed.*call ampkit.unrecompute\(model\)"):
        recompute(model, ["blocks.1"])
    with pytest.raises(ValueError, match=r"\['blocks.1.fc1'\] already recomputed, or inside"):
        recompute(model, ["head", "blocks.1.fc1"])  # nested inside a checkpointed block
    assert recompute(model, ["head"]).modules == ("head",)  # alongside is fine
    with pytest.raises(ValueError, match="already recomputed"):
        recompute(model, "auto", example_batch=batch)
    flat = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, 10))
    with pytest.raises(ValueError, match=r"found no repeated blocks.*modules=\(MyBlock,\)"):
        recompute(flat, "auto", example_batch=batch)
    with pytest.raises(TypeError, match="takes an nn.Module first"):
        recompute(lambda x: x, (MLPBlock,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be a tensor that requires grad|must return a tensor"):
        recompute(net()[0], (MLPBlock,), example_batch=batch, loss_fn=lambda out, y: 0.0)
