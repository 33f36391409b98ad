"""The docs tests' summary: every python block of the documentation that was not run, with its reason.

The page tests record each skipped block as a user property, which pytest carries back from xdist workers too; the
summary is printed at the end of the run, so a skip is never silent.
"""

from __future__ import annotations

import pytest

SKIP_PROPERTY = "docs-test skip"  # tests/docs/test_code_blocks.py records it


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = sorted({value for reports in terminalreporter.stats.values() for report in reports
                      if getattr(report, "when", None) == "call" or getattr(report, "when", None) == "setup"
                      for name, value in getattr(report, "user_properties", ()) if name == SKIP_PROPERTY})
    if skipped:
        terminalreporter.write_sep("-", "documentation code blocks not run")
        for line in skipped:
            terminalreporter.write_line(line)
