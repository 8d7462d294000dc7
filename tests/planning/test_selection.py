"""selection.py: which plans a run covers, and that they close over what they share.

A single-file run (``selection.plan_tree`` on a tree with ``only_files``)
plans only what can reach the file (``plan_reaching``): the staged file's
classes, the files importing it and what those resolve, instead of every
model file. Its plans must be exactly those of the whole-tree plan filtered
to the file (``selection.select``), on real releases, for files in the
middle of the class graph (llama.py, qwen2.py, deepseek_v2.py), leaves
(qwen3_moe.py, gpt_oss.py) and files with no model; a sample of real files
of five releases too (every file of those releases with
``PATCHCRAFT_EVERY_FILE=1``, ~25 s).

``select`` closes a ``--model`` choice: after ``apply --model M`` on a
pristine tree, and after ``revert --model M`` on a fully applied one, no
class whose forward reads the flag may lack an ``__init__`` that sets it
(a server would crash on its first forward, CUDA-graph capture at
start-up), on every release and for every ``--model`` name.

Reads the pristine cached releases, writes nothing.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import release_package
from patchcraft.planning import selection
from patchcraft.planning.model_plans import _capturing_forward, _init_owner, plan_models, scan
from patchcraft.base.releases import ALL_RELEASES
from patchcraft.planning.selection import plan_reaching, plan_tree, select
from patchcraft.base.target import SglangTree, resolve_target

# -- a single-file run plans what reaches the file ------------------------------------

FILES = {
    "0.5.10": ("qwen2", "deepseek_v2", "llama", "qwen3", "qwen3_moe", "gpt_oss", "mllama4", "llama_eagle3", "registry"),
    "0.5.23": ("qwen2", "deepseek_v2", "llama", "qwen3", "qwen3_moe", "gpt_oss", "qwen3_5", "kimi_k25", "registry"),
}


@pytest.fixture(scope="module")
def trees() -> dict[str, tuple[SglangTree, list]]:
    """Each release's tree and its whole-tree plans (planned once)."""
    found = {}
    for version in FILES:
        tree = resolve_target(str(release_package(version)))
        found[version] = (tree, plan_models(scan(tree.models_dir), inheriting=True))
    return found


def _single(tree: SglangTree, stem: str) -> SglangTree:
    return replace(tree, only_files=((tree.models_dir / f"{stem}.py").resolve(),))


@pytest.mark.parametrize("version,stem", [(v, s) for v, stems in FILES.items() for s in stems], ids=lambda x: x)
def test_single_file_plans_equal_the_whole_tree_filtered(trees, version: str, stem: str) -> None:
    tree, whole = trees[version]
    single = _single(tree, stem)
    if not single.only_files[0].exists():
        pytest.skip(f"{stem}.py is not in {version}")
    expected = select(whole, single, ())
    assert plan_tree(single) == expected
    if stem in ("llama", "qwen2", "deepseek_v2", "qwen3_moe"):
        assert expected, "these files hold models in every release listed: an empty match would prove nothing"


def test_model_names_combine_with_the_file(trees) -> None:
    tree, whole = trees["0.5.23"]
    single = _single(tree, "llama")
    names = ("LlamaForCausalLM",)
    assert plan_tree(single, names) == select(whole, single, names)


def test_the_comparison_catches_a_scope_that_misses_importers(trees, monkeypatch) -> None:
    """With the reverse imports left out, qwen2.py's plans lose the models built on Qwen2Model."""
    tree, whole = trees["0.5.23"]
    single = _single(tree, "qwen2")
    monkeypatch.setattr(selection, "importers", lambda imports, stems: set(stems))
    assert plan_tree(single) != select(whole, single, ())


def test_a_file_outside_the_models_dir_plans_the_whole_tree(tmp_path: Path) -> None:
    assert plan_reaching(SglangTree(package=tmp_path, root=tmp_path, only_files=(tmp_path / "x.py",))) is None


def _stride(items: list[Path], count: int) -> list[Path]:
    step = max(1, len(items) // count)
    return items[::step][:count]


SAMPLED = ("0.4.10", "0.5.2", "0.5.10", "0.5.15", "0.5.23")


@pytest.mark.parametrize("version", SAMPLED)
def test_sampled_real_files_plan_as_in_the_whole_tree(version: str) -> None:
    """Every ``PATCHCRAFT_EVERY_FILE=1``: all model files; else 12 by stride and those with a plan's site."""
    tree = resolve_target(str(release_package(version)))
    whole = plan_models(scan(tree.models_dir), inheriting=True)
    files = sorted(tree.models_dir.glob("*.py"))
    if not os.environ.get("PATCHCRAFT_EVERY_FILE"):
        sites = sorted({site.path for p in whole for site in p.sites} - {tree.models_dir / "deepseek_v2.py"})
        files = sorted(set(_stride(files, 12)) | set(_stride(sites, 8)))
    for path in files:
        single = replace(tree, only_files=(path.resolve(),))
        assert plan_tree(single) == select(whole, single, ()), path.name


# -- the closure: no subset half-patches a sibling ------------------------------------


def _readers(graph) -> list[tuple[str, tuple, tuple | None]]:
    """Every class running a capturing forward: (label, forward site key, init site key or None)."""
    found = []
    for cls in list(graph.classes.values()):
        forward = _capturing_forward(graph, cls)
        if forward is None:
            continue
        init = _init_owner(graph, cls)
        found.append(
            (
                cls.label,
                (str(forward[0].path), forward[0].name, "forward"),
                (str(init.path), init.name, "init") if init is not None else None,
            )
        )
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
    resolved = {key: Path(key[0]).resolve() for key in every}
    for name in names:
        applied = {site.key for plan in select(plans, tree, [name]) for site in plan.sites}
        if _crashing(readers, applied):
            problems.append(f"apply --model {name}: {_crashing(readers, applied)}")
        reverted = {path.resolve() for plan in select(plans, tree, [name], whole_files=True) for path in plan.files}
        left = {key for key in every if resolved[key] not in reverted}
        if _crashing(readers, left):
            problems.append(f"revert --model {name}: {_crashing(readers, left)}")
    assert not problems, problems


def test_the_check_sees_a_half_patched_sibling() -> None:
    """The check above can fail: without the closure, --model deepseek_v2 on 0.5.10 leaves Glm4MoeLite bare."""
    tree = resolve_target(str(release_package("0.5.10")))
    graph = scan(tree.models_dir)
    plans = plan_models(graph)
    named_only = [p for p in plans if p.module == "deepseek_v2"]
    patched = {
        site.key for plan in named_only for site in plan.sites if site.kind != "init" or site.cls == "DeepseekV2Model"
    }
    assert "glm4_moe_lite.Glm4MoeLiteModel" in _crashing(_readers(graph), patched)
    closed = {site.key for plan in select(plans, tree, ["deepseek_v2"]) for site in plan.sites}
    assert not _crashing(_readers(graph), closed)
