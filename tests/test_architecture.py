"""The layers of docs/architecture.md, checked on the source: a module imports only its own layer and those below.

A module's layer is its package: ``patchcraft/engine/records.py`` is in
the engine layer because it is in ``patchcraft/engine/``. The table below
is the one in docs/architecture.md (a test keeps the two the same, both
ways), and every package on disk must be in it: a new package takes a layer
before it lands.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"

#: Layer -> the packages (folders of ``patchcraft``) that make it, bottom up; ``__init__``, ``cli`` and ``__main__`` are modules.
LAYERS: dict[str, tuple[str, ...]] = {
    "base": ("__init__", "base"),
    "reading": ("reading",),
    "planning": ("planning",),
    "transforms": ("transforms",),
    "engine": ("engine",),
    "analysis": ("analysis", "overlay", "harness"),
    "ui": ("ui",),
    "commands": ("commands", "gpu_smoke", "cli", "__main__"),
}
#: Third-party imports only these modules may make (torch: the harness and the GPU smoke; rich: the console).
ONLY_IN = {"rich": ("ui.console",), "torch": ("harness.*", "gpu_smoke.*"), "click": ("cli",)}


def module_name(path: Path) -> str:
    if path.parts[len(ROOT.parts)] == "transforms":
        rel = path.relative_to(ROOT).with_suffix("")
    else:
        rel = path.relative_to(ROOT / "patchcraft").with_suffix("")
    name = ".".join(rel.parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def modules() -> dict[str, Path]:
    paths = sorted((ROOT / "patchcraft").rglob("*.py")) + sorted((ROOT / "transforms").rglob("*.py"))
    return {module_name(p): p for p in paths}


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
    name = name[len("patchcraft.") :]
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
    bad = tmp_path / "tree_run.py"
    bad.write_text(
        known["engine.tree_run"].read_text(encoding="utf-8") + "\nfrom patchcraft.cli import main\nimport rich\n",
        encoding="utf-8",
    )
    planted["engine.tree_run"] = bad
    assert violations(planted) == [
        "engine.tree_run (engine) imports cli (commands)",
        "engine.tree_run imports rich, which only ui.console may",
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
    named = {m for members in LAYERS.values() for m in members if m not in ("__init__", "cli", "__main__")}
    assert on_disk == named


def test_development_tools_are_not_in_the_wheel() -> None:
    """tools/ (the sweep, the coverage table) is outside the package: a user's install does not carry it."""
    assert not (ROOT / "patchcraft" / "sweep.py").exists() and (ROOT / "tools" / "sweep.py").is_file()
    tomllib = pytest.importorskip("tomllib")
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]
    assert "patchcraft" in packages and not [name for name in packages if name.split(".")[0] == "tools"]


#: Modules with logic whose tests are, today, feature tests that run them through the CLI or a neighbour
#: (named here), not ``tests/<package>/test_<module>.py``. A new module needs a mirror file or a row here.
TESTED_ELSEWHERE: dict[str, tuple[str, ...]] = {
    "analysis.fixes": ("harness/test_served.py", "analysis/test_draft_check.py"),
    "base.errors": ("commands/test_cli.py", "reliability/test_refusals.py"),
    "base.pristine": ("engine/test_replace_hand_edits.py",),
    "base.releases": ("planning/test_selection.py", "test_coverage.py"),
    "base.status": ("ui/test_machine_output.py", "commands/test_proof.py"),
    "base.tree_lock": ("engine/test_workers.py", "reliability/test_concurrency.py"),
    "commands._hand_edits": ("engine/test_replace_hand_edits.py", "reliability/test_hand_edits.py"),
    "commands._pipeline": ("commands/test_cli.py", "engine/test_result_cache.py"),
    "commands._targets": ("commands/test_cli.py",),
    "commands.apply": ("commands/test_cli.py", "test_golden.py"),
    "commands.check_draft": ("analysis/test_draft_check.py",),
    "commands.diff": ("commands/test_cli.py",),
    "commands.explain": ("analysis/test_explain.py",),
    "commands.fetch": ("ui/test_console_progress.py", "base/test_cache_errors.py"),
    "commands.list_": ("commands/test_cli.py",),
    "commands.prune": ("overlay/test_overlay_integrity.py",),
    "commands.revert": ("commands/test_cli.py", "reliability/test_revert_matrix.py"),
    "commands.smoke": ("harness/test_harness_cli.py", "gpu_smoke/test_smoke_cuda_cli.py"),
    "commands.verify": ("commands/test_cli.py", "test_golden.py"),
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
    "harness.runner": ("harness/test_harness_parts.py", "test_release_history.py"),
    "harness.scenarios": ("harness/test_harness_parts.py", "harness/test_harness_mutations.py"),
    "harness.shapes": ("harness/test_harness_parts.py",),
    "harness.smoke_rows": ("harness/test_harness_cli.py",),
    "harness.standins": ("harness/test_harness_parts.py",),
    "harness.subject": ("harness/test_harness_parts.py",),
    "overlay.bootstrap": ("overlay/test_overlay_integrity.py", "commands/test_run.py"),
    "overlay.build": ("overlay/test_overlay_integrity.py", "commands/test_run.py"),
    "overlay.store": ("overlay/test_overlay_integrity.py",),
    "planning.runner_edits": ("test_runner_transform.py",),
    "reading.class_graph": ("planning/test_model_plans.py", "engine/test_tree_run.py"),
    "reading.fusion_reading": ("engine/test_allreduce_fusion.py",),
    "transforms._base": ("test_transforms.py", "test_slices.py"),
    "transforms._contract": ("test_types.py",),
    "transforms._slices": ("test_slices.py",),
}


def mirror_of(name: str) -> Path:
    """``engine.tree_run`` -> tests/engine/test_tree_run.py (a private ``commands._proof`` -> tests/commands/test_proof.py)."""
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
    assert unmirrored == set(TESTED_ELSEWHERE)
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
