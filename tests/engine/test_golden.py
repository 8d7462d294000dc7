"""Golden diffs for real releases: one case per patched model file, ids like ``0.5.10/deepseek_v2``.

Each release of the coverage matrix is applied once per session
(tests/applied_releases.py; model files only: the runner files have their
own goldens, checked by tests/transforms/test_runner_transform.py). Each
case then checks the byte-exact diff, idempotence (the verify run after
apply would change nothing), a clean verify of every model touching the
file, ``compile()`` of the result, and a byte-identical revert.
``pytest --update-golden`` rewrites the model-file diffs under golden/
for review.

Releases between the matrix ones (``BETWEEN``) get the same checks
without golden files: structure, not release numbers, drives the
transforms, so they must come out just as clean.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from patchcraft.base.releases import BETWEEN, MATRIX  # the matrix has golden/<release>/ sets; BETWEEN has none
from patchcraft.base.status import ModelStatus

from applied_releases import Applied, applied, on_one_worker
from conftest import GOLDEN

#: Runner-file goldens live beside ours; tests/transforms/test_runner_transform.py owns them.
RUNNER_STEMS = {"model_runner", "cuda_graph_runner"}


def _model_goldens(version: str) -> list[Path]:
    return sorted(p for p in (GOLDEN / version).glob("*.diff") if p.stem not in RUNNER_STEMS)


CASES = [f"{v}/{p.stem}" for v in MATRIX for p in _model_goldens(v)]


def check_release(state: Applied) -> None:
    """No error; every supported model patched, then verified; nothing left to do."""
    assert not state.errors, state.errors
    statuses = {m.model: m.status for m in state.first.models}
    assert set(statuses.values()) <= {ModelStatus.PATCHED, ModelStatus.UNSUPPORTED, ModelStatus.NOT_APPLICABLE}, (
        statuses
    )
    bad = [
        (m.model, m.status, m.message)
        for m in state.verify.models
        if m.status not in (ModelStatus.UNSUPPORTED, ModelStatus.NOT_APPLICABLE)
        and not (m.status == ModelStatus.ALREADY and m.compiles)
    ]
    assert not bad
    assert not state.verify.changes, [c.rel for c in state.verify.changes]
    for stem, reverted in state.reverted.items():
        assert reverted == state.pristine[stem], f"{stem}: revert is not byte-identical"


@pytest.mark.parametrize("version", [on_one_worker(v) for v in MATRIX])
def test_golden_set_matches_patched_files(version: str, session_tmp: Path, update_golden: bool) -> None:
    """Every model file apply changes has a golden diff, and every golden diff is still produced."""
    state = applied(version, session_tmp)
    if update_golden:
        (GOLDEN / version).mkdir(parents=True, exist_ok=True)
        for old in _model_goldens(version):
            old.unlink()
        for stem, diff in state.diffs.items():
            (GOLDEN / version / f"{stem}.diff").write_bytes(diff.encode("utf-8"))
    assert set(state.diffs) == {p.stem for p in _model_goldens(version)}
    check_release(state)


@pytest.mark.parametrize("case", [on_one_worker(c) for c in CASES])
def test_golden_case(case: str, session_tmp: Path, update_golden: bool) -> None:
    version, stem = case.split("/")
    state = applied(version, session_tmp)
    if update_golden:
        pytest.skip("golden files rewritten")
    assert stem in state.diffs, f"{case}: apply no longer changes this file"
    assert state.diffs[stem] == (GOLDEN / version / f"{stem}.diff").read_bytes().decode("utf-8"), (
        f"{case}: diff differs from golden"
    )
    compile(state.after[stem], f"{case}.py", "exec", dont_inherit=True)
    # Idempotence, T(T(x)) == T(x): the verify run would change nothing in this file.
    assert not [c.rel for c in state.verify.changes if Path(c.rel).stem == stem]
    # Verify: every model whose edits touch this file is verified, and names the file.
    touching = [m for m in state.verify.models if any(Path(f).stem == stem for f in m.files)]
    assert touching, f"{case}: no model owns this file"
    assert all(m.status == ModelStatus.ALREADY and m.compiles for m in touching), [
        (m.model, m.status, m.message) for m in touching
    ]
    # Revert: byte-identical to the release.
    assert state.reverted[stem] == state.pristine[stem]


@pytest.mark.parametrize("version", [on_one_worker(v) for v in BETWEEN])
def test_release_between_the_matrix(version: str, session_tmp: Path) -> None:
    """A release outside the matrix comes out as clean as the matrix (no golden files)."""
    state = applied(version, session_tmp)
    assert state.diffs, f"{version}: apply changed nothing"
    check_release(state)
