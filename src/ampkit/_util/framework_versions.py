"""The releases of each training framework ampkit's integrations are tested against, and the check that names them.

An integration (``ampkit.lightning``, ``ampkit.transformers``, ``ampkit.accelerate``) and a tool reading a framework's
objects (``--model hf:PATH``, a ``LightningModule``, a ``datasets.Dataset``) call :func:`require` once, at import: a
package that is missing raises an ImportError naming the extra to install; a release outside the tested range logs
one warning naming the range and the release found, and the integration goes on (it uses the framework's documented
extension points, which change rarely, but its own tests ran on the range only).

    >>> TESTED["lightning"]
    ('2.6', '2.6')
    >>> in_range("2.6.6", TESTED["lightning"]), in_range("2.7.0", TESTED["lightning"]), in_range("2.5.1", TESTED["lightning"])
    (True, False, False)
"""

from __future__ import annotations

import importlib.metadata
import logging

__all__ = ["EXTRAS", "TESTED", "in_range", "require", "range_text"]

log = logging.getLogger("ampkit")

TESTED: dict[str, tuple[str, str]] = {
    "lightning": ("2.6", "2.6"),
    "transformers": ("5.23", "5.23"),
    "accelerate": ("1.16", "1.16"),
    "datasets": ("5.0", "5.2"),
}
"""Per package, the oldest and the newest ``major.minor`` release the integration's tests ran on (constraints.txt pins
the one CI installs)."""

EXTRAS: dict[str, str] = {"lightning": "lightning", "transformers": "hf", "accelerate": "hf", "datasets": "hf"}
"""The ampkit extra that installs each package."""

_warned: set[str] = set()


def _minor(version: str) -> tuple[int, int]:
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in version.split(".")[:2]]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def in_range(version: str, tested: tuple[str, str]) -> bool:
    """Whether ``version``'s ``major.minor`` lies within ``tested`` (both ends included)."""
    return _minor(tested[0]) <= _minor(version) <= _minor(tested[1])


def range_text(package: str) -> str:
    """The tested range as pip writes it: ``lightning>=2.6,<2.7``.

    >>> range_text("transformers")
    'transformers>=5.23,<5.24'
    """
    low, high = TESTED[package]
    major, minor = _minor(high)
    return f"{package}>={low},<{major}.{minor + 1}"


def require(package: str, what: str) -> str:
    """The installed release of ``package``, for ``what`` (the integration or tool asking); an ImportError naming the
    extra to install when it is missing; one warning per package naming the tested range when it is outside it."""
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(
            f"{what} needs {package}, which is not installed: pip install 'ampkit[{EXTRAS.get(package, package)}]' "
            f"(tested: {range_text(package)})."
        ) from None
    if not in_range(version, TESTED[package]) and package not in _warned:
        _warned.add(package)
        log.warning(
            "%s: %s %s is outside the releases ampkit is tested with; it may work, but if it fails, install a tested "
            "release: pip install '%s'", what, package, version, range_text(package),
        )
    return version
