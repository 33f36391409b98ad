"""The import graph of ampkit: no cycle, and every import points down the layers (see LAYERS).

Only imports that run when a module is first imported count: module level, class bodies, and the branches of
module-level ``if``/``try``/``with``. An import inside a function is deferred until the call, and one under
``if TYPE_CHECKING:`` never runs, so neither makes an edge. Importing ``ampkit.a.b`` runs ``ampkit/a/__init__``
first, so it is an edge to that package as well (unless the importer lives inside it: then it is already loading).

The other two kinds are watched too. A deferred import may not close a cycle, and one pointing up a layer is
listed with its reason. An import under ``TYPE_CHECKING`` that points up or sideways, or closes a cycle with the
imports that run, is a dependency the layers hide: those are listed, and the list may only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
ROOT = "ampkit"

# The layers from the bottom. A module may import its own layer's package and any layer below it; packages
# grouped in one layer are siblings and import neither each other nor anything above. The package root
# (``ampkit/__init__``) sits above them all: it imports lazily.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_errors", "_util", "_moved"),  # bottom: imports nothing from ampkit
    ("_compat",),  # every private torch API, behind version checks
    ("fileio",),  # atomic writes, safe torch.load, RNG snapshots
    ("scaling",),  # loss scalers and their kernels: below the policies, which build their default scaler
    ("policy",),  # the policies and the parts they build (masters, casts, FSDP's mixed precision)
    ("distributed",),  # strategies: what differs across ranks
    ("training",),  # the engine, its step state, the optimizer step, masters, clipping, OOM splitting
    ("checkpoint",),  # one payload, single-file and sharded writers, the safe DCP reader
    ("accelerate", "lightning"),  # the engine inside the frameworks people train with: Accelerate's Accelerator, Lightning's plugin
    ("transformers",),  # Hugging Face's Trainer, on the Accelerate integration (the Trainer trains through an Accelerator)
    ("_report",),  # figures, markdown and tables shared by the tools: below every tool, so each can use it
    ("workloads",),  # what the tools run: built-in workloads, the user's model and data, batch rules, step timing
    ("memory", "numerics"),  # tools, siblings
    ("bench", "profile"),  # tools on the workloads, siblings: the profile times a workload without the bench
    ("tuning",),  # the tool of tools: trains on the bench's runs, prunes with memory's predictions, times the profile's loaders
    ("apex",),  # the legacy amp API, on the training layer
    ("cli",),
)
BOTTOM = LAYERS[0]

# Module-level imports that still point the wrong way. The redesign removes them; the set may only shrink.
ALLOWED_WRONG_WAY: set[tuple[str, str]] = set()

# Imports inside functions that point upward, each kept on purpose: the lower module offers a convenience that
# needs the higher one only when called. The list may only shrink.
ALLOWED_DEFERRED_UPWARD: dict[tuple[str, str], str] = {
    ("ampkit.training._engine", "ampkit.checkpoint"): "Engine.save/load/load_state_dict: the public shortcut to the checkpoint layer",
    ("ampkit.training._engine_args", "ampkit.numerics"): "Engine(numerics=N) builds the sampler, a step hook: the shortcut the API keeps",
    ("ampkit.training._engine_args", "ampkit.numerics._sampler"): "the same",
}

# Imports under `if TYPE_CHECKING:` that would point up or sideways, or close a cycle, if they ran: the type names a
# module needs from a module that depends on it. The set may only shrink.
KNOWN_TYPE_CHECKING: set[tuple[str, str]] = {
    # Engine(numerics=N) takes the sampler (a layer up, built on demand by _engine_args): the engine's signature names it.
    ("ampkit.training._engine", "ampkit.numerics"),
    ("ampkit.training._engine", "ampkit.numerics._sampler"),
    # The same dependency, read back: EngineView (engine.numerics) types what Engine(numerics=N) built.
    ("ampkit.training._engine_view", "ampkit.numerics"),
    ("ampkit.training._engine_view", "ampkit.numerics._sampler"),
}

# The Engine's class: the modules it calls with itself (its helpers, step hooks, the checkpoint layer, the numerics
# sampler) type it as ampkit.training._engine_protocol.EngineLike, so only the faces and the tools above import it.
ENGINE = "ampkit.training._engine"
ENGINE_FACES = {"ampkit", "ampkit.training"}


def _module_names(src: Path = SRC) -> dict[str, Path]:
    """Every module under ``src/ampkit`` by dotted name; a package is named by its ``__init__``'s package."""
    names = {}
    for path in sorted((src / ROOT).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _eager_imports(body: list[ast.stmt], deferred: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run while the module body runs (not in functions, not for type checkers);
    with ``deferred``, those inside functions too."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if deferred:
                found += _eager_imports(node.body, deferred)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            found += _eager_imports(node.orelse, deferred)
        else:  # if/try/with/for/class bodies run at import time
            for field in ("body", "orelse", "finalbody"):
                found += _eager_imports(getattr(node, field, []), deferred)
            for clause in getattr(node, "handlers", []) + getattr(node, "cases", []):
                found += _eager_imports(clause.body, deferred)
    return found


def _type_checking_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The imports under ``if TYPE_CHECKING:`` wherever the module body reaches one (not in functions)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            found += [n for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))]
            found += _type_checking_imports(node.orelse)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for field in ("body", "orelse", "finalbody"):
                found += _type_checking_imports(getattr(node, field, []))
            for clause in getattr(node, "handlers", []) + getattr(node, "cases", []):
                found += _type_checking_imports(clause.body)
    return found


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: set[str], packages: bool = True) -> set[str]:
    """The ampkit modules an import statement loads, its packages' ``__init__`` included; with ``packages=False``
    only the modules it names, as a reader sees it (``from .p import sub`` names ``p.sub``, not ``p``)."""
    if isinstance(node, ast.Import):
        dotted = [alias.name for alias in node.names]
    else:
        if node.level:
            base = importer.split(".") if is_package else importer.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        # `from p import x` loads p, and p.x too when x is a submodule rather than a name.
        subs = [f"{prefix}.{alias.name}" for alias in node.names if f"{prefix}.{alias.name}" in modules]
        dotted = [prefix] + subs if packages or len(subs) < len(node.names) else subs
    loaded = {".".join(name.split(".")[:end]) for name in dotted for end in range(1, name.count(".") + 2)} if packages else set(dotted)
    # A package the importer sits in is already running (its __init__ started the import): not a new edge.
    ancestors = {".".join(importer.split(".")[:end]) for end in range(1, importer.count(".") + 1 + is_package)}
    return {name for name in loaded if name in modules and name not in ancestors and name != importer}


def import_graph(src: Path = SRC, deferred: bool = False, type_checking: bool = False, packages: bool = True) -> dict[str, set[str]]:
    """Module -> the ampkit modules it imports when it is imported (with ``deferred``: or when its functions run;
    with ``type_checking``: or when a type checker reads it; ``packages=False``: only the modules it names)."""
    paths = _module_names(src)
    modules = set(paths)
    graph = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[name] = set().union(*(_targets(n, name, is_package, modules, packages) for n in _eager_imports(tree.body, deferred)))
        if type_checking:
            typed = set().union(*(_targets(n, name, is_package, modules, packages) for n in _type_checking_imports(tree.body)))
            # A lazy face (ampkit.training) names its own modules under TYPE_CHECKING for type checkers only: they
            # load when a user reads the name, so importing one module of the package does not reach the others.
            graph[name] |= {t for t in typed if not (is_package and t.startswith(f"{name}."))}
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def hidden_type_checking_edges(src: Path = SRC) -> set[tuple[str, str]]:
    """The ``TYPE_CHECKING`` imports that point up or sideways, or close a cycle with the imports that run (or with
    other such imports): the dependencies a type checker sees and the import graph does not."""
    runs = import_graph(src, deferred=True)
    typed = import_graph(src, deferred=True, type_checking=True)
    only_typed = {a: targets - runs[a] for a, targets in typed.items()}
    wrong = wrong_way_edges(only_typed)
    return {(a, b) for a, targets in only_typed.items() for b in targets if (a, b) in wrong or a in _reachable(typed, b)}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; the graph is ~130 modules, well within the recursion limit
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(set(component), graph) for component in components]


def _cycle_in(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the component's first module, as ``[a, b, ..., a]``."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a strongly connected component always has one


def _package(module: str) -> str:
    """The top-level package (or module) under ampkit; "" for the root and for ``python -m ampkit``'s entry."""
    package = module.split(".")[1] if "." in module else ""
    return "" if package == "__main__" else package


def layer_of(module: str) -> int | None:
    """The layer index of ``module``; None for the package root and for a package no layer names."""
    package = _package(module)
    return next((i for i, layer in enumerate(LAYERS) if package in layer), None)


def wrong_way_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Edges to a higher layer, or to a sibling package of the same layer."""
    wrong = set()
    for module, targets in graph.items():
        here = layer_of(module)
        if here is None:
            continue
        for target in targets:
            there = layer_of(target)
            if there is not None and (there > here or (there == here and _package(target) != _package(module))):
                wrong.add((module, target))
    return wrong


def test_no_import_cycle():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles (move the shared piece down a layer, or defer the import into the function):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_every_package_has_a_layer():
    packages = {_package(m) for m in import_graph()} - {""}
    unplaced = sorted(p for p in packages if layer_of(f"ampkit.{p}") is None)
    assert not unplaced, f"add these to a layer in LAYERS (and to the layout in DEVELOPERS.md): {unplaced}"


def test_no_import_points_up_or_sideways():
    edges = wrong_way_edges(import_graph())
    new = edges - ALLOWED_WRONG_WAY
    assert not new, "imports to a higher layer or a sibling tool (move the shared piece down a layer):\n" + "\n".join(
        f"{a} -> {b}" for a, b in sorted(new)
    )
    gone = ALLOWED_WRONG_WAY - edges
    assert not gone, f"these allowed edges are gone, remove them from ALLOWED_WRONG_WAY: {sorted(gone)}"


def test_deferred_upward_imports_are_the_known_ones():
    edges = wrong_way_edges(import_graph(deferred=True)) - wrong_way_edges(import_graph())
    new = sorted(set(edges) - set(ALLOWED_DEFERRED_UPWARD))
    assert not new, f"new imports inside functions that point up or sideways (move the piece down, or list it with a reason): {new}"
    gone = sorted(set(ALLOWED_DEFERRED_UPWARD) - set(edges))
    assert not gone, f"these allowed deferred imports are gone, remove them from ALLOWED_DEFERRED_UPWARD: {gone}"


def test_no_cycle_through_deferred_imports():
    # A deferred import that closes a cycle runs, until the day someone moves it to the top of its module.
    graph = import_graph(deferred=True)
    for a, b in ALLOWED_DEFERRED_UPWARD:  # each listed with its reason (the test above)
        graph[a].discard(b)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles through imports inside functions (move the shared piece into a module both import):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_type_checking_imports_hide_no_new_dependency():
    edges = hidden_type_checking_edges()
    new = sorted(edges - KNOWN_TYPE_CHECKING)
    assert not new, (
        "imports under TYPE_CHECKING that point up or sideways, or close a cycle (pass the function what it needs rather "
        f"than the object that holds it, or move the type down a layer): {new}"
    )
    gone = sorted(KNOWN_TYPE_CHECKING - edges)
    assert not gone, f"these TYPE_CHECKING imports hide no dependency any more: remove them from KNOWN_TYPE_CHECKING ({len(edges)} left): {gone}"


def engine_imports_out_of_place(graph: dict[str, set[str]]) -> list[str]:
    """The modules that import the Engine's module where they may not: at or below the checkpoint layer (the faces
    aside), or anywhere the engine's own imports reach, where the two would make a circle."""
    importers = {m for m, targets in graph.items() if ENGINE in targets} - ENGINE_FACES
    ceiling = LAYERS.index(("checkpoint",))
    low = {m for m in importers if (layer_of(m) or 0) <= ceiling}  # the bottom layer, and an unplaced module, count as low
    return sorted(low | (importers & _reachable(graph, ENGINE)))


def test_only_the_faces_and_the_tools_above_import_the_engine_class():
    # Every import counts, in functions and under TYPE_CHECKING, each to the module it names (as a reader and a type
    # checker see it): the engine calls its helpers, its checkpoints and the numerics sampler with itself, and any of
    # them typed by its class would close the circle issue 48 broke.
    wrong = engine_imports_out_of_place(import_graph(deferred=True, type_checking=True, packages=False))
    assert not wrong, (
        f"these modules import {ENGINE}, from at or below the checkpoint layer or from what the engine itself imports: type the "
        f"engine as ampkit.training._engine_protocol.EngineLike (add a member there if one is missing), or pass the parts it reads: {wrong}"
    )


def test_no_cycle_among_the_modules_as_named():
    # Every import, each to the module it names: the graph a reader, mypy and farm-studio see. A cycle here (through
    # TYPE_CHECKING imports, say) is a circle of modules even where nothing at run time follows it.
    cycles = find_cycles(import_graph(deferred=True, type_checking=True, packages=False))
    assert not cycles, "modules that name each other in a circle (type against a protocol lower down, or pass the parts):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_the_commands_read_their_workload_from_the_workloads_layer_not_from_the_bench():
    # What bench, doctor, memory and profile share (the workload flags, the built-in workloads, the user's model
    # and data) is the layer below them all: reading it must not import the bench tool, even in a function.
    graph = import_graph(deferred=True)
    assert "ampkit.workloads" in graph
    for shared in ("ampkit.cli._workload_args", "ampkit.workloads"):
        bench = sorted(m for m in (_reachable(graph, shared) - {shared}) if m == "ampkit.bench" or m.startswith("ampkit.bench."))
        assert not bench, f"{shared} reaches the bench tool: {bench}"


def test_bottom_layer_imports_nothing_from_ampkit():
    graph = import_graph()
    upward = {module: sorted(targets) for module, targets in graph.items() if _package(module) in BOTTOM and targets}
    assert not upward, f"the bottom layer ({', '.join(BOTTOM)}) must not import ampkit modules: {upward}"


# The checker itself, on small trees: each rule is shown to catch what it is meant to.


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for rel, text in files.items():
        path = tmp_path / ROOT / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph(tmp_path)


def test_finds_a_cycle_through_relative_and_package_imports(tmp_path):
    graph = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from .pkg.b import f\n",
            "pkg/__init__.py": "from . import b\n",
            "pkg/b.py": "from ..c import g\n",
            "c.py": "import ampkit.pkg\n",
        },
    )
    assert graph["ampkit.a"] == {"ampkit.pkg", "ampkit.pkg.b"}
    assert graph["ampkit.pkg"] == {"ampkit.pkg.b"}
    assert find_cycles(graph) == [["ampkit.c", "ampkit.pkg", "ampkit.pkg.b", "ampkit.c"]]


def test_deferred_and_type_checking_imports_are_no_edges(tmp_path):
    graph = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from . import b\n",
            "b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from .a import x\nelse:\n    from . import c\n"
                "def f():\n    from .a import x\n"
                "class K:\n    from . import d\n"
                "try:\n    import ampkit.e\nexcept ImportError:\n    pass\n"
            ),
            "c.py": "",
            "d.py": "",
            "e.py": "",
        },
    )
    assert graph["ampkit.b"] == {"ampkit.c", "ampkit.d", "ampkit.e"}
    assert find_cycles(graph) == []


def test_upward_and_sibling_edges_are_reported(tmp_path):
    graph = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "training/__init__.py": "",
            "training/engine.py": "from ..memory import oom\nfrom ..policy import base\n",
            "memory/__init__.py": "",
            "memory/oom.py": "from ..numerics import stats\n",
            "numerics/__init__.py": "",
            "numerics/stats.py": "",
            "policy/__init__.py": "",
            "policy/base.py": "",
        },
    )
    assert wrong_way_edges(graph) == {
        ("ampkit.training.engine", "ampkit.memory"),
        ("ampkit.training.engine", "ampkit.memory.oom"),
        ("ampkit.memory.oom", "ampkit.numerics"),
        ("ampkit.memory.oom", "ampkit.numerics.stats"),
    }


def test_deferred_imports_count_only_when_asked(tmp_path):
    files = {"__init__.py": "", "policy.py": "def f():\n    from . import bench\n", "bench.py": ""}
    assert wrong_way_edges(_tree(tmp_path, files)) == set()
    assert wrong_way_edges(import_graph(tmp_path, deferred=True)) == {("ampkit.policy", "ampkit.bench")}


def test_deferred_cycles_and_hidden_type_checking_imports_are_found(tmp_path):
    files = {
        "__init__.py": "",
        "policy/__init__.py": "",
        "policy/base.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..training.engine import Engine\n",  # up
        "training/__init__.py": "",
        "training/engine.py": "from . import step\nfrom ..policy import base\ndef f():\n    from . import table\n",
        "training/step.py": "import typing\nif typing.TYPE_CHECKING:\n    from .engine import Engine\n",  # closes a cycle
        "training/hooks.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .step import x\n",  # down, no cycle
        "training/table.py": "from . import engine\n",  # with engine's deferred import: a cycle
    }
    graph = _tree(tmp_path, files)
    assert find_cycles(graph) == [] and wrong_way_edges(graph) == set()  # nothing that runs at import is wrong
    assert find_cycles(import_graph(tmp_path, deferred=True)) == [["ampkit.training.engine", "ampkit.training.table", "ampkit.training.engine"]]
    assert hidden_type_checking_edges(tmp_path) == {
        ("ampkit.policy.base", "ampkit.training"),
        ("ampkit.policy.base", "ampkit.training.engine"),
        ("ampkit.training.step", "ampkit.training.engine"),
    }


def test_named_imports_and_engine_imports_out_of_place_are_found(tmp_path):
    files = {
        "__init__.py": "",
        "training/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._engine import Engine\n",  # the face
        "training/_engine.py": "def save():\n    from ..checkpoint import save\ndef sampler():\n    from ..numerics._sampler import S\n",
        "training/_hooks.py": "import typing\nif typing.TYPE_CHECKING:\n    from ._engine import Engine\n",  # below the checkpoint layer
        "checkpoint/__init__.py": "from . import _payload\n",
        "checkpoint/_payload.py": "",
        "numerics/__init__.py": "",
        "numerics/_sampler.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..training._engine import Engine\n",  # the engine reaches it
        "numerics/_doctor.py": "from ..training._engine import Engine\n",  # a tool above, which the engine does not reach: fine
    }
    _tree(tmp_path, files)
    named = import_graph(tmp_path, deferred=True, type_checking=True, packages=False)
    assert named["ampkit.training._engine"] == {"ampkit.checkpoint", "ampkit.numerics._sampler"}
    assert named["ampkit.checkpoint"] == {"ampkit.checkpoint._payload"}
    assert import_graph(tmp_path, deferred=True)["ampkit.training._engine"] == {"ampkit.checkpoint", "ampkit.numerics", "ampkit.numerics._sampler"}
    assert engine_imports_out_of_place(named) == ["ampkit.numerics._sampler", "ampkit.training._hooks"]
    assert find_cycles(named) == [["ampkit.numerics._sampler", "ampkit.training._engine", "ampkit.numerics._sampler"]]
