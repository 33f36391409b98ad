"""``ampkit bench``: the same training run under several precision policies, measured side by side.

A :class:`Workload` (built-in, or the user's model and data: :mod:`ampkit.workloads`) is trained from identical weights on identical
batches under each policy; the runner records time, memory, loss and eval figures into a :class:`BenchResult`.
:func:`bench_model` runs it from Python on a model and data, as ``ampkit bench --model --data`` does.
"""

from ..workloads import Accuracy, Batch, BenchData, Metric, Workload
from ._api import bench_model
from ._policy_run import PolicyRun
from ._results import BenchResult, RunResult
from ._runner import run_bench
from ._speedup import speedup_interval

__all__ = ["Accuracy", "Batch", "BenchData", "BenchResult", "Metric", "PolicyRun", "RunResult", "Workload", "bench_model", "run_bench", "speedup_interval"]
