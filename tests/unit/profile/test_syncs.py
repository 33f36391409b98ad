"""SyncFinder: each read-back of device values is counted at the user's line, and a clean engine loop has none."""

from __future__ import annotations

import inspect
import statistics
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.profile import SyncFinder


def _train(steps: int, *, read_loss: bool, fused: bool = True, scheduler: bool = False, on_nonfinite: bool | str | None = None) -> tuple[SyncFinder, int]:
    torch.manual_seed(0)
    engine = Engine("bf16-mixed", clip_grad_norm=1.0, skip_nonfinite=on_nonfinite)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), fused=fused)
    schedulers = [torch.optim.lr_scheduler.StepLR(opt, 10)] if scheduler else None
    model, _ = engine.setup(model, opt, schedulers=schedulers)
    x = torch.randn(8, 16)
    line = 0
    with SyncFinder() as finder:
        for _ in range(steps):
            with engine.autocast():
                loss = model(x).float().pow(2).mean()
            engine.backward(loss)
            engine.step()  # the engine's read, where it reads, is counted here
            if read_loss:
                line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
                logged = loss.item()  # noqa: F841  # the per-step log line every tutorial has
    return finder, line


def test_a_per_step_item_is_counted_at_its_line_and_the_engine_adds_none() -> None:
    finder, line = _train(4, read_loss=True)
    sites = finder.sites()
    assert [(s.op, s.count) for s in sites] == [("item", 4)]
    assert sites[0].where.endswith(f"test_syncs.py:{line} in _train") and sites[0].code == "logged = loss.item()  # noqa: F841  # the per-step log line every tutorial has"
    clean, _ = _train(4, read_loss=False)
    assert clean.total == 0  # with a fused optimizer the engine's step (clipping, the non-finite check) reads nothing back


@pytest.mark.parametrize(("fused", "scheduler", "on_nonfinite", "why", "change"), [
    (False, False, None, "AdamW takes no found_inf flag (not fused)", "construct the optimizer with fused=True"),
    (True, True, None, "a scheduler given to setup() steps only after a step that was taken", "nothing to change"),
    (True, False, "raise", "skip_nonfinite='raise' stops at the step itself", "skip_nonfinite=True (the default)"),
])
def test_the_engines_read_of_its_flag_is_named_at_the_step_with_its_reason(
    fused: bool, scheduler: bool, on_nonfinite: str | None, why: str, change: str
) -> None:
    """A plain or foreach optimizer takes no found_inf flag: to skip a non-finite step the engine reads its flag on
    the host once per step, a sync on a GPU that the user removes with fused=True, so it is counted at the user's
    engine.step() (not dropped as ampkit's own read); a scheduler given to setup() needs that read by design."""
    from ampkit.profile import advise
    from ampkit.profile._syncs import ENGINE_READ

    finder, _ = _train(3, read_loss=False, fused=fused, scheduler=scheduler, on_nonfinite=on_nonfinite)
    (site,) = finder.sites()
    assert (site.count, site.op, site.via, site.via_code) == (3, "item", ENGINE_READ, why)
    assert site.where.endswith("in _train") and site.code.startswith("engine.step()")
    data = {"device": "cuda", "syncs": {"sites": [{**site.__dict__, "per_step": 1.0}]}}
    (item,) = [a for a in advise(data) if a["topic"] == "host syncs"]
    assert change in item["change"] and why in item["finding"]


def test_bool_and_float_are_reads_too() -> None:
    t = torch.tensor([1.5, -2.0])
    with SyncFinder() as finder:
        if t.sum() > 0:
            pass
        float(t[0])
    assert [s.op for s in finder.sites()] == ["item"] * 2
    assert all("test_syncs.py" in s.where and "test_bool_and_float" in s.where for s in finder.sites())


def test_a_librarys_own_reads_are_not_the_loops() -> None:
    """torch's single-tensor Adam reads its step counter with .item(): a CPU tensor even in a GPU run, no sync."""
    model = nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters(), foreach=False)
    model(torch.ones(2, 4)).sum().backward()
    with SyncFinder() as finder:
        opt.step()
    assert finder.total == 0
    model(torch.ones(2, 4)).sum().backward()
    with SyncFinder(library=True) as everything:
        opt.step()
    assert [(s.op, s.count) for s in everything.sites()] == [("item", 2)]  # one read per parameter, at torch's line
    assert "/torch/" in everything.sites()[0].where  # a library line: SyncFinder() alone leaves it out


def test_on_cuda_a_sync_warning_is_counted_at_the_line_and_other_warnings_still_shown() -> None:
    # The CUDA path's routing, without a GPU: torch.cuda.set_sync_debug_mode("warn") reports each sync as this
    # warning, shown from the frame of the op that synced (test_cuda_paths.py runs it for real on a GPU).
    finder = SyncFinder("cuda")
    shown: list[str] = []
    report = lambda message, category, *rest: shown.append(str(message))
    finder._cuda_warning(report, UserWarning("called a synchronizing CUDA operation"), UserWarning, "x.py", 1)  # the line
    finder._cuda_warning(report, UserWarning("something else"), UserWarning, "x.py", 1)
    (site,) = finder.sites()
    assert site.op == "cuda sync" and site.where.startswith(f"{__file__}:") and site.code.endswith("# the line")
    assert shown == ["something else"]


PROTOTYPE_NOTICE = "Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations"


def test_on_cuda_torchs_prototype_notice_neither_raises_nor_is_shown_nor_leaves_the_mode_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch.cuda.set_sync_debug_mode warns that the mode is a prototype (TORCH_WARN_ONCE in torch/csrc/cuda/Module.cpp:
    # once per process, after the mode is set). Under an "error" filter (pytest's filterwarnings, python -W error)
    # that notice raised out of __enter__ with the mode left on "warn" and showwarning replaced, so every later
    # sync in the process warned; without one, it was printed to the user. Faked here, without a GPU, warning on
    # every call (TORCH_WARN_ONCE's first).
    mode = {"now": 0}

    def set_sync_debug_mode(debug_mode: int | str) -> None:
        mode["now"] = {"default": 0, "warn": 1, "error": 2}.get(debug_mode, debug_mode)  # type: ignore[call-overload]
        warnings.warn(PROTOTYPE_NOTICE, UserWarning, stacklevel=2)

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_sync_debug_mode)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode["now"])
    showwarning, filters = warnings.showwarning, list(warnings.filters)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("error")
        with SyncFinder("cuda") as finder:
            assert mode["now"] == 1  # "warn": each sync reports itself to the finder
        assert mode["now"] == 0 and finder.total == 0
    assert not shown
    assert warnings.showwarning is showwarning and warnings.filters == filters


LIBRARY = """
def padding_mask(mask):
    if mask.all():  # a library's read-back, as transformers' masking_utils checks its mask
        return None
    return mask
"""


def test_a_read_inside_a_library_is_counted_at_the_users_line_that_called_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A third-party package's line (site-packages) or the standard library's is no line the user can change: the
    read is counted at the user's line that called into it, and names the library's line beneath."""
    packages = tmp_path / "site-packages"
    packages.mkdir()
    (packages / "masklib.py").write_text(textwrap.dedent(LIBRARY))
    monkeypatch.syspath_prepend(str(packages))
    monkeypatch.delitem(sys.modules, "masklib", raising=False)
    import masklib  # type: ignore[import-not-found]

    mask, losses = torch.ones(4, dtype=torch.bool), [torch.tensor(2.0), torch.tensor(1.0), torch.tensor(3.0)]
    with SyncFinder() as finder:
        for _ in range(2):
            masklib.padding_mask(mask)  # the user's call into the package
        statistics.median(losses)  # the standard library compares the tensors: reads of the user's line too
    lines = {s.code: s for s in finder.sites()}
    call = lines["masklib.padding_mask(mask)  # the user's call into the package"]
    assert call.count == 2 and call.where.startswith(f"{__file__}:") and call.where.endswith("in test_a_read_inside_a_library_is_counted_at_the_users_line_that_called_it")
    assert call.via == f"{packages / 'masklib.py'}:3 in padding_mask"
    assert call.via_code == "if mask.all():  # a library's read-back, as transformers' masking_utils checks its mask"
    median = lines["statistics.median(losses)  # the standard library compares the tensors: reads of the user's line too"]
    assert median.where.startswith(f"{__file__}:") and median.via.startswith(statistics.__file__)
    assert len(lines) == 2
