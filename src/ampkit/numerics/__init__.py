"""The numerics doctor: how a model's activations, weights and gradients fit fp16 and bf16, and what to do.

    ampkit doctor                                   # a built-in workload
    ampkit doctor --model mypkg.nets:build --data mypkg.data:batches --precision 16-mixed --out doctor/

In Python, :func:`diagnose` returns a :class:`Diagnosis`; ``Engine(**diagnosis.engine_kwargs())`` applies its
recommendation. :class:`NumericsSampler` (``Engine(numerics=N)``) is the cheap version for a running training
job: every N steps it reads the gradients and activations the engine already has and logs how they fit fp16,
and audits how much of the update lands where the optimizer steps 16-bit weights directly.

doctor.json (:meth:`Diagnosis.to_dict`) holds: ``recommended_precision`` and ``precision_reasons``;
``recommended_loss_scale`` (``2^loss_scale_log2``, the largest keeping every gradient within fp16) and
``gradient_max_abs``; ``keep_fp32`` (module names); ``engine`` (the Engine keyword arguments) and
``engine_code`` (a torch.nn type in place of its modules where every module of it is kept); ``paste_check`` (when the
tailored policy's step still diverged: each configuration trained against fp32 and the one pasted instead,
:mod:`~ampkit.numerics._paste`; None otherwise); ``underflow_share_unscaled`` / ``underflow_share_scaled`` (gradient values below 2^-24, weight
and activation gradients together) with their split in ``gradient_underflow`` and exponent histograms in
``gradient_histograms``; ``comparisons`` (the policy as it comes and as tailored, per module against fp32);
``tailoring_notes``; and ``modules``: per module its type, parameter count, statistics of ``weights``,
``grads``, ``inputs``, ``outputs`` and ``output_grads`` (:meth:`TensorStats.to_dict`), ``problems`` and
``severity``; ``update_precision`` (with an optimizer: whether bf16 weights stepped directly lose updates, per
parameter, each remedy tried and the one ``prescribed``, ``judged`` false when fp32's own held-out loss did not
fall beyond its noise ``fp32_noise``, ``forward_keep`` (the forward fixes every trial ran with), ``forward_fault`` (the
modules still diverging with them: no remedy tried), ``preferred`` (why a remedy is prescribed where bf16-true also
recovered), and ``applied``: whether the prescription is part of the recommendation or an option beside it;
:mod:`~ampkit.numerics._update_remedy`);
``fp8_headroom`` (per ``nn.Linear`` and Hugging Face ``Conv1D``, its ``kind``, worst first, how its input, weight and output gradient survive torchao's
float8 cast: amax, format, share flushed to zero, round-trip error; :mod:`~ampkit.numerics._fp8_headroom`); plus run facts
(versions, device, command, workload, date).
"""

from ._doctor import Diagnosis, diagnose
from ._formats import BF16, FP16, Format
from ._sample import NumericsSample
from ._sampler import NumericsSampler
from ._stats import StatsAccumulator, TensorStats

__all__ = ["BF16", "FP16", "Diagnosis", "Format", "NumericsSample", "NumericsSampler", "StatsAccumulator", "TensorStats", "diagnose"]
