"""``AmpkitTrainer`` measured against two controls on the same GPT-2 (2 layers, n_embd 32), weights, data and seed: the
Trainer's own mixed precision (``TrainingArguments(bf16=True)``, and its fp32 run), and the plain ``ampkit.Engine``
loop on the batches the Trainer trained on. Accumulation (2 micro-batches) and ``max_grad_norm`` clipping are on."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from datasets import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, PrinterCallback, Trainer, TrainerCallback, TrainingArguments

import ampkit
from ampkit.policy import get_policy
from ampkit.transformers import AmpkitTrainer, AmpkitTrainerMixin

VOCAB, SEQ, STEPS, ACCUMULATE = 64, 16, 12, 2
# bf16-true-sr's step is torchao's, compiled by torch.compile: about 45 s for this GPT-2's 30 tensors on two loaded
# cores with inductor's cache cold (as in CI; 9 s warm), where the other policies take seconds. CI checks the same AmpkitAccelerator path with sr on a small MLP
# (tests/unit/accelerate/test_accelerator.py, bit for bit against the engine loop); the Trainer adds nothing sr-specific.
POLICIES = ["32-true", "bf16-mixed", "16-mixed", "bf16-true", "bf16-true-masters", "bf16-true-remainder", "16-true-masters",
            "bf16-true-kahan", pytest.param("bf16-true-sr", marks=pytest.mark.slow)]


def _gpt2(dropout: float = 0.0) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0,
                        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    return GPT2LMHeadModel(config)


def _dataset(n: int = 96, seed: int = 1) -> Dataset:
    """Counting sequences from random starts (t, t+1, t+2... mod 64): a pattern the model learns in a few steps."""
    g = torch.Generator().manual_seed(seed)
    ids = (torch.randint(0, VOCAB, (n, 1), generator=g) + torch.arange(SEQ)) % VOCAB
    return Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})


def _args(**overrides: Any) -> TrainingArguments:
    settings: dict[str, Any] = dict(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to=[], per_device_train_batch_size=4,
                                    gradient_accumulation_steps=ACCUMULATE, max_steps=STEPS, logging_steps=1, learning_rate=3e-3,
                                    save_strategy="no", seed=0, max_grad_norm=1.0, disable_tqdm=True)
    settings.update(overrides)
    return TrainingArguments(**settings)


def _fresh() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _fit(trainer: Trainer) -> dict[str, Any]:
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {"losses": [h["loss"] for h in logs], "norms": [h["grad_norm"] for h in logs], "lrs": [h["learning_rate"] for h in logs],
            "params": [p.detach().clone() for p in trainer.model.parameters()], "trainer": trainer}


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["losses"] == b["losses"] and a["norms"] == b["norms"] and a["lrs"] == b["lrs"]
    for p, q in zip(a["params"], b["params"]):
        assert p.dtype == q.dtype and torch.equal(p, q)


# ------------------------------------------------------------------------------------------------ against the Trainer
def test_bf16_mixed_trains_as_the_trainers_own_bf16_bit_for_bit() -> None:
    """Dropout and accumulation on. Tolerance 0: the same autocast around the same forward, the same division, the same
    clip, so the same numbers; and not vacuously, since the fp32 run lands measurably elsewhere (bf16's rounding)."""
    _fresh()
    native = _fit(Trainer(model=_gpt2(0.1), args=_args(bf16=True), train_dataset=_dataset()))
    _fresh()
    ours = _fit(AmpkitTrainer(model=_gpt2(0.1), args=_args(), train_dataset=_dataset(), precision="bf16-mixed"))
    _same(ours, native)
    _fresh()
    fp32 = _fit(Trainer(model=_gpt2(0.1), args=_args(), train_dataset=_dataset()))
    assert max(abs(a - b) for a, b in zip(native["losses"], fp32["losses"])) > 1e-4


def test_fp32_trains_as_the_trainers_fp32_bit_for_bit() -> None:
    _fresh()
    native = _fit(Trainer(model=_gpt2(0.1), args=_args(), train_dataset=_dataset()))
    _fresh()
    _same(_fit(AmpkitTrainer(model=_gpt2(0.1), args=_args(), train_dataset=_dataset(), precision="32-true")), native)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_trains(policy: str) -> None:
    """With the Trainer's own optimizer (AdamW, weight-decay groups) and linear schedule: finite, falling loss."""
    support = get_policy(policy).support("cpu")
    if not support.supported:
        pytest.skip(f"{policy}: {support.reason}")
    out = _fit(AmpkitTrainer(model=_gpt2(), args=_args(), train_dataset=_dataset(), precision=policy))
    losses = torch.tensor(out["losses"])
    assert losses.isfinite().all() and torch.tensor(out["norms"]).isfinite().all()
    assert losses[-4:].mean() < losses[:4].mean() - 0.2, f"{policy} did not learn: {losses.tolist()}"
    engine = out["trainer"].engine
    assert engine.steps == STEPS and engine.policy.name == policy


# ------------------------------------------------------------------------------------------------ against the engine
class _Recording(AmpkitTrainer):
    """Records what each micro-batch trained on; at the steps in ``poison``, an inf in one gradient at the window's end."""

    def __init__(self, *args: Any, poison: frozenset[int] = frozenset(), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[dict[str, torch.Tensor], Any]] = []
        self.poison = poison

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        self.seen.append(({k: v.clone() for k, v in inputs.items()}, num_items_in_batch))
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.accelerator.sync_gradients and self.state.global_step in self.poison:
            next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")
        return loss


def _optimizer(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / (2 * STEPS))


def _engine_loop(policy: str, seen: list[tuple[dict[str, torch.Tensor], Any]], poison: frozenset[int]) -> dict[str, Any]:
    """The control: the Trainer's micro-batches replayed through a plain ampkit.Engine loop (accumulate=1 and two
    backward passes per step, as the Trainer's loss is already normalised over the window by num_items_in_batch)."""
    model = _gpt2()
    opt, sched = _optimizer(model)
    engine = ampkit.Engine(policy, clip_grad_norm=1.0)
    model, opt = engine.setup(model, opt, schedulers=sched)
    model.train()
    losses, norms = [], []
    for step in range(STEPS):
        total = 0.0
        for inputs, n in seen[step * ACCUMULATE:(step + 1) * ACCUMULATE]:
            with engine.autocast():
                loss = model(**inputs, num_items_in_batch=n).loss
            engine.backward(loss)
            total += loss.detach()
        if step in poison:
            next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")
        engine.step()
        losses.append(total.item())
        norms.append(engine.grad_norm)
    return {"losses": losses, "norms": norms, "params": [p.detach().clone() for p in model.parameters()], "engine": engine}


@pytest.mark.parametrize("policy", ["16-mixed", "bf16-true-masters", "bf16-true-remainder", "16-true-masters"])
def test_the_trainer_trains_as_the_plain_engine_loop_and_logs_the_unscaled_norm(policy: str) -> None:
    """The Trainer's micro-batches through the plain engine loop: the same losses, weights, skips and loss scale bit for
    bit; the grad_norm the Trainer logs is the engine's unscaled norm (not multiplied by the scale of 2**16)."""
    poison = frozenset({5}) if get_policy(policy).loss_scaling == "dynamic" else frozenset()
    model = _gpt2()
    trainer = _Recording(model=model, args=_args(), train_dataset=_dataset(), optimizers=_optimizer(model), precision=policy, poison=poison)
    ours = _fit(trainer)
    control = _engine_loop(policy, trainer.seen, poison)
    assert ours["losses"] == control["losses"]
    assert ours["norms"][:5] + ours["norms"][6:] == control["norms"][:5] + control["norms"][6:]
    assert all(0.01 < n < 100 for i, n in enumerate(ours["norms"]) if i not in poison)  # unscaled
    for p, q in zip(ours["params"], control["params"]):
        assert torch.equal(p, q)
    assert trainer.engine.skipped_steps == control["engine"].skipped_steps == len(poison)
    assert trainer.engine.scale == control["engine"].scale


def test_an_overflow_skips_the_step_and_the_scheduler_and_halves_the_scale() -> None:
    """16-mixed, an inf at the 4th step: its weights are the step before's, the learning rate it logs next is the same
    (the scheduler did not step), every other step moves both; the scale is init * backoff."""
    snapshots: list[list[torch.Tensor]] = []

    class Snapshot(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            snapshots.append([p.detach().clone() for p in model.parameters()])

    trainer = _Recording(model=_gpt2(), args=_args(), train_dataset=_dataset(), precision="16-mixed", poison=frozenset({3}),
                         scaler=ampkit.ScalerConfig(init_scale=2.0**12), callbacks=[Snapshot()])
    out = _fit(trainer)
    assert trainer.engine.skipped_steps == 1 and trainer.engine.scale == 2.0**12 * 0.5
    for step in range(1, STEPS):
        unchanged = all(torch.equal(p, q) for p, q in zip(snapshots[step - 1], snapshots[step]))
        assert unchanged == (step == 3), step
        assert (out["lrs"][step] == out["lrs"][step - 1]) == (step == 4), step  # logged before its own scheduler step


# ------------------------------------------------------------------------------------------------ the surface
class _HalfLossTrainer(Trainer):
    """A user's Trainer subclass with a loss of its own."""

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
        outputs = model(**inputs)
        return (outputs.loss * 0.5, outputs) if return_outputs else outputs.loss * 0.5


class _AmpkitHalfLossTrainer(AmpkitTrainerMixin, _HalfLossTrainer):
    pass


def test_the_mixin_trains_a_users_trainer_subclass_as_its_own_bf16() -> None:
    _fresh()
    native = _fit(_HalfLossTrainer(model=_gpt2(0.1), args=_args(bf16=True), train_dataset=_dataset()))
    _fresh()
    ours = _fit(_AmpkitHalfLossTrainer(model=_gpt2(0.1), args=_args(), train_dataset=_dataset(), precision="bf16-mixed"))
    _same(ours, native)


def test_evaluate_runs_in_the_policy_before_and_after_training() -> None:
    """The forward's context covers evaluate(): the eval loss equals the Trainer's own bf16 one; an evaluate() before
    train() sets the policy up, and training after it still clones its masters from the fp32 values."""
    evals = {}
    for name in ("native", "ours"):
        _fresh()
        if name == "native":
            trainer: Trainer = Trainer(model=_gpt2(), args=_args(bf16=True), train_dataset=_dataset(), eval_dataset=_dataset(16, seed=2))
        else:
            trainer = AmpkitTrainer(model=_gpt2(), args=_args(), train_dataset=_dataset(), eval_dataset=_dataset(16, seed=2), precision="bf16-mixed")
        evals[name] = trainer.evaluate()["eval_loss"]
    assert evals["ours"] == evals["native"]
    # bf16-true-masters: evaluate() casts the model first; the masters must still come from the fp32 values, so the run
    # equals one that never evaluated, bit for bit (evaluation draws no random numbers and changes no weight).
    runs = []
    for evaluate_first in (True, False):
        _fresh()
        trainer = AmpkitTrainer(model=_gpt2(), args=_args(), train_dataset=_dataset(), eval_dataset=_dataset(16, seed=2),
                                precision="bf16-true-masters")
        if evaluate_first:
            trainer.evaluate()
            assert trainer.model.transformer.h[0].attn.c_attn.weight.dtype == torch.bfloat16
        runs.append(_fit(trainer))
    _same(runs[0], runs[1])
