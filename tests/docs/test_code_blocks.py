"""The documentation runs as written: every ```python block of README.md and docs/**/*.md, page by page, and the
site builds with ``mkdocs build --strict``.

Each page's python blocks run in order in one namespace, in a process of their own whose working directory is a
temporary one (``engine.save("runs/last.pt")`` writes there), under the suite's warning filters (a warning is an
error) and a timeout: one test per page, its id the page's path. The process is forked from the suite's forkserver,
which imported torch and ampkit once and nothing else. A traceback names the page and the line of the
Markdown file. Three markers, HTML comments that neither the site nor the repository host shows, say what a page
needs::

    <!-- docs-test: skip (needs a CUDA device) -->    the next python block is not run; the reason is printed
    <!-- docs-test: setup
    model = torch.nn.Linear(4, 2)                      python run at this point, unseen by the reader: what makes
    -->                                                a quick start's placeholders (MyNet, loader) real and small
    <!-- docs-test: check
    assert engine.scale == 32768.0                     the same, after a block: what the text says it printed
    -->

A skip without a reason, a marker that is not right before a python block, or a marker of another name fails the
page's test: no block goes unrun without a reason a reader can check. Every skipped block is listed, with its reason,
at the end of the run (tests/docs/conftest.py); a page whose every block is skipped is reported as skipped, with them.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import runpy
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from _pytest.config import parse_warning_filter

ROOT = Path(__file__).resolve().parents[2]
PAGE_TIMEOUT_S = 180  # a hang, not a budget: a page takes seconds (the profile guide's, the longest, 10-30 s on 2 busy cores)
SKIP_PROPERTY = "docs-test skip"  # the user property tests/docs/conftest.py reads back for its summary

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test\s*:(?P<rest>.*)$")
_SKIP = re.compile(r"^\s*skip\s*\((?P<reason>.*)\)\s*-->\s*$")
_HIDDEN = re.compile(r"^\s*(?P<kind>setup|check)\s*$")
_PYTHON_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*(python|py)\b", re.MULTILINE)
PYTHON_LANGUAGES = {"python", "py"}


class PageError(ValueError):
    """A page's docs-test markers cannot be read; the message names the page, the line and the fix."""


@dataclass(frozen=True)
class Block:
    line: int  # the page's line of the block's first line of code (1-based)
    code: str
    hidden: bool = False  # a setup or check block: run, not shown
    skip: str | None = None  # the reason it is not run


def parse_page(text: str, page: str) -> list[Block]:
    """The python blocks of a Markdown page (shown and hidden), in order, with their skip reasons."""
    lines = text.splitlines()
    blocks: list[Block] = []
    pending_skip: tuple[int, str] | None = None  # (marker line, reason) waiting for its python block
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        marker = _MARKER.match(line)
        if fence:
            indent, mark = fence["indent"], fence["fence"]
            language = (fence["info"].split() or [""])[0].lower()
            closing = re.compile(rf"^[ \t]*{re.escape(mark[0])}{{{len(mark)},}}\s*$")
            end = i + 1
            while end < len(lines) and not closing.match(lines[end]):
                end += 1
            body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1 : end]]
            if language in PYTHON_LANGUAGES:
                blocks.append(Block(line=i + 2, code="\n".join(body) + "\n", skip=pending_skip[1] if pending_skip else None))
            elif pending_skip:
                raise PageError(f"{page}:{pending_skip[0]}: the docs-test skip marker is followed by a ```{language or '(plain)'} "
                                "block, not a ```python one: put it right before the python block it skips")
            pending_skip = None
            i = end + 1
            continue
        if pending_skip and line.strip():
            raise PageError(f"{page}:{pending_skip[0]}: the docs-test skip marker is not right before a ```python block "
                            "(only blank lines may come between): move it there")
        if marker:
            rest = marker["rest"]
            skip = _SKIP.match(rest)
            if skip:
                if not skip["reason"].strip():
                    raise PageError(f"{page}:{i + 1}: a docs-test skip needs its reason: <!-- docs-test: skip (needs a CUDA device) -->")
                pending_skip = (i + 1, skip["reason"].strip())
            elif hidden := _HIDDEN.match(rest):
                end = i + 1
                while end < len(lines) and lines[end].strip() != "-->":
                    end += 1
                if end == len(lines):
                    raise PageError(f"{page}:{i + 1}: the docs-test {hidden['kind']} block is never closed: end it with a line '-->'")
                blocks.append(Block(line=i + 2, code=textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n", hidden=True))
                i = end
            else:
                raise PageError(f"{page}:{i + 1}: unknown docs-test marker {line.strip()!r}: write "
                                "'<!-- docs-test: skip (the reason) -->', or '<!-- docs-test: setup' (or 'check') ... '-->'")
        i += 1
    if pending_skip:
        raise PageError(f"{page}:{pending_skip[0]}: the docs-test skip marker is followed by no ```python block: remove it")
    return blocks


# Runs in the page's process: its own working directory and output files, the suite's warning filters, then each
# block compiled with the page as its file name and its own line numbers, so a traceback shows the Markdown line.
_DRIVER = """\
import importlib, json, os, sys, traceback, warnings
spec = json.loads(open(SPEC, encoding="utf-8").read())
os.chdir(spec["cwd"])
for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
    stream.flush()
    out = os.open(spec["output"][fd - 1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, fd)
    os.close(out)
os.environ.update(spec["env"])
warnings.resetwarnings()
for action, message, category, module, lineno in spec["filters"]:
    owner, _, name = category.rpartition(".")
    warnings.filterwarnings(action, message, getattr(importlib.import_module(owner), name), module, lineno)
sys.argv = [spec["path"]]
namespace = {"__name__": "__main__", "__file__": spec["path"]}
try:
    for block in spec["blocks"]:
        print(f"docs-test: {spec['page']}:{block['line']}" + (" (hidden)" if block["hidden"] else ""), flush=True)
        exec(compile("\\n" * (block["line"] - 1) + block["code"], spec["path"], "exec"), namespace)
except Exception:
    traceback.print_exc()
    raise SystemExit(1)
print(EVERY_BLOCK_RAN, flush=True)
"""
EVERY_BLOCK_RAN = "docs-test: every block ran"
# Nothing is downloaded: Hugging Face reads local folders only; plots render without a display.
PAGE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}


def warning_filters(config: pytest.Config) -> list[tuple[str, str, str, str, int]]:
    """The suite's filterwarnings (pyproject.toml), as the driver applies them, in the same order."""
    filters = []
    for entry in config.getini("filterwarnings"):
        action, message, category, module, lineno = parse_warning_filter(entry, escape=False)
        filters.append((action, message, f"{category.__module__}.{category.__qualname__}", module, lineno))
    return filters


@dataclass(frozen=True)
class Finished:
    exitcode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exitcode == 0 and EVERY_BLOCK_RAN in self.stdout  # a block's sys.exit(0) stops the page too early


def run_blocks(path: Path, page: str, blocks: list[Block], cwd: Path, filters: list, timeout: float = PAGE_TIMEOUT_S) -> Finished:
    """Run a page's blocks in a process of their own, forked from the suite's forkserver (tests/conftest.py), which
    imported torch, torch._dynamo and ampkit once: a fresh interpreter would import them again for every page, about
    5 s each on 2 cores, most of a page's time. The process imports nothing else first and sees no test's state."""
    output = [str(cwd / "docs_test.stdout"), str(cwd / "docs_test.stderr")]
    spec = {"path": str(path), "page": page, "cwd": str(cwd), "output": output, "env": PAGE_ENV, "filters": filters,
            "blocks": [{"line": b.line, "code": b.code, "hidden": b.hidden} for b in blocks if b.skip is None]}
    (cwd / "docs_test_spec.json").write_text(json.dumps(spec), encoding="utf-8")
    (cwd / "docs_test_driver.py").write_text(f"EVERY_BLOCK_RAN = {EVERY_BLOCK_RAN!r}\n" + _DRIVER, encoding="utf-8")
    # Not a daemon: a page may start processes of its own (DataLoader workers).
    child = multiprocessing.get_context("forkserver").Process(
        target=runpy.run_path, args=(str(cwd / "docs_test_driver.py"),),
        kwargs={"init_globals": {"SPEC": str(cwd / "docs_test_spec.json")}, "run_name": "__main__"})
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        exitcode = None
    else:
        exitcode = child.exitcode
    read = [Path(name).read_text(encoding="utf-8", errors="replace") if Path(name).exists() else "" for name in output]
    return Finished(exitcode, *read)


def pages_with_python() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p.relative_to(ROOT).as_posix() for p in pages if _PYTHON_FENCE.search(p.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("page", pages_with_python())
def test_the_pages_python_blocks_run(page: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    path = ROOT / page
    try:
        blocks = parse_page(path.read_text(encoding="utf-8"), page)
    except PageError as e:
        pytest.fail(str(e), pytrace=False)
    skipped = [b for b in blocks if b.skip is not None]
    for b in skipped:
        request.node.user_properties.append((SKIP_PROPERTY, f"{page}:{b.line}: {b.skip}"))
    if all(b.skip is not None for b in blocks if not b.hidden):
        pytest.skip(f"{page}: every python block is skipped: " + "; ".join(f"line {b.line}: {b.skip}" for b in skipped))
    done = run_blocks(path, page, blocks, tmp_path, warning_filters(request.config))
    if done.exitcode is None:
        pytest.fail(f"{page}: its blocks ran past {PAGE_TIMEOUT_S} s:\n{_tail(done.stdout, done.stderr)}", pytrace=False)
    if not done.ok:
        pytest.fail(f"{page}: a python block failed (exit {done.exitcode}):\n{_tail(done.stdout, done.stderr)}", pytrace=False)


def _tail(stdout: str, stderr: str, chars: int = 6000) -> str:
    return "\n".join(s for s in (stdout, stderr) if s)[-chars:]


def test_the_site_builds_with_strict_links(tmp_path: Path) -> None:
    # CI runs the build itself too; this is how a broken link or a page missing from the nav fails a test run alone.
    pytest.importorskip("mkdocs", reason="Requires: mkdocs (pip install -e '.[dev]')")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=300)
    complaints = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(complaints or [_tail(done.stdout, done.stderr)])


# The harness itself: each rule above can fail.

PAGE = """\
# A page

<!-- docs-test: setup
import pathlib
placeholder = 41
-->

```python
answer = placeholder + 1
pathlib.Path("written.txt").write_text(str(answer))
```

```bash
echo not python
```

<!-- docs-test: skip (needs a CUDA device) -->

```python
import torch; torch.ones(1, device="cuda")
```

- a list item:

  ```python
  assert pathlib.Path("written.txt").read_text() == "42"
  ```

<!-- docs-test: check
assert answer == 42
-->
"""


def test_a_page_gives_its_setup_shown_and_skipped_blocks_in_order_with_their_lines() -> None:
    blocks = parse_page(PAGE, "page.md")
    assert [(b.line, b.hidden, b.skip) for b in blocks] == [
        (4, True, None), (9, False, None), (20, False, "needs a CUDA device"), (26, False, None), (30, True, None)]
    assert blocks[0].code == "import pathlib\nplaceholder = 41\n"
    assert blocks[3].code == 'assert pathlib.Path("written.txt").read_text() == "42"\n'  # the list's indent removed


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("<!-- docs-test: skip () -->\n```python\npass\n```\n", "needs its reason"),
        ("<!-- docs-test: skip -->\n```python\npass\n```\n", "unknown docs-test marker"),
        ("<!-- docs-test: skp (typo) -->\n```python\npass\n```\n", "unknown docs-test marker"),
        ("<!-- docs-test: skip (why) -->\nsome text\n```python\npass\n```\n", "not right before"),
        ("<!-- docs-test: skip (why) -->\n```bash\nls\n```\n", "not a ```python one"),
        ("<!-- docs-test: skip (why) -->\n", "followed by no"),
        ("<!-- docs-test: setup\nx = 1\n", "setup block is never closed"),
        ("```python\npass\n```\n<!-- docs-test: check\nassert True\n", "check block is never closed"),
    ],
)
def test_a_marker_that_cannot_be_read_is_refused_naming_the_fix(text: str, says: str) -> None:
    with pytest.raises(PageError, match=re.escape(says)):
        parse_page(text, "page.md")


def test_blocks_share_one_namespace_in_a_temporary_directory(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE, encoding="utf-8")
    done = run_blocks(page, "page.md", parse_page(PAGE, "page.md"), tmp_path, warning_filters(request.config), timeout=60)
    assert done.ok, done.stderr
    assert "page.md:9" in done.stdout and "page.md:20" not in done.stdout  # the skipped block did not run
    assert (tmp_path / "written.txt").read_text() == "42"


@pytest.mark.parametrize(
    ("code", "says"),
    [
        ("x = 1\nraise RuntimeError('broken example')\n", "RuntimeError: broken example"),
        ("import warnings\nwarnings.warn('a warning in an example')\n", "UserWarning: a warning in an example"),
    ],
)
def test_a_block_that_raises_or_warns_fails_naming_the_page_and_its_line(tmp_path: Path, request: pytest.FixtureRequest, code: str, says: str) -> None:
    text = f"# Title\n\n```python\n{code}```\n"
    page = tmp_path / "broken.md"
    page.write_text(text, encoding="utf-8")
    done = run_blocks(page, "broken.md", parse_page(text, "broken.md"), tmp_path, warning_filters(request.config), timeout=60)
    assert done.exitcode == 1 and not done.ok and says in done.stderr
    assert f'File "{page}", line 5' in done.stderr  # the Markdown line of the statement that failed


@pytest.mark.parametrize(
    ("code", "exitcode"),
    [
        ("import sys\nsys.exit(0)\n", 0),  # the blocks after it would not run: not a pass
        ("import time\ntime.sleep(60)\n", None),  # killed at the timeout
    ],
)
def test_a_page_that_stops_early_or_hangs_does_not_pass(tmp_path: Path, request: pytest.FixtureRequest, code: str, exitcode: int | None) -> None:
    text = f"```python\n{code}```\n\n```python\nprint('after')\n```\n"
    page = tmp_path / "stops.md"
    page.write_text(text, encoding="utf-8")
    done = run_blocks(page, "stops.md", parse_page(text, "stops.md"), tmp_path, warning_filters(request.config), timeout=5)
    assert done.exitcode == exitcode and not done.ok and "after" not in done.stdout
