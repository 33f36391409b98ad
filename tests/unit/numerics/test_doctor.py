"""The doctor on models built to break fp16 in one known layer: it must name the layer, and its prescription
must train where the default policy does not, checked against an fp32 control run from the same weights."""

from __future__ import annotations

import copy
import importlib.util
import io
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit import Engine, LossScaleCollapseError
from ampkit.numerics import diagnose

_spec = importlib.util.spec_from_file_location("ampkit_test_fragile", Path(__file__).with_name("fragile.py"))
fragile = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(fragile)  # type: ignore[union-attr]
sys.modules[_spec.name] = fragile  # torch.compile imports the module of the code it traces

STEPS = 30


def _train(model: nn.Module, engine: Engine | None, loss_fn, device: torch.device, steps: int = STEPS) -> tuple[nn.Module, list[float], int]:  # type: ignore[no-untyped-def]
    """Train a copy on ``device``; returns (model, losses, skipped steps). engine None: plain fp32."""
    model = copy.deepcopy(model).to(device)
    opt = fragile.scale_free_adam(model.parameters())
    data = [(x.to(device), y.to(device)) for x, y in fragile.batches()]
    losses = []
    if engine is not None:
        model, opt = engine.setup(model, opt)
    for i in range(steps):
        x, y = data[i % len(data)]
        if engine is None:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        else:
            with engine.autocast():
                loss = loss_fn(model(x).float(), y)
            engine.backward(loss)
            engine.step()
        losses.append(float(loss.detach()))
    return model, losses, engine.skipped_steps if engine is not None else 0


# The fp32 model and its batches stay on the CPU, as a user hands them over: diagnose(device=...) moves both.
@pytest.fixture(scope="module")
def overflow_diagnosis(device: torch.device):  # type: ignore[no-untyped-def]
    return diagnose(fragile.overflow_net(), fragile.batches(), steps=3, target="16-mixed", optimizer=fragile.scale_free_adam, update_steps=0, device=device)


@pytest.fixture(scope="module")
def underflow_diagnosis(device: torch.device):  # type: ignore[no-untyped-def]
    return diagnose(
        fragile.underflow_net(), fragile.batches(), fragile.underflow_loss, steps=3, target="16-mixed", optimizer=fragile.scale_free_adam, update_steps=0, device=device
    )


# -- overflow --------------------------------------------------------------------------------------------
def test_overflow_layer_is_named_first_and_kept_in_fp32(overflow_diagnosis, device: torch.device) -> None:  # type: ignore[no-untyped-def]
    d = overflow_diagnosis
    assert d.to_dict()["device"] == str(device)
    assert d.keep_fp32 == [fragile.OVERFLOW_LAYER]
    worst = d.modules[0]
    assert worst["name"] == fragile.OVERFLOW_LAYER and worst["keep_fp32"]
    assert worst["outputs"]["fp16_overflow_share"] > 0.05
    default = next(c for c in d.comparisons if c.label == "default")
    assert not default.finite and default.forward_origin == fragile.OVERFLOW_LAYER
    recommended = next(c for c in d.comparisons if c.label == "recommended")
    assert recommended.finite and recommended.diverging == []


def test_overflow_default_collapses_while_the_prescription_trains_like_fp32(overflow_diagnosis, device: torch.device) -> None:  # type: ignore[no-untyped-def]
    model, ce = fragile.overflow_net(), nn.functional.cross_entropy
    assert overflow_diagnosis.engine_kwargs()["precision"] == "16-mixed"  # fp16 made to work, not fp32 fallen back to
    _, fp32_losses, _ = _train(model, None, ce, device)
    with pytest.raises(LossScaleCollapseError, match=fragile.OVERFLOW_LAYER):
        _train(model, Engine(precision="16-mixed"), ce, device)  # every step overflows: the scale collapses
    _, losses, skipped = _train(model, Engine(**overflow_diagnosis.engine_kwargs()), ce, device)
    assert skipped == 0
    assert fp32_losses[-1] < 0.8 * fp32_losses[0]  # the control learns, so tracking it means something
    for got, ref in zip(losses, fp32_losses):
        assert got == pytest.approx(ref, rel=0.05, abs=0.02)


def test_overflow_net_needs_nothing_in_bf16(device: torch.device) -> None:
    from ampkit import get_policy

    if not get_policy("bf16-mixed").support(device).supported:
        pytest.skip(f"bf16-mixed does not run on {device}: {get_policy('bf16-mixed').support(device).reason}")
    d = diagnose(fragile.overflow_net(), fragile.batches(), steps=2, target="bf16-mixed", device=device)
    assert d.recommended_precision == "bf16-mixed" and d.keep_fp32 == []
    assert d.engine_kwargs() == {"precision": "bf16-mixed"}  # no loss scaler for bf16


# -- underflow -------------------------------------------------------------------------------------------
def test_underflow_layer_is_named_and_the_scale_brings_its_gradients_back(underflow_diagnosis) -> None:  # type: ignore[no-untyped-def]
    d = underflow_diagnosis
    worst = d.modules[0]
    assert worst["name"] == fragile.UNDERFLOW_LAYER
    assert worst["grads"]["fp16_underflow_share"] > 0.9  # below 2^-24 unscaled
    default = next(c for c in d.comparisons if c.label == "default")
    assert default.finite and default.diverging == [fragile.UNDERFLOW_LAYER]  # lost at GradScaler's 2^16
    assert default.modules[fragile.UNDERFLOW_LAYER].cosine < 0.5
    assert d.loss_scale_log2 is not None and d.loss_scale_log2 > 20
    recommended = next(c for c in d.comparisons if c.label == "recommended")
    assert recommended.diverging == [] and recommended.modules[fragile.UNDERFLOW_LAYER].cosine > 0.99
    data = d.to_dict()
    assert data["underflow_share_scaled"] < 0.1 * data["underflow_share_unscaled"]


def test_underflow_scale_is_the_largest_without_overflow(underflow_diagnosis, device: torch.device) -> None:  # type: ignore[no-untyped-def]
    # Control: every gradient of an fp32 backward (parameters and activations) at the diagnosed weights' start.
    model = fragile.underflow_net().to(device)
    x, y = (t.to(device) for t in fragile.batches()[0])
    acts: list[torch.Tensor] = []
    def keep_grad(module: nn.Module, inputs: object, out: torch.Tensor) -> None:
        out.register_hook(lambda g: acts.append(g.detach()))

    for m in model.modules():
        if not list(m.children()):
            m.register_forward_hook(keep_grad)
    fragile.underflow_loss(model(x), y).backward()
    largest = max(max(float(p.grad.abs().max()) for p in model.parameters()), max(float(g.abs().max()) for g in acts))
    k = underflow_diagnosis.scale.log2
    # The reference steps train a little, so the largest gradient seen may differ from this first step's by a
    # factor; the scale must still keep this step's gradients in range, and not be far below what they allow.
    assert largest * 2.0**k <= 65504 * 2
    assert largest * 2.0 ** (k + 3) > 65504


def test_underflow_prescription_trains_the_layer_as_fp32_does(underflow_diagnosis, device: torch.device) -> None:  # type: ignore[no-untyped-def]
    model, loss = fragile.underflow_net(), fragile.underflow_loss
    assert underflow_diagnosis.engine_kwargs()["precision"] == "16-mixed"
    start = model.embed.weight.detach().clone().to(device)
    ref, _, _ = _train(model, None, loss, device)
    default, _, _ = _train(model, Engine(precision="16-mixed"), loss, device)
    fixed, _, skipped = _train(model, Engine(**underflow_diagnosis.engine_kwargs()), loss, device)
    moved = (ref.embed.weight - start).norm()
    assert moved > 0.1  # in fp32 the layer learns
    off_default = (default.embed.weight - ref.embed.weight).norm() / moved
    off_fixed = (fixed.embed.weight - ref.embed.weight).norm() / moved
    assert skipped == 0
    assert off_fixed < 0.1 < off_default


# -- the report's contract -------------------------------------------------------------------------------
def test_engine_kwargs_and_code_agree(underflow_diagnosis) -> None:  # type: ignore[no-untyped-def]
    d = underflow_diagnosis
    kwargs = d.engine_kwargs()
    assert kwargs["precision"] == "16-mixed"
    assert kwargs["scaler"].init_scale == 2.0**d.loss_scale_log2 == d.recommended_loss_scale
    assert kwargs["scaler"].max_scale >= kwargs["scaler"].init_scale  # widened past ScalerConfig's 2^24 ceiling
    assert f"init_scale={2.0**d.loss_scale_log2!r}" in d.engine_code()
    Engine(**kwargs)  # accepted as is


def test_doctor_json_holds_the_promised_keys(overflow_diagnosis, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = overflow_diagnosis.write_json(tmp_path / "doctor.json")
    data = json.loads(path.read_text())
    for key in ("recommended_precision", "recommended_loss_scale", "keep_fp32", "underflow_share_unscaled", "underflow_share_scaled", "modules", "fp8_headroom", "paste_check"):
        assert key in data
    assert data["keep_fp32"] == [fragile.OVERFLOW_LAYER]
    assert {m["name"] for m in data["modules"]} >= {"embed", "amplify", "norm", "head"}
    assert math.log2(data["recommended_loss_scale"]) == data["loss_scale_log2"]


def test_diagnose_leaves_the_model_untouched(device: torch.device) -> None:
    model = fragile.overflow_net().to(device)
    before = copy.deepcopy(model.state_dict())
    batches = [(x.to(device), y.to(device)) for x, y in fragile.batches()]
    diagnose(model, batches, steps=2, target="16-mixed", optimizer=fragile.scale_free_adam, update_steps=0)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    assert all(not m._forward_hooks for m in model.modules())


def test_a_model_that_fails_in_fp32_is_refused() -> None:
    model = nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.fill_(float("inf"))
    with pytest.raises(ValueError, match="fails without any 16-bit"):
        diagnose(model, [(torch.ones(2, 4), torch.tensor([0, 1]))])


def test_on_a_cpu_without_a_target_the_doctor_picks_bf16_and_says_why_not_fp16() -> None:
    from ampkit import get_policy

    if not get_policy("bf16-mixed").support("cpu").fast:
        pytest.skip("Requires: a CPU with bf16 instructions (AMX-BF16 or AVX512-BF16), where bf16-mixed pays")
    d = diagnose(fragile.underflow_net(), fragile.batches(), fragile.underflow_loss, steps=2, device="cpu")
    assert d.recommended_precision == "bf16-mixed"
    assert any("16-mixed is slow on cpu" in r for r in d.precision_reasons)


# -- compiled against eager ----------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")  # dynamo reads it
def test_compile_checks_the_prescription_and_names_the_module_a_broken_compiler_changes() -> None:
    from ampkit.numerics._report import render_report

    torch._dynamo.reset()
    head = fragile.grad_scaling_backend((4, 32))  # the head's weight gradient, 1% off in the compiled step
    d = diagnose(fragile.overflow_net(), fragile.batches(), steps=1, target="16-mixed", compile={"backend": head})
    check = d.compile_check
    assert check is not None and check.policy == "16-mixed"
    # The step checked is the prescription's: its fp32 modules and its loss scale.
    assert check.keep_fp32 == d.keep_fp32 == ["amplify"] and check.loss_scale == d.recommended_loss_scale
    assert check.diverging == ["head"] and check.loss_agrees and check.dtypes_agree
    data = d.to_dict()
    assert data["compile_check"]["diverging"] == ["head"] and "head off by" in data["compile_check"]["verdict"]
    section = render_report(data).split("## Compiled against eager")[1].split("\n## ")[0]
    assert "diverges from eager under 16-mixed" in section and "| head " in section


@pytest.mark.parametrize(("model", "compile", "message"), [
    (fragile.overflow_net(), "fast", "compile='fast' is not understood"),
    (fragile.overflow_net(), "regional", "found no repeated blocks"),
])  # fmt: skip
def test_a_compile_setting_that_cannot_apply_is_refused_before_any_step(model: nn.Module, compile: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        diagnose(model, fragile.batches(), compile=compile)


# -- the loss scale and the report agree -------------------------------------------------------------------
class OwnLoss(nn.Module):
    """Computes its own loss from labels and returns it beside the logits, as a Hugging Face model does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.fc(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Damped(nn.Module):
    """A block whose own arithmetic (outside any submodule) shrinks its output: the gradient arriving at the block's
    output is 1e4 times the one its Linear sees, and fp16 autocast holds it in fp16 all the same."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * 1e-4


def _largest_model_gradient(model: nn.Module, batches: list, loss_fn) -> float:  # type: ignore[no-untyped-def,type-arg]
    """Control: the largest gradient of every parameter and every module output of plain fp32 backwards (the
    loss itself left out: its gradient is the seed, 1, that scaling replaces by the scale)."""
    largest = 0.0
    for batch in batches:
        grads: list[torch.Tensor] = []

        def keep(module: nn.Module, args: object, out: object, grads: list[torch.Tensor] = grads) -> None:
            tensors = [out] if isinstance(out, torch.Tensor) else [v for v in out.values() if v.dim() > 0]  # type: ignore[union-attr]
            for t in tensors:
                t.register_hook(grads.append)

        handles = [m.register_forward_hook(keep) for m in model.modules()]
        x, y = (batch["x"], batch["labels"]) if isinstance(batch, dict) else batch
        out = model(x, y) if isinstance(batch, dict) else model(x)
        loss_fn(out, y).backward()
        for h in handles:
            h.remove()
        largest = max([largest, *(float(g.abs().max()) for g in grads), *(float(p.grad.abs().max()) for p in model.parameters())])
        model.zero_grad()
    return largest


def _overflow_findings(d) -> list[str]:  # type: ignore[no-untyped-def]
    return [f"{m['name']}: {p}" for m in d.modules for p in m["problems"] if "overflow fp16 at loss scale" in p]


def test_the_models_own_loss_gradient_is_no_overflow() -> None:
    # The gradient of a loss the model returns is the backward's seed (the scale itself, held in fp32): at the
    # recommended scale it is above 65504 by construction, and it is no value the model computed.
    g = torch.Generator().manual_seed(1)
    batches = [{"x": torch.randn(16, 8, generator=g), "labels": torch.randint(0, 4, (16,), generator=g)} for _ in range(3)]
    d = diagnose(OwnLoss(), batches, steps=2, target="16-mixed", update_steps=0, fp8_recipe=None)
    k = d.scale.log2  # what the fp32 gradients allow (tailoring may start the engine lower: d.loss_scale_log2)
    assert d.loss_scale_log2 is not None and 2.0**d.loss_scale_log2 > 65504  # the loss's gradient, 1, would read as an overflow
    assert _overflow_findings(d) == []
    largest = _largest_model_gradient(OwnLoss(), batches[:2], lambda out, y: out["loss"])
    assert largest * 2.0**k <= 65504 < largest * 2.0 ** (k + 1)  # the largest scale the model's own gradients allow


def test_the_recommended_scale_overflows_nothing_the_report_names() -> None:
    # The largest gradient arrives at the block's output, not at any leaf module's: the scale must keep it in range.
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)) for _ in range(3)]
    d = diagnose(nn.Sequential(Damped()), batches, nn.functional.mse_loss, steps=2, target="16-mixed", update_steps=0, fp8_recipe=None)
    assert _overflow_findings(d) == []
    largest = _largest_model_gradient(nn.Sequential(Damped()), batches[:2], nn.functional.mse_loss)
    assert largest * 2.0**d.scale.log2 <= 65504 < largest * 2.0 ** (d.scale.log2 + 1)


# -- one recommendation ------------------------------------------------------------------------------------
def _losing_gains() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A LayerNorm whose gains (1.0, bf16's half-gap there 2^-8) never move under AdamW at lr 2e-3 in bf16, and hold
    0.77% of the weights; its inputs are 4 latent features spread over 256, so fp32 learns the targets in 8 steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 128), nn.LayerNorm(128), nn.Tanh(), nn.Linear(128, 2))
    g = torch.Generator().manual_seed(1)
    mix = torch.randn(4, 256, generator=g) / 2
    latents = [torch.randn(16, 4, generator=g) for _ in range(4)]
    return model, [(z @ mix, z[:, :2]) for z in latents]


def _engine_lines(d) -> list[str]:  # type: ignore[no-untyped-def]
    from rich.console import Console

    from ampkit.numerics._table import render

    console = Console(file=io.StringIO(), width=300)
    render(d.to_dict(), console)
    return [line.strip() for line in console.file.getvalue().splitlines() if "Engine(" in line]  # type: ignore[attr-defined]


def _gains_adamw(params):  # type: ignore[no-untyped-def]
    return torch.optim.AdamW(params, lr=2e-3, weight_decay=0.0)


@pytest.fixture(scope="module")
def gains_diagnosis():  # type: ignore[no-untyped-def]
    """The doctor tailoring bf16-true (bf16 weights asked for) on :func:`_losing_gains`."""
    model, batches = _losing_gains()
    return diagnose(model, batches, nn.functional.mse_loss, steps=3, target="bf16-true", optimizer=_gains_adamw, update_steps=8, fp8_recipe=None)


def test_under_bf16_true_the_update_remedy_is_part_of_the_one_recommendation(gains_diagnosis) -> None:  # type: ignore[no-untyped-def]
    d = gains_diagnosis
    check = d.update_precision
    assert check is not None and check.judged and (check.prescribed, check.keep_fp32) == ("bf16-true", ["1"])  # the gains lose theirs
    assert d.engine_kwargs() == {"precision": "bf16-true", "keep_fp32": ["1"]}
    assert _engine_lines(d) == [f"Paste: {d.engine_code()}", f"Prescribed, and part of the recommendation above: {d.engine_code()}"]


def test_a_remedy_prescribed_over_a_bf16_true_that_recovers_says_why(gains_diagnosis) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console

    from ampkit.numerics._table import render

    check = gains_diagnosis.update_precision
    plain = check.trials[0]
    # bf16-true itself follows fp32's decrease over the check's steps, yet the gains lose their updates: the report
    # prescribes keeping them in fp32, and must say why it prefers that to the bf16-true it says recovers.
    assert plain.policy == "bf16-true" and plain.recovered and check.prescribed == "bf16-true" and check.keep_fp32 == ["1"]
    assert check.preferred is not None and "1.weight" in check.preferred
    console = Console(file=io.StringIO(), width=400)
    render(gains_diagnosis.to_dict(), console)
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    assert printed.count("bf16-true with 1 in fp32 is preferred to plain bf16-true, which also follows fp32's decrease") == 2  # reasons, check


def test_beside_fp32_weights_the_update_remedy_is_an_option_said_as_one(gains_diagnosis, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from ampkit.numerics import _doctor as doctor

    monkeypatch.setattr(doctor, "check_update_precision", lambda *a, **k: gains_diagnosis.update_precision)  # the same check
    model, batches = _losing_gains()
    d = diagnose(model, batches, nn.functional.mse_loss, steps=3, target="bf16-mixed", optimizer=_gains_adamw, update_steps=8, fp8_recipe=None)
    assert d.engine_kwargs() == {"precision": "bf16-mixed"}
    assert _engine_lines(d) == [
        f"Paste: {d.engine_code()}",
        'Only to hold the weights in bf16 (the recommendation above keeps them in fp32): Engine(precision="bf16-true", keep_fp32=["1"])',
    ]


# -- the prescription in the user's framework's terms ------------------------------------------------------
def test_the_prescription_is_printed_in_the_frameworks_terms_beside_the_engine_line(overflow_diagnosis, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import ast

    d = copy.copy(overflow_diagnosis)  # the fixture's, shared by other tests: its framework left as it was
    assert d.framework is None and d.framework_code() is None and d.to_dict()["framework_code"] is None  # plain PyTorch: the Engine line alone
    engine_line = d.engine_code()
    scaler = d.engine_kwargs()["scaler"]
    for framework, call in (("lightning", "AmpkitPrecision"), ("transformers", "AmpkitTrainer")):
        d.framework = framework
        text = d.framework_code()
        assert text is not None and d.engine_code() == engine_line  # the Engine line as it was
        tree = ast.parse(text)
        calls = {ast.unparse(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
        # 16-mixed with a module kept in fp32 and its own loss scale: ampkit's integration, carrying exactly the doctor's numbers.
        keywords = {k.arg: k.value for k in calls[call].keywords}
        assert ast.literal_eval(keywords["keep_fp32"]) == [fragile.OVERFLOW_LAYER]
        got = {k.arg: ast.literal_eval(k.value) for k in calls["ampkit.ScalerConfig"].keywords}
        assert got == {k: getattr(scaler, k) for k in got} and got["init_scale"] == d.recommended_loss_scale
        data = json.loads(d.write_json(tmp_path / f"{framework}.json").read_text())
        assert (data["framework"], data["framework_code"], data["engine_code"]) == (framework, text, engine_line)
    d.framework = "keras"
    with pytest.raises(ValueError, match=r"framework 'keras'.*'lightning', 'transformers' or None"):
        d.framework_code()
