"""The API reference (docs/reference/api/*.md) covers every package face, and renders each face's ``__all__``.

Each page is one ``::: ampkit.<face>`` directive; mkdocs.yml's ``filters: public`` and ``show_submodules: false``
make mkdocstrings render the members Griffe calls public, which for a module with ``__all__`` are its names. These
tests hold that chain together without building the site (the strict build, tests/docs/test_code_blocks.py and CI,
fails on a reference it cannot resolve): every face in tests/unit/public_api.txt has its page, Griffe reads each
face's public members as exactly its ``__all__`` (lazy ``__getattr__`` faces included: Griffe reads their
``TYPE_CHECKING`` imports), and every one of them resolves to the object it names. The docstring extension the
reference loads (docs/reference/griffe_ampkit.py) is tested here too.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import types
from pathlib import Path

import griffe
import pytest

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "reference" / "api"
SNAPSHOT = ROOT / "tests" / "unit" / "public_api.txt"


def _extension_module() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("griffe_ampkit", ROOT / "docs" / "reference" / "griffe_ampkit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ext = _extension_module()


def faces() -> list[str]:
    """The package faces the public API snapshot lists: ``ampkit`` and each ``ampkit.<package>``."""
    names = re.findall(r"^(ampkit(?:\.[a-z_]+)?): module$", SNAPSHOT.read_text(encoding="utf-8"), re.MULTILINE)
    return sorted(set(names))


def page_of(face: str) -> Path:
    return API / f"{face.removeprefix('ampkit.') if face != 'ampkit' else 'ampkit'}.md"


@pytest.fixture(scope="module")
def package() -> griffe.Module:
    # As mkdocstrings loads it (mkdocs.yml: paths [src], the extension), aliases resolved within ampkit.
    loaded = griffe.load("ampkit", search_paths=[str(ROOT / "src")], extensions=griffe.load_extensions(ext.AmpkitDocstrings()),
                         resolve_aliases=True, resolve_external=False)
    assert isinstance(loaded, griffe.Module)
    return loaded


def test_every_face_has_a_page_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert len(faces()) >= 15  # the snapshot was read
    for face in faces():
        page = page_of(face)
        assert page.is_file(), f"{face} has no API page: add {page.relative_to(ROOT)} with '::: {face}' and list it in mkdocs.yml"
        assert re.search(rf"^::: {re.escape(face)}$", page.read_text(encoding="utf-8"), re.MULTILINE), page
        assert f"reference/api/{page.name}" in nav, f"mkdocs.yml's nav does not list reference/api/{page.name}"


def test_the_apex_page_renders_each_module_apex_code_imports() -> None:
    # ampkit.apex's names are mostly modules (apex.amp, apex.optimizers, ...): each has its own directive there.
    modules = re.findall(r"^(ampkit\.apex\.[a-z_0-9]+): module$", SNAPSHOT.read_text(encoding="utf-8"), re.MULTILINE)
    page = (API / "apex.md").read_text(encoding="utf-8")
    assert modules and [m for m in set(modules) if f"::: {m}\n" not in page] == []


@pytest.mark.parametrize("face", [f for f in faces() if f != "ampkit.apex"])
def test_the_members_rendered_are_the_face_all(package: griffe.Module, face: str) -> None:
    module = package if face == "ampkit" else package[face.removeprefix("ampkit.")]
    public = {name for name, member in module.members.items() if member.is_public and not member.is_module}
    assert public == set(importlib.import_module(face).__all__)
    for name in public:
        member = module.members[name]
        if member.is_alias:
            target = member.final_target  # raises where the name points nowhere Griffe can follow
            assert target.name == name, (face, name, target.path)


# The docstring extension.


def test_a_doctest_in_prose_becomes_a_fenced_block() -> None:
    text = "Run it.\n\n>>> x = 1\n>>> x + 1\n2\n\nThen more."
    assert ext.to_markdown(text) == "Run it.\n\n```pycon\n>>> x = 1\n>>> x + 1\n2\n```\n\n\nThen more."


def test_an_indented_doctest_is_fenced_at_the_margin() -> None:
    # Module docstrings indent their examples under the prose (an rST block quote).
    assert ext.to_markdown("Prose.\n\n    >>> 1\n    1") == "Prose.\n\n```pycon\n>>> 1\n1\n```\n"


def test_google_sections_and_existing_fences_are_left_to_griffe() -> None:
    text = "Summary.\n\nArgs:\n    x: the value.\n        >>> not fenced\n\n```pycon\n>>> kept\n```"
    assert ext.to_markdown(text) == text


def test_an_rst_literal_block_becomes_a_fence() -> None:
    text = "From Python::\n\n    result = tune(model)\n    print(result)\n\nAfter."
    assert ext.to_markdown(text) == "From Python:\n\n```\nresult = tune(model)\nprint(result)\n```\n\n\nAfter."


def test_roles_become_optional_cross_references() -> None:
    out = ext.to_markdown(":class:`~ampkit.bench.BenchData`, :func:`ampkit.tune`, :meth:`Engine.save <ampkit.Engine.save>`")
    assert out == ('<autoref identifier="ampkit.bench.BenchData" optional><code>BenchData</code></autoref>, '
                   '<autoref identifier="ampkit.tune" optional><code>ampkit.tune</code></autoref>, '
                   '<autoref identifier="ampkit.Engine.save" optional><code>Engine.save</code></autoref>')


def test_a_relative_role_resolves_in_its_owners_scope(package: griffe.Module) -> None:
    # bench's face names Workload, imported from ampkit.workloads: the link goes to the face it came from, which the
    # reference renders (ampkit.workloads.Workload).
    out = ext.to_markdown(":class:`Workload`", package["bench"])
    assert 'identifier="ampkit.workloads.Workload"' in out
    # A method's sibling (:meth:`setup` inside Engine.setup_module) resolves through the class.
    engine = package["training._engine.Engine"]
    assert 'identifier="ampkit.training._engine.Engine.setup"' in ext.to_markdown(":meth:`setup`", engine["setup_module"])
    # A name nothing defines stays as written: an optional reference, shown as code.
    assert 'identifier="nowhere"' in ext.to_markdown(":func:`nowhere`", engine)


def test_the_extension_rewrites_every_docstring_once(package: griffe.Module) -> None:
    # Loaded as mkdocs loads it, no docstring keeps a role or an unfenced doctest outside a Google section.
    leftovers = []
    for obj in ext._objects(package):
        value = obj.docstring.value if obj.docstring else ""
        if ext._ROLE.search(value):
            leftovers.append(obj.path)
    assert leftovers == []
    assert "```pycon" in package["bench._api.bench_model"].docstring.value  # type: ignore[union-attr]


def test_the_extension_docstring_examples_hold() -> None:
    # docs/ is outside pytest's doctest paths: the extension's own examples run here.
    import doctest

    failures, tried = doctest.testmod(ext, optionflags=doctest.ELLIPSIS)
    assert (failures, tried > 0) == (0, True)
