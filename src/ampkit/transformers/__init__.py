"""ampkit inside Hugging Face's Trainer: :class:`AmpkitTrainer` in place of ``Trainer``, or :class:`AmpkitTrainerMixin`
before a Trainer subclass of your own (TRL's ``SFTTrainer``...).

    from ampkit.transformers import AmpkitTrainer
    trainer = AmpkitTrainer(model=model, args=TrainingArguments(...), train_dataset=ds, precision="bf16-true-masters")
    trainer.train(resume_from_checkpoint=True)   # continues a preempted run from its checkpoint-N

The Trainer's own loop trains through an :class:`~ampkit.accelerate.AmpkitAccelerator`: the policy, the loss scaler
(with ``scaler=ampkit.ScalerConfig(...)``), the fp32 masters, the kernel guards and the skip decision are the
engine's; ``max_grad_norm`` clips the unscaled (master) gradients and the logged ``grad_norm`` is the unscaled one;
``checkpoint-N`` holds the engine's state (``ampkit_state.pt``) and a resume reads it back; SIGTERM saves
``checkpoint-N`` after the step in flight and exits with code 75 (``ampkit.training.REQUEUE_EXIT_CODE``). Why a
subclass and not a callback, and what it overrides: :mod:`ampkit.transformers._trainer`. Importing this package
checks the installed transformers and accelerate against the tested ranges.

    >>> from ampkit.transformers import AmpkitTrainer
    >>> AmpkitTrainer.__mro__[2].__name__
    'Trainer'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._util.framework_versions import require
from .._util.lazy import lazy_names

require("transformers", "ampkit.transformers")
require("accelerate", "ampkit.transformers")

if TYPE_CHECKING:
    from ._trainer import AmpkitTrainer, AmpkitTrainerMixin

# Where each public name lives (its module, relative to this package): imported on the name's first use.
_NAMES = {
    "AmpkitTrainer": "_trainer",
    "AmpkitTrainerMixin": "_trainer",
}

__all__ = ["AmpkitTrainer", "AmpkitTrainerMixin"]

__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
