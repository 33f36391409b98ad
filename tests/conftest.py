"""Fixtures shared by every test: the device a pass runs on, and leak guards that keep one test's global state
out of the next.

``pytest --device cuda`` runs every device-generic test (one that takes the ``device`` fixture, or is marked
``gpu``) on the GPU and skips the rest, which are CPU-only by construction and run in the default CPU pass::

    python -m pytest -q                                   # the CPU pass (CI: every test, the slow tier included)
    python -m pytest -q -m "not slow"                     # the same without the slow tier (a quicker pass while working)
    python -m pytest -q -m "not slow" --device cuda       # the same device-generic tests on a GPU
    python -m pytest -q -m "not slow" --half fp16         # the CPU pass in the CUDA pass's precision (fp16, 16-mixed)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import multiprocessing
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

DEVICE_TYPES = ("cpu", "cuda")

# The 16-bit type of a device-generic test (``half_dtype``) and the mixed policy that goes with it (``mixed_policy``),
# by the name ``--half`` takes. Without ``--half``, each device's own choice: fp16 on CUDA, bf16 on the CPU.
HALF_TYPES = {"fp16": (torch.float16, "16-mixed"), "bf16": (torch.bfloat16, "bf16-mixed")}

# Tests that start ranks fork them from a server process that imported these once for the session
# (start_method="forkserver"): a spawned rank imports torch, torch.distributed and ampkit again, about 3 s per test
# on two cores, most of a short body's time; a fork starts in well under a second. Each run still gets fresh ranks
# that no earlier test touched, since the server only imports. A forked rank ends with os._exit, skipping
# interpreter finalization: what happens there is tests/unit/distributed/test_shutdown.py's subject, which spawns.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor", "torch._dynamo", "ampkit", "ampkit.distributed", "ampkit.training"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default="cpu",
        help="run the device-generic tests (those taking the `device` fixture or marked gpu) on this device: "
        "cpu (default), cuda or cuda:N. On cuda the CPU-only tests skip: the CPU pass runs them.",
    )
    parser.addoption(
        "--half",
        choices=tuple(HALF_TYPES),
        default=None,
        help="the 16-bit type of the device-generic tests (the `half_dtype` and `mixed_policy` fixtures): fp16 "
        "(16-mixed, with loss scaling) or bf16 (bf16-mixed). Default: the device's own choice, fp16 on cuda and bf16 on "
        "cpu. `--half fp16` on the CPU reproduces the CUDA pass's precision without a GPU (slowly: fp16 has no fast CPU "
        "kernels).",
    )


# An xdist worker starts with COLUMNS=80 and LINES=24 in its environment (set while execnet starts it, whatever the
# controller has), so every subprocess a test started there printed its rich tables squeezed to 80 columns, which the
# tests that read those tables then failed to parse (seen with pytest-xdist 3.8, execnet 2.1). The controller hands
# its own values to each worker, which puts them back.
_TERMINAL_VARIABLES = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    """xdist, in the controller: give the worker this process's terminal variables (None: unset)."""
    node.workerinput["terminal_variables"] = {name: os.environ.get(name) for name in _TERMINAL_VARIABLES}  # type: ignore[attr-defined]


def _restore_terminal_variables(config: pytest.Config) -> None:
    for name, value in getattr(config, "workerinput", {}).get("terminal_variables", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_configure(config: pytest.Config) -> None:
    _restore_terminal_variables(config)
    config.test_device = _parse_device(config.getoption("--device"))  # type: ignore[attr-defined]
    config.test_half = config.getoption("--half") or ("fp16" if config.test_device.type == "cuda" else "bf16")  # type: ignore[attr-defined]
    # Every sparse tensor a test builds is validated. Opting in globally also silences torch's "invariant checks
    # are implicitly disabled" warning (an error here), which torch 2.11 emits even for check_invariants=True.
    torch.sparse.check_sparse_tensor_invariants.enable()
    multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)


def _parse_device(text: str) -> torch.device:
    try:
        device = torch.device(text)
    except RuntimeError as error:
        raise pytest.UsageError(f"--device {text!r}: {error}. Use cpu, cuda or cuda:N.") from None
    if device.type not in DEVICE_TYPES:
        raise pytest.UsageError(f"--device {text!r}: the test suite runs on {' or '.join(DEVICE_TYPES)}, not {device.type}.")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise pytest.UsageError(
                f"--device {text}: torch {torch.__version__} sees no CUDA device (built with CUDA {torch.version.cuda}). "
                "Run on a GPU machine, or drop --device for the CPU pass."
            )
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise pytest.UsageError(f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) are visible.")
        device = torch.device("cuda", index)
    return device


def _takes_the_device_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` is device-generic: it takes the ``device`` fixture, directly or through another fixture. A test
    that parametrizes an argument of that name itself (a command line's device string) takes no fixture: CPU-only."""
    parametrized = getattr(getattr(item, "callspec", None), "params", {})
    return "device" in getattr(item, "fixturenames", ()) and "device" not in parametrized


def pytest_report_header(config: pytest.Config) -> str:
    """Name the pass in its log: which device, and which 16-bit type its device-generic tests ran in."""
    dtype, policy = HALF_TYPES[config.test_half]  # type: ignore[attr-defined]
    return f"ampkit test pass: --device {config.test_device} --half {config.test_half} (half_dtype {dtype}, mixed_policy {policy})"  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    device: torch.device = config.test_device  # type: ignore[attr-defined]
    cpu_only = pytest.mark.skip(reason=f"CPU-only test (takes no `device` fixture): the CPU pass runs it, not --device {device}")
    needs_cuda = pytest.mark.skip(reason="needs a CUDA device: run `pytest --device cuda` on a GPU machine")
    if device.type != "cpu":
        # Doctests are CPU-only (the CPU pass runs them), and they cannot carry a skip mark: a doctest of a decorated
        # function has no line number, and pytest's report of a marked skip asserts one (the first GPU suite's test
        # pass died of it, in an xdist worker, hiding which of its tests had failed). They are deselected instead.
        doctests = [item for item in items if isinstance(item, pytest.DoctestItem)]
        if doctests:
            config.hook.pytest_deselected(items=doctests)
            items[:] = [item for item in items if not isinstance(item, pytest.DoctestItem)]
    for item in items:
        generic = _takes_the_device_fixture(item)
        marked_gpu = item.get_closest_marker("gpu") is not None
        if device.type != "cuda" and marked_gpu:
            item.add_marker(needs_cuda)
        elif device.type != "cpu" and not (generic or marked_gpu):
            item.add_marker(cpu_only)


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> torch.device:
    """The device of this pass (``--device``, default cpu): device-generic tests build their models and tensors on it."""
    return pytestconfig.test_device  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def half_dtype(pytestconfig: pytest.Config, device: torch.device) -> torch.dtype:
    """The 16-bit type of this pass (``--half``), by default the one a mixed-precision user picks on ``device``: fp16
    on CUDA (tensor cores, Apex's default), bf16 on the CPU (fp16 has no fast CPU kernels)."""
    return HALF_TYPES[pytestconfig.test_half][0]  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def mixed_policy(pytestconfig: pytest.Config, device: torch.device) -> str:
    """The mixed-precision policy of ``half_dtype``: ``16-mixed`` (fp16 with loss scaling, CUDA's default) or
    ``bf16-mixed`` (the CPU's default)."""
    return HALF_TYPES[pytestconfig.test_half][1]  # type: ignore[attr-defined]


def _cuda_sync_debug_mode() -> int | None:
    """``torch.cuda.get_sync_debug_mode()`` once CUDA is initialised; None before (reading it would initialise CUDA).
    Left at 1 ("warn") or 2 ("error"), every later host-device sync of the process warns or raises."""
    return torch.cuda.get_sync_debug_mode() if torch.cuda.is_initialized() else None


def _set_cuda_sync_debug_mode(mode: int) -> None:
    with warnings.catch_warnings():  # torch's once-per-process notice that the mode is a prototype
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype feature")
        torch.cuda.set_sync_debug_mode(mode)


def _tf32_flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.fixture(autouse=True)
def _restore_torch_globals():
    """Fail a test that leaves autocast on, or changes the default dtype, matmul precision, TF32 switches or CUDA's
    sync debug mode, and put each back: left as it was, one test's leak would fail the tests after it."""
    dtype, precision, tf32 = torch.get_default_dtype(), torch.get_float32_matmul_precision(), _tf32_flags()
    sync_mode = _cuda_sync_debug_mode()
    yield
    leaked = []
    now, expected = _cuda_sync_debug_mode(), sync_mode or 0
    if now is not None and now != expected:
        leaked.append(f"CUDA sync debug mode left at {now}")
        _set_cuda_sync_debug_mode(expected)
    for device_type in DEVICE_TYPES:
        if torch.is_autocast_enabled(device_type):
            leaked.append(f"{device_type} autocast still enabled")
            torch.set_autocast_enabled(device_type, False)
    if torch.get_default_dtype() != dtype:
        leaked.append(f"default dtype changed to {torch.get_default_dtype()}")
        torch.set_default_dtype(dtype)
    if torch.get_float32_matmul_precision() != precision:
        leaked.append(f"float32 matmul precision changed to {torch.get_float32_matmul_precision()}")
        torch.set_float32_matmul_precision(precision)
    if _tf32_flags() != tf32:
        leaked.append(f"TF32 switches (matmul, cudnn) changed to {_tf32_flags()}")
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    assert not leaked, "; ".join(leaked)


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="session")
def load_script() -> Iterator[Callable[..., ModuleType]]:
    """``load_script("fp8_training", monkeypatch)``: benchmarks/fp8_training.py imported as the module
    ``fp8_training``, the name its neighbours import it by (benchmarks/ is on the tests' path). The module is in
    ``sys.modules`` before it runs, since dataclasses (and torch.compile) look their module up there: with the test's
    ``monkeypatch`` only until the test ends; without (a module-scoped fixture's call) until the session ends."""
    registered: list[tuple[str, ModuleType]] = []

    def load(name: str, monkeypatch: pytest.MonkeyPatch | None = None) -> ModuleType:
        path = BENCHMARKS / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        if not path.is_file() or spec is None or spec.loader is None:
            raise FileNotFoundError(f"load_script({name!r}): no {path}; name a script of benchmarks/, without .py")
        module = importlib.util.module_from_spec(spec)
        if monkeypatch is not None:
            monkeypatch.setitem(sys.modules, name, module)
        else:
            registered.append((name, module))
            sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    yield load
    for name, module in registered:
        if sys.modules.get(name) is module:
            del sys.modules[name]


@pytest.fixture
def hf_gpt2() -> str:
    """Path of examples/train_hf_gpt2.py (a random-init transformers GPT-2, dict batches, ModelOutput with .loss):
    ``f"{hf_gpt2}:model"`` and ``f"{hf_gpt2}:data"`` are what --model and --data take."""
    pytest.importorskip("transformers", reason="Requires: transformers (pip install -e '.[hf]')")
    return str(Path(__file__).resolve().parents[1] / "examples" / "train_hf_gpt2.py")


HF_CONV1D = '''
import torch
from torch import nn


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D, line for line (GPT-2's projections): a Linear whose weight is stored
    transposed, (in, out), and applied as addmm(bias, x, weight)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.nx = nx
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        x = x.view(size_out)
        return x
'''
"""Source of a stand-in for Hugging Face's ``Conv1D``: the tests need no transformers (an optional extra)."""


@pytest.fixture
def hf_conv1d_source() -> str:
    """:data:`HF_CONV1D`, to write into a user's model file for the CLI."""
    return HF_CONV1D


@pytest.fixture
def hf_conv1d() -> type[torch.nn.Module]:
    """The ``Conv1D`` class of :data:`HF_CONV1D`: ``Conv1D(nf=out_features, nx=in_features)``."""
    namespace: dict[str, object] = {}
    exec(compile(HF_CONV1D, "hf_conv1d", "exec"), namespace)  # noqa: S102 - the constant above, a class definition
    return namespace["Conv1D"]  # type: ignore[return-value]


@pytest.fixture
def quiet_machine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tune reads how busy the machine is (:class:`ampkit.tuning._machine.CpuMeter`) and measures differently on a
    busy one; a test of what it does must not depend on what else the test machine runs (CI's other test processes,
    a neighbour's build). The tune's tests use this (their conftest or ``pytestmark``): a quiet machine, unless a test
    is marked ``real_load`` (the meter's own) or sets the load it tests itself. Not autouse: it imports ampkit.tuning,
    which the import-cost tests must see unimported."""
    if request.node.get_closest_marker("real_load") is not None:
        return
    from ampkit.tuning import _machine

    real = _machine.CpuMeter.read

    def quiet(self: _machine.CpuMeter) -> _machine.Load:
        return dataclasses.replace(real(self), others_cores=0.0)

    monkeypatch.setattr(_machine.CpuMeter, "read", quiet)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that writes nothing: a running writer whose files a cleanup must keep (fileio's temporaries,
    the sharded checkpoint's leftovers)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()
