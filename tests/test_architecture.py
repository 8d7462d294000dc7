"""The layers of docs/architecture.md, checked on the source: a module imports only its own layer and those below.

The table below is the one in docs/architecture.md (a test there keeps the
two the same). Every module of ``patchcraft`` and ``transforms`` must be in
it: a new module takes a layer before it lands.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"

#: Layer -> modules, bottom up (names relative to ``patchcraft``; ``harness.*`` is the whole subpackage).
LAYERS: dict[str, tuple[str, ...]] = {
    "foundations": ("__init__", "errors", "status", "lazy", "releases", "layer_ids", "sources", "cache_root", "digests", "fetch", "tree", "lock", "overlay_bootstrap", "pristine"),
    "reading": ("graph", "scope", "setter_eval", "server_args", "hub_cache", "fusion_reading"),
    "planning": ("plan", "selection", "runner_plan"),
    "transforms": ("transforms.*",),
    "engine": ("results", "patching", "workers", "tree_rows", "engine", "cache", "preflight_cache", "diffs", "hand_edits", "hand_advice"),
    "analysis": ("explain", "draft", "training", "fixes", "overlay", "overlay_check", "overlay_store", "harness.*", "gpu_smoke.summary"),
    "presentation": ("report", "output"),
    "commands": ("commands.*", "gpu_smoke.*", "cli", "__main__"),
    "tools": ("sweep", "coverage"),
}
#: Third-party imports only these modules may make (torch: the harness and the GPU smoke; rich: output).
ONLY_IN = {"rich": ("output",), "torch": ("harness.*", "gpu_smoke.*"), "click": ("cli",)}


def module_name(path: Path) -> str:
    if path.parts[len(ROOT.parts)] == "transforms":
        rel = path.relative_to(ROOT).with_suffix("")
    else:
        rel = path.relative_to(ROOT / "patchcraft").with_suffix("")
    name = ".".join(rel.parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def modules() -> dict[str, Path]:
    paths = sorted((ROOT / "patchcraft").rglob("*.py")) + sorted((ROOT / "transforms").glob("*.py"))
    return {module_name(p): p for p in paths}


def matches(name: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        return name == pattern[:-2] or name.startswith(pattern[:-1])
    return name == pattern


def layer_of(name: str) -> int | None:
    for index, members in enumerate(LAYERS.values()):
        if any(matches(name, m) for m in members):
            return index
    return None


def imports(path: Path) -> set[str]:
    """Absolute names a module imports (``patchcraft.x`` as ``x``), at any depth, TYPE_CHECKING blocks included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Deferred" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
    return found


def internal(name: str, known: dict[str, Path]) -> str | None:
    """``patchcraft.transforms._base`` -> ``transforms._base``; a name that is not a module of ours -> None."""
    if name == "patchcraft":
        return "__init__"
    if not name.startswith("patchcraft."):
        return None
    name = name[len("patchcraft."):]
    return name if name in known else None


def violations(known: dict[str, Path]) -> list[str]:
    found = []
    names = list(LAYERS)
    for name, path in known.items():
        own = layer_of(name)
        for imported in sorted(imports(path)):
            target = internal(imported, known)
            theirs = layer_of(target) if target is not None and target != name else None
            if own is not None and theirs is not None and theirs > own:
                found.append(f"{name} ({names[own]}) imports {target} ({names[theirs]})")
            top = imported.split(".")[0]
            if top in ONLY_IN and not any(matches(name, m) for m in ONLY_IN[top]):
                found.append(f"{name} imports {top}, which only {', '.join(ONLY_IN[top])} may")
    return found


def test_every_module_has_a_layer() -> None:
    assert [name for name in modules() if layer_of(name) is None] == []


def test_no_module_imports_upward() -> None:
    assert violations(modules()) == []


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    """The check itself: an engine module importing the CLI, or rich outside output, is named."""
    known = modules()
    planted = dict(known)
    bad = tmp_path / "engine.py"
    bad.write_text(known["engine"].read_text(encoding="utf-8") + "\nfrom patchcraft.cli import main\nimport rich\n", encoding="utf-8")
    planted["engine"] = bad
    assert violations(planted) == [
        "engine (engine) imports cli (commands)",
        "engine imports rich, which only output may",
    ]


@pytest.mark.parametrize("layer", list(LAYERS))
def test_the_doc_lists_the_same_layers(layer: str) -> None:
    """docs/architecture.md's table names each layer with the same modules as LAYERS."""
    rows = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith(f"| {layer} |")]
    assert len(rows) == 1, f"docs/architecture.md: no table row for layer {layer!r}"
    for member in LAYERS[layer]:
        assert f"`{member}`" in rows[0], f"docs/architecture.md: layer {layer!r} does not name `{member}`"
