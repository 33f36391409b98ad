"""``AmpkitTrainer`` and ``AmpkitTrainerMixin``: the Hugging Face Trainer training through an ampkit engine.

Why a Trainer subclass (and a mixin, for users who already subclass Trainer: TRL's ``SFTTrainer``...) and not a
callback alone: in transformers 5.23 ``Trainer._run_epoch`` calls ``self.training_step`` (whose backward is
``self.accelerator.backward(loss)``) and then, at the window's end, ``self.optimizer.step()`` itself; a
``TrainerCallback`` is told ``on_pre_optimizer_step`` / ``on_optimizer_step`` but returns only a ``TrainerControl``
(log, save, evaluate, stop), so it can neither multiply the loss by a scale before the backward nor skip the
optimizer step (the scheduler steps unless ``accelerator.optimizer_step_was_skipped``). Both go through the
Trainer's accelerator, so the subclass gives the Trainer an :class:`~ampkit.accelerate.AmpkitAccelerator` and the
Trainer's own loop does the rest, unchanged:

* ``accelerator.backward`` scales the loss (``engine.backward``); ``accelerator.clip_grad_norm_`` (``max_grad_norm``)
  unscales first and clips the gradients the optimizer steps (the fp32 masters where there are), and returns the
  unscaled norm, the ``grad_norm`` the Trainer logs; ``self.optimizer.step()`` is ``engine.step()`` (check, skip,
  scaler update, masters copy-back); ``accelerator.optimizer_step_was_skipped`` is the engine's, so the scheduler
  does not step on a skipped step;
* the forward runs in the policy's context through the prepared model's forward, as the Trainer's own bf16 runs in
  Accelerate's autocast (``autocast_smart_context_manager`` is a no-op in 5.23: "we rely on accelerate"), which
  covers ``evaluate()`` and ``predict()`` too;
* the kernel guards, masters and policy casts come from the engine at ``prepare``.

What is overridden, each kept small and tested: ``create_accelerator_and_postprocess`` (public: the accelerator is
an AmpkitAccelerator built from the very arguments the Trainer built for its own, ``_build_accelerator_args``, which
is overridden only to keep them), ``_save_scaler`` / ``_load_scaler`` (the Trainer's pair for the loss scaler's
state: the engine's state goes into ``checkpoint-N/ampkit_state.pt`` beside the scaler's place, and is read back right
after the optimizer and scheduler, as the scaler's is), and ``train`` (save on preemption's exit,
:mod:`~ampkit.transformers._preemption`).
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from transformers import Trainer

from ..accelerate import AmpkitAccelerator
from ..accelerate._checks import check_plain_model
from ..accelerate._state_file import read_engine_state, write_engine_state
from ..policy import get_policy
from ..training import REQUEUE_EXIT_CODE
from ._checks import check_training_args
from ._preemption import TrainerPreemption

if TYPE_CHECKING:
    from torch import nn

    from ..policy import Policy
    from ..scaling import ScalerConfig, StepScaler
    from ..training import Engine

__all__ = ["AmpkitTrainer", "AmpkitTrainerMixin"]


class AmpkitTrainerMixin:
    """Put before ``Trainer`` (or a subclass of it) in the bases: ``class MyTrainer(AmpkitTrainerMixin, SFTTrainer)``.

    Adds the keyword arguments ``precision`` (an ampkit policy name or Policy), ``keep_fp32``, ``scaler``, ``numerics``
    (as :class:`ampkit.Engine` takes them) and ``preemption_signals`` (default SIGTERM; ``()`` turns save on preemption
    off); everything else goes to the Trainer. ``trainer.engine`` is the engine (scale, skipped steps, masters).
    Refused, naming what to drop: ``TrainingArguments(fp16=True)`` / ``bf16=True`` / ``fp16_full_eval`` /
    ``bf16_full_eval``, the launcher's ``ACCELERATE_MIXED_PRECISION``, DeepSpeed, FSDP, a model already wrapped.
    """

    def __init__(self, *args: Any, precision: str | int | Policy, keep_fp32: Sequence[str | type[nn.Module]] = (),
                 scaler: StepScaler | ScalerConfig | str | float | None = None, numerics: Any = None,
                 preemption_signals: Sequence[signal.Signals | int] = (signal.SIGTERM,), **kwargs: Any) -> None:
        get_policy(precision, keep_fp32=keep_fp32)  # an unknown name fails here, naming the closest, before the Trainer starts
        self._ampkit_engine_args = dict(precision=precision, scaler=scaler, keep_fp32=keep_fp32, numerics=numerics)
        self._ampkit_accelerator_args: dict[str, Any] | None = None
        super().__init__(*args, **kwargs)
        self._ampkit_preemption = TrainerPreemption(self, preemption_signals, REQUEUE_EXIT_CODE)  # type: ignore[arg-type]
        self.add_callback(self._ampkit_preemption)  # type: ignore[attr-defined]

    @property
    def engine(self) -> Engine:
        """The :class:`ampkit.Engine` the Trainer's accelerator runs (``trainer.accelerator.engine``)."""
        return self.accelerator.engine  # type: ignore[attr-defined,no-any-return]

    # ------------------------------------------------------------------------------------------ the accelerator
    def _build_accelerator_args(self, **kwargs: Any) -> dict[str, Any]:
        args: dict[str, Any] = super()._build_accelerator_args(**kwargs)  # type: ignore[misc]
        self._ampkit_accelerator_args = dict(args)  # kept for the AmpkitAccelerator built from them
        return args

    def create_accelerator_and_postprocess(self) -> None:
        """The Trainer's own setup, then its accelerator replaced by an AmpkitAccelerator built from the same arguments."""
        precision = get_policy(self._ampkit_engine_args["precision"]).name
        check_training_args(precision, self.args)  # type: ignore[attr-defined]
        model = getattr(self, "model", None)
        if model is not None:
            check_plain_model(model)
        super().create_accelerator_and_postprocess()  # type: ignore[misc]
        if self._ampkit_accelerator_args is None:
            raise RuntimeError("AmpkitTrainer: this transformers release builds its accelerator without _build_accelerator_args(); "
                               "install a tested release (see ampkit._util.framework_versions.TESTED).")
        plain = self.accelerator  # type: ignore[has-type]
        self.accelerator = AmpkitAccelerator(**self._ampkit_engine_args, **self._ampkit_accelerator_args)
        self.gather_function = _rebound(self.gather_function, plain, self.accelerator)  # type: ignore[has-type]

    # ------------------------------------------------------------------------------------------ checkpoints
    def _save_scaler(self, output_dir: str) -> None:
        super()._save_scaler(output_dir)  # type: ignore[misc]  # Accelerate's scaler: none (the engine's replaces it)
        if self.args.should_save and self.engine.models:  # type: ignore[attr-defined]
            write_engine_state(self.engine, output_dir)

    def _load_scaler(self, checkpoint: str | None) -> None:
        super()._load_scaler(checkpoint)  # type: ignore[misc]
        if checkpoint is not None:
            state = read_engine_state(self.engine, checkpoint)  # after the optimizer and scheduler, as the scaler's
            if state is not None:
                self.engine.load_state_dict(state)

    # ------------------------------------------------------------------------------------------ train
    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; preempted (SIGTERM), it returns only after ``checkpoint-N`` is written, by exiting the process
        with :data:`ampkit.training.REQUEUE_EXIT_CODE` (``resume_from_checkpoint=True`` continues from it)."""
        try:
            output = super().train(*args, **kwargs)  # type: ignore[misc]
        except BaseException as error:
            self._ampkit_preemption.abort(error)
            raise
        self._ampkit_preemption.finish()  # raises Preempted (SystemExit 75) if the signal came
        return output


class AmpkitTrainer(AmpkitTrainerMixin, Trainer):
    """``transformers.Trainer`` with an ampkit precision policy: ``AmpkitTrainer(model=..., args=..., train_dataset=...,
    precision="bf16-true-masters")`` in place of ``Trainer(..., args=TrainingArguments(bf16=True, ...))``. See
    :class:`AmpkitTrainerMixin` for the arguments it adds and the module docstring for how it works.

    >>> import torch, tempfile
    >>> from transformers import TrainingArguments
    >>> args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to=[], max_steps=2, disable_tqdm=True)
    >>> trainer = AmpkitTrainer(model=torch.nn.Linear(2, 2), args=args, precision="bf16-mixed")
    >>> type(trainer.accelerator).__name__, trainer.engine.policy.name
    ('AmpkitAccelerator', 'bf16-mixed')
    """


def _rebound(fn: Any, old: Any, new: Any) -> Any:
    """``fn`` (a bound method of ``old``, or a partial of one) bound to ``new`` instead; anything else as it is."""
    if isinstance(fn, functools.partial):
        return functools.partial(_rebound(fn.func, old, new), *fn.args, **fn.keywords)
    if getattr(fn, "__self__", None) is old:
        return getattr(new, fn.__name__)
    return fn
