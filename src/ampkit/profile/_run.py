"""``ampkit profile``'s run: train a workload through a DataLoader under a :class:`~ampkit.profile.Profiler`,
time the loader's variants on the same step, and put it all, with the advice, in one ``profile.json`` dict.

    >>> from ampkit.workloads import get_workload
    >>> data = profile_workload(get_workload("gpt", size="tiny"), "32-true", "cpu", plain_steps=2, timed=3, sync_steps=1, trace_steps=1)
    >>> data["workload"]["name"], sorted(data["phases"])[:3], data["trials"]
    ('gpt', ['backward', 'copy', 'data'], [])
"""

from __future__ import annotations

import copy
import datetime
import itertools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from .. import __version__
from .._report.progress import NullReporter
from .._util.cpu_load import CpuMeter
from .._util.model_io import batch_loss
from ..policy import Policy, get_policy
from ..training._engine import Engine
from ..workloads._device import device_info
from ..workloads._lightning_step import StepCall, step_loader
from ..workloads._prepared import unwrap_prepared
from ..workloads._recipe import with_lr
from ..workloads._workload import Batch, Workload
from ._advice import advise
from ._disturbed import load_record
from ._progress import Progress, window_phase
from ._session import Profiler
from ._trials import search_size, try_loader_settings

__all__ = ["profile_workload", "workload_loader"]


class _Batches(Dataset[Batch]):
    """A workload's ready-made batches as a dataset of whole batches (read with ``batch_size=None``)."""

    def __init__(self, batches: Sequence[Batch]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> Batch:
        return self.batches[index]


def workload_loader(workload: Workload) -> DataLoader[Any]:
    """The DataLoader a built-in workload is read through, as a plain loop would build it: in this process, no
    pinned memory. A workload with a per-sample dataset (``Workload.samples``) is batched by the loader; one
    without is read a ready batch at a time.

    >>> from ampkit.workloads import get_workload
    >>> loader = workload_loader(get_workload("gpt", size="tiny"))
    >>> loader.batch_size is None, loader.num_workers
    (True, 0)
    """
    if workload.samples is not None:
        return DataLoader(workload.samples, batch_size=workload.items_per_batch, shuffle=False)
    return DataLoader(_Batches(workload.train_batches), batch_size=None, shuffle=False)


def _cycled(loader: Iterable[Any], count: int, needed: int) -> Iterator[Any]:
    """``count`` batches of ``loader``, starting it again (a new epoch) each time it runs out. An iterator (a
    generator) cannot start again: it is read to its end, which must come after the ``needed`` batches that time
    the phases (the sync and trace windows may run short: the profile says how many steps they got)."""
    one_shot = isinstance(loader, Iterator)
    given = 0
    while given < count:
        before = given
        for batch in itertools.islice(loader, count - given):
            given += 1
            yield batch
        if one_shot and given < count:
            if given < needed:
                raise ValueError(
                    f"the training data is an iterator (a generator), {ONE_SHOT}: it gave {given} batches and the profile "
                    f"needs {needed} batches to time the phases (warm-up, plain and timed steps); give it more batches, "
                    "return a DataLoader or a list instead, or lower --warmup, --plain-steps and --steps."
                )
            return
        if given == before:
            raise ValueError("the data loader gave no batches; give it at least one batch.")


ONE_SHOT = "read only once"
"""How the profile names an iterator's limit: it cannot be started again, for another epoch or a trial."""


def _trials_note(loader: Iterable[Any], given: bool) -> str | None:
    """Why the loader's settings cannot be tried on this data; None when they can."""
    if isinstance(loader, DataLoader):
        return None
    if isinstance(loader, Iterator):
        return (
            f"no DataLoader settings were tried: the training data is an iterator (a generator), {ONE_SHOT}, so it "
            "cannot be read again for the trials; return a DataLoader to have its settings timed"
        )
    if given:
        return f"no DataLoader settings were tried: the training data is a {type(loader).__name__}, not a DataLoader"
    return None


def profile_workload(
    workload: Workload,
    precision: str | Policy,
    device: torch.device | str,
    *,
    compile: Any = None,
    loader: Iterable[Any] | None = None,
    warmup: int = 3,
    plain_steps: int = 10,
    timed: int = 20,
    sync_steps: int = 5,
    trace_steps: int = 3,
    trials: bool = True,
    trace_dir: str | Path | None = None,
    seed: int = 0,
    context: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Profile ``workload`` trained under ``precision`` (a Policy, taken as it is, or a name) on ``device``, fed by
    ``loader`` (default: :func:`workload_loader`; any iterable of batches, read as the loop reads it: an iterator,
    a generator, is read once, and its settings cannot be tried), then time the loader's variants on the same step (``trials``; a
    workload whose batches are ready in memory has no loader worth varying and gets none). Returns the
    ``profile.json`` dict; ``context`` (the command, the workload's size) is merged into it. ``progress`` receives
    the steps as they run and each trial as it starts (see :mod:`ampkit.profile._progress`).
    """
    policy = get_policy(precision)  # the API's edge: a name becomes a Policy here, once
    device = torch.device(device)
    torch.manual_seed(seed)
    # A hand-built Workload may hold what Accelerator.prepare() returned: profile the plain fp32 module inside.
    model = copy.deepcopy(unwrap_prepared(workload.model, "profile_workload()")).to(device)
    if workload.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = with_lr(workload.optimizer(model.parameters()), workload.lr)
    engine = Engine(policy, clip_grad_norm=workload.clip_grad_norm, accumulate=workload.accumulate, compile=compile)
    model, optimizer = engine.setup(model, optimizer)
    model.train()
    given_loader = loader is not None
    loader = loader if loader is not None else workload_loader(workload)
    if given_loader and isinstance(workload.model, StepCall) and isinstance(loader, DataLoader):
        loader = step_loader(loader)  # a LightningModule's own batches, given to its training_step

    def micro_step(batch: Any) -> None:
        with engine.autocast():
            loss = batch_loss(model, batch, workload.loss_fn)
        engine.backward(loss)
        engine.step()  # updates the weights at the accumulation window's last micro-batch

    profiler = Profiler(
        engine, warmup=warmup, plain_steps=plain_steps, timed=timed, sync_steps=sync_steps, trace_steps=trace_steps, trace_dir=trace_dir
    )
    steps = warmup + plain_steps + timed + sync_steps + trace_steps
    total, needed = steps * workload.accumulate, (warmup + plain_steps + timed) * workload.accumulate
    varied = loader if trials and isinstance(loader, DataLoader) and (given_loader or workload.samples is not None) else None
    report = progress or NullReporter()
    report.start(steps + (search_size(varied, device) if varied is not None else 0))
    try:
        with profiler:
            for batch in profiler.batches(_cycled(loader, total, needed), channels_last=workload.channels_last):
                micro_step(batch)
                if engine.micro_batches_pending == 0 and profiler.window is not None:
                    report.update(window_phase(profiler.window), advance=1)
        measured: list[Any] = []
        trials_load: dict[str, Any] | None = None
        note = _trials_note(loader, given_loader) if trials else None
        if varied is not None:
            meter = CpuMeter(children=True)  # the trials' workers are the loop's own
            meter.mark()
            started: list[str] = []

            def on_trial(label: str) -> None:
                report.update(f"DataLoader trial: {label}", advance=1 if started else 0)  # the one before it is done
                started.append(label)

            measured = try_loader_settings(varied, micro_step, device, channels_last=workload.channels_last, on_trial=on_trial)
            trials_load = load_record(meter.read())
            report.update(f"DataLoader trial: {started[-1]}", advance=1)
    finally:
        report.finish()
    data: dict[str, Any] = {
        **profiler.result(trials=measured),
        "ampkit_version": __version__,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device_info": device_info(device),
        "workload": {"name": workload.name, "description": workload.description},
        **({"trials_note": note} if note else {}),
        **(context or {}),
    }
    data["machine"]["trials"] = trials_load
    data["device_name"] = data["device_info"].get("name", data["device"])
    flags = context.get("workload_flags", "") if context else ""
    data["advice"] = advise(data, workload_flags=flags)
    return data
