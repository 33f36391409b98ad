"""What the tools run: a workload, built in or the user's own, with its batches, its recipe and its device.

One layer below every tool (bench, memory, doctor, profile, and the coming tune), above the training layer: a
tool reads its workload here and never from another tool. :func:`choose_workload` applies the rules that turn
``-w``/``--size``/``--batch-size`` or ``--model``/``--data`` into a :class:`Workload`; :func:`get_workload` builds
a built-in one by name (:mod:`~ampkit.workloads._registry`; the modules ``digits``, ``digits_aug``, ``gpt``,
``resnet`` and ``segment`` beside it); :mod:`~ampkit.workloads._user` loads the user's factories;
:func:`parse_precisions` makes the policies a tool runs into Policy objects, once.

    >>> from ampkit.workloads import choose_workload
    >>> choose_workload(size="tiny", device=default_device()).name in WORKLOADS
    True
"""

from .._util.model_io import to_device
from ..training._micro_batching import batch_rows, split_batch
from ._choose import choose_workload
from ._defaults import default_size, default_workload, workload_size
from ._device import default_device, device_info
from ._precisions import parse_precisions
from ._registry import WORKLOADS, get_workload, workload_names
from ._user import BenchData, load_factory, workload_from
from ._workload import SIZES, Accuracy, Batch, Metric, Workload

__all__ = [
    "SIZES",
    "WORKLOADS",
    "Accuracy",
    "Batch",
    "BenchData",
    "Metric",
    "Workload",
    "batch_rows",
    "choose_workload",
    "default_device",
    "default_size",
    "default_workload",
    "device_info",
    "get_workload",
    "load_factory",
    "parse_precisions",
    "split_batch",
    "to_device",
    "workload_from",
    "workload_names",
    "workload_size",
]
