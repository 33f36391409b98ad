"""How a model is called on a user's batch and how its output becomes a loss; the rules live in
:mod:`ampkit._util.model_io`, below bench, memory and the doctor, which all use them."""

from .._util.model_io import LOSS_FN_HINT, batch_loss, batch_parts, call_model, default_loss, output_as_float, prediction, run_batch

__all__ = ["call_model", "batch_parts", "run_batch", "batch_loss", "default_loss", "output_as_float", "prediction", "LOSS_FN_HINT"]
