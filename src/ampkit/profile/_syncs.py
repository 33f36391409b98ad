"""Where the loop makes the host wait for the device: each host sync and the line of user code that asked for it.

A value read back to Python (``loss.item()``, ``float(t)``, ``if t > 0:``) or a device tensor copied to the CPU makes the host wait until the device has run everything queued before it, which
drains the GPU's queue and leaves it idle while the host catches up. Each such read dispatches one of a few ops
(``aten::_local_scalar_dense`` under ``.item()`` and ``bool()``, a copy to the CPU), so a dispatch mode sees them
all, on any device, and the Python stack at that moment names the line. On the CPU nothing waits (the host *is* the
device), but the same lines are the ones that will stall a GPU: counting them on a laptop is the point.

    >>> import torch
    >>> x = torch.ones(3)
    >>> with SyncFinder() as syncs:
    ...     for _ in range(2):
    ...         v = x.sum().item()
    >>> [(s.count, s.op) for s in syncs.sites()]
    [(2, 'item')]
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import sysconfig
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..training._step_passes import read_flags

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["SyncFinder", "SyncSite"]

# The ops a read-back dispatches: the scalar read under .item()/float()/bool()/int(), and the copies that land on
# the CPU (.cpu(), .to("cpu")). Not seen yet: .tolist() and printing a tensor, which read without dispatching
# through a mode on the CPU (to check on CUDA, and to cover with torch.cuda.set_sync_debug_mode there).
_SCALAR = {torch.ops.aten._local_scalar_dense.default: "item"}
_COPIES = (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)

# What torch.cuda.set_sync_debug_mode("warn") says at each synchronising operation.
_CUDA_SYNC_MESSAGE = r"called a synchronizing CUDA operation"
# What set_sync_debug_mode itself says, once per process, after setting the mode (TORCH_WARN_ONCE): no news to the
# user, and under an "error" filter it would raise with the mode already on.
_CUDA_PROTOTYPE_NOTICE = r"Synchronization debug mode is a prototype feature"

_LIBRARY_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["ampkit"]) if getattr(m, "__file__", None)
)
# Code the user calls but does not write: installed packages (transformers, timm) and the standard library. A read
# made there is counted at the user's line that called into it, the line the user can change; the package's line
# is named beneath it (transformers' masking_utils reading a mask is fixed by what the user's line passes it).
_THIRD_PARTY_DIRS = tuple(
    {sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib") if sysconfig.get_paths().get(k)}
)
_PACKAGE_DIRS = tuple(os.sep + d + os.sep for d in ("site-packages", "dist-packages"))
# (A virtual environment's platstdlib may hold its site-packages: a package's directory is checked first.)
_STDLIB_DIRS = tuple({sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib") if sysconfig.get_paths().get(k)}) + ("<frozen ",)
# ampkit's own code that runs a workload's step for a command (the CLI, the tools' runs, the step's loss): the loop
# of a profiled command is theirs, and what called them (the command line, a test calling main()) is no user's loop.
_DRIVERS = tuple(
    os.path.join(os.path.dirname(sys.modules["ampkit"].__file__ or "ampkit"), *parts)
    for parts in (("cli", ""), ("profile", "_run.py"), ("bench", ""), ("tuning", ""), ("workloads", ""), ("_util", "model_io.py"))
)
# The console scripts (bin/ampkit, bin/pytest: `sys.exit(main())`) start the process; no read is theirs to fix.
_LAUNCHER_DIRS = tuple({sysconfig.get_paths()[k] + os.sep for k in ("scripts",) if sysconfig.get_paths().get(k)})
# Python frames a read passes through on its way from the user's line: this mode, the dispatch machinery that calls
# it (dynamo's disable wrapper, the op overloads), Tensor's dunder methods and printing, and on CUDA the warnings
# machinery that reports a sync debug warning. A read whose first other
# frame is inside torch or ampkit is the library's own (an optimizer's step counter, which lives on the CPU even in a
# GPU run), not the loop's.
_PASS_THROUGH = tuple(
    os.path.join(os.path.dirname(torch.__file__), *parts)
    for parts in (("_compile.py",), ("_dynamo", "eval_frame.py"), ("_ops.py",), ("utils", "_python_dispatch.py"), ("_tensor.py",), ("_tensor_str.py",))
) + (__file__, warnings.__file__, functools.__file__)


ENGINE_READ = "ampkit's optimizer step, reading its non-finite flag"
"""The ``via`` of a site where the engine's step read whether to skip (:func:`_engine_read`): one read per optimizer
step that the user can remove (a fused optimizer) or has asked for (a scheduler given to setup). Its ``via_code``
is the reason the step gave."""


@dataclass(frozen=True)
class SyncSite:
    """A line of code that read device values back to the host, how often, and how (``item`` or ``copy to cpu``)."""

    where: str
    """``file:line in function`` of the user's frame that made the read."""
    op: str
    count: int
    code: str
    """The line's source, stripped (empty when unavailable)."""
    via: str = ""
    """``file:line in function`` of the library line beneath ``where`` that made the read (an installed package's
    or the standard library's, which ``where`` called); empty when ``where`` read it itself."""
    via_code: str = ""
    """The source of the ``via`` line, stripped."""


class SyncFinder:
    """Records each host read-back and the user's line that caused it (see the module), as a context manager.

    ``device``: where the loop runs. On the CPU (the default) a dispatch mode sees the read-backs, and compiled
    code runs eagerly meanwhile (torch.compile would otherwise give up on it for good); on CUDA,
    ``torch.cuda.set_sync_debug_mode("warn")`` reports every operation that synchronises the device (printing a
    tensor, ``.tolist()``, ``nonzero`` and boolean-mask indexing included), and each report is counted at the
    line that caused it.

    ``library``: count the reads torch and ampkit make themselves too (each at the library's line), which are left
    out by default since the user cannot change them. :func:`~ampkit.profile.count_step` sets it to
    compare two loops whole, the engine's own reads included.
    """

    def __init__(self, device: torch.device | str | None = None, *, library: bool = False) -> None:
        self.device = torch.device("cpu" if device is None else device)
        self.library = library
        self._seen: Counter[tuple[str, str, str, str, str]] = Counter()
        self._mode: _ReadBacks | None = None
        self._cuda: tuple[Any, Any] | None = None  # (catch_warnings context, previous sync debug mode)
        self._stance: Any = None

    def __enter__(self) -> Self:
        if self.device.type == "cuda":
            catcher = warnings.catch_warnings()
            catcher.__enter__()
            # Before pytest's or the user's "error" filters: a sync is to be counted here, not raised or shown.
            warnings.filterwarnings("always", message=_CUDA_SYNC_MESSAGE)
            warnings.filterwarnings("ignore", message=_CUDA_PROTOTYPE_NOTICE)
            shown = warnings.showwarning
            warnings.showwarning = functools.partial(self._cuda_warning, shown)
            self._cuda = (catcher, torch.cuda.get_sync_debug_mode())
            torch.cuda.set_sync_debug_mode("warn")
        else:
            # torch.compile skips for good a frame it first meets under a dispatch mode: its compiled code would not
            # run again after this window. Eager for the window's steps, the compiled code is kept for the others.
            self._stance = _eager_stance()
            self._stance.__enter__()
            self._mode = _ReadBacks(self._record)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._cuda is not None:
            catcher, previous = self._cuda
            torch.cuda.set_sync_debug_mode(previous)
            catcher.__exit__(*exc)  # restores the filters and showwarning
            self._cuda = None
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
            self._stance.__exit__(*exc)

    def _record(self, op: str) -> None:
        why = None if self.library else _engine_read()
        if why is not None:
            # ampkit's own read, but one the user's configuration asked for: counted at the user's line that stepped.
            line = _user_frame(stack=traceback.extract_stack(), own_read=True)
            site: tuple[str, str, str, str] | None = (line[0], line[1], ENGINE_READ, why) if line is not None else None
        else:
            site = _user_frame(self.library)
        if site is not None:
            where, code, via, via_code = site
            self._seen[(where, op, code, via, via_code)] += 1

    def _cuda_warning(self, shown: Any, message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        if re.match(_CUDA_SYNC_MESSAGE, str(message)):
            self._record("cuda sync")  # warnings.warn runs in the frame of the op that synced: the stack names the line
        else:
            shown(message, category, *args, **kwargs)

    def sites(self) -> list[SyncSite]:
        """Every line that synced, most frequent first."""
        return [SyncSite(where, op, n, code, via, via_code) for (where, op, code, via, via_code), n in self._seen.most_common()]

    @property
    def total(self) -> int:
        """All read-backs recorded."""
        return sum(self._seen.values())


def _eager_stance() -> Any:
    """A context in which torch.compile'd code runs eagerly (``set_stance("force_eager")``; torch 2.6+)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


class _ReadBacks(TorchDispatchMode):
    """The dispatch mode under :class:`SyncFinder` on the CPU: calls ``record(op)`` at each read-back op."""

    def __init__(self, record: Any) -> None:
        super().__init__()
        self._record = record

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        op = _SCALAR.get(func)
        if op is None and func in _COPIES and _lands_on_cpu(func, args, kwargs):
            op = "copy to cpu"
        if op is not None:
            self._record(op)
        return func(*args, **kwargs)


def _lands_on_cpu(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    if func is torch.ops.aten._to_copy.default:
        source, target = args[0], kwargs.get("device")
        return isinstance(source, torch.Tensor) and source.device.type != "cpu" and target is not None and torch.device(target).type == "cpu"
    destination, source = args[0], args[1]
    return destination.device.type == "cpu" and isinstance(source, torch.Tensor) and source.device.type != "cpu"


def _third_party(filename: str) -> bool:
    return filename.startswith(_THIRD_PARTY_DIRS) or any(d in filename for d in _PACKAGE_DIRS) or filename.startswith("<frozen ")


def _where(frame: traceback.FrameSummary) -> str:
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def _launcher(filename: str) -> bool:
    """A frame of what started the process, not of the loop: a console script (``bin/ampkit``, ``bin/pytest``)."""
    return filename.startswith(_LAUNCHER_DIRS)


def _engine_read() -> str | None:
    """The reason the engine's step gave for reading its non-finite flag, where the read under way is that one."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is read_flags.__code__:
            why = frame.f_locals.get("why")
            return (why() if callable(why) else why) or "the step must know whether it skipped"
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _user_frame(library: bool = False, stack: list[traceback.FrameSummary] | None = None, *, own_read: bool = False) -> tuple[str, str, str, str] | None:
    """The user's line that read a value back, its source, and the library line beneath it that made the read and
    its source ('' if none); None when the read is torch's or ampkit's own (with ``library``: the line that read,
    whatever its file). ``stack``: the frames, outermost first (default: this call's).

    The user's line is the innermost one outside torch, ampkit, installed packages, the standard library and the
    console script that started the process: a read inside a package the user's line called is that line's. Without
    any such frame (the CLI calls the user's model from ampkit; a Hugging Face model's code is an installed
    package's), the model's forward is named: the outermost ``forward`` of the code torch called into (a package's
    or the model's; else its outermost frame), the reading line beneath it; never ampkit's launcher, which only
    started the process. ``own_read``: the read is torch's or ampkit's but is counted at that user's line all the same
    (the engine's read of its flag)."""
    frames = [f for f in reversed(traceback.extract_stack() if stack is None else stack) if not f.filename.startswith(_PASS_THROUGH)]
    if not frames:
        return None
    reader = frames[0]
    if library:
        return _where(reader), (reader.line or "").strip(), "", ""
    if reader.filename.startswith(_LIBRARY_DIRS) and not own_read:
        return None  # torch's or ampkit's own read (an optimizer's step counter), not the loop's
    user = outer = forward = None
    for frame in frames:
        if frame.filename.startswith(_DRIVERS) or _launcher(frame.filename):
            break  # an ampkit command runs the step from here (or the process starts): what is above is no loop's
        if frame.filename.startswith(_LIBRARY_DIRS):
            continue  # torch's module call, the engine's and the profiler's wrappers around the forward
        if not _third_party(frame.filename):
            user = frame  # the user's own line: the innermost one wins
            break
        if any(d in frame.filename for d in _PACKAGE_DIRS) or not frame.filename.startswith(_STDLIB_DIRS):
            # A package's frame, not the standard library's: the outermost forward wins (a decorator's wrapper
            # around it, as transformers' are, is not the model), else the outermost frame.
            outer = frame
            forward = frame if frame.name == "forward" else forward
    model = user or forward or outer or reader
    if model is reader:
        return _where(reader), (reader.line or "").strip(), "", ""
    return _where(model), (model.line or "").strip(), _where(reader), (reader.line or "").strip()
