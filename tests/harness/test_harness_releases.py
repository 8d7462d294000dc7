"""Every model class the engine patches, in every release of the coverage matrix, passes the harness.

The cases are whatever the engine plans for each release (read from the
cache at collection time), so the set grows with the transforms: a model
class the engine does not patch yet is skipped with the engine's reason,
and one it patches must pass every scenario. A release not yet cached is
one case that fetches it and checks all its model classes at once.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from harness_support import MATRIX, patched, planned_labels  # noqa: E402

from patchcraft.harness.runner import ERROR, PASS, SKIPPED, SmokeRun, smoke_tree  # noqa: E402

ALL = "*"
_RUNS: dict[str, SmokeRun] = {}

#: Model classes the harness knows it cannot run, and why. Each must stay an ``error``
#: row (never a silent pass); once the harness can run one, its case fails until removed.
#: Empty since qwen4_exp became unsupported (its aux states never reach the draft).
KNOWN_LIMITATIONS: dict[str, str] = {}


def _cases() -> list[tuple[str, str]]:
    cases = []
    for version in MATRIX:
        try:
            labels = planned_labels(version)
        except Exception:  # the engine cannot plan it: the run-time case says why
            labels = None
        cases += [(version, label) for label in labels] if labels else [(version, ALL)]
    return cases


def smoke_release(version: str) -> SmokeRun:
    """Apply in memory, then smoke every model class apply patched (once per session)."""
    if version not in _RUNS:
        state = patched(version)
        _RUNS[version] = smoke_tree(state.tree, models=state.applied.models, texts=state.texts)
    return _RUNS[version]


def _problems(run: SmokeRun) -> list[str]:
    return [
        f"{r.model}: {r.status}: {r.message}"
        for r in run.results
        if r.status not in (PASS, SKIPPED) and not (r.model in KNOWN_LIMITATIONS and r.status == ERROR)
    ]


@pytest.mark.parametrize("version, label", _cases(), ids=lambda value: value)
def test_every_patched_model_class_passes(version: str, label: str) -> None:
    run = smoke_release(version)
    if label == ALL:
        assert not _problems(run), _problems(run)
        return
    rows = [r for r in run.results if r.model == label]
    if not rows:
        pytest.skip(f"{version}: the engine reports no verdict for {label}")
    result = rows[0]
    if result.status == SKIPPED:
        pytest.skip(f"{version}: not patched by the engine: {result.message}")
    if label in KNOWN_LIMITATIONS:
        assert result.status == ERROR, f"{label} now runs ({result.status}): remove it from KNOWN_LIMITATIONS"
        pytest.xfail(f"harness limitation: {KNOWN_LIMITATIONS[label]} ({result.message})")
    assert result.status == PASS, f"{result.message}\n" + "\n".join(
        f"  {c.name}: {c.status}: {c.detail}" for c in result.checks
    )


def test_each_release_has_patched_model_classes_that_ran() -> None:
    """Guard against a vacuous pass: the harness really ran models in the releases that have them."""
    ran = {version: sum(r.status == PASS for r in smoke_release(version).results) for version in ("0.5.10", "0.5.23")}
    assert all(count >= 10 for count in ran.values()), ran
