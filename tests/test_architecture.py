"""The layers of docs/architecture.md, checked on the source: a module imports only its own layer and those below.

A module's layer is its package: ``patchcraft/engine/records.py`` is in
the engine layer because it is in ``patchcraft/engine/``. The table below
is the one in docs/architecture.md (a test keeps the two the same, both
ways), and every package on disk must be in it: a new package takes a layer
before it lands.

An import is every way a module names another: ``import`` and ``from``
statements, absolute or relative (``from ..engine import records`` is
resolved against the module's own package and checked like the absolute
name), at any depth (in a function, a ``TYPE_CHECKING`` block, a ``try``),
and a module name written as a string for ``importlib.import_module``,
``import_module``, ``__import__`` or the deferred import
:class:`patchcraft.base.lazy.Deferred` (the module is imported then, on
first use). ``from package import name`` names the module
``package.name`` when there is one, else the package itself; the package
an import passes through on the way (``patchcraft.engine`` for
``patchcraft.engine.records``) is not counted as imported.

Over those imports:

- no module imports a layer above its own (:func:`violations`);
- the packages (``engine``, ``commands``, ``gpu_smoke``, ``cli``...) have
  an order: no package imports, through any chain, a package that imports
  it back (:func:`package_cycles`);
- inside a layer, the modules have an order too: no chain of imports
  between modules of one layer comes back to where it started
  (:func:`layer_cycles`); each cycle is reported with its path and the
  line of every import on it.

Late imports (in a function body, or through ``Deferred``) count for the
cycles too. They do not fail at import time, which is why they are the
usual way round a cycle, but the two modules still need each other: one
cannot be understood, tested or moved without the other, and an order
inside a layer that a late import contradicts is no order. Counting them
is the stricter rule and, on this tree, the true one: the layer graph is
drawn from what runs, not from what runs first. ``TYPE_CHECKING`` imports
count as well (a type is a dependency).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"

#: Layer -> the packages (folders of ``patchcraft``) that make it, bottom up; ``__init__``, ``__main__`` and the
#: click modules (:data:`CLICK`) are modules.
LAYERS: dict[str, tuple[str, ...]] = {
    "base": ("__init__", "base"),
    "reading": ("reading",),
    "planning": ("planning",),
    "transforms": ("transforms",),
    "engine": ("engine",),
    "analysis": ("analysis", "overlay", "harness"),
    "ui": ("ui",),
    "pipeline": ("pipeline",),
    "commands": ("commands", "gpu_smoke", "real_engine", "cli", "cli_options", "cli_drafts", "__main__"),
}
#: The click layer: the group and entry point (``cli``), the shared options, the draft commands.
CLICK = ("cli", "cli_options", "cli_drafts")
#: The members of LAYERS that are modules of ``patchcraft/``, not packages.
TOP_MODULES = ("__init__", "__main__", *CLICK)
#: Third-party imports only these modules may make (torch: the harness and the GPU smoke; rich: the console).
ONLY_IN = {"rich": ("ui.console",), "torch": ("harness.*", "gpu_smoke.*", "real_engine.inenv.*"), "click": CLICK}
#: Calls whose first argument, a string, names a module imported then (the deferred one on first use).
STRING_IMPORTS = ("import_module", "__import__", "Deferred")

#: A module's source by its path: ``engine/records.py`` under ``patchcraft/``; ``transforms/...`` is
#: the top-level ``transforms/`` folder, installed as ``patchcraft.transforms``.
Sources = Mapping[str, str]


def module_name(rel: str) -> str:
    """``engine/records.py`` -> ``engine.records``; ``engine/__init__.py`` -> ``engine``; ``__init__.py`` stays ``__init__``."""
    name = ".".join(Path(rel).with_suffix("").parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def source_files() -> dict[str, Path]:
    """Every module of patchcraft by its path as :data:`Sources` names it."""
    files = {str(p.relative_to(ROOT / "patchcraft")): p for p in sorted((ROOT / "patchcraft").rglob("*.py"))}
    files.update({str(p.relative_to(ROOT)): p for p in sorted((ROOT / "transforms").rglob("*.py"))})
    return files


def real_sources() -> dict[str, str]:
    return {rel: path.read_text(encoding="utf-8") for rel, path in source_files().items()}


def modules() -> dict[str, str]:
    """Module name -> its path (as :data:`Sources` names it)."""
    return {module_name(rel): rel for rel in source_files()}


def matches(name: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        return name == pattern[:-2] or name.startswith(pattern[:-1])
    return name == pattern


def package_of(name: str) -> str:
    """``engine.records`` -> ``engine``; a top-level module is its own name (``cli``)."""
    return name.split(".")[0]


def layer_of(name: str) -> int | None:
    for index, members in enumerate(LAYERS.values()):
        if package_of(name) in members:
            return index
    return None


def absolute(name: str) -> str:
    """``engine.records`` -> ``patchcraft.engine.records``; ``__init__`` -> ``patchcraft``."""
    return "patchcraft" if name == "__init__" else f"patchcraft.{name}"


def internal(name: str, known: set[str] | Mapping[str, object]) -> str | None:
    """``patchcraft.transforms._base`` -> ``transforms._base``; a name that is not a module of ours -> None."""
    if name == "patchcraft":
        return "__init__"
    if not name.startswith("patchcraft."):
        return None
    name = name[len("patchcraft.") :]
    return name if name in known else None


@dataclass(frozen=True)
class Import:
    """One import a module makes: the absolute names it may mean, most specific first, and where it is."""

    names: tuple[str, ...]
    line: int
    #: Runs only when a function is called (an import in a function body) or on first use (``Deferred``).
    late: bool


def _resolve(package: str, level: int, module: str | None) -> str | None:
    """The absolute module of ``from <level dots><module> import``, from ``package``; None above ``patchcraft``."""
    parts = package.split(".")
    if level - 1 >= len(parts):
        return None
    base = ".".join(parts[: len(parts) - (level - 1)])
    return f"{base}.{module}" if module else base


def _string_import(node: ast.Call, package: str) -> str | None:
    """``import_module("patchcraft.x")``, ``Deferred("patchcraft.x", "attr")``...: the module named, else None."""
    func = node.func
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if called not in STRING_IMPORTS or not node.args:
        return None
    first = node.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return None
    name = first.value
    if called == "import_module" and name.startswith("."):  # import_module(".x", package)
        anchor = (
            node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "package"), None)
        )
        if isinstance(anchor, ast.Constant) and isinstance(anchor.value, str):
            relative_to = anchor.value
        elif isinstance(anchor, ast.Name) and anchor.id == "__package__":
            relative_to = package
        else:
            return None
        level = len(name) - len(name.lstrip("."))
        return _resolve(relative_to, level, name[level:] or None)
    return name


def imports(rel: str, text: str) -> list[Import]:
    """Every import of the module at ``rel`` (a :data:`Sources` path), at any depth, relative ones made absolute.

    A relative import above ``patchcraft`` is named ``<above patchcraft>`` (a :func:`violations` row).
    """
    name = absolute(module_name(rel))
    package = name if rel.endswith("__init__.py") else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, late: bool) -> None:
        if isinstance(node, ast.ImportFrom):
            module = node.module if node.level == 0 else _resolve(package, node.level, node.module)
            if module is None:
                found.append(Import(("<above patchcraft>",), node.lineno, late))
            else:
                for alias in node.names:
                    names = (module,) if alias.name == "*" else (f"{module}.{alias.name}", module)
                    found.append(Import(names, node.lineno, late))
        elif isinstance(node, ast.Import):
            found.extend(Import((alias.name,), node.lineno, late) for alias in node.names)
        elif isinstance(node, ast.Call):
            module = _string_import(node, package)
            if module is not None:
                deferred = getattr(node.func, "id", getattr(node.func, "attr", None)) == "Deferred"
                found.append(Import((module,), node.lineno, late or deferred))
        inner = late or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(text), False)
    return found


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` (both modules of ours) at ``line``."""

    source: str
    target: str
    line: int
    late: bool

    def __str__(self) -> str:
        return f"{self.source} imports {self.target} (line {self.line}{', late' if self.late else ''})"


def edges(sources: Sources) -> Iterator[tuple[str, Import, str | None]]:
    """(module, one of its imports, the module of ours it names or None) for every import of ``sources``."""
    known = {module_name(rel) for rel in sources}
    for rel, text in sources.items():
        name = module_name(rel)
        for found in imports(rel, text):
            target = next((t for t in (internal(n, known) for n in found.names) if t is not None), None)
            yield name, found, target


def graph(sources: Sources) -> dict[str, list[Edge]]:
    """Module -> its imports of other modules of ours (a module importing itself is left out)."""
    result: dict[str, list[Edge]] = {module_name(rel): [] for rel in sources}
    for name, found, target in edges(sources):
        if target is not None and target != name:
            result[name].append(Edge(name, target, found.line, found.late))
    return result


def violations(sources: Sources) -> list[str]:
    """Imports of a layer above, of a third-party package outside its one home, and relative ones above patchcraft."""
    found = []
    names = list(LAYERS)
    for name, imported, target in edges(sources):
        line = f"line {imported.line}{', late' if imported.late else ''}"
        own = layer_of(name)
        theirs = layer_of(target) if target is not None and target != name else None
        if own is not None and theirs is not None and theirs > own:
            found.append(f"{name} ({names[own]}) imports {target} ({names[theirs]}), {line}")
        top = imported.names[0].split(".")[0]
        if top in ONLY_IN and not any(matches(name, m) for m in ONLY_IN[top]):
            found.append(f"{name} imports {top}, which only {', '.join(ONLY_IN[top])} may, {line}")
        if top == "<above patchcraft>":
            found.append(f"{name} imports from above patchcraft (a relative import with too many dots), {line}")
    return found


def _components(nodes: list[str], succ: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(succ.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            connect(node)
    return sorted(found)


def _cycle_through(start: str, succ: Mapping[str, set[str]], within: set[str]) -> list[str]:
    """The shortest path ``start -> ... -> start`` inside ``within`` (breadth first, neighbours in sorted order)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(succ.get(node, ())):
                if nxt not in within:
                    continue
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{start} is on no cycle")


def _cycles(nodes: list[str], hops: Mapping[tuple[str, str], list[Edge]], what: str) -> list[str]:
    """One line per cycle of the graph ``hops`` draws: the path, then the imports that make each step."""
    succ: dict[str, set[str]] = {}
    for source, target in hops:
        succ.setdefault(source, set()).add(target)
    lines = []
    for component in _components(nodes, succ):
        path = _cycle_through(component[0], succ, set(component))
        steps = "; ".join(str(min(hops[(a, b)], key=lambda e: (e.source, e.line))) for a, b in zip(path, path[1:]))
        lines.append(
            f"{what}: {' -> '.join(path)} ({steps})"
            + (f"; all of {', '.join(component)} reach each other" if len(component) > len(path) - 1 else "")
        )
    return lines


def package_cycles(sources: Sources) -> list[str]:
    """Every set of packages that import each other, through any chain: one line each, with a path and its imports."""
    hops: dict[tuple[str, str], list[Edge]] = {}
    for edge_list in graph(sources).values():
        for edge in edge_list:
            if package_of(edge.source) != package_of(edge.target):
                hops.setdefault((package_of(edge.source), package_of(edge.target)), []).append(edge)
    return _cycles(sorted({package_of(module_name(rel)) for rel in sources}), hops, "package cycle")


def layer_cycles(sources: Sources) -> list[str]:
    """Every set of modules of one layer that import each other, through any chain of that layer's modules."""
    names = list(LAYERS)
    hops: dict[tuple[str, str], list[Edge]] = {}
    for edge_list in graph(sources).values():
        for edge in edge_list:
            own = layer_of(edge.source)
            if own is not None and own == layer_of(edge.target):
                hops.setdefault((edge.source, edge.target), []).append(edge)
    found = []
    for index, layer in enumerate(names):
        members = sorted(m for m in (module_name(rel) for rel in sources) if layer_of(m) == index)
        inside = {hop: e for hop, e in hops.items() if hop[0] in members}
        found += _cycles(members, inside, f"module cycle in the {layer} layer")
    return found


def test_every_module_has_a_layer() -> None:
    assert [name for name in modules() if layer_of(name) is None] == []


def test_no_module_imports_upward() -> None:
    found = violations(real_sources())
    assert found == [], "\n".join(found)


def test_no_package_cycle() -> None:
    """The packages have an order: commands -> gpu_smoke -> commands, through a late import too, fails."""
    found = package_cycles(real_sources())
    assert found == [], "\n".join(found)


def test_the_modules_of_each_layer_have_an_order() -> None:
    found = layer_cycles(real_sources())
    assert found == [], "\n".join(found)


#: The most lines a module may have (issue 31): a module past it does more than one job, and is split by job.
MAX_LINES = 600
#: Modules held to fewer lines: ``explain`` is three steps called by name, its findings and text live beside it.
MAX_LINES_OF = {"analysis/explain.py": 400}
#: Not modules with a job: each transform's before/after examples, data written as Python (a run never loads
#: them, and the tests' mirror rule leaves them out too); they grow with every shape a transform supports.
DATA_MODULES = "transforms/examples/"


def oversized(sources: Sources) -> list[str]:
    """Each module over its limit (:data:`MAX_LINES`, or its own in :data:`MAX_LINES_OF`), with its lines."""
    found = []
    for rel, text in sorted(sources.items()):
        if rel.startswith(DATA_MODULES):
            continue
        limit = MAX_LINES_OF.get(rel, MAX_LINES)
        lines = len(text.splitlines())
        if lines > limit:
            shown = rel if rel.startswith("transforms/") else f"patchcraft/{rel}"
            found.append(f"{shown}: {lines} lines, over {limit}")
    return found


def test_no_module_is_over_its_size() -> None:
    found = oversized(real_sources())
    assert found == [], "\n".join(found)


# -- the checks themselves, each shown failing on a planted violation ------------------------------


def test_an_upward_import_is_caught() -> None:
    """An engine module importing the CLI, or rich outside the console, is named, with its line."""
    planted = real_sources()
    planted["engine/tree_run.py"] += "\nfrom patchcraft.cli import main\nimport rich\n"
    lines = planted["engine/tree_run.py"].count("\n")
    assert violations(planted) == [
        f"engine.tree_run (engine) imports cli (commands), line {lines - 1}",
        f"engine.tree_run imports rich, which only ui.console may, line {lines}",
    ]


def test_a_module_over_its_size_is_caught() -> None:
    """601 lines anywhere, 401 in analysis/explain.py; the transforms' examples are data, never counted."""
    tree = {
        "engine/records.py": "x = 1\n" * 601,
        "engine/tree_run.py": "x = 1\n" * 600,
        "analysis/explain.py": "x = 1\n" * 401,
        "transforms/_base.py": "x = 1\n" * 601,
        "transforms/examples/big.py": "x = 1\n" * 2000,
    }
    assert oversized(tree) == [
        "patchcraft/analysis/explain.py: 401 lines, over 400",
        "patchcraft/engine/records.py: 601 lines, over 600",
        "transforms/_base.py: 601 lines, over 600",
    ]


#: A small tree of its own, for the planted cases: three layers' packages, each importing only below.
SMALL: dict[str, str] = {
    "__init__.py": "",
    "base/__init__.py": "",
    "base/errors.py": "class PatchcraftError(Exception): ...\n",
    "base/lazy.py": "import importlib\n",
    "engine/__init__.py": "",
    "engine/records.py": "from ..base.errors import PatchcraftError\n",
    "engine/tree_run.py": "from . import records\nfrom .records import PatchcraftError\n",
    "commands/__init__.py": "",
    "commands/apply.py": "from patchcraft.engine import tree_run\n",
    "gpu_smoke/__init__.py": "",
    "gpu_smoke/engines.py": "from patchcraft.engine.records import PatchcraftError\n",
    "cli.py": "from .commands import apply\n",
}


def planted(changes: Mapping[str, str]) -> dict[str, str]:
    """:data:`SMALL` with each text of ``changes`` appended to its module's source."""
    tree = dict(SMALL)
    for rel, text in changes.items():
        tree[rel] = tree.get(rel, "") + text
    return tree


def test_the_small_tree_is_clean() -> None:
    """Relative imports resolved (``from ..base.errors``, ``from . import records``) and nothing reported."""
    assert violations(SMALL) == [] and package_cycles(SMALL) == [] and layer_cycles(SMALL) == []
    assert [str(e) for e in graph(SMALL)["engine.tree_run"]] == [
        "engine.tree_run imports engine.records (line 1)",
        "engine.tree_run imports engine.records (line 2)",
    ]
    assert [str(e) for e in graph(SMALL)["engine.records"]] == ["engine.records imports base.errors (line 1)"]


@pytest.mark.parametrize(
    "plant, target",
    [
        ("from ..cli import main\n", "cli"),
        ("from .. import cli\n", "cli"),
        ("from ..commands.apply import main\n", "commands.apply"),
        ("from ..commands import apply\n", "commands.apply"),
        ("def late():\n    from ..commands import apply\n", "commands.apply"),
    ],
)
def test_a_relative_upward_import_is_caught(plant: str, target: str) -> None:
    """``from ..cli import main`` in the engine is ``patchcraft.cli``, in a function too."""
    [found] = violations(planted({"engine/tree_run.py": plant}))
    late = ", late" if "def late" in plant else ""
    assert found == f"engine.tree_run (engine) imports {target} (commands), line {2 + plant.count(chr(10))}{late}"


def test_click_outside_the_click_modules_is_caught() -> None:
    """``cli``, ``cli_options`` and ``cli_drafts`` may import click; a command module may not."""
    tree = planted({"commands/apply.py": "import click\n", "cli.py": "import click\n"})
    assert violations(tree) == ["commands.apply imports click, which only cli, cli_options, cli_drafts may, line 2"]


def test_a_relative_import_above_patchcraft_is_caught() -> None:
    assert violations(planted({"engine/tree_run.py": "from ... import x\n"})) == [
        "engine.tree_run imports from above patchcraft (a relative import with too many dots), line 3"
    ]


@pytest.mark.parametrize(
    "plant",
    [
        'importlib.import_module("patchcraft.commands.apply")\n',
        'import_module("patchcraft.commands.apply")\n',
        'import_module(".apply", "patchcraft.commands")\n',
        'def late():\n    return importlib.import_module("patchcraft.commands.apply")\n',
        'APPLY = Deferred("patchcraft.commands.apply", "main")\n',
        '__import__("patchcraft.commands.apply")\n',
    ],
)
def test_a_string_import_going_upward_is_caught(plant: str) -> None:
    [found] = violations(planted({"engine/records.py": plant}))
    assert found.startswith("engine.records (engine) imports commands.apply (commands), line "), found
    late = "def late" in plant or "Deferred" in plant
    assert found.endswith(", late") == late


def test_a_package_cycle_is_caught_with_its_path() -> None:
    """gpu_smoke -> commands through a late import, commands -> gpu_smoke at the top: one cycle, both imports named."""
    tree = planted(
        {
            "commands/apply.py": "from patchcraft.gpu_smoke import engines\n",
            "gpu_smoke/engines.py": "def proof():\n    from patchcraft.commands import apply\n",
        }
    )
    assert violations(tree) == []  # one layer: no upward import, only the cycle
    assert package_cycles(tree) == [
        "package cycle: commands -> gpu_smoke -> commands (commands.apply imports gpu_smoke.engines (line 2); "
        "gpu_smoke.engines imports commands.apply (line 3, late))"
    ]
    assert layer_cycles(tree) == [
        "module cycle in the commands layer: commands.apply -> gpu_smoke.engines -> commands.apply "
        "(commands.apply imports gpu_smoke.engines (line 2); gpu_smoke.engines imports commands.apply (line 3, late))"
    ]


def test_a_module_cycle_inside_a_layer_is_caught_with_its_path() -> None:
    """records -> tree_run -> records, one package: no package cycle, but the engine's modules have no order."""
    tree = planted({"engine/records.py": 'runs = Deferred("patchcraft.engine.tree_run")\n'})
    assert violations(tree) == [] and package_cycles(tree) == []
    assert layer_cycles(tree) == [
        "module cycle in the engine layer: engine.records -> engine.tree_run -> engine.records "
        "(engine.records imports engine.tree_run (line 2, late); engine.tree_run imports engine.records (line 1))"
    ]


def test_a_longer_cycle_is_reported_along_its_path() -> None:
    tree = dict(SMALL)
    tree["base/a.py"] = "from . import b\n"
    tree["base/b.py"] = "from . import c\n"
    tree["base/c.py"] = "from patchcraft.base import a\n"
    assert layer_cycles(tree) == [
        "module cycle in the base layer: base.a -> base.b -> base.c -> base.a "
        "(base.a imports base.b (line 1); base.b imports base.c (line 1); base.c imports base.a (line 1))"
    ]


def doc_layers(text: str) -> dict[str, tuple[str, ...]]:
    """Layer -> the backquoted names of the "packages" column of docs/architecture.md's table."""
    found = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] in LAYERS:
            found[cells[0]] = tuple(name.rstrip("/") for name in re.findall(r"`([^`]+)`", cells[1]))
    return found


def test_the_doc_lists_the_same_layers_and_packages() -> None:
    """docs/architecture.md's table has the layers of LAYERS, in order, each with exactly its packages."""
    assert doc_layers(DOC.read_text(encoding="utf-8")) == LAYERS


def test_a_doc_with_an_extra_or_a_missing_package_fails(tmp_path: Path) -> None:
    """The check itself, both ways: a package the doc names but LAYERS does not, and one it leaves out."""
    text = DOC.read_text(encoding="utf-8")
    assert doc_layers(text.replace("| `reading/` |", "| `reading/`, `extra/` |", 1)) != LAYERS
    assert doc_layers(text.replace("| `reading/` |", "| |", 1)) != LAYERS


def test_every_package_on_disk_has_a_layer_and_every_layer_package_exists() -> None:
    on_disk = {p.name for p in (ROOT / "patchcraft").iterdir() if (p / "__init__.py").is_file()} | {"transforms"}
    named = {m for members in LAYERS.values() for m in members if m not in TOP_MODULES}
    assert on_disk == named
    assert [m for m in TOP_MODULES if not (ROOT / "patchcraft" / f"{m}.py").is_file()] == []


def test_development_tools_are_not_in_the_wheel() -> None:
    """tools/ (the sweep, the coverage table) is outside the package: a user's install does not carry it."""
    assert not (ROOT / "patchcraft" / "sweep.py").exists() and (ROOT / "tools" / "sweep.py").is_file()
    tomllib = pytest.importorskip("tomllib")
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]
    assert "patchcraft" in packages and not [name for name in packages if name.split(".")[0] == "tools"]


def _runs_as_a_script(path: Path) -> bool:
    """A module with a top-level ``if __name__ == "__main__":``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)


def test_tests_hold_no_developer_scripts() -> None:
    """tests/ holds tests and their helpers; the sweeps over releases are tools (``python -m tools.sweep_harness``)."""
    assert [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").rglob("*.py")) if _runs_as_a_script(p)] == []
    assert [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").rglob("sweep*.py"))] == []


@pytest.mark.parametrize("tool", ["sweep_harness.py", "sweep_compile.py"])
def test_the_harness_sweeps_run_from_anywhere(tool: str, tmp_path: Path) -> None:
    """tools/sweep_harness.py and tools/sweep_compile.py put the checkout and the tests' helpers on sys.path."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / tool), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr


#: Modules with logic whose tests are, today, feature tests that run them through the CLI or a neighbour
#: (named here), not ``tests/<package>/test_<module>.py``. A new module needs a mirror file or a row here.
TESTED_ELSEWHERE: dict[str, tuple[str, ...]] = {
    "base.errors": ("commands/test_cli.py", "reliability/test_refusals.py"),
    "base.pristine": ("engine/test_replace_hand_edits.py",),
    "base.releases": ("planning/test_selection.py", "test_coverage.py"),
    "base.status": ("ui/test_machine_output.py", "pipeline/test_proof.py"),
    "base.tree_lock": ("engine/test_workers.py", "reliability/test_concurrency.py"),
    "pipeline.hand_review": ("engine/test_replace_hand_edits.py", "reliability/test_hand_edits.py"),
    "pipeline.stages": ("commands/test_cli.py", "engine/test_result_cache.py", "pipeline/test_serve.py"),
    "commands._pipeline": ("commands/test_cli.py", "engine/test_result_cache.py"),
    "commands._targets": ("commands/test_cli.py",),
    "commands.apply": ("commands/test_cli.py", "engine/test_golden.py"),
    "commands.check_draft": ("analysis/test_draft_check.py",),
    "commands.diff": ("commands/test_cli.py",),
    "commands.explain": ("analysis/test_explain.py",),
    "commands.fetch": ("ui/test_console_progress.py", "base/test_cache_errors.py"),
    "commands.list_": ("commands/test_cli.py",),
    "commands.probe": ("commands/test_probe_cli.py", "analysis/test_probe.py"),
    "commands.prune": ("overlay/test_overlay_integrity.py",),
    "commands.revert": ("commands/test_cli.py", "reliability/test_revert_matrix.py"),
    "commands.smoke": ("harness/test_harness_cli.py", "gpu_smoke/test_smoke_cuda_cli.py"),
    "commands.verify": ("commands/test_cli.py", "engine/test_golden.py"),
    "real_engine.check": ("real_engine/test_vllm_engine.py",),
    "real_engine.vllm_cpu": ("real_engine/test_vllm_engine.py", "real_engine/test_environments.py"),
    "real_engine.inenv": ("real_engine/test_vllm_engine.py",),
    "real_engine.inenv.engine_probe": ("real_engine/test_vllm_engine.py",),
    "real_engine.inenv.tiny_models": ("real_engine/test_vllm_engine.py",),
    "real_engine.inenv.vllm_run": ("real_engine/test_vllm_engine.py",),
    "real_engine.inenv.eagle3_torch": ("real_engine/test_eagle3_torch.py",),
    "real_engine.inenv.vllm_train_draft": ("real_engine/test_vllm_engine.py",),
    "real_engine.sglang_cpu": ("real_engine/test_sglang_engine.py", "real_engine/test_sglang_run_spec.py"),
    "real_engine.inenv.sglang_models": ("real_engine/test_sglang_engine.py",),
    "real_engine.inenv.sglang_run": ("real_engine/test_sglang_engine.py", "real_engine/test_sglang_run_spec.py"),
    "real_engine.inenv.sglang_runtime": ("real_engine/test_sglang_engine.py",),
    "real_engine.inenv.sglang_standins": ("real_engine/test_sglang_standins.py",),
    "real_engine.inenv.sglang_standins.absent": ("real_engine/test_sglang_standins.py",),
    "real_engine.inenv.sglang_standins.ops": ("real_engine/test_sglang_standins.py",),
    "real_engine.inenv.sglang_standins_check": ("real_engine/test_sglang_standins.py",),
    "real_engine.inenv.sglang_train_draft": ("real_engine/test_sglang_engine.py",),
    "engine.hand_advice": ("engine/test_replace_hand_edits.py",),
    "engine.hand_edits": ("engine/test_replace_hand_edits.py", "reliability/test_hand_edits.py"),
    "engine.preflight_cache": ("commands/test_preflight.py",),
    "engine.records": ("ui/test_machine_output.py",),
    "gpu_smoke.engines": ("gpu_smoke/test_smoke_entry_points.py", "gpu_smoke/test_smoke_via_run.py"),
    "gpu_smoke.probe": ("gpu_smoke/test_cuda_smoke.py",),
    "gpu_smoke.probe_records": ("gpu_smoke/test_cuda_smoke.py",),
    "gpu_smoke.wheels": ("gpu_smoke/test_draft_builder.py", "gpu_smoke/test_engine_args.py"),
    "gpu_smoke.worker": ("gpu_smoke/test_smoke_entry_points.py",),
    "harness.assemble": ("harness/test_harness_parts.py",),
    "harness.compiled": ("harness/test_harness_compile.py",),
    "harness.cuda": ("harness/test_harness_device.py",),
    "harness.extract": ("harness/test_harness_parts.py",),
    "harness.gpu_summary": ("gpu_smoke/test_cuda_smoke.py",),
    "harness.layer_boundary": ("harness/test_harness_layer_boundary.py", "harness/test_harness_parts.py"),
    "harness.nothing": ("harness/test_harness_parts.py", "harness/test_served.py"),
    "harness.probe_standins": ("harness/test_draft_probe.py",),
    "harness.runner": ("harness/test_harness_parts.py", "test_release_history.py"),
    "harness.scenarios": ("harness/test_harness_parts.py", "harness/test_harness_mutations.py"),
    "harness.shapes": ("harness/test_harness_parts.py",),
    "harness.smoke_rows": ("harness/test_harness_cli.py",),
    "harness.standins": ("harness/test_harness_parts.py",),
    "harness.subject": ("harness/test_harness_parts.py",),
    "overlay.bootstrap": ("overlay/test_overlay_integrity.py", "commands/test_run.py"),
    "overlay.build": ("overlay/test_overlay_integrity.py", "commands/test_run.py"),
    "overlay.store": ("overlay/test_overlay_integrity.py",),
    "planning.runner_edits": ("transforms/test_runner_transform.py",),
    "reading.class_graph": ("planning/test_model_plans.py", "engine/test_tree_run.py"),
    "reading.fusion_reading": ("engine/test_allreduce_fusion.py",),
    "transforms._base": ("transforms/test_transforms.py", "transforms/test_slices.py"),
    "transforms._contract": ("test_types.py",),
}


def mirror_of(name: str) -> Path:
    """``engine.tree_run`` -> tests/engine/test_tree_run.py (a private ``commands._preflight`` -> tests/commands/test_preflight.py)."""
    package, _, module = name.rpartition(".")
    return ROOT / "tests" / package.replace(".", "/") / f"test_{module.lstrip('_')}.py"


def test_tests_mirror_the_source() -> None:
    """Every module with logic has tests/<package>/test_<module>.py, or its row in TESTED_ELSEWHERE naming real test files."""
    unmirrored = {
        name
        for name in modules()
        if "." in name
        and not name.endswith("__init__")
        and not name.startswith("transforms.examples")
        and not mirror_of(name).is_file()
    }
    without_a_row = sorted(unmirrored - set(TESTED_ELSEWHERE))
    stale_rows = sorted(set(TESTED_ELSEWHERE) - unmirrored)  # mirrored now, or gone
    assert (without_a_row, stale_rows) == ([], [])
    missing = [
        f"{name}: tests/{path}"
        for name, paths in TESTED_ELSEWHERE.items()
        for path in paths
        if not (ROOT / "tests" / path).is_file()
    ]
    assert missing == []


@pytest.mark.parametrize("script", ["sweep.py", "coverage_table.py"])
def test_the_tool_scripts_find_tools_without_an_install(script: str, tmp_path: Path) -> None:
    """scripts/ put the checkout on sys.path themselves: tools/ is not installed, and they run from any directory."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "ModuleNotFoundError" not in proc.stderr, proc.stderr
