"""Golden diffs for real releases: one case per patched file, ids like ``0.5.10/deepseek_v2``.

Each case checks the byte-exact diff, idempotence (a second apply changes
nothing), a clean verify of every model touching the file, ``compile()``
of the result, and a byte-identical revert. ``pytest --update-golden``
rewrites the files under golden/ for review.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from patchcraft.diffs import unified_diff
from patchcraft.engine import ALREADY, ERROR, Mode, patch_text, revert_text, run, write_changes
from patchcraft.tree import resolve_target

from conftest import GOLDEN, copy_release

#: Runner-file goldens; a release with only these (no model goldens yet) is left to test_runner_transform.py.
RUNNER_STEMS = {"model_runner", "cuda_graph_runner"}
RELEASES = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir() and {f.stem for f in p.glob("*.diff")} - RUNNER_STEMS) if GOLDEN.is_dir() else []
CASES = [f"{r}/{p.stem}" for r in RELEASES for p in sorted((GOLDEN / r).glob("*.diff"))]


@dataclass
class Applied:
    package: Path
    before: dict = field(default_factory=dict)
    diffs: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    verify: object = None
    second: object = None
    reverted: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)


_CACHE: dict[str, Applied] = {}


def applied(version: str, tmp_root: Path) -> Applied:
    """Apply, re-apply, verify and revert a whole release once per session."""
    if version in _CACHE:
        return _CACHE[version]
    package = copy_release(version, tmp_root / version)
    tree = resolve_target(str(package))
    first = run(tree, Mode.APPLY)
    state = Applied(package=package)
    state.errors = [m for m in first.models if m.status == ERROR]
    for change in first.changes:
        stem = Path(change.rel).stem
        state.before[stem] = change.before
        state.diffs[stem] = unified_diff(change)
    write_changes(first.changes)
    for change in first.changes:
        stem = Path(change.rel).stem
        state.after[stem] = change.source.path.read_bytes().decode(change.source.encoding).removeprefix("\ufeff")
    state.second = run(tree, Mode.APPLY)
    state.verify = run(tree, Mode.VERIFY)
    for change in first.changes:
        stem = Path(change.rel).stem
        state.reverted[stem] = revert_text(state.after[stem], change.source.path)
    _CACHE[version] = state
    return state


@pytest.fixture(scope="session")
def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("golden")


@pytest.mark.parametrize("version", RELEASES)
def test_golden_set_matches_patched_files(version: str, session_tmp: Path, update_golden: bool) -> None:
    """Every file apply changes has a golden diff, and every golden diff is still produced."""
    state = applied(version, session_tmp)
    if update_golden:
        for old in (GOLDEN / version).glob("*.diff"):
            old.unlink()
        for stem, diff in state.diffs.items():
            (GOLDEN / version / f"{stem}.diff").write_bytes(diff.encode("utf-8"))
    expected = {p.stem for p in (GOLDEN / version).glob("*.diff")}
    assert set(state.diffs) == expected
    assert not state.errors, [f"{m.model}: {m.message}" for m in state.errors]


@pytest.mark.parametrize("case", CASES)
def test_golden_case(case: str, session_tmp: Path, update_golden: bool) -> None:
    version, stem = case.split("/")
    state = applied(version, session_tmp)
    golden = GOLDEN / version / f"{stem}.diff"
    if update_golden:
        pytest.skip("golden files rewritten")
    assert stem in state.diffs, f"{case}: apply no longer changes this file"
    assert state.diffs[stem] == golden.read_bytes().decode("utf-8"), f"{case}: diff differs from golden"
    compile(state.after[stem], f"{case}.py", "exec", dont_inherit=True)
    # Idempotence: nothing left to do on the tree, and T(T(x)) == T(x) for this file.
    assert not [c.rel for c in state.second.changes if Path(c.rel).stem == stem]
    # Verify: every model whose edits touch this file is verified.
    touching = [m for m in state.verify.models if any(Path(f).stem == stem for f in m.files)]
    assert touching, f"{case}: no model owns this file"
    assert all(m.status == ALREADY and m.compiles for m in touching), [(m.model, m.status, m.message) for m in touching]
    # Revert: byte-identical to the release.
    assert state.reverted[stem] == state.before[stem]


def test_transform_is_idempotent_on_text() -> None:
    """T(T(x)) == T(x) on a real file, through the str -> str layer."""
    if not RELEASES:
        pytest.skip("no golden releases")
    version = RELEASES[-1]
    state = applied(version, Path(__import__("tempfile").mkdtemp()))
    tree = resolve_target(str(state.package))
    from patchcraft.engine import plan_tree

    for plan in plan_tree(tree):
        if plan.unsupported or plan.label in {m.model for m in state.errors}:
            continue
        for site in plan.sites:
            text = site.path.read_text(encoding="utf-8")
            assert patch_text(text, site.path, [site]).after == text
