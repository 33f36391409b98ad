"""``ampkit tune``: the fastest training configuration that keeps fp32's accuracy, found and proven on your own model
and device.

    ampkit tune -w digits --budget 120 --out tune/digits
    ampkit tune --model mypkg.nets:build --data mypkg.data:batches --run-steps 20000 --out tune/

From Python, :func:`tune` is ``ampkit.tune`` (this package, ``ampkit.tuning``, holds it and what it returns)::

    result = ampkit.tune(model, batches, optimizer=optimizer, budget=600, out="tune/")
    print(ampkit.tuning.code(result))         # the Engine(...) call, batch and accumulation, DataLoader arguments

How it works (each step its own module): the **search space** of precision policy, compile, the fused master step,
micro-batch with accumulation, recompute, DataLoader settings and CPU threads (:mod:`~ampkit.tuning._space`);
**pruning** with a reason per rule, trials ordered by expected gain (:mod:`~ampkit.tuning._prune`), on facts from
the memory prediction, fp8's roofline, the doctor and the loader (:mod:`~ampkit.tuning._facts`); **short
interleaved trials** on the bench's machinery with bootstrap intervals, compile time amortised
(:mod:`~ampkit.tuning._trials`); the **accuracy guard** against fp32 and its own measured noise
(:mod:`~ampkit.tuning._guard`); the stages and finalists (:mod:`~ampkit.tuning._run`); the **report**
(:mod:`~ampkit.tuning._report`) with its plots (:mod:`~ampkit.tuning._plots`, written by :mod:`~ampkit.tuning._files`), with trials kept on disk so a killed tune resumes (:mod:`~ampkit.tuning._store`).

    >>> import ampkit
    >>> ampkit.tune is tune
    True
"""

from __future__ import annotations

from ._api import tune
from ._files import write_files
from ._guard import GuardResult
from ._report import code, rows
from ._result import TuneResult
from ._run import tune_workload
from ._space import STAGES, Candidate
from ._trials import Trial, WaveSettings

# What a user calls and reads back: the two entry points, the result and its parts, and the result's three forms
# (the code to paste, the table's rows, the files). The search's own machinery (facts, pruning rules, waves) is
# internal: its modules are tested directly.
__all__ = ["tune", "tune_workload", "TuneResult", "Candidate", "Trial", "GuardResult", "WaveSettings", "STAGES", "code", "rows", "write_files"]

