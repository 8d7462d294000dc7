"""A whole release applied, verified and reverted once per test process (model files only).

Shared by tests/engine/test_golden.py (the golden diffs) and
tests/test_coverage.py (the coverage matrix), so a release costs one
apply, one verify and one revert per test process, whichever of the two
asks first; their tests run on one xdist worker (:func:`on_one_worker`,
:data:`GROUP`), so that is once per run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import copy_release, release_package
from patchcraft.base.status import ModelStatus
from patchcraft.base.target import resolve_target
from patchcraft.engine.diffs import unified_diff
from patchcraft.engine.file_patch import revert_text
from patchcraft.engine.records import Mode, RunResult
from patchcraft.engine.tree_run import run, write_changes


@dataclass
class Applied:
    """One release after ``apply``: what changed, the verify run, and the reverts."""

    package: Path
    first: RunResult
    verify: RunResult
    pristine: dict = field(default_factory=dict)  # stem -> release bytes
    diffs: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    reverted: dict = field(default_factory=dict)  # stem -> bytes

    @property
    def errors(self) -> list:
        return [f"{m.model}: {m.message}" for m in self.first.models if m.status == ModelStatus.ERROR]


_CACHE: dict[str, Applied] = {}


#: The xdist group of every test that reads :func:`applied` states: one worker applies each release once per run,
#: and the coverage page, which reads every release's state, reuses what the golden and coverage tests applied.
GROUP = "applied-releases"


def on_one_worker(value: str):
    """``value`` as a parameter whose test runs on the worker that holds every :func:`applied` state (``--dist
    loadgroup``): each release is applied once per run, not once per worker."""
    return pytest.param(value, marks=pytest.mark.xdist_group(GROUP), id=value)


def applied(version: str, tmp_root: Path) -> Applied:
    """Apply, verify and revert a whole release once per session (model classes only).

    The verify run doubles as the second apply: it runs the same pipeline,
    so its ``changes`` are what a second ``apply`` would write.
    """
    if version in _CACHE:
        return _CACHE[version]
    package = copy_release(version, tmp_root / version)
    tree = resolve_target(str(package))
    first = run(tree, Mode.APPLY, runner=False)
    write_changes(first.changes)
    state = Applied(package=package, first=first, verify=run(tree, Mode.VERIFY, runner=False))
    origin = release_package(version)
    for change in first.changes:
        stem = Path(change.rel).stem
        state.pristine[stem] = (origin / change.source.path.relative_to(package)).read_bytes()
        state.diffs[stem] = unified_diff(change)
        state.after[stem] = change.after
        state.reverted[stem] = change.source.encode(revert_text(change.after, change.source.path))
    _CACHE[version] = state
    return state
