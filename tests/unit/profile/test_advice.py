"""advise() on profiles built to show one problem each, and on one that shows none."""

from __future__ import annotations

from typing import Any

from ampkit.profile import advise
from ampkit.profile._advice import CAST_SHARE, DATA_SHARE, MIN_SPEEDUP, UNTESTED

GIVEN = {"num_workers": 0, "pin_memory": False, "non_blocking": False, "persistent_workers": False, "prefetch_factor": None, "torch_threads": None}


def _profile(data_share: float = 0.05, trials: list[dict[str, Any]] | None = None, sites: list[dict[str, Any]] | None = None,
             ops: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "device": "cpu", "precision": "bf16-mixed", "compile": False, "step_s": {"median": 0.1},
        "phases": {"data": {"median_s": 0.1 * data_share, "share": data_share}, "copy": {"median_s": 0.0, "share": 0.0}},
        "syncs": {"sites": sites or []}, "ops": ops, "trials": trials or [], **extra,
    }


def _trial(name: str, step_s: float, speedup: float, **settings: Any) -> dict[str, Any]:
    return {"name": name, "step_s": step_s, "speedup": speedup, "baseline": name == "as given", "settings": {**GIVEN, **settings}}


def test_a_healthy_profile_gets_no_advice() -> None:
    assert advise(_profile(ops={"cast_share": CAST_SHARE / 2, "casts_per_step": 3, "optimizer_ops_per_step": 1}, parameter_tensors=4)) == []


def test_the_fastest_measured_loader_is_advised_with_its_measured_speedup() -> None:
    trials = [_trial("as given", 0.2, 1.0), _trial("num_workers=1", 0.12, 1.67, num_workers=1),
              _trial("num_workers=2, persistent_workers=True", 0.08, 2.5, num_workers=2, persistent_workers=True)]
    (item,) = advise(_profile(0.6, trials))
    assert item["topic"] == "input pipeline" and item["change"] == "DataLoader(..., num_workers=2, persistent_workers=True)"
    assert item["measured"].startswith("2.50x faster step (200.0 ms -> 80.0 ms")
    assert "60% of the step" in item["finding"]


def test_pinned_memory_advice_names_the_non_blocking_copy() -> None:
    trials = [_trial("as given", 0.2, 1.0), _trial("pin", 0.15, 1.33, pin_memory=True, non_blocking=True)]
    (item,) = advise(_profile(0.3, trials))
    assert item["change"] == "DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True)"


def test_a_trial_within_noise_is_not_advised_and_the_cost_is_named() -> None:
    trials = [_trial("as given", 0.2, 1.0), _trial("num_workers=1", 0.2 / (MIN_SPEEDUP - 0.01), MIN_SPEEDUP - 0.01, num_workers=1)]
    (item,) = advise(_profile(0.6, trials))
    assert "no loader setting tried made the step faster" in item["finding"] and "per-sample work" in item["change"]
    assert advise(_profile(DATA_SHARE / 2, trials)) == []  # and a small data phase is not worth a word


def test_a_data_bound_loop_without_trials_is_pointed_at_the_trial_api() -> None:
    (item,) = advise(_profile(0.5))
    assert "try_loader_settings" in item["change"] and item["measured"] is None


def test_each_sync_site_gets_the_change_that_fits_it() -> None:
    sites = [
        {"where": "train.py:10 in loop", "op": "item", "per_step": 1, "code": "print(loss.item())"},
        {"where": "train.py:12 in loop", "op": "item", "per_step": 2, "code": "if loss > 4:"},
        {"where": "train.py:14 in loop", "op": "copy to cpu", "per_step": 1, "code": "preds = out.cpu()"},
    ]
    advice = advise(_profile(sites=sites))
    assert [a["topic"] for a in advice] == ["host syncs"] * 3
    assert "total += loss.detach()" in advice[0]["change"] and "train.py:10" in advice[0]["finding"]
    assert "torch.where" in advice[1]["change"] and "2 read-backs per step" in advice[1]["finding"]
    assert "non_blocking=True" in advice[2]["change"]
    assert "on a GPU" in advice[0]["measured"]


def test_a_sync_inside_a_library_is_advised_at_the_users_line_with_the_library_line_named() -> None:
    site = {"where": "train.py:30 in loop", "op": "item", "per_step": 1, "code": "out = model(**batch)",
            "via": "/venv/site-packages/transformers/masking_utils.py:321 in sdpa_mask", "via_code": "if padding_mask.all():"}
    (item,) = advise(_profile(sites=[site]))
    assert item["finding"].startswith("1 read-back per step at train.py:30 in loop: out = model(**batch)")
    assert "masking_utils.py:321 in sdpa_mask: if padding_mask.all():" in item["finding"]
    assert "masking_utils.py:321" in item["change"] and "total += loss.detach()" not in item["change"]


def test_casts_point_at_compile_and_16_bit_weights_with_the_bench_that_confirms() -> None:
    (item,) = advise(_profile(ops={"cast_share": 0.2, "casts_per_step": 40, "optimizer_ops_per_step": 1}), workload_flags="-w gpt --size small ")
    assert "20%" in item["finding"] and "compile" in item["change"] and "bf16-true-masters" in item["change"]
    assert item["confirm"] == "ampkit bench -w gpt --size small --precision bf16-mixed,bf16-true-masters --compile"
    compiled = advise(_profile(ops={"cast_share": 0.2, "casts_per_step": 40, "optimizer_ops_per_step": 1}, compile=True))
    assert "compile the model" not in compiled[0]["change"]


def test_the_confirm_command_reproduces_the_users_workload() -> None:
    """The bench command must run what was profiled: the command's workload flags as given (compile mode included,
    so a compiled profile is not confirmed on eager runs), or, for a loop profiled through the API, the user's
    model and data as factories to fill in, with the loop's accumulation and compilation."""
    casts = {"cast_share": 0.2, "casts_per_step": 40, "optimizer_ops_per_step": 1}
    flags = "--model nets:build --data nets:loader --seed 3 --compile regional "
    (item,) = advise(_profile(ops=casts, compile="regional"), workload_flags=flags)
    assert item["confirm"] == "ampkit bench --model nets:build --data nets:loader --seed 3 --compile regional --precision bf16-mixed,bf16-true-masters"
    (item,) = advise(_profile(ops=casts, compile="regional", accumulate=4))
    assert item["confirm"] == (
        "ampkit bench --model your_module:model_factory --data your_module:data_factory --accumulate 4 --compile regional "
        "--precision bf16-mixed,bf16-true-masters"
    )
    (item,) = advise(_profile(ops=casts))
    assert item["confirm"] == "ampkit bench --model your_module:model_factory --data your_module:data_factory --precision bf16-mixed,bf16-true-masters --compile"
    idle = advise(_profile(device="cuda", device_idle={"share": 0.5}), workload_flags=flags)[0]
    assert idle["confirm"] == "ampkit bench --model nets:build --data nets:loader --seed 3 --compile regional"


def test_a_per_parameter_optimizer_loop_is_named() -> None:
    ops = {"cast_share": 0.0, "casts_per_step": 0, "optimizer_ops_per_step": 120}
    (item,) = advise(_profile(ops=ops, parameter_tensors=10))
    assert item["topic"] == "optimizer" and "fused=True" in item["change"]
    assert advise(_profile(ops={**ops, "optimizer_ops_per_step": 45}, parameter_tensors=10)) == []  # foreach: 4-5 per tensor


def test_fewer_torch_threads_are_advised_beside_the_workers() -> None:
    trials = [_trial("as given", 0.2, 1.0), _trial("num_workers=1, torch_threads=1", 0.1, 2.0, num_workers=1, torch_threads=1)]
    (item,) = advise(_profile(0.6, trials))
    assert item["change"] == "DataLoader(..., num_workers=1) and torch.set_num_threads(1) (the workers need the other cores)"


def test_a_host_bound_loop_is_pointed_at_compile_with_the_bench_that_confirms() -> None:
    ops = {"cast_share": 0.0, "casts_per_step": 0, "optimizer_ops_per_step": 1, "host_share": 0.6}
    (item,) = advise(_profile(ops=ops), workload_flags="-w gpt ")
    assert item["topic"] == "host overhead" and "60%" in item["finding"] and "--compile" in item["change"]
    assert item["confirm"] == "ampkit bench -w gpt --precision bf16-mixed --compile"
    assert advise(_profile(ops={**ops, "host_share": 0.1})) == []


def test_compile_and_precision_changes_are_marked_untested_and_measured_ones_are_not() -> None:
    # The profile runs neither a compile nor another policy: its own "confirm with" once showed compile 1.08x slower.
    casts = {"cast_share": 0.2, "casts_per_step": 40, "optimizer_ops_per_step": 1, "host_share": 0.6}
    idle = {"share": 0.5, "seconds_per_step": 0.05}
    advice = advise(_profile(ops=casts)) + advise(_profile(ops={"cast_share": 0.0, "optimizer_ops_per_step": 1}, device="cuda:0", device_idle=idle))
    proposing = [a for a in advice if "compile" in a["change"] or "bf16-true-masters" in a["change"]]
    assert {a["topic"] for a in proposing} == {"host overhead", "casts", "device idle"}
    for item in proposing:
        assert item["untested"] == UNTESTED and item["measured"] is None and item["confirm"].startswith("ampkit bench")
    # The twin: the loader setting the trials measured is advised on its measurement, not marked untested.
    trials = [_trial("as given", 0.2, 1.0), _trial("num_workers=2", 0.1, 2.0, num_workers=2)]
    (loader,) = advise(_profile(0.6, trials))
    assert loader["untested"] is None and loader["measured"].startswith("2.00x")
    # An already compiled loop's host overhead advises a larger batch: nothing untested about it.
    (compiled,) = advise(_profile(ops=casts | {"cast_share": 0.0}, compile=True))
    assert compiled["topic"] == "host overhead" and compiled["untested"] is None


def test_untested_advice_is_shown_as_such() -> None:
    from ampkit.profile._table import advice_parts

    (item,) = advise(_profile(ops={"cast_share": 0.0, "optimizer_ops_per_step": 1, "host_share": 0.6}))
    labels = [label for label, _ in advice_parts(item)]
    assert labels == ["host overhead", "change", "untested", "confirm with"]
