"""Model subsets never half-patch a sibling: every release, every ``--model`` name (planning only).

After ``apply --model M`` on a pristine tree, and after ``revert --model M``
on a fully applied one, no class whose forward reads the flag may lack an
``__init__`` that sets it (a server would crash on its first forward, CUDA-
graph capture at start-up). Checked on the plans and the class graph: the
sites a command edits are exactly its selected plans' sites.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import release_package
from patchcraft.plan import _capturing_forward, _init_owner, plan_models, scan
from patchcraft.releases import ALL_RELEASES
from patchcraft.selection import select
from patchcraft.tree import resolve_target


def _readers(graph) -> list[tuple[str, tuple, tuple | None]]:
    """Every class running a capturing forward: (label, forward site key, init site key or None)."""
    found = []
    for cls in list(graph.classes.values()):
        forward = _capturing_forward(graph, cls)
        if forward is None:
            continue
        init = _init_owner(graph, cls)
        found.append((
            cls.label,
            (str(forward[0].path), forward[0].name, "forward"),
            (str(init.path), init.name, "init") if init is not None else None,
        ))
    return found


def _crashing(readers, patched: set) -> list[str]:
    """Classes whose forward would read the flag while no __init__ of theirs sets it."""
    return [label for label, forward, init in readers if forward in patched and init not in patched]


@pytest.mark.parametrize("version", ALL_RELEASES)
def test_no_subset_leaves_a_forward_without_its_flag(version: str) -> None:
    tree = resolve_target(str(release_package(version)))
    graph = scan(tree.models_dir)
    plans = plan_models(graph)
    readers = _readers(graph)
    every = {site.key for plan in plans for site in plan.sites}
    assert not _crashing(readers, every), "a full apply leaves a class without the flag"
    names = sorted({p.module for p in plans} | {p.cls for p in plans})
    problems = []
    for name in names:
        applied = {site.key for plan in select(plans, tree, [name]) for site in plan.sites}
        if _crashing(readers, applied):
            problems.append(f"apply --model {name}: {_crashing(readers, applied)}")
        reverted = {path.resolve() for plan in select(plans, tree, [name], whole_files=True) for path in plan.files}
        left = {key for key in every if Path(key[0]).resolve() not in reverted}
        if _crashing(readers, left):
            problems.append(f"revert --model {name}: {_crashing(readers, left)}")
    assert not problems, problems


def test_the_check_sees_a_half_patched_sibling() -> None:
    """The check above can fail: without the closure, --model deepseek_v2 on 0.5.10 leaves Glm4MoeLite bare."""
    tree = resolve_target(str(release_package("0.5.10")))
    graph = scan(tree.models_dir)
    plans = plan_models(graph)
    named_only = [p for p in plans if p.module == "deepseek_v2"]
    patched = {site.key for plan in named_only for site in plan.sites if site.kind != "init" or site.cls == "DeepseekV2Model"}
    assert "glm4_moe_lite.Glm4MoeLiteModel" in _crashing(_readers(graph), patched)
    closed = {site.key for plan in select(plans, tree, ["deepseek_v2"]) for site in plan.sites}
    assert not _crashing(_readers(graph), closed)
