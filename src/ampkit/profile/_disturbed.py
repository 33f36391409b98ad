"""Whether a profile's figures are the loop's own: the machine's load while its steps and its trials ran.

A profile's step times, phase shares, overhead ratios and trial speed-ups are the loop's only when nothing else
runs on the cores: a GPT-2 step profiled beside two CPU-bound processes took 597 ms where it takes 41 ms alone. The
measure is the one ``ampkit tune`` reads (:class:`ampkit._util.cpu_load.CpuMeter`: the CPU time other processes
took, in cores, from the kernel's counters; the loop's own DataLoader workers count as the loop's), and a window
is **disturbed** when other processes took :data:`~ampkit._util.cpu_load.BUSY_CORES` or more. A disturbed
profile still shows its figures, under a line that says they are not the loop's own; its overhead is not read.

    >>> data = {"machine": {"steps": {"others_cores": 1.9, "cores": 2, "seconds": 3.1, "busy": True}, "trials": None}}
    >>> print(disturbed_line(data))
    Disturbed run: other processes took 1.9 of the 2 cores while the steps were measured (busy from 0.5, as ampkit tune reads it): the step times, phase shares and overhead below are slowed by them, not the loop's own. Rerun on a quiet machine before acting on them.
    >>> disturbed_line({"machine": {"steps": {"others_cores": 0.1, "cores": 2, "seconds": 3.1, "busy": False}}}) is None
    True
"""

from __future__ import annotations

from typing import Any

from .._util.cpu_load import BUSY_CORES, Load

__all__ = ["disturbed", "disturbed_line", "load_record"]


def load_record(load: Load) -> dict[str, Any]:
    """``load`` as profile.json keeps it: the other processes' cores (None where the OS does not say), the cores,
    the seconds measured, and whether that made the window disturbed.

    >>> load_record(Load(1.2, 4.0, 2))
    {'others_cores': 1.2, 'cores': 2, 'seconds': 4.0, 'busy': True}
    """
    return {"others_cores": load.others_cores, "cores": load.cores, "seconds": load.seconds, "busy": load.busy}


def disturbed(data: dict[str, Any], window: str = "steps") -> bool:
    """Whether other processes took enough CPU in ``window`` (``steps`` or ``trials``) to disturb its figures.

    >>> disturbed({"machine": {"steps": {"busy": True}}}), disturbed({}), disturbed({"machine": {"trials": None}}, "trials")
    (True, False, False)
    """
    record = (data.get("machine") or {}).get(window) or {}
    return bool(record.get("busy"))


def _took(record: dict[str, Any]) -> str:
    return f"other processes took {record['others_cores']:.1f} of the {record['cores']} cores"


def disturbed_line(data: dict[str, Any]) -> str | None:
    """What the machine's load did to the figures, in words; None for a quiet run (or one whose load is unknown).

    >>> rec = {"others_cores": 0.9, "cores": 2, "seconds": 2.0}
    >>> print(disturbed_line({"machine": {"steps": {**rec, "busy": False}, "trials": {**rec, "busy": True}}}))
    Disturbed trials: other processes took 0.9 of the 2 cores while the loader's settings were timed (busy from 0.5, as ampkit tune reads it): their speed-ups may be the load's, not the settings'. Rerun on a quiet machine before acting on them.
    """
    machine = data.get("machine") or {}
    steps, trials = machine.get("steps") or {}, machine.get("trials") or {}
    busy = f"(busy from {BUSY_CORES:g}, as ampkit tune reads it)"
    if steps.get("busy"):
        also = ", the trials' speed-ups" if trials.get("busy") else ""
        return (
            f"Disturbed run: {_took(steps)} while the steps were measured {busy}: the step times, phase shares{also} and "
            "overhead below are slowed by them, not the loop's own. Rerun on a quiet machine before acting on them."
        )
    if trials.get("busy"):
        return (
            f"Disturbed trials: {_took(trials)} while the loader's settings were timed {busy}: their speed-ups may be the "
            "load's, not the settings'. Rerun on a quiet machine before acting on them."
        )
    return None
