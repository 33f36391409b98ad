"""``ampkit tune``: the fastest training configuration that keeps fp32's accuracy, found and proven on your own model
and device.

    ampkit tune -w digits --budget 120 --out tune/digits
    ampkit tune --model mypkg.nets:build --data mypkg.data:batches --run-steps 20000 --out tune/

From Python, the package itself is the call (``ampkit.tune(model, data, ...)``, :func:`tune`)::

    result = ampkit.tune(model, batches, optimizer=optimizer, budget=600, out="tune/")
    print(ampkit.tune.code(result))         # the Engine(...) call, batch and accumulation, DataLoader arguments

How it works (each step its own module): the **search space** of precision policy, compile, the fused master step,
micro-batch with accumulation, recompute, DataLoader settings and CPU threads (:mod:`~ampkit.tune._space`);
**pruning** with a reason per rule, trials ordered by expected gain (:mod:`~ampkit.tune._prune`), on facts from
the memory prediction, fp8's roofline, the doctor and the loader (:mod:`~ampkit.tune._facts`); **short
interleaved trials** on the bench's machinery with bootstrap intervals, compile time amortised
(:mod:`~ampkit.tune._trials`); the **accuracy guard** against fp32 and its own measured noise
(:mod:`~ampkit.tune._guard`); the stages and finalists (:mod:`~ampkit.tune._run`); the **report**
(:mod:`~ampkit.tune._report`), with trials kept on disk so a killed tune resumes (:mod:`~ampkit.tune._store`).

    >>> import ampkit
    >>> callable(ampkit.tune), ampkit.tune.tune is tune
    (True, True)
"""

from __future__ import annotations

import sys
import types
from typing import Any

from ._api import optimizer_factory, tune
from ._facts import gather_facts
from ._guard import GuardResult, Reference
from ._prune import RULES, StagePlan, plan_stage, stage_order
from ._report import code, render, rows, write_files
from ._result import TuneResult
from ._run import tune_workload
from ._space import STAGES, Candidate, Facts, PolicyFacts, stage_candidates
from ._trials import Trial, WaveSettings, measure_wave

__all__ = [
    "tune", "tune_workload", "TuneResult", "Candidate", "Facts", "PolicyFacts", "STAGES", "RULES", "StagePlan", "Trial",
    "WaveSettings", "GuardResult", "Reference", "code", "gather_facts", "measure_wave", "optimizer_factory", "plan_stage",
    "render", "rows", "stage_candidates", "stage_order", "write_files",
]


class _CallableModule(types.ModuleType):
    """``ampkit.tune`` is both this package and the call: ``ampkit.tune(model, data)`` runs :func:`tune`."""

    def __call__(self, *args: Any, **kwargs: Any) -> TuneResult:
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
