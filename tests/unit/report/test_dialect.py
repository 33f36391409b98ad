"""Advice in each framework's own terms: every dialect's lines run as printed, with the real torch, lightning and
transformers, and build what the advice says; the lines of ampkit's integrations (``ampkit.lightning``,
``ampkit.transformers``) are parsed and their calls checked, and built for real where the integration exists."""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampkit
from ampkit._report.dialect import AS_GIVEN, FRAMEWORKS, Advice, check_framework, paste_code
from ampkit.policy import policy_names

L = pytest.importorskip("lightning", reason="the lightning extra: pip install 'ampkit[lightning]'")
transformers = pytest.importorskip("transformers", reason="the hf extra: pip install 'ampkit[hf]'")

ROWS = 32


@pytest.fixture(autouse=True)
def _threads() -> Any:
    """The printed ``torch.set_num_threads`` runs here: the process's threads come back as they were."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(2 * ROWS, 8, generator=g), torch.randint(0, 3, (2 * ROWS,), generator=g))


class _Blocks(nn.Module):
    """Two repeated blocks and a head: what recompute and regional compile work on, ``head`` what keep_fp32 names."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(2)])
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


class _Module(L.LightningModule):
    """A LightningModule as a user writes one; it records the rows of each batch its training_step sees."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _Blocks()
        self.rows: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        self.rows.append(x.shape[0])
        return nn.functional.cross_entropy(self(x).float(), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        return torch.utils.data.DataLoader(_dataset(), batch_size=ROWS)


def _run(text: str, names: dict[str, Any], last: bool = True) -> dict[str, Any]:
    """Execute the printed lines as a script would (``last=False``: all but the final call, which trains)."""
    lines = text.splitlines()
    namespace = dict(names)
    exec(compile("\n".join(lines if last else lines[:-1]), "<advice>", "exec"), namespace)  # noqa: S102 - the lines under test
    return namespace


def _call(text: str, name: str) -> ast.Call:
    """The one call of ``name`` (``L.Trainer``, ``TrainingArguments``...) in the printed lines."""
    calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and ast.unparse(n.func) == name]
    assert len(calls) == 1, f"{name} called {len(calls)} times in:\n{text}"
    return calls[0]


def _keywords(call: ast.Call) -> dict[str, Any]:
    """A call's keyword arguments: literals as values, anything else as its source text."""
    out = {}
    for k in call.keywords:
        try:
            out[k.arg] = ast.literal_eval(k.value)
        except ValueError:
            out[k.arg] = ast.unparse(k.value)
    return out


def _scaler_of(text: str) -> dict[str, Any]:
    return _keywords(_call(text, "ampkit.ScalerConfig"))


# ------------------------------------------------------------------------------------------------- the contract
def test_bad_advice_and_an_unknown_framework_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"compile='all'.*None \(eager\), 'regional'"):
        Advice(compile="all")
    with pytest.raises(ValueError, match=r"accumulate=0.*whole number >= 1"):
        Advice(accumulate=0)
    with pytest.raises(ValueError, match=r"clip_grad_norm=-1.*positive finite norm, None \(no clipping\)"):
        Advice(clip_grad_norm=-1)
    with pytest.raises(ValueError, match="unknown setting.*workers; the settings are num_workers"):
        Advice(loader={"workers": 2})
    with pytest.raises(ValueError, match=r"framework 'keras'.*'lightning', 'transformers' or None"):
        paste_code(Advice(), "keras")
    with pytest.raises(ampkit.PolicyError, match="Did you mean 'bf16-mixed'"):
        Advice(precision="bf61-mixed")
    assert Advice(precision="bf16").precision == "bf16-mixed"  # an alias, named once as the policy is
    # The twins: every documented form is accepted as is.
    assert check_framework(None) is None and [check_framework(f) for f in FRAMEWORKS] == list(FRAMEWORKS)
    Advice(compile="regional", accumulate=2, clip_grad_norm=None, loader={"num_workers": 2, "torch_threads": 1, "non_blocking": True})


@pytest.mark.parametrize("framework", [None, *FRAMEWORKS])
@pytest.mark.parametrize("precision", policy_names())
def test_every_policy_parses_in_every_dialect_and_takes_one_precision_setting(precision: str, framework: str | None) -> None:
    for device in ("cpu", "cuda"):
        for extra in ({}, {"keep_fp32": ("head",)}):
            advice = Advice(precision=precision, device=device, **extra)  # type: ignore[arg-type]
            text = paste_code(advice, framework)
            ast.parse(text)
            if framework == "lightning":  # Lightning refuses precision= beside a precision plugin: never both
                keywords = _keywords(_call(text, "L.Trainer"))
                assert ("precision" in keywords) != ("plugins" in keywords)
                native = precision in ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true") and not extra
                assert ("precision" in keywords) == (native and not (precision == "16-mixed" and device == "cpu"))
            if framework == "transformers":  # the plain Trainer with a flag, or AmpkitTrainer owning the precision
                flags = {k for k in _keywords(_call(text, "TrainingArguments")) if k in ("bf16", "fp16", "tf32")}
                ampkit_trainer = "AmpkitTrainer(" in text
                assert ampkit_trainer != bool(flags) or (precision == "32-true" and not extra)
                assert ampkit_trainer == (precision not in ("32-true", "bf16-mixed", "16-mixed", "tf32") or bool(extra)
                                          or (precision == "16-mixed" and device == "cpu"))


# ------------------------------------------------------------------------------------------------- ampkit.Engine
def test_the_engine_lines_build_the_engine_and_loader_the_advice_describes() -> None:
    advice = Advice(precision="bf16-true-masters", micro_batch=16, accumulate=2, clip_grad_norm=0.5, keep_fp32=("head",), compile="regional",
                    recompute=True, threads=1, loader={"num_workers": 1, "persistent_workers": True, "torch_threads": 1}, channels_last=False)
    model = _Blocks()
    ns = _run(paste_code(advice), {"model": model, "optimizer": torch.optim.AdamW(model.parameters()), "dataset": _dataset()})
    engine = ns["engine"]
    assert (engine.policy.name, engine.accumulate, engine.clip_grad_norm, engine.policy.keep_fp32) == ("bf16-true-masters", 2, 0.5, ("head",))
    assert engine.compile_plan is not None and engine.compile_plan.regional
    assert ampkit.memory.recomputed_modules(model) == ["blocks.0", "blocks.1"]
    assert (ns["loader"].batch_size, ns["loader"].num_workers, ns["loader"].persistent_workers) == (16, 1, True)
    assert torch.get_num_threads() == 1


def test_the_engine_lines_carry_the_scaler_settings() -> None:
    text = paste_code(Advice(precision="16-mixed", scaler={"init_scale": 8192.0, "max_scale": 2.0**30}))
    model = _Blocks()
    engine = _run(text, {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)})["engine"]
    assert (engine.scaler.config.init_scale, engine.scaler.config.max_scale) == (8192.0, 2.0**30)


# ------------------------------------------------------------------------------------------------- Lightning
@pytest.fixture
def trainer_for_tests(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``L.Trainer`` as printed, plus what a test needs: two steps, no logger, checkpoint or progress bar."""
    quiet = functools.partial(L.Trainer, max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                              enable_model_summary=False, default_root_dir=tmp_path)
    monkeypatch.setattr(L, "Trainer", quiet)


# Lightning 2.6's own loop, under torch 2.13: not the printed lines' doing, and made an error by the suite's filterwarnings.
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")
def test_lightning_native_precision_trains_as_printed(trainer_for_tests: None) -> None:
    advice = Advice(precision="bf16-mixed", micro_batch=16, accumulate=2, clip_grad_norm=1.0, recompute=True, threads=1,
                    loader={"num_workers": 1, "persistent_workers": True}, device="cpu")
    model = _Module()
    text = paste_code(advice, "lightning")
    ns = _run(text, {"model": model, "dataset": _dataset()})
    trainer = ns["trainer"]
    assert (trainer.precision, trainer.accumulate_grad_batches, trainer.gradient_clip_val) == ("bf16-mixed", 2, 1.0)
    assert type(trainer.accelerator).__name__ == "CPUAccelerator" and torch.get_num_threads() == 1
    assert ampkit.memory.recomputed_modules(model) == ["net.blocks.0", "net.blocks.1"]
    assert trainer.global_step == 2 and model.rows == [16] * 4  # two optimizer steps of 16 x 2 micro-batches


def test_lightning_compile_lines_compile_what_was_measured(trainer_for_tests: None) -> None:
    model = _Module()
    ns = _run(paste_code(Advice(precision="bf16-true", compile="regional", device="cpu"), "lightning"), {"model": model}, last=False)
    assert all(model.get_submodule(name)._compiled_call_impl is not None for name in ("net.blocks.0", "net.blocks.1"))
    assert ns["trainer"].precision == "bf16-true"
    ns = _run(paste_code(Advice(precision="32-true", compile="model"), "lightning"), {"model": _Module()}, last=False)
    assert isinstance(ns["model"], torch._dynamo.eval_frame.OptimizedModule)  # what trainer.fit(model) then trains


def test_lightning_runs_fp16_on_a_cpu_through_ampkits_policy_where_its_own_would_run_bf16() -> None:
    on_cpu, on_gpu = (paste_code(Advice(precision="16-mixed", device=d), "lightning") for d in ("cpu", "cuda"))
    assert 'plugins=[AmpkitPrecision("16-mixed")]' in on_cpu and "precision=" not in on_cpu
    assert _keywords(_call(on_gpu, "L.Trainer")) == {"precision": "16-mixed"}
    # Lightning's own "16-mixed" on a CPU trains in bf16: the reason for the plugin above.
    with pytest.warns(UserWarning, match="AMP with fp16 is not supported on CPU"):
        trainer = L.Trainer(accelerator="cpu", precision="16-mixed", logger=False, enable_checkpointing=False)
    assert trainer.precision == "bf16-mixed"


PLUGIN_ADVICE = [
    Advice(precision="bf16-true-masters", keep_fp32=("net.head",), accumulate=4, clip_grad_norm=1.0, device="cpu"),
    Advice(precision="16-mixed", keep_fp32=("net.head",), scaler={"init_scale": 8192.0}, device="cpu"),
    Advice(precision="tf32", device="cuda"),
]


@pytest.mark.parametrize("advice", PLUGIN_ADVICE, ids=lambda a: a.precision)
def test_lightning_plugin_lines_name_ampkit_precisions_documented_arguments(advice: Advice) -> None:
    text = paste_code(advice, "lightning")
    assert "from ampkit.lightning import AmpkitPrecision" in text.splitlines()
    plugin = _call(text, "AmpkitPrecision")
    assert [ast.literal_eval(a) for a in plugin.args] == [advice.precision]
    keywords = _keywords(plugin)
    assert set(keywords) <= {"scaler", "clip_grad_norm", "keep_fp32", "numerics"}  # AmpkitPrecision's signature
    assert keywords.get("keep_fp32", []) == list(advice.keep_fp32)
    assert (_scaler_of(text) if advice.scaler else None) == advice.scaler
    trainer = _keywords(_call(text, "L.Trainer"))
    assert "precision" not in trainer and trainer["plugins"] == f"[{ast.unparse(plugin)}]"
    expected = {"accumulate_grad_batches": advice.accumulate} if advice.accumulate > 1 else {}
    expected |= {"gradient_clip_val": advice.clip_grad_norm} if advice.clip_grad_norm not in (None, AS_GIVEN) else {}
    assert {k: v for k, v in trainer.items() if k in ("accumulate_grad_batches", "gradient_clip_val")} == expected


@pytest.mark.skipif(importlib.util.find_spec("ampkit.lightning") is None,
                    reason="ampkit.lightning is not built yet (issue 46): its printed lines are only parsed and checked (test above)")
@pytest.mark.parametrize("advice", [a for a in PLUGIN_ADVICE if a.device == "cpu"], ids=lambda a: a.precision)
def test_lightning_plugin_lines_build_the_real_trainer(advice: Advice, trainer_for_tests: None) -> None:
    from ampkit.lightning import AmpkitPrecision

    ns = _run(paste_code(advice, "lightning"), {"model": _Module()}, last=False)
    plugin = ns["trainer"].precision_plugin
    assert isinstance(plugin, AmpkitPrecision) and ns["trainer"].accumulate_grad_batches == advice.accumulate


# ------------------------------------------------------------------------------------------------- Hugging Face
def _hf_model() -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def _hf_dataset() -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, 64, (ROWS, 16), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": row, "labels": row} for row in ids]


def test_hugging_face_native_flags_train_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the Trainer's default output_dir, trainer_output, is made in the working directory
    advice = Advice(precision="bf16-mixed", micro_batch=4, accumulate=2, clip_grad_norm=None, recompute=True, gradient_checkpointing=True,
                    loader={"num_workers": 0, "pin_memory": False}, device="cpu")
    text = paste_code(advice, "transformers")
    assert "from transformers import Trainer, TrainingArguments" in text and "ampkit" not in text
    model = _hf_model()
    ns = _run(text, {"model": model, "train_dataset": _hf_dataset()}, last=False)
    args = ns["trainer"].args
    assert (args.use_cpu, args.bf16, args.fp16, args.per_device_train_batch_size, args.gradient_accumulation_steps) == (True, True, False, 4, 2)
    assert (args.max_grad_norm, args.activation_checkpointing, args.dataloader_pin_memory) == (0.0, True, False)  # measured unclipped
    args.max_steps, args.save_strategy, args.report_to = 2, "no", []  # the test's: two steps, nothing saved
    _run(text.splitlines()[-1], ns)  # trainer.train(), as printed
    assert ns["trainer"].state.global_step == 2 and model.is_activation_checkpointing


@pytest.mark.parametrize(
    ("advice", "expected"),
    [
        (Advice(precision="32-true", compile="model", clip_grad_norm=1.0, recompute=True, gradient_checkpointing=False, device="cpu"),
         {"use_cpu": True, "max_grad_norm": 1.0, "torch_compile": True}),
        (Advice(precision="16-mixed", micro_batch=8, device="cuda"), {"fp16": True, "per_device_train_batch_size": 8}),
        (Advice(precision="bf16-mixed", loader={"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4, "non_blocking": True}),
         {"bf16": True, "dataloader_num_workers": 2, "dataloader_persistent_workers": True, "dataloader_prefetch_factor": 4,
          "accelerator_config": {"non_blocking": True}}),
    ],
    ids=["compile-no-checkpointing", "fp16-cuda", "loader"],
)
def test_hugging_face_training_arguments_are_built_from_the_printed_text(advice: Advice, expected: dict[str, Any]) -> None:
    text = paste_code(advice, "transformers")
    keywords = _keywords(_call(text, "TrainingArguments"))
    assert keywords == expected
    # Built as printed; on a machine without a GPU, training on the CPU (bf16=True is refused there otherwise).
    cpu = {} if torch.cuda.is_available() else {"use_cpu": True}
    args = transformers.TrainingArguments(**{**keywords, **cpu})
    for key, value in expected.items():
        got = getattr(args, key)
        assert ({k: getattr(got, k) for k in value} if key == "accelerator_config" else got) == value
    # Recompute without the model's own checkpointing is ampkit's, on the model, before the Trainer.
    assert ("ampkit.recompute(model" in text) == advice.recompute


AMPKIT_TRAINER_ADVICE = [
    Advice(precision="bf16-true-masters", keep_fp32=("transformer.ln_f",), micro_batch=4, device="cpu"),
    Advice(precision="16-mixed", scaler={"init_scale": 1024.0}, device="cuda"),
    Advice(precision="16-mixed", device="cpu"),
]


@pytest.mark.parametrize("advice", AMPKIT_TRAINER_ADVICE, ids=["masters-keep", "scaler", "fp16-cpu"])
def test_hugging_face_ampkit_trainer_lines_name_its_documented_arguments(advice: Advice) -> None:
    text = paste_code(advice, "transformers")
    assert {"from transformers import TrainingArguments", "from ampkit.transformers import AmpkitTrainer"} <= set(text.splitlines())
    keywords = _keywords(_call(text, "AmpkitTrainer"))
    assert {k: keywords[k] for k in ("model", "args", "train_dataset")} == {"model": "model", "args": "args", "train_dataset": "train_dataset"}
    assert set(keywords) <= {"model", "args", "train_dataset", "precision", "keep_fp32", "scaler"}
    assert keywords["precision"] == advice.precision and keywords.get("keep_fp32", []) == list(advice.keep_fp32)
    assert (_scaler_of(text) if advice.scaler else None) == advice.scaler
    # The precision is AmpkitTrainer's alone: no flag of the Trainer's own beside it.
    assert not {"bf16", "fp16", "tf32"} & set(_keywords(_call(text, "TrainingArguments")))


@pytest.mark.skipif(importlib.util.find_spec("ampkit.transformers") is None,
                    reason="ampkit.transformers is not built yet (issue 46): its printed lines are only parsed and checked (test above)")
def test_hugging_face_ampkit_trainer_lines_build_the_real_trainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ampkit.transformers import AmpkitTrainer

    monkeypatch.chdir(tmp_path)
    ns = _run(paste_code(AMPKIT_TRAINER_ADVICE[0], "transformers"), {"model": _hf_model(), "train_dataset": _hf_dataset()}, last=False)
    assert isinstance(ns["trainer"], AmpkitTrainer) and ns["trainer"].args.per_device_train_batch_size == 4


def test_the_frameworks_forms_set_the_batch_only_where_the_advice_changes_it() -> None:
    same = Advice(precision="bf16-mixed", micro_batch=32, given_micro_batch=32, device="cpu")
    assert "DataLoader" not in paste_code(same, "lightning") and "per_device_train_batch_size" not in paste_code(same, "transformers")
    assert "loader = torch.utils.data.DataLoader(dataset, batch_size=32)" in paste_code(same)  # the Engine form states its loader always
    split = dataclasses.replace(same, micro_batch=16, accumulate=2)
    assert "loader = torch.utils.data.DataLoader(dataset, batch_size=16)  # 16 x 2 micro-batches = your batch of 32;" in paste_code(split, "lightning")
    assert "per_device_train_batch_size=16, gradient_accumulation_steps=2" in paste_code(split, "transformers")
