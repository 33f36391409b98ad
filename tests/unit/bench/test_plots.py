"""Tests for the bench plots: real PNG files, what each picture holds, failed runs, missing matplotlib."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from ampkit._errors import AmpkitError
from ampkit.bench._plots import (
    LOSS_PLOT,
    TIME_MEMORY_PLOT,
    loss_figure,
    plot_losses,
    time_memory_figure,
    write_plots,
)
from ampkit.bench._results import BenchResult, RunResult

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header, after checking it is one."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data.rstrip(b"\0").endswith(b"IEND\xaeB`\x82"), f"{path} is truncated"
    return width, height


def _texts(fig) -> list[str]:  # type: ignore[no-untyped-def]
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_write_plots_writes_two_valid_pngs(bench_result: BenchResult, tmp_path: Path) -> None:
    paths = write_plots(bench_result, tmp_path / "out")
    assert [p.name for p in paths] == [LOSS_PLOT, TIME_MEMORY_PLOT]
    for path in paths:
        width, height = _png_size(path)
        assert 600 <= width <= 3000 and 300 <= height <= 1500
        assert path.stat().st_size > 10_000  # a blank canvas compresses to a few KiB
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([LOSS_PLOT, TIME_MEMORY_PLOT])


def test_loss_curves_leave_out_failed_runs_and_mark_the_diverged_one(bench_result: BenchResult) -> None:
    ax = loss_figure(bench_result).axes[0]
    labels = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert labels == ["32-true", "bf16-mixed", "16-mixed", "16-true (diverged at step 31)"]
    assert ax.get_legend() is not None
    dotted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert len(dotted) == 1 and list(dotted[0].get_xdata()) == [31, 31]
    assert ax.get_yscale() == "linear"  # 0.25 to 2.3 is not a wide range


def test_wide_loss_range_goes_log(bench_result: BenchResult) -> None:
    ref = bench_result.runs[0]
    ref.losses = [10.0 * 0.8**i for i in range(60)]  # 10 down to 2e-5
    assert loss_figure(bench_result).axes[0].get_yscale() == "log"


def test_time_and_memory_panels(bench_result: BenchResult) -> None:
    time_ax, memory_ax = time_memory_figure(bench_result).axes[:2]
    ticks = [t.get_text() for t in time_ax.get_xticklabels()]
    assert ticks == ["32-true", "bf16-mixed", "16-mixed", "16-true\n(diverged)"]  # the failed run is absent
    assert [p.get_height() for p in time_ax.patches] == pytest.approx([20.0, 12.5, 12.5, 11.0])
    assert [t.get_text() for t in time_ax.texts] == ["1.00x", "1.60x", "1.60x", "1.82x"]
    legend = [t.get_text() for t in memory_ax.get_legend().get_texts()]
    assert legend == ["parameters", "gradients", "optimizer state", "activations"]
    assert "22.0 MiB" in _texts(memory_ax.figure) and "19.0 MiB\n-14%" in _texts(memory_ax.figure)


def test_memory_without_breakdown_uses_the_peak(throughput_result: BenchResult) -> None:
    memory_ax = time_memory_figure(throughput_result).axes[1]
    assert [t.get_text() for t in memory_ax.get_legend().get_texts()] == ["peak memory"]
    assert [p.get_height() for p in memory_ax.patches] == pytest.approx([22.0, 19.0])


def test_each_bar_is_labelled_with_the_peak_the_table_prints(bench_result: BenchResult) -> None:
    # The parts need not coexist (gradients grow in backward while activations are freed): a peak below their sum
    # is the figure, and the bar's label says it, as the table's Peak memory column does.
    ref = bench_result.run("32-true")
    assert ref is not None
    ref.peak_memory_bytes = 20 * 2**20  # the parts sum to 22 MiB
    texts = _texts(time_memory_figure(bench_result))
    assert "20.0 MiB" in texts and "22.0 MiB" not in texts


def test_only_failed_runs_still_give_pictures(tmp_path: Path) -> None:
    result = BenchResult(workload="w", runs=[RunResult(precision="32-true", status="failed", error="boom")])
    for path in write_plots(result, tmp_path):
        _png_size(path)
    assert "no step times" in _texts(time_memory_figure(result))


def test_results_read_back_from_json(bench_result: BenchResult, tmp_path: Path) -> None:
    # results.json stores the diverged run's NaN losses as null.
    result = BenchResult.from_dict(bench_result.to_dict())
    assert None in result.runs[3].losses
    _png_size(plot_losses(result, tmp_path / "loss.png"))


def test_missing_matplotlib_says_how_to_install(
    bench_result: BenchResult, tmp_path: Path, block_import: Callable[[str], None]
) -> None:
    block_import("matplotlib")
    with pytest.raises(AmpkitError, match=r'pip install "ampkit\[bench\]"'):
        write_plots(bench_result, tmp_path)
    assert list(tmp_path.iterdir()) == []
