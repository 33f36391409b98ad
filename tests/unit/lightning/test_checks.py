"""The Lightning release is checked against the tested range when ampkit.lightning is imported, and a missing package
names the extra that installs it (ampkit._util.framework_versions, shared by every integration)."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging

import pytest

import ampkit._util.framework_versions as versions


def test_an_untested_lightning_release_is_named_with_the_tested_range(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import ampkit.lightning._precision as plugin

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.9.0" if name == "lightning" else real(name))
    monkeypatch.setattr(versions, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        importlib.reload(plugin)
    assert "lightning 2.9.0 is outside the releases ampkit is tested with" in caplog.text
    assert "pip install 'lightning>=2.6,<2.7'" in caplog.text


def test_the_tested_release_passes_silently(caplog: pytest.LogCaptureFixture) -> None:
    versions._warned.discard("lightning")
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        assert versions.require("lightning", "ampkit.lightning") == importlib.metadata.version("lightning")
    assert not caplog.text


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(ImportError, match=r"pip install 'ampkit\[lightning\]'"):
        versions.require("lightning", "ampkit.lightning")
