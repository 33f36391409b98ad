"""The suite's ``--device`` option (tests/conftest.py): which tests a pass runs, and the errors that name the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")

SAMPLE = """
import pytest, torch

def test_generic(device, half_dtype, mixed_policy):
    print("RAN", device, half_dtype, mixed_policy)

def test_cpu_only():
    print("RAN cpu-only")

@pytest.mark.gpu
def test_gpu():
    print("RAN gpu")
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a CUDA device\n")
    pytester.makepyfile(test_sample=SAMPLE)
    return pytester


def test_cpu_pass_runs_generic_and_cpu_only_tests_and_skips_gpu_ones(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-s", "-rs")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*RAN cpu torch.bfloat16 bf16-mixed*", "*RAN cpu-only*", "*needs a CUDA device: run `pytest --device cuda`*"])


def test_half_fp16_gives_the_cpu_pass_the_cuda_pass_precision_and_says_so_in_the_header(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-s", "--half", "fp16")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["ampkit test pass: --device cpu --half fp16 (half_dtype torch.float16, mixed_policy 16-mixed)", "*RAN cpu torch.float16 16-mixed*"])


def test_an_unknown_half_is_a_usage_error_naming_the_choices(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--half", "fp32")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--half*invalid choice*'fp32'*fp16*bf16*"])


DOCTESTED = '''
import functools


class Table:
    @functools.cached_property
    def width(self):
        """A doctest that pytest finds no line number for (that of a cached_property, here).

        >>> Table().width
        3
        """
        return 3
'''


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch reports one CUDA device, so that ``--device cuda`` gets past its check on a machine without one (the
    sample's tests touch no CUDA memory)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_cuda_pass_deselects_doctests_instead_of_marking_them_skipped(suite: pytest.Pytester, fake_cuda: None) -> None:
    # A skip mark on such a doctest crashed the first GPU suite's test pass (pytest's report of a marked skip asserts
    # a line number; here too, in-process): the CPU pass runs doctests, the CUDA pass leaves them out.
    suite.makepyfile(doctested=DOCTESTED)
    result = suite.runpytest_inprocess("--device", "cuda", "--doctest-modules", "-s", "-rs")
    result.assert_outcomes(passed=2, skipped=1, deselected=1)
    result.stdout.fnmatch_lines(["*RAN cuda:0 torch.float16 16-mixed*", "*RAN gpu*", "*CPU-only test*"])


PARAMETRIZED_DEVICE = """
import pytest

@pytest.mark.parametrize("device", ["meta", "cuda:x"])  # a command line's device string, not the pass's device
def test_parses(device):
    print("RAN parses", device)
"""


def test_a_test_parametrizing_its_own_device_argument_is_cpu_only(suite: pytest.Pytester, fake_cuda: None) -> None:
    # Its `device` is a parameter, not the fixture: nothing in it runs on the pass's device (the CLI's device
    # parsing tests are such), so the CUDA pass skips it as it skips every CPU-only test.
    suite.makepyfile(test_parametrized=PARAMETRIZED_DEVICE)
    result = suite.runpytest_inprocess("--device", "cuda", "-s", "-rs", "test_parametrized.py")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*CPU-only test*"])


LEAKS_SYNC_DEBUG_MODE = """
import torch

def test_leaves_it_on(device):
    torch.cuda.set_sync_debug_mode("error")
    torch.set_autocast_enabled("cpu", True)

def test_next(device):
    print("MODE", torch.cuda.get_sync_debug_mode(), "AUTOCAST", torch.is_autocast_enabled("cpu"))
"""


def test_a_test_leaving_the_cuda_sync_debug_mode_or_autocast_on_fails_and_the_next_starts_without_them(
    suite: pytest.Pytester, fake_cuda: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Left on "error" (or "warn"), every later sync in the worker raised: one test's leak became a run of failures.
    mode = {"now": 0}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode["now"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: mode.update(now={"default": 0, "warn": 1, "error": 2}.get(m, m)))
    suite.makepyfile(test_leak=LEAKS_SYNC_DEBUG_MODE)
    result = suite.runpytest_inprocess("--device", "cuda", "-s", "test_leak.py")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*MODE 0 AUTOCAST False*"])  # printed by the next test, in the progress line
    result.stdout.fnmatch_lines(["E * AssertionError: CUDA sync debug mode left at 2; cpu autocast still enabled"])


def test_an_unknown_device_is_a_usage_error_naming_the_choices(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--device", "tpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--device 'tpu'*cpu, cuda or cuda:N*"])


def test_a_device_type_the_suite_does_not_run_on_is_refused(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--device", "meta")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*runs on cpu or cuda, not meta*"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: --device cuda is valid")
def test_cuda_without_a_gpu_says_so_instead_of_skipping_everything(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--device", "cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*sees no CUDA device*drop --device for the CPU pass*"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to run the CUDA pass")
def test_cuda_pass_runs_generic_and_gpu_tests_and_skips_cpu_only_ones(suite: pytest.Pytester, device: torch.device) -> None:
    # Takes `device` so that the CUDA pass itself runs it (a CPU-only test is skipped there).
    result = suite.runpytest("--device", "cuda", "-s", "-rs")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*RAN cuda:* torch.float16 16-mixed*", "*CPU-only test*"])
