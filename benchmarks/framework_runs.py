"""One training run inside each framework, natively or with ampkit, for benchmarks/framework_overhead.py.

Each runner trains a :class:`Job` (a model, its data, how many epochs, where it starts and stops, a checkpoint to
write or resume from, gradients to poison with an inf) the way a user of that framework writes it, and returns a
:class:`Run`: every optimizer step's wall time, timed by a hook at the step's start and end inside the framework's
own loop (Lightning's ``on_train_batch_start``/``_end``, the Trainer's ``on_step_begin``/``on_step_end``, around the
step in a Fabric or Accelerate loop), every step's loss, the final weights and, with ampkit, the engine's counters.
``precision=None`` is the framework's own bf16-mixed; a policy name trains through ampkit's plugin, Trainer or
accelerator. The two sides of a framework share everything else: model, weights, data and order, fused AdamW
(lr 1e-3, weight decay 0.01; the foreach AdamW under Lightning's Trainer, see ``lightning_trainer``), gradient
clipping to norm 1.0 by the framework's own call, and the seed. The models: ``benchmarks/framework_models.py``.

    >>> from framework_models import gpt, gpt_data
    >>> job = Job(model=gpt(n_layer=1, n_embd=16, n_head=2, vocab=32, seq=8), data=gpt_data(4, vocab=32, seq=8), batch=2)
    >>> run = RUNNERS["fabric"](None, job)
    >>> len(run.times), len(run.losses), run.engine is None
    (2, 2, True)
"""

from __future__ import annotations

import logging
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from framework_models import SEED, Samples
from lockstep import Lockstep
from torch import nn

log = logging.getLogger("ampkit")

LR, WEIGHT_DECAY, CLIP = 1e-3, 0.01, 1.0

__all__ = ["CLIP", "Job", "Run", "RUNNERS", "STRIP", "quiet_frameworks"]


# ---------------------------------------------------------------------------------------------------- job and result
@dataclass(kw_only=True)
class Job:
    """What one run trains. One epoch is ``len(data) // batch`` optimizer steps, in the data's order (the Trainer
    shuffles with its seed, the same on both sides)."""

    model: Callable[[], nn.Module]
    data: Samples
    batch: int
    epochs: int = 1
    """The run's configured length (the Trainer's ``max_steps`` is ``epochs`` epochs)."""
    stop_epoch: int | None = None
    """Where this process stops (a killed run: before ``epochs``); None: at ``epochs``."""
    start_epoch: int = 0
    resume_from: Path | None = None
    """A checkpoint the run loads first, written by this runner's ``save_to`` run that stopped at ``start_epoch``."""
    save_to: Path | None = None
    """Where the run writes its checkpoint when it stops (a file or folder, as the framework takes it)."""
    poison: frozenset[int] = frozenset()
    """Optimizer steps (0-based, over the whole run) whose gradient gets an inf after the backward: an fp16 overflow."""
    lockstep: tuple[Lockstep, str] | None = None
    """Step in turn with another run (:mod:`lockstep`), as this side: each step waits for its turn before its clock starts."""

    @property
    def steps_per_epoch(self) -> int:
        return len(self.data) // self.batch

    @property
    def last_epoch(self) -> int:
        return self.epochs if self.stop_epoch is None else self.stop_epoch


@dataclass
class Run:
    lockstep: tuple[Lockstep, str] | None = None
    times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    params: list[torch.Tensor] = field(default_factory=list)
    engine: Any = None
    checkpoint: Path | None = None
    threads: set[int] = field(default_factory=set)
    _recorded: list[torch.Tensor] = field(default_factory=list)
    _t0: float = 0.0

    def begin(self) -> None:
        if self.lockstep is not None:
            self.lockstep[0].begin(self.lockstep[1])
        self._t0 = time.perf_counter()

    def end(self, loss: torch.Tensor) -> None:
        self.times.append(time.perf_counter() - self._t0)
        self._recorded.append(loss.detach())  # read after the run: no host read inside the timed loop
        self.threads.add(torch.get_num_threads())
        if self.lockstep is not None:
            self.lockstep[0].end(self.lockstep[1])

    def finish(self, model: nn.Module, engine: Any = None) -> Run:
        self.losses = torch.stack(self._recorded).float().tolist() if self._recorded else []
        self.params = [p.detach().clone() for p in model.parameters()]
        self.engine = engine
        return self


def _poison(model: nn.Module, step: int, job: Job) -> None:
    if step in job.poison:
        next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")


def _optimizer(params: Any, fused: bool = True) -> torch.optim.Optimizer:
    # The multi-tensor (foreach) kernels where the fused one is refused: no per-tensor Python loop on either side.
    return torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY, **({"fused": True} if fused else {"foreach": True}))


def _loader(job: Job) -> torch.utils.data.DataLoader[Any]:
    return torch.utils.data.DataLoader(job.data, batch_size=job.batch, shuffle=False, drop_last=True)


def quiet_frameworks() -> None:
    """Lightning's and Transformers' advice for a CPU run (loader workers, GPU available: False) is no part of a figure."""
    from lightning.fabric.utilities.warnings import PossibleUserWarning

    warnings.filterwarnings("ignore", category=PossibleUserWarning)
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # save_state's note that GPT-2's tied lm_head.weight is written once ("This should be OK"): the resume rows check it
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # "Writing model shards" at each checkpoint-N


def _reset_accelerate() -> None:
    # Accelerate keeps its process state in singletons: an Accelerator with another mixed precision than the last one
    # built is refused unless they are reset (as tests/unit/accelerate/conftest.py does between runs).
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


# ---------------------------------------------------------------------------------------------------- Lightning Trainer
def lightning_trainer(precision: str | None, job: Job) -> Run:
    import lightning as L

    from ampkit.lightning import AmpkitPrecision

    run = Run(job.lockstep)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = job.model()

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.model(**batch)["loss"]

        def on_after_backward(self) -> None:
            _poison(self.model, self.global_step, job)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            # Not the fused AdamW: Lightning's own bf16-mixed refuses gradient_clip_val beside it ("does not allow for
            # gradient clipping because it performs unscaling of gradients internally"), though bf16 has no scaler.
            return _optimizer(self.parameters(), fused=False)

    class Clock(L.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            run.begin()

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, *args: Any) -> None:
            run.end(outputs["loss"])

    module = Module()
    mixed = dict(precision="bf16-mixed") if precision is None else dict(plugins=[AmpkitPrecision(precision)])
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=job.last_epoch, gradient_clip_val=CLIP, callbacks=[Clock()], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **mixed)
    torch.manual_seed(SEED + 1)
    trainer.fit(module, train_dataloaders=_loader(job), ckpt_path=job.resume_from)
    if job.save_to is not None:
        trainer.save_checkpoint(job.save_to)
        run.checkpoint = job.save_to
    return run.finish(module.model, None if precision is None else trainer.precision_plugin.engine)


# ---------------------------------------------------------------------------------------------------- Lightning Fabric
def fabric(precision: str | None, job: Job) -> Run:
    import lightning as L

    from ampkit.lightning import AmpkitPrecision

    run = Run(job.lockstep)
    mixed = dict(precision="bf16-mixed") if precision is None else dict(plugins=[AmpkitPrecision(precision)])
    fab = L.Fabric(accelerator="cpu", devices=1, **mixed)
    model = job.model()
    model, optimizer = fab.setup(model, _optimizer(model.parameters()))
    plugin = fab.strategy.precision
    state = {"model": model, "optimizer": optimizer, "precision": plugin}  # the plugin's state travels in the user's dict
    if job.resume_from is not None:
        if precision is not None:
            plugin.setup_optimizers(optimizer)  # the masters in the optimizer before its state loads (the plugin's docs)
        fab.load(job.resume_from, state)
    torch.manual_seed(SEED + 1)
    loader, step = _loader(job), job.start_epoch * job.steps_per_epoch
    for _ in range(job.start_epoch, job.last_epoch):
        for batch in loader:
            run.begin()
            loss = model(**batch)["loss"]
            fab.backward(loss)
            _poison(model, step, job)
            # an overflowed step under loss scaling has an inf norm by design: skipped, not an error (both sides alike)
            fab.clip_gradients(model, optimizer, max_norm=CLIP, error_if_nonfinite=False)
            optimizer.step()
            optimizer.zero_grad()
            run.end(loss)
            step += 1
    if job.save_to is not None:
        fab.save(job.save_to, state)
        run.checkpoint = job.save_to
    return run.finish(model, None if precision is None else plugin.engine)


# ---------------------------------------------------------------------------------------------------- Hugging Face Trainer
def hf_trainer(precision: str | None, job: Job) -> Run:
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    from ampkit.transformers import AmpkitTrainer

    run = Run(job.lockstep)

    class Clock(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            run.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            run.end(recorded[-1])
            if state.global_step == job.last_epoch * job.steps_per_epoch:
                control.should_training_stop = True  # a run killed at stop_epoch (its checkpoint-N is written first)
            return control

    recorded: list[torch.Tensor] = []

    class Recording:
        """The loss of each step, as compute_loss returns it; the poisoned gradient after the step's backward."""

        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
            out = super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)  # type: ignore[misc]
            recorded.append((out[0] if return_outputs else out).detach())
            return out

        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            loss = super().training_step(model, inputs, num_items_in_batch)  # type: ignore[misc]
            _poison(model, self.state.global_step, job)  # type: ignore[attr-defined]
            return loss

    _reset_accelerate()
    with tempfile.TemporaryDirectory(prefix="fw_overhead_hf_") as scratch:  # output_dir of a run that writes nothing
        out_dir = job.save_to or (job.resume_from.parent if job.resume_from is not None else Path(scratch))
        args = TrainingArguments(
            output_dir=str(out_dir), use_cpu=True, report_to=[], disable_tqdm=True, seed=SEED, per_device_train_batch_size=job.batch,
            max_steps=job.epochs * job.steps_per_epoch, learning_rate=LR, weight_decay=WEIGHT_DECAY, optim="adamw_torch_fused",
            lr_scheduler_type="constant", max_grad_norm=CLIP, logging_strategy="no", dataloader_num_workers=0,
            save_strategy="steps" if job.save_to is not None else "no", save_steps=job.steps_per_epoch, bf16=precision is None,
        )
        common = dict(model=job.model(), args=args, train_dataset=job.data, callbacks=[Clock()])
        if precision is None:
            trainer = type("Native", (Recording, Trainer), {})(**common)
        else:
            trainer = type("Ampkit", (Recording, AmpkitTrainer), {})(**common, precision=precision)
        trainer.remove_callback(PrinterCallback)
        trainer.train(resume_from_checkpoint=None if job.resume_from is None else str(job.resume_from))
    if job.save_to is not None:
        run.checkpoint = job.save_to / f"checkpoint-{job.last_epoch * job.steps_per_epoch}"
    return run.finish(trainer.model, None if precision is None else trainer.engine)


# ---------------------------------------------------------------------------------------------------- Accelerate
def accelerate(precision: str | None, job: Job) -> Run:
    from accelerate import Accelerator

    from ampkit.accelerate import AmpkitAccelerator

    run = Run(job.lockstep)
    _reset_accelerate()
    acc = Accelerator(mixed_precision="bf16", cpu=True) if precision is None else AmpkitAccelerator(precision, cpu=True)
    model = job.model()
    model, optimizer, loader = acc.prepare(model, _optimizer(model.parameters()), _loader(job))
    torch.manual_seed(SEED + 1)
    if job.resume_from is not None:
        acc.load_state(str(job.resume_from))
    step = job.start_epoch * job.steps_per_epoch
    for _ in range(job.start_epoch, job.last_epoch):
        for batch in loader:
            run.begin()
            loss = model(**batch)["loss"]
            acc.backward(loss)
            _poison(model, step, job)
            acc.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            optimizer.zero_grad()
            run.end(loss)
            step += 1
    if job.save_to is not None:
        acc.save_state(str(job.save_to))
        run.checkpoint = job.save_to
    return run.finish(acc.unwrap_model(model), None if precision is None else acc.engine)


# ---------------------------------------------------------------------------------------------------- negative control
def _strip_lightning(checkpoint: Path) -> None:
    state = torch.load(checkpoint, weights_only=True)
    del state["AmpkitPrecision"]  # the plugin's state in Lightning's checkpoint, under its class name
    torch.save(state, checkpoint)


def _strip_fabric(checkpoint: Path) -> None:
    state = torch.load(checkpoint, weights_only=True)
    state["precision"] = {}  # the plugin loads an empty state as none (the key stays: fabric.load is strict)
    torch.save(state, checkpoint)


def _strip_folder(checkpoint: Path) -> None:
    (checkpoint / "ampkit_state.pt").unlink()


STRIP: dict[str, Callable[[Path], None]] = {
    "lightning-trainer": _strip_lightning,
    "fabric": _strip_fabric,
    "hf-trainer": _strip_folder,
    "accelerate": _strip_folder,
}
"""Removes ampkit's state (masters, scale, counters) from a checkpoint the framework wrote: the resume's negative control."""

RUNNERS: dict[str, Callable[[str | None, Job], Run]] = {
    "lightning-trainer": lightning_trainer,
    "fabric": fabric,
    "hf-trainer": hf_trainer,
    "accelerate": accelerate,
}
"""Each framework's run: ``RUNNERS[name](precision, job)``; ``precision=None`` is the framework's own bf16-mixed."""

NATIVE = {
    "lightning-trainer": 'L.Trainer(precision="bf16-mixed")',
    "fabric": 'L.Fabric(precision="bf16-mixed")',
    "hf-trainer": "Trainer(args=TrainingArguments(bf16=True))",
    "accelerate": 'Accelerator(mixed_precision="bf16")',
}
AMPKIT = {
    "lightning-trainer": "L.Trainer(plugins=[AmpkitPrecision({p!r})])",
    "fabric": "L.Fabric(plugins=[AmpkitPrecision({p!r})])",
    "hf-trainer": "AmpkitTrainer(precision={p!r})",
    "accelerate": "AmpkitAccelerator({p!r})",
}
CHECKPOINT = {
    "lightning-trainer": "trainer.save_checkpoint / fit(ckpt_path=)",
    "fabric": "fabric.save / fabric.load",
    "hf-trainer": "checkpoint-N / train(resume_from_checkpoint=)",
    "accelerate": "save_state / load_state",
}
