"""Golden diffs for vLLM releases (golden/vllm/<release>/<stem>.diff): the one pipeline on a vLLM tree.

For each release: ``apply --model deepseek_v2`` (proven by the harness first) gives the golden diff
byte for byte, ``verify`` and ``apply --check`` then exit 0, and ``revert`` gives the release back
byte for byte. 0.34.0 in the fast tier, 0.18.0 in the full tier. ``pytest --update-golden`` rewrites
the files for review.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import GOLDEN, vllm_release_package

from patchcraft.base.engines import ServingEngine
from patchcraft.engine.diffs import unified_diffs
from patchcraft.engine.records import Mode
from patchcraft.pipeline.stages import Options, run_trees

pytest.importorskip("torch")

VERSIONS = ["0.34.0", pytest.param("0.18.0", marks=pytest.mark.slow)]


def _copy(version: str, dest: Path) -> Path:
    source = vllm_release_package(version)
    package = dest / "vllm"
    shutil.copytree(source / "model_executor" / "models", package / "model_executor" / "models")
    for name in ("_version.py", "version.py", "__init__.py"):
        if (source / name).is_file():
            shutil.copy2(source / name, package / name)
    return package


@pytest.mark.parametrize("version", VERSIONS)
def test_apply_verify_check_revert(version: str, tmp_path: Path, update_golden: bool) -> None:
    package = _copy(version, tmp_path)
    path = package / "model_executor" / "models" / "deepseek_v2.py"
    pristine = path.read_bytes()
    options = Options(targets=(str(package),), models=("deepseek_v2",), output_format="json", engine=ServingEngine.VLLM)
    applied = run_trees(options, Mode.APPLY)
    assert applied.code == 0
    rows = {m.model: m for m in applied.results[0].models}
    assert rows["deepseek_v2.DeepseekV3ForCausalLM"].proof.value == "harness-passed"
    assert rows["kimi_k25.KimiK25ForConditionalGeneration"].included_by
    diff = unified_diffs(applied.results[0].changes)
    golden = GOLDEN / "vllm" / version / "deepseek_v2.diff"
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(diff)
    assert diff == golden.read_text()
    assert run_trees(options, Mode.VERIFY).code == 0
    assert run_trees(options, Mode.CHECK).code == 0
    assert run_trees(options, Mode.REVERT).code == 0
    assert path.read_bytes() == pristine


def test_a_vllm_tree_is_told_from_its_target(tmp_path: Path) -> None:
    package = _copy("0.34.0", tmp_path)
    checked = run_trees(Options(targets=(str(package),), models=("deepseek_v2",), output_format="json"), Mode.CHECK)
    assert checked.results[0].tree.engine == "vllm" and checked.code == 1  # would change: not applied yet
