"""A Griffe extension that reads ampkit's docstrings as they are written, for the API reference (mkdocs.yml loads it).

ampkit's docstrings are prose with doctest examples and Sphinx roles, plus a Google-style ``Args:`` section here and
there. Griffe's Google parser reads the sections, but renders the rest as Markdown, where a doctest is a nested
block quote (``>>>``) and ``:class:`Engine``` shows its role. Before the parser runs, this rewrites each docstring:

* a doctest block (``>>>`` lines, their ``...`` continuations and expected output, up to a blank line) outside a
  Google section becomes a fenced ``pycon`` block, so it renders as code; inside an ``Examples:`` section Griffe
  does the same itself;
* an rST literal block (a paragraph ending in ``::``, then an indented block) becomes a fenced block after a ``:``;
* a role (``:class:`~ampkit.bench.BenchData```, ``:meth:`setup```, ``:func:`title <target>```) becomes an
  optional cross-reference: a link where the target is rendered in the reference, plain code where it is not (a
  private module), so an unresolved role never fails the strict build. Relative targets are resolved in the
  docstring owner's scope, as Sphinx does.

The source files are not changed: the doctests keep running as tests.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Module, NameResolutionError, Object

__all__ = ["AmpkitDocstrings", "to_markdown"]

# A role: `:class:`target``, `:meth:`~a.b.c``, `:func:`Title <a.b.c>``; `py:` domains included.
_ROLE = re.compile(r":(?:py:)?(?P<kind>class|func|meth|mod|data|attr|exc|obj|const):`(?P<body>[^`]+)`")
# A Google-style section title on its own line (Griffe parses what is indented under it).
_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters|Returns|Return|Yields|Yield|"
    r"Receives|Raises|Raise|Exceptions|Except|Warns|Warnings|Attributes|Functions|Methods|Classes|Modules|"
    r"Type Aliases|Type Parameters|Examples|Example):\s*$"
)
_FENCE = "```"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _fence(out: list[str], block: list[str], language: str) -> None:
    """Append ``block`` (lines at one indentation or deeper) to ``out``, dedented into a fence at the left margin,
    with a blank line on each side (Markdown starts no block inside a paragraph)."""
    cut = min(_indent(line) for line in block if line.strip())
    if out and out[-1].strip():
        out.append("")
    out.extend([f"{_FENCE}{language}", *(line[cut:] for line in block), _FENCE, ""])


def _blocks(lines: list[str]) -> list[str]:
    """The lines with doctest and literal blocks fenced; Google sections and existing fences left as they are."""
    out: list[str] = []
    i, in_fence, in_section = 0, False, False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith(_FENCE):
            in_fence = not in_fence
        if in_fence or stripped.startswith(_FENCE):
            out.append(line)
            i += 1
            continue
        if _SECTION.match(line):
            in_section = True
        elif in_section and stripped and _indent(line) == 0:
            in_section = False  # a section ends at the first line back at the left margin
        if in_section:
            out.append(line)
            i += 1
            continue
        if stripped.startswith(">>>"):
            end = i
            while end < len(lines) and lines[end].strip():
                end += 1
            _fence(out, lines[i:end], "pycon")
            i = end
            continue
        if stripped.endswith("::") and i + 2 < len(lines) and not lines[i + 1].strip() and _indent(lines[i + 2]) > _indent(line):
            # An rST literal block: `text::` (the `::` reads as `:`), a blank line, the indented block up to the first
            # line back at the paragraph's indentation.
            end = i + 2
            while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > _indent(line)):
                end += 1
            while not lines[end - 1].strip():
                end -= 1
            text = line.rstrip()[:-1].rstrip()
            if text.strip() != ":":
                out.append(text)
            _fence(out, lines[i + 2:end], "")
            i = end
            continue
        out.append(line)
        i += 1
    return out


def _target(body: str) -> tuple[str, str]:
    """(title, target) of a role's body: ``~a.b.C`` -> (``C``, ``a.b.C``); ``Title <a.b.C>`` -> (``Title``, ``a.b.C``)."""
    explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^<>]+)>", body)
    if explicit:
        return explicit["title"], explicit["target"].lstrip("~.")
    target = body.lstrip("~.")
    return (target.rsplit(".", 1)[-1] if body.startswith("~") else target), target


def _identifier(target: str, owner: Object | None) -> str:
    """The full path of ``target``, resolved in ``owner``'s scope when it is relative (as Sphinx resolves roles)."""
    if owner is None or target.startswith("ampkit.") or target == "ampkit":
        return target
    head, _, rest = target.partition(".")
    for scope in (owner, owner.parent):
        if scope is None:
            continue
        try:
            resolved = scope.resolve(head)
        except NameResolutionError:
            continue
        return f"{resolved}.{rest}" if rest else resolved
    return target


def _roles(text: str, owner: Object | None) -> str:
    def link(match: re.Match[str]) -> str:
        title, target = _target(match["body"])
        identifier = _identifier(target, owner)
        # An autorefs element marked optional: a link when the target is rendered, plain code when it is not.
        return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'

    return _ROLE.sub(link, text)


def to_markdown(docstring: str, owner: Object | None = None) -> str:
    """``docstring`` (ampkit's style: prose, doctests, Sphinx roles) as the Markdown Griffe's Google parser expects.

    >>> to_markdown("Run it.\\n\\n>>> 1 + 1\\n2").split("\\n")
    ['Run it.', '', '```pycon', '>>> 1 + 1', '2', '```', '']
    >>> to_markdown("See :class:`~ampkit.bench.BenchData`.")
    'See <autoref identifier="ampkit.bench.BenchData" optional><code>BenchData</code></autoref>.'
    """
    return _roles("\n".join(_blocks(docstring.split("\n"))), owner)


def _objects(obj: Object) -> Any:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:  # an alias's target is visited in its own module
            yield from _objects(member)  # type: ignore[arg-type]


class AmpkitDocstrings(Extension):
    """Rewrites every docstring of the package once it is loaded, before any docstring is parsed."""

    def on_package(self, *, pkg: Module, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = to_markdown(obj.docstring.value, obj)
