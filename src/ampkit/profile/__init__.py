"""``ampkit profile``: where a training step's time goes, why the device waits, and which change gives it back.

:class:`Profiler` profiles the user's own loop through the engine's step hooks: :class:`PhaseTimer` times each
step's phases, :class:`SyncFinder` finds the host syncs and the lines that make them, and :func:`op_breakdown`
reads the casts' share and the optimizer's ops from torch.profiler, :func:`count_step` counts a step's aten ops and
syncs (to compare two loops exactly, without a clock). :func:`try_loader_settings` times a
DataLoader's variants on the loop's own step, :func:`advise` turns a profile into advice, and
:func:`profile_workload` is the command's whole run on a workload.

    >>> from ampkit.profile import Profiler, try_loader_settings
"""

from ._advice import advise
from ._files import save_profile, show_profile
from ._idle import DeviceIdle, device_idle
from ._op_count import StepCounts, count_step
from ._op_shares import OpBreakdown, PhaseRanges, op_breakdown
from ._phases import PHASES, PhaseTimer, StepPhases
from ._run import profile_workload, workload_loader
from ._session import Profiler
from ._syncs import SyncFinder, SyncSite
from ._trials import LoaderSettings, Trial, candidate_settings, loader_settings, loader_variant, try_loader_settings, usable_cores

__all__ = [
    "Profiler", "PHASES", "PhaseTimer", "StepPhases", "SyncFinder", "SyncSite", "PhaseRanges", "OpBreakdown",
    "op_breakdown", "DeviceIdle", "device_idle", "LoaderSettings", "Trial", "candidate_settings", "loader_settings", "loader_variant",
    "try_loader_settings", "usable_cores", "advise", "profile_workload", "workload_loader", "save_profile", "show_profile",
    "StepCounts", "count_step",
]
