"""A pytest plugin that writes each failed or errored test to a file the moment pytest reports it.

The GPU suite's test pass can be cut short (its step's limit, a crash of pytest itself), and pytest prints the
names of its failures only at the very end: the first H200 run's pass reported "98 failed" and an INTERNALERROR,
and which 98 was never printed. With this plugin every failure is on disk as soon as it happens, one line each::

    FAILED tests/unit/x/test_y.py::test_z - AssertionError: 3 != 4
    ERROR tests/unit/x/test_y.py::test_w - RuntimeError: CUDA error: out of memory   (in setup or teardown)
    ERROR tests/unit/x/test_v.py - ImportError: ...                                  (collecting the file)

    python -m pytest -p benchmarks.failure_log --failure-log failures.txt ...   # from the repository root

Under pytest-xdist the workers run the tests and the controller receives every report, so only the controller
writes (a worker would write each line a second time). Each line is appended and flushed on its own, so a pass
killed at any point leaves every failure reported before it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

__all__ = ["reason_of"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--failure-log", metavar="PATH", default=None,
                     help="append each failed or errored test (node id and the first line of its reason) to PATH as it is reported")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--failure-log")
    if path and not hasattr(config, "workerinput"):  # an xdist worker has workerinput: its controller writes
        config.pluginmanager.register(_FailureLog(Path(path)), "failure_log_writer")


def reason_of(report: pytest.CollectReport | pytest.TestReport) -> str:
    """The first line of a failure's reason: the exception's message pytest shows in its short summary, else the
    first non-blank line of the report's text.

    >>> from types import SimpleNamespace
    >>> crash = SimpleNamespace(reprcrash=SimpleNamespace(message="AssertionError: 3 != 4\\nmore"))
    >>> reason_of(SimpleNamespace(longrepr=crash, longreprtext=""))
    'AssertionError: 3 != 4'
    >>> reason_of(SimpleNamespace(longrepr="text", longreprtext="\\n  worker 'gw1' crashed while running 'a.py::t'\\n"))
    "worker 'gw1' crashed while running 'a.py::t'"
    """
    crash = getattr(report.longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or report.longreprtext or ""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "(no reason given)")[:300]


class _FailureLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")  # this pass's failures only

    def _write(self, kind: str, nodeid: str, report: pytest.CollectReport | pytest.TestReport) -> None:
        with self.path.open("a", encoding="utf-8") as sink:
            sink.write(f"{kind} {nodeid or '(session)'} - {reason_of(report)}\n")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:  # the call failed, or (an error) its setup or teardown did
            self._write("FAILED" if report.when == "call" else "ERROR", report.nodeid, report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._write("ERROR", report.nodeid, report)
