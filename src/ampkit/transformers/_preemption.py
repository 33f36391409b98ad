"""Save on preemption inside the Hugging Face Trainer: the signal ends the run with a normal ``checkpoint-N``.

A scheduler stops a job with SIGTERM and a grace period. Under an :class:`~ampkit.transformers.AmpkitTrainer`:

* the signal handler only notes the signal (and calls the handler it replaced, a user's Python function);
* at the end of the optimizer step in flight (the Trainer's ``on_step_end``: its whole accumulation window trained,
  the scheduler stepped, ``global_step`` counted), the callback asks the Trainer, through its own
  ``TrainerControl``, to save and to stop: the Trainer writes ``checkpoint-N`` by its own save path (model,
  optimizer, scheduler, RNG, ``trainer_state.json``, and ampkit's ``ampkit_state.pt``) and leaves its loop;
* ``trainer.train()`` then ends the process with :class:`ampkit.training.Preempted`, exit code
  :data:`~ampkit.training.REQUEUE_EXIT_CODE` (75), and the requeued job's ``trainer.train(resume_from_checkpoint=True)``
  continues from ``checkpoint-N`` exactly as the run would have gone on;
* a signal after the last step (the run was finishing) saves ``checkpoint-N`` when ``train()`` returns, then exits the
  same way; leaving ``train()`` puts back the handlers it replaced.

The noting, the chaining and restoring of handlers and the agreement across DDP ranks (every rank stops at the same
step, though the signal may reach only some) are :class:`ampkit.training.PreemptionWatch`'s, reused as they are: the
watch's ``check`` runs at each ``on_step_end``, and its save is the Trainer's. Where the watch would exit at once
(its :class:`~ampkit.training.Preempted`), the callback turns that into the Trainer's save-and-stop instead, and
``train()`` raises it once the Trainer has saved.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from ..training import REQUEUE_EXIT_CODE, Preempted, PreemptionWatch

if TYPE_CHECKING:
    from transformers import Trainer, TrainerControl, TrainerState, TrainingArguments

__all__ = ["TrainerPreemption"]

log = logging.getLogger("ampkit")


class TrainerPreemption(TrainerCallback):
    """The Trainer callback (and ``train()``'s companion) that saves and exits on ``signals`` (module docstring)."""

    def __init__(self, trainer: Trainer, signals: Sequence[signal.Signals | int] = (signal.SIGTERM,), exit_code: int = REQUEUE_EXIT_CODE) -> None:
        self._trainer = weakref.ref(trainer)  # the Trainer holds this callback: no cycle keeping it alive
        self.signals = tuple(signals)
        self.exit_code = exit_code
        self._watch: PreemptionWatch | None = None
        self._preempted: Preempted | None = None
        self._in_loop = False

    # ------------------------------------------------------------------------------------------ Trainer events
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        trainer = self._trainer()
        self._preempted = None
        if trainer is None or not self.signals:
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning("AmpkitTrainer: train() runs outside the main thread, where Python delivers no signals: no save on preemption.")
            return
        engine = trainer.accelerator.engine
        watch = PreemptionWatch(engine, self._save, lambda _: None, args.output_dir, signals=self.signals, exit_code=self.exit_code)
        watch.__enter__()
        self._watch, self._in_loop = watch, True

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        if self._watch is not None and self._preempted is None:
            try:
                self._watch.check(boundary=True)  # the window in flight is done: agree across ranks, "save", raise
            except Preempted as preempted:
                self._preempted = preempted
                log.warning("preempted: the Trainer writes checkpoint-%d and stops; train() then exits with %d", state.global_step, self.exit_code)
                control.should_save = True
                control.should_training_stop = True
        return control

    def _save(self, path: str, extra: dict[str, Any] | None) -> None:
        # The watch's save. In the loop the Trainer saves itself (on_step_end asked it to); after the loop (a signal once
        # the last step was done) nothing will: the checkpoint of the last step is written here, unless it exists.
        trainer = self._trainer()
        if self._in_loop or trainer is None:
            return
        folder = os.path.join(trainer.args.output_dir, f"checkpoint-{trainer.state.global_step}")
        if not os.path.isdir(folder):
            trainer._save_checkpoint(trainer.model_wrapped, trial=None)

    # ------------------------------------------------------------------------------------------ train()'s end
    def finish(self) -> None:
        """``train()`` returned: a signal noted after the last check saves now; either way, exit if preempted."""
        watch, self._watch, self._in_loop = self._watch, None, False
        if watch is None:
            return
        if self._preempted is not None:
            preempted, self._preempted = self._preempted, None
            watch.__exit__(type(preempted), preempted, None)  # puts the handlers back; saves nothing more
            raise preempted
        watch.__exit__(None, None, None)  # may save (self._save) and raise Preempted

    def abort(self, error: BaseException) -> None:
        """``train()`` raised: put the handlers back and save nothing."""
        watch, self._watch, self._in_loop, self._preempted = self._watch, None, False, None
        if watch is not None:
            watch.__exit__(type(error), error, error.__traceback__)
