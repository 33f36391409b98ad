"""What to change, read from a profile: the input pipeline (backed by the trials' measured step times), the host
syncs (where and what removes them), autocast's casts and the optimizer's small ops (with the bench command that
confirms a change before it is adopted).

Each piece of advice says what was found, the change, and what was measured of it: a measured speed-up for the
loader settings it tried; for the others, which ampkit cannot try on the user's loop, the command that measures
it. A change of compilation or precision, which the profile does not run, is marked untested (``untested``:
:data:`UNTESTED`), never prescribed as a gain. A profile that shows nothing worth changing gets no advice.

    >>> given = {"num_workers": 0, "pin_memory": False, "non_blocking": False, "persistent_workers": False, "prefetch_factor": None}
    >>> data = {"device": "cpu", "precision": "bf16-mixed", "phases": {"data": {"median_s": 0.12, "share": 0.6}},
    ...         "step_s": {"median": 0.2}, "syncs": {"sites": []}, "ops": None,
    ...         "trials": [{"name": "as given", "step_s": 0.2, "speedup": 1.0, "baseline": True, "settings": given},
    ...                    {"name": "num_workers=2", "step_s": 0.1, "speedup": 2.0, "baseline": False,
    ...                     "settings": {**given, "num_workers": 2}}]}
    >>> [(a["topic"], a["change"]) for a in advise(data)]
    [('input pipeline', 'DataLoader(..., num_workers=2)')]
"""

from __future__ import annotations

from typing import Any

from ._syncs import ENGINE_READ

__all__ = ["CAST_SHARE", "DATA_SHARE", "HOST_SHARE", "IDLE_SHARE", "MIN_SPEEDUP", "PER_PARAMETER_OPS", "UNTESTED", "advise"]

DATA_SHARE = 0.10
"""A data phase above this share of the step is worth a look at the input pipeline."""
MIN_SPEEDUP = 1.05
"""A trial must beat the loader as given by this much to be advised: smaller differences are this machine's noise."""
CAST_SHARE = 0.05
"""Casts above this share of the forward and backward are worth removing."""
PER_PARAMETER_OPS = 8
"""Optimizer ops per parameter tensor per step from which the step is a per-parameter loop: torch 2.13's Adam
dispatches about 12 per tensor in its loop, 4-5 with ``foreach`` (on a CPU), about 1 fused, beside a constant few
of the engine's (unscale, clip)."""
HOST_SHARE = 0.30
"""Above this share of the phases spent outside any op, the loop is bound by its own Python."""
IDLE_SHARE = 0.20
"""A GPU idle for more than this share of the step is being fed too slowly."""

_SIXTEEN_BIT_WEIGHTS = {"bf16-mixed": "bf16-true-masters", "16-mixed": "16-true-masters", "fp8-tensorwise": "bf16-true-masters", "fp8-rowwise": "bf16-true-masters"}
"""For a mixed policy, the policy keeping 16-bit weights (and fp32 masters, so training stays exact) whose
forward has no weight casts."""


def advise(data: dict[str, Any], *, workload_flags: str = "") -> list[dict[str, Any]]:
    """The advice for the profile ``data`` (the ``profile.json`` dict), most rewarding first.

    ``workload_flags``: the command-line flags that give ``ampkit bench`` the profiled workload (``--model``,
    ``--data``, ``-w``, ``--size``, ``--seed``, ``--compile``... as ``ampkit profile`` was given them), for the
    bench commands that confirm. Empty for a loop profiled through the API: the commands then name the user's
    model and data as factories to fill in, with the loop's accumulation and compilation.
    """
    out = [*_pipeline(data), *_syncs(data), *_host(data, workload_flags), *_casts(data, workload_flags), *_optimizer(data)]
    idle = data.get("device_idle")
    if idle and idle.get("share", 0.0) > IDLE_SHARE and not out:
        out.append(_item(
            "device idle", f"the GPU ran nothing for {idle['share']:.0%} of the step and neither data nor syncs explain it",
            "look at the Chrome trace (trace.json, chrome://tracing or ui.perfetto.dev) for the gaps between kernels: "
            "Python overhead between many small kernels is what torch.compile or CUDA graphs remove",
            None, _bench(data, workload_flags, compile=True), untested=True,
        ))
    return out


def _bench(data: dict[str, Any], workload_flags: str, precision: str | None = None, *, compile: bool = False) -> str:
    """The ``ampkit bench`` command that runs the profiled workload under ``precision``, compiled too with ``compile``.

    >>> _bench({"compile": False}, "-w gpt --size small ", "bf16-mixed", compile=True)
    'ampkit bench -w gpt --size small --precision bf16-mixed --compile'
    """
    flags = workload_flags.split() or _your_workload(data)
    parts = ["ampkit bench", *flags]
    if precision:
        parts.append(f"--precision {precision}")
    if compile and "--compile" not in flags:
        parts.append("--compile")
    return " ".join(parts)


def _your_workload(data: dict[str, Any]) -> list[str]:
    """Flags for a loop profiled through the API: the user's model and data as factories (``--model`` and
    ``--data`` take ``module:function``), and what the loop's engine did to the step."""
    flags = ["--model", "your_module:model_factory", "--data", "your_module:data_factory"]
    if (data.get("accumulate") or 1) > 1:
        flags += ["--accumulate", str(data["accumulate"])]
    if data.get("compile"):
        flags += ["--compile"] + (["regional"] if data["compile"] == "regional" else [])
    return flags


def _item(topic: str, finding: str, change: str, measured: str | None, confirm: str | None, *, untested: bool = False) -> dict[str, Any]:
    """One piece of advice; ``untested``: a change of compilation or precision, which the profile did not run."""
    return {"topic": topic, "finding": finding, "change": change, "measured": measured, "confirm": confirm, "untested": UNTESTED if untested else None}


UNTESTED = (
    "not measured on this model in this run: compiling or changing the precision can as well make the step slower "
    "(a compile's overhead, a CPU without fast 16-bit kernels); adopt it only where the command below measures it faster"
)
"""Said of every change the profile advises without having run it: torch.compile, another precision policy."""


def _loader_call(settings: dict[str, Any], base: dict[str, Any]) -> str:
    """The DataLoader keywords that differ from the loader as given, and the copy's ``non_blocking``."""
    keywords = [f"{k}={v}" for k, v in settings.items() if k not in ("non_blocking", "torch_threads") and v != base.get(k)]
    call = f"DataLoader(..., {', '.join(keywords)})" if keywords else "the loader as given"
    if settings.get("non_blocking") and not base.get("non_blocking"):
        call += " and batch.to(device, non_blocking=True)"
    if settings.get("torch_threads") is not None and settings.get("torch_threads") != base.get("torch_threads"):
        call += f" and torch.set_num_threads({settings['torch_threads']}) (the workers need the other cores)"
    return call


def _pipeline(data: dict[str, Any]) -> list[dict[str, Any]]:
    phases = data.get("phases") or {}
    wait = phases.get("data", {}).get("share", 0.0) + phases.get("copy", {}).get("share", 0.0)
    trials = data.get("trials") or []
    found = f"{wait:.0%} of the step is spent waiting for data" + (
        f" ({phases['data']['median_s'] * 1e3:.1f} ms of a {data['step_s']['median'] * 1e3:.1f} ms step)" if "data" in phases else ""
    )
    if not trials:
        if wait < DATA_SHARE:
            return []
        return [_item(
            "input pipeline", found, "time the loader's settings on this loop: ampkit.profile.try_loader_settings(loader, step, device)",
            None, None,
        )]
    base = next(t for t in trials if t.get("baseline"))
    best = max(trials, key=lambda t: t["speedup"])
    if best is base or best["speedup"] < MIN_SPEEDUP:
        if wait < DATA_SHARE:
            return []
        return [_item(
            "input pipeline", found + f"; no loader setting tried made the step faster (best: {best['name']}, {best['speedup']:.2f}x)",
            "the per-sample work itself is the cost: do it once ahead of training (cache the transformed samples) or on the device",
            f"{len(trials)} loader settings timed", None,
        )]
    return [_item(
        "input pipeline", found, _loader_call(best["settings"], base["settings"]),
        f"{best['speedup']:.2f}x faster step ({base['step_s'] * 1e3:.1f} ms -> {best['step_s'] * 1e3:.1f} ms, measured here)", None,
    )]


def _sync_change(site: dict[str, Any]) -> str:
    code = site.get("code", "")
    if site.get("via") == ENGINE_READ:
        return _engine_read_change(site.get("via_code", ""))
    if site.get("via"):
        return (
            f"the library code this line calls reads the value back ({site['via']}): look for an argument or option "
            "of that call that spares the read (a mask or length passed ready, a check turned off), or make the call "
            "less often"
        )
    if site["op"] == "copy to cpu":
        return "copy to the host less often, or into pinned memory with non_blocking=True and read it a step later"
    if code.lstrip().startswith(("if ", "while ", "elif ", "assert ")):
        return "a condition on a device value makes the host wait: compute it on the device (torch.where) or check it every N steps"
    return (
        "keep the value on the device (total += loss.detach()) and read it every N steps; "
        "for a scheduler or a threshold pass a Python float, not a tensor"
    )


def _engine_read_change(why: str) -> str:
    """What removes the engine's read of its non-finite flag, by the reason its step gave (ampkit.training's
    ``read_flags``)."""
    if "not fused" in why:
        return (
            "construct the optimizer with fused=True: torch's fused AdamW, Adam and SGD take the flag and skip a "
            "non-finite step on the device, with no read. (Engine(skip_nonfinite=False) removes it too, under a policy "
            "without a loss scale, but lets inf and NaN reach the weights.)"
        )
    if "raise" in why:
        return "skip_nonfinite=True (the default) skips a non-finite step instead, with no read where the optimizer is fused"
    return "nothing to change: the read is what the configuration asks for (one per optimizer step)"


def _syncs(data: dict[str, Any]) -> list[dict[str, Any]]:
    syncs = data.get("syncs") or {}
    gpu = str(data.get("device", "cpu")).startswith("cuda")
    cost = (
        "each one drains the GPU's queue: the device idles until the host catches up" if gpu
        else "nothing waits on a CPU, but on a GPU each one drains the device's queue"
    )
    return [
        _item(
            "host syncs",
            f"{site['per_step']:g} read-back{'s' if site['per_step'] != 1 else ''} per step at {site['where']}: {site['code']}"
            + (f" (inside {site['via']}: {site.get('via_code', '')})" if site.get("via") else ""),
            _sync_change(site), cost, None,
        )
        for site in syncs.get("sites", [])[:3]
    ]


def _casts(data: dict[str, Any], workload_flags: str) -> list[dict[str, Any]]:
    ops = data.get("ops")
    if not ops or ops.get("cast_share", 0.0) < CAST_SHARE:
        return []
    precision = data.get("precision", "")
    other = _SIXTEEN_BIT_WEIGHTS.get(precision)
    changes = [] if data.get("compile") else ["compile the model (Engine(compile=True), --compile): the casts fuse into the kernels that read them"]
    if other is not None:
        changes.append(f"or keep the weights in 16 bits ({other}): the forward has no weight casts left")
    if not changes:
        return []
    tried = ",".join(p for p in (precision, other) if p)
    return [_item(
        "casts", f"autocast's casts take {ops['cast_share']:.0%} of the forward and backward ({ops['casts_per_step']:.0f} per step)",
        "; ".join(changes), None, _bench(data, workload_flags, tried, compile=not data.get("compile")), untested=True,
    )]


def _optimizer(data: dict[str, Any]) -> list[dict[str, Any]]:
    ops = data.get("ops")
    tensors = data.get("parameter_tensors")
    if not ops or not tensors or ops.get("optimizer_ops_per_step", 0.0) < PER_PARAMETER_OPS * tensors:
        return []
    return [_item(
        "optimizer", f"the optimizer step dispatches {ops['optimizer_ops_per_step']:.0f} ops for {tensors} parameter tensors: a loop per parameter",
        "construct the optimizer with fused=True (or foreach=True): one kernel for all parameters", None, None,
    )]


def _host(data: dict[str, Any], workload_flags: str) -> list[dict[str, Any]]:
    ops = data.get("ops")
    if not ops or ops.get("host_share", 0.0) < HOST_SHARE:
        return []
    gpu = str(data.get("device", "cpu")).startswith("cuda")
    idle = data.get("device_idle")
    cost = f"the GPU idles {idle['share']:.0%} of the step" if gpu and idle else None
    change = "a larger batch amortizes it" if data.get("compile") else "compile the model (--compile): fewer, larger kernels and no Python between them; or a larger batch"
    return [_item(
        "host overhead", f"{ops['host_share']:.0%} of forward, backward and optimizer runs outside any op (Python, module calls, autograd)",
        change, cost, None if data.get("compile") else _bench(data, workload_flags, data.get("precision"), compile=True),
        untested=not data.get("compile"),
    )]
