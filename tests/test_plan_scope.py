"""A single-file run plans only what can reach the file, and gets the whole tree's plans.

``selection.plan_tree`` on a tree with ``only_files`` plans the staged file's
classes, the files importing it (found by a bytes search) and what those
resolve, instead of every model file. The plans must be exactly those of
the whole-tree plan filtered to the file (``selection.select``), on real
releases, for files in the middle of the class graph (llama.py, qwen2.py,
deepseek_v2.py), leaves (qwen3_moe.py, gpt_oss.py) and files with no model.
Reads the pristine cached releases, writes nothing; ~6 s of CPU.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from conftest import release_package
from patchcraft import selection
from patchcraft.plan import plan_models, scan
from patchcraft.scope import ModelTexts, import_map, importers
from patchcraft.selection import plan_reaching, plan_tree, select
from patchcraft.tree import SglangTree, resolve_target

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
        found[version] = (tree, plan_models(scan(tree.models_dir)))
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


def test_importers_follow_every_import_form() -> None:
    data = {
        "base": b"class Base: pass\n",
        "a": b"from sglang.srt.models.base import Base\n",
        "b": b"from .a import X\n",
        "c": b"from sglang.srt.models import (\n    other,\n    b,\n)\n",
        "d": b"from . import \\\n    c\n",
        "e": b"    import sglang.srt.models.d as dd\n",
        "f": b"from sglang.srt.models.base_extra import Y\nx = 'base'\n",
        "g": b"from torch import base\nimport base\n",
    }
    # Over-approximating is allowed (a needless parse); missing an importer is not.
    assert importers(import_map(ModelTexts(data)), {"base"}) == {"base", "a", "b", "c", "d", "e"}
    assert importers(import_map(ModelTexts(data)), {"a"}) == {"a", "b", "c", "d", "e"}


def test_importers_see_imports_anywhere_on_a_line_and_skip_comments() -> None:
    data = {
        "base": b"class Base: pass\n",
        "inline": b"if TYPE_CHECKING: from sglang.srt.models.base import Base\n",
        "relative": b"try: from \\\n    .base import Base\nexcept ImportError: pass\n",
        "late_names": b"if f(x): from sglang.srt.models import (  # (see\n    base,\n)\n",
        "comment": b"# Adapted from vllm/model_executor/models/base.py\nimport torch\n",
        "trailing": b"import torch  # like sglang.srt.models.base\n",
        "old_mac": b"# header\rfrom sglang.srt.models.base import Base\r",
    }
    assert importers(import_map(ModelTexts(data)), {"base"}) == {"base", "inline", "relative", "late_names", "old_mac"}


def test_a_file_outside_the_models_dir_plans_the_whole_tree(tmp_path: Path) -> None:
    assert plan_reaching(SglangTree(package=tmp_path, root=tmp_path, only_files=(tmp_path / "x.py",))) is None
