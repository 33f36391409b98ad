"""Memory of a training loop, step by step: what tensors hold, what the process holds, and whether it keeps growing.

:class:`MemoryTracker` wraps the loop and ``tracker.step()``, called once per training step, records a
:class:`MemorySample`. On CUDA the figures are the caching allocator's counters (allocated, reserved, the peak
since the previous step), which live on the host: reading them does not synchronize the device. On the CPU
there is no allocator to ask, so the tracker counts the bytes of live tensor storages exactly
(:class:`~ampkit.memory.LiveBytes`), and reads the process's resident set size (RSS) beside them.

Memory that rises step after step is reported once, as a warning on the ``ampkit`` logger that names the likely
holder: a tensor that keeps the autograd graph of past steps (``total += loss``), a list that gains a tensor
each step, a tensor grown by ``torch.cat`` each step. The search for the holder (:mod:`~ampkit.memory._leak_holders`)
walks the garbage collector's objects, so it runs only once growth has been seen, never in the per-step path.
A :class:`MemorySummary` is logged at the end.

    >>> import torch
    >>> from torch import nn
    >>> model = nn.Linear(8, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with MemoryTracker("cpu", watch=(model, opt)) as tracker:
    ...     for _ in range(6):
    ...         model(torch.randn(4, 8)).sum().backward()
    ...         opt.step(); opt.zero_grad(set_to_none=True)
    ...         sample = tracker.step()
    >>> s = tracker.summary()   # 72 bytes of weights, and nothing else outlives a step
    >>> s.steps, s.start, s.end, s.growth_per_step, s.warning
    (6, 72, 72, 0.0, None)
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from ..policy._device import as_device
from ._accounting import LiveBytes
from ._leak_holders import Growth, HolderSearch, Snapshot, StepBoundaries
from ._process import peak_rss_bytes, rss_bytes
from ._tracker_growth import _BLOCKS, _GrowthDetector
from ._tracker_results import MemorySample, MemorySummary
from ._tracker_watch import _device_of, _tensors_of

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

__all__ = ["MemorySample", "MemorySummary", "MemoryTracker"]

log = logging.getLogger("ampkit")

MiB = 2**20


# The CUDA reads, one function each so that tests can stand in for the allocator on a machine without CUDA.
def _cuda_read(device: torch.device) -> tuple[int, int, int]:
    """(allocated, reserved, peak allocated since the last reset): the caching allocator's host-side counters."""
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    if not stats:  # CUDA not initialised yet: nothing allocated
        return 0, 0, 0
    allocated, reserved = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
    return int(allocated["current"]), int(reserved["current"]), int(allocated["peak"])


def _cuda_reset_peak(device: torch.device) -> None:
    torch.cuda.reset_peak_memory_stats(device)


def _cuda_sync(device: torch.device) -> None:
    torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------- the tracker
class MemoryTracker:
    """Per-step memory of a training loop, with a warning naming the likely cause when it grows steadily.

    Use it as a context manager around the loop and call :meth:`step` once per training step, after the
    optimizer step (passing the step's loss is optional and catches a kept autograd graph exactly)::

        with MemoryTracker(watch=(model, optimizer)) as tracker:
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(); optimizer.step(); optimizer.zero_grad()
                tracker.step(loss)
        print(tracker.summary())

    With an :class:`~ampkit.Engine`, add it as a step hook instead (``Engine(..., hooks=[tracker])`` or
    ``engine.add_hook(tracker)``): the engine calls :meth:`step` after every optimizer step, with that window's
    last loss, and the search for a holder still names the loop's variables.

    Args:
        device: ``"cuda"``, ``"cuda:1"``, ``"cpu"`` or a torch.device; default: the device of the watched
            tensors, else the current CUDA device if there is one, else the CPU.
        watch: what exists before the loop and must count in the CPU's live total: modules, optimizers, an ampkit
            :class:`~ampkit.Engine`, tensors, or lists/dicts of them (CUDA needs none: the allocator sees all).
        window: steps over which growth must be steady before it is reported (at least 4). Steady means that
            the lowest value of each quarter of the window is above the previous quarter's. A slow leak (of a
            few KiB a step, seen only in RSS) needs a long window: hundreds of steps.
        warmup: first steps left out of growth detection and rates: optimizer state, gradients and caches are
            allocated in them legitimately.
        min_growth: bytes the window must gain for growth to be reported (default 1 MiB). Growth of the
            process heap must also average a page (4 KiB) a step, above the creep of Python objects.
        sync: synchronize the device before each read. The allocator's counters are kept on the host and are
            exact without it; syncing only lines each sample up with the step's kernels having finished (for
            timing them, or to surface an asynchronous error at the step that caused it), at a cost per step.
        accounted: CPU only: count live tensor bytes exactly with a dispatch mode (a small cost per op). False:
            RSS only, at no cost per op; use it with ``torch.compile``, which a dispatch mode gets in the way of.
            Ignored on CUDA.
        keep: samples kept in :attr:`samples` (the summary covers every step regardless).

    On the CPU the live total counts the storages of the watched objects and of every tensor created inside the
    ``with`` block on its thread, each storage once, as long as it lives. On CUDA each step resets the
    allocator's peak statistics (``torch.cuda.reset_peak_memory_stats``) to read the step's own peak. Growth is
    judged on live tensor bytes and on the process heap (the anonymous part of RSS: a leak of autograd graph
    nodes or Python objects shows only there). The search for a holder runs once, when growth is first seen (a
    walk over the garbage collector's objects: tens of milliseconds to a second), and may wait for the next step
    that grows to compare against it; the warning is given then.

    >>> from torch import nn
    >>> model, outputs = nn.Linear(8, 2), []
    >>> with MemoryTracker("cpu", watch=model, window=8, warmup=1, min_growth=64) as tracker:
    ...     for _ in range(12):
    ...         out = model(torch.randn(4, 8))
    ...         out.sum().backward()
    ...         outputs.append(out)          # the bug: each output, with its graph, outlives its step
    ...         sample = tracker.step()
    >>> "`outputs`" in tracker.warning and "graph" in tracker.warning
    True
    """

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        *,
        watch: Any = (),
        window: int = 20,
        warmup: int = 3,
        min_growth: float = MiB,
        sync: bool = False,
        accounted: bool = True,
        keep: int = 10_000,
    ) -> None:
        for arg, value, low in (("window", window, _BLOCKS), ("warmup", warmup, 0), ("keep", keep, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{arg} must be an int >= {low}, got {value!r}.")
        if isinstance(min_growth, bool) or not isinstance(min_growth, (int, float)) or not min_growth >= 0:
            raise ValueError(f"min_growth must be a number of bytes >= 0 (e.g. 2**20 for 1 MiB), got {min_growth!r}.")
        watched = list(watch) if isinstance(watch, tuple) else [watch]
        _tensors_of(watched, [])  # an object of the wrong kind fails here, at construction, with the fix
        if device is None:
            found = _device_of(watched)
            self.device = found if found is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
            self.device = as_device(self.device)
        else:
            self.device = as_device(device)
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(f"MemoryTracker measures 'cuda' and 'cpu' devices, not {self.device.type!r}.")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={str(self.device)!r} but CUDA is not available here; pass device='cpu'.")
        self.window, self.warmup, self.min_growth, self.sync = window, warmup, min_growth, bool(sync)
        self.accounted = bool(accounted) and self.device.type == "cpu"
        self._watched: list[Any] = watched if self.accounted else []
        self.samples: deque[MemorySample] = deque(maxlen=keep)
        """The most recent samples, oldest first."""
        self.warning: str | None = None
        """The steady-growth warning, once given."""
        self.note: str | None = None
        """CUDA: the note given when reserved memory grew while allocated memory did not."""
        self._live: LiveBytes | None = None
        self._active = False
        self._steps = 0
        self._start: tuple[int | None, int | None] | None = None  # (tensor bytes, rss) when tracking began
        self._peak: int | None = None
        self._detector = _GrowthDetector(window, min_growth, self.device.type == "cuda")
        self._boundaries = StepBoundaries(keep)  # dates the autograd graphs found alive, if growth is seen
        self._pending: tuple[Growth, Snapshot] | None = None
        self._used = False
        self._summary: MemorySummary | None = None
        self._loss: Any = None  # as a step hook: the last micro-batch's loss, until the optimizer step

    # ------------------------------------------------------------------------------------------ context
    def __enter__(self) -> Self:
        if self._active or self._used:
            raise RuntimeError("A MemoryTracker tracks one run, in one `with` block; make a new one for the next run.")
        if self.accounted:
            self._live = LiveBytes()
            self._live.__enter__()
            self._track(self._watched)
        self._watched = []  # tracked now: the tracker must not keep the model alive
        self._active = self._used = True
        self._begin()
        return self

    def __exit__(self, *exc: object) -> None:
        frame = sys._getframe(1)
        try:
            if self._pending is not None:
                self._report(self._safely(self._pending[0], self._diagnose, frame))
        finally:
            del frame
            if self._live is not None:
                self._live.__exit__(*exc)
            self._active = False
            self._summary = self.summary()
            log.info("%s", self._summary)

    def watch(self, *objs: Any) -> None:
        """Count ``objs`` (modules, optimizers, an Engine, tensors) in the CPU's live total from now on."""
        _tensors_of(list(objs), [])
        if not self.accounted:
            return
        if self._active:
            self._track(list(objs))
        else:
            self._watched.extend(objs)

    def _track(self, objs: list[Any]) -> None:
        tensors: list[torch.Tensor] = []
        _tensors_of(objs, tensors)
        assert self._live is not None
        self._live.track(tensors)

    def _begin(self) -> None:
        if self.device.type == "cuda":
            if self.sync:
                _cuda_sync(self.device)
            allocated: int | None = _cuda_read(self.device)[0]
            _cuda_reset_peak(self.device)
        else:
            allocated = self._live.current if self._live is not None else None
            if self._live is not None:
                self._live.reset_peak()
        rss = rss_bytes()
        self._start = (allocated, rss[0] if rss is not None else None)
        self._boundaries.start(self._steps)

    # ------------------------------------------------------------------------------------------ per step
    def step(self, loss: Any = None) -> MemorySample:
        """Record the memory after this training step; call it once per step, after the optimizer step.

        ``loss`` (optional): the step's loss tensor. The tracker marks its autograd graph and, should the graphs
        of past steps stay alive (``total += loss``), says so after ``window`` steps, whether or not memory grows
        enough to show. Anything else passed (a float) is ignored. No host-device sync unless ``sync=True``.
        """
        frame = sys._getframe(1)  # the training loop: where the search for a holder starts naming
        try:
            return self._record(loss, frame)
        finally:
            del frame

    # -- step hook: Engine(hooks=[tracker]) calls step() after each optimizer step, with the window's last loss --
    def before_backward(self, engine: Any, loss: Any) -> None:
        """Keep the micro-batch's loss (the window's last one is marked at the step), as ``step(loss)`` would get it."""
        self._loss = loss

    def after_optimizer_step(self, engine: Any) -> None:
        """Record the step, as a call of :meth:`step` in the loop after ``engine.step()`` would."""
        loss, self._loss = self._loss, None
        frame = _caller_outside_ampkit(sys._getframe(1))
        try:
            self._record(loss, frame)
        finally:
            del frame

    def _record(self, loss: Any, frame: FrameType) -> MemorySample:
        if self.accounted and not self._active:
            raise RuntimeError(
                "MemoryTracker.step() was called outside its `with` block: on the CPU, live tensor bytes are counted "
                "only inside it. Use `with MemoryTracker(...) as tracker:` around the loop, or accounted=False."
            )
        if self._start is None:
            self._begin()  # CUDA or RSS only, used without `with`: tracking begins at the first step
        self._summary = None
        self._steps += 1
        n = self._steps
        reserved = None
        if self.device.type == "cuda":
            if self.sync:
                _cuda_sync(self.device)
            allocated, reserved, peak = _cuda_read(self.device)
            _cuda_reset_peak(self.device)
        elif self._live is not None:
            allocated, peak = self._live.current, self._live.peak
            self._live.reset_peak()
        else:
            allocated = peak = None
        rss = rss_bytes()
        sample = MemorySample(n, allocated, reserved, peak, rss[0] if rss is not None else None)
        self.samples.append(sample)
        if peak is not None:
            self._peak = peak if self._peak is None else max(self._peak, peak)
        self._boundaries.record(n)
        if n > self.warmup:
            self._detector.add(n, allocated, rss[1] if rss is not None else None, reserved, sample.rss, loss)
        self._watchdog(n, frame)
        return sample

    def _watchdog(self, n: int, frame: FrameType) -> None:
        if self.warning is None:
            if self._pending is None:
                growth = self._detector.growth(n)
                if growth is not None:
                    found = self._safely(None, HolderSearch(self._boundaries).first_look, frame, growth, n)
                    if isinstance(found, str):
                        self._report(found)
                    else:  # name what grows at the next step that grows, against this snapshot
                        self._pending = (growth, found if found is not None else Snapshot(n, {}, {}))
            else:
                growth = self._pending[0]
                series = self._detector.series["tensors" if growth.kind == "graph" else growth.kind]
                grew = growth.kind == "graph" or (len(series) >= 2 and series[-1] > series[-2])
                if grew or n - growth.step >= self.window:
                    self._report(self._safely(growth, self._diagnose, frame))
        if self.note is None and self.device.type == "cuda":
            self.note = self._detector.reserved_note(n)
            if self.note is not None:
                log.warning("%s", self.note)

    def _safely(self, fallback: Any, search: Any, *args: Any) -> Any:
        # The search walks arbitrary objects of the user's process: a failure there must not stop training.
        try:
            return search(*args)
        except Exception:
            log.debug("MemoryTracker: the search for what holds memory failed", exc_info=True)
            return f"{fallback.detail}." if isinstance(fallback, Growth) else fallback

    def _report(self, message: str) -> None:
        self._pending = None
        self.warning = message
        log.warning("%s", message)

    # ------------------------------------------------------------------------------------------ the search
    def _diagnose(self, frame: FrameType) -> str:
        """The second look: what grew since the snapshot, or else the numbers alone."""
        assert self._pending is not None
        growth, before = self._pending
        return HolderSearch(self._boundaries).diagnose(frame, growth, before, tensors_measured=bool(self._detector.series["tensors"]))

    # ------------------------------------------------------------------------------------------ results
    def summary(self) -> MemorySummary:
        """What was seen so far, or over the whole ``with`` block once it has ended."""
        if self._summary is not None:
            return self._summary
        start = self._start if self._start is not None else (None, None)
        last = self.samples[-1] if self.samples else None
        return MemorySummary(
            device=str(self.device),
            steps=self._steps,
            start=start[0],
            end=last.allocated if last is not None else start[0],
            peak=self._peak,
            growth_per_step=self._detector.fits["tensors"].slope,
            rss_start=start[1],
            rss_end=last.rss if last is not None else start[1],
            rss_growth_per_step=self._detector.fits["rss"].slope,
            peak_rss=peak_rss_bytes(),
            reserved=last.reserved if last is not None else None,
            warning=self.warning,
            note=self.note,
        )


def _caller_outside_ampkit(frame: FrameType | None) -> FrameType:
    """The first frame up the stack that is not ampkit's own: the user's loop, when the engine calls a hook."""
    start = frame
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("ampkit."):
        frame = frame.f_back
    return frame if frame is not None else start  # type: ignore[return-value]
