"""vLLM's ``vllm/models/<family>/`` packages (0.22+): the rows patchcraft cannot make true there are unsupported.

On 0.34.0 the registry serves GlmMoeDsaForCausalLM from ``vllm/models/deepseek_v32``, not from
``model_executor/models/deepseek_v2.py``: that class's row is unsupported, and every architecture the
registry maps into a family holding an EAGLE-3 target gets an unsupported row of its own. A copied
release whose registry maps GlmMoeDsa back to deepseek_v2 shows the rule failing: the row is patched again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import run_cli, vllm_release_package

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.status import EditKind
from patchcraft.base.vllm_tree import VllmTree
from patchcraft.planning.selection import plan_tree
from patchcraft.planning.vllm_plans import plan_vllm

GLM = "deepseek_v2.GlmMoeDsaForCausalLM"
REGISTRY = Path("model_executor") / "models" / "registry.py"


def _tree(package: Path) -> VllmTree:
    return VllmTree(package=package, root=package.parent)


def _plans(package: Path) -> dict[str, object]:
    return {p.label: p for p in plan_vllm(_tree(package))}


def test_a_class_the_registry_serves_from_vllm_models_is_unsupported() -> None:
    plans = _plans(vllm_release_package("0.34.0"))
    glm = plans[GLM]
    assert not glm.sites and not glm.not_applicable
    assert glm.unsupported == (
        "vLLM 0.34.0 serves GlmMoeDsaForCausalLM from vllm/models/deepseek_v32 (registry.py), not this class; "
        "patchcraft does not read vllm/models/ yet"
    )
    # the class the registry does serve from deepseek_v2.py keeps its edit
    assert [s.kind for s in plans["deepseek_v2.DeepseekV3ForCausalLM"].sites] == [EditKind.VLLM_FORWARD]
    for label in ("qwen3_5.Qwen3_5ForCausalLM", "qwen3_5.Qwen3_5MoeForCausalLM"):  # vllm/models/qwen3_5 on 0.34
        assert not plans[label].sites and "from vllm/models/qwen3_5 (registry.py)" in plans[label].unsupported


def test_each_family_architecture_with_an_eagle3_target_gets_an_unsupported_row() -> None:
    package = vllm_release_package("0.34.0")
    plans = _plans(package)
    families = {label: p for label, p in plans.items() if "which patchcraft does not read yet" in (p.unsupported or "")}
    assert sorted(families) == [
        "beam.BeamForCausalLM",
        "deepseek_v32.DeepseekV32ForCausalLM",
        "deepseek_v32.GlmMoeDsaForCausalLM",
        "deepseek_v4.DeepseekV4ForCausalLM",
        "glm5next.Glm5NextForCausalLM",
        "kimi_k3.KimiLinearForCausalLM",
        "minimax_m3.MiniMaxM3SparseForCausalLM",
        "mistral_large4.MistralLarge4ForCausalLM",
    ]
    v32 = families["deepseek_v32.DeepseekV32ForCausalLM"]
    assert not v32.sites and not v32.not_applicable
    assert v32.path == package / "models" / "deepseek_v32" / "nvidia" / "model.py"
    assert v32.unsupported == (
        "served from vllm/models/deepseek_v32/ (DeepseekV32ForCausalLM in registry.py), which patchcraft does not "
        "read yet: what id 0 feeds there is not shown"
    )
    # an alias (imported as GlmMoeDsaForCausalLM) has no class of its own: the family's __init__.py
    assert families["deepseek_v32.GlmMoeDsaForCausalLM"].path == package / "models" / "deepseek_v32" / "__init__.py"
    # no family without a target (flint, hy_v4, step5, ...) and none before the first family with one
    assert not any(
        "which patchcraft does not read yet" in (p.unsupported or "")
        for p in plan_vllm(_tree(vllm_release_package("0.18.0")))
    )


def test_naming_a_family_architecture_selects_its_unsupported_row() -> None:
    plans = plan_tree(_tree(vllm_release_package("0.34.0")), ["DeepseekV32ForCausalLM"])
    assert [(p.label, bool(p.unsupported)) for p in plans] == [("deepseek_v32.DeepseekV32ForCausalLM", True)]


@pytest.mark.parametrize("name", ["DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"])
def test_explain_on_a_family_architecture_is_one_line_exit_2(capsys, name: str) -> None:
    pytest.importorskip("torch")
    package = str(vllm_release_package("0.34.0"))
    args = ("explain", package, "--engine", "vllm", "--model", name, "--layer-ids", "0,3,31", "--num-layers", "61")
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert (
        f"{name}: vLLM 0.34.0 serves {name} from vllm/models/deepseek_v32/ (registry.py), which patchcraft "
        "does not read yet" in err
    )
    assert "no such model class" not in err


def test_apply_naming_a_family_architecture_fails_and_writes_nothing(capsys, tmp_path: Path) -> None:
    source = vllm_release_package("0.34.0")
    package = tmp_path / "vllm"
    for part in (Path("model_executor") / "models", Path("models") / "deepseek_v32"):
        shutil.copytree(source / part, package / part)
    before = {p: p.read_bytes() for p in package.rglob("*.py")}
    code, out, err = run_cli(capsys, "apply", str(package), "--engine", "vllm", "--model", "DeepseekV32ForCausalLM")
    said = " ".join((out + err).split())
    assert code == 1 and "unsupported deepseek_v32.DeepseekV32ForCausalLM served from vllm/models/deepseek_v32/" in said
    assert {p: p.read_bytes() for p in package.rglob("*.py")} == before


def test_a_registry_serving_the_class_from_model_executor_patches_it_again(tmp_path: Path) -> None:
    source = vllm_release_package("0.34.0")
    package = tmp_path / "vllm"
    shutil.copytree(source / "model_executor" / "models", package / "model_executor" / "models")
    registry = package / REGISTRY
    text = registry.read_text()
    entry = '"GlmMoeDsaForCausalLM": ("vllm.models.deepseek_v32", "GlmMoeDsaForCausalLM"),'
    assert text.count(entry) == 1
    registry.write_text(text.replace(entry, '"GlmMoeDsaForCausalLM": ("deepseek_v2", "GlmMoeDsaForCausalLM"),'))
    glm = _plans(package)[GLM]
    assert not glm.unsupported and [s.kind for s in glm.sites] == [EditKind.VLLM_FORWARD]


def test_only_a_key_naming_the_class_counts(tmp_path: Path) -> None:
    """Another key mapping to deepseek_v2's class means vLLM serves it from there: the row stays patched."""
    source = vllm_release_package("0.34.0")
    package = tmp_path / "vllm"
    shutil.copytree(source / "model_executor" / "models", package / "model_executor" / "models")
    registry = package / REGISTRY
    text = registry.read_text()
    entry = '"GlmMoeDsaForCausalLM": ("vllm.models.deepseek_v32", "GlmMoeDsaForCausalLM"),'
    registry.write_text(
        text.replace(entry, entry + '\n    "GlmOldForCausalLM": ("deepseek_v2", "GlmMoeDsaForCausalLM"),')
    )
    assert _plans(package)[GLM].sites
    with pytest.raises(PatchcraftError, match="no model matches"):
        plan_tree(_tree(package), ["NoSuchForCausalLM"])


def test_naming_deepseek_v2_names_its_unsupported_glm_row(capsys, tmp_path: Path) -> None:
    """From 0.29 ``--model deepseek_v2`` names GlmMoeDsaForCausalLM too: the others' edit is written, exit 1."""
    pytest.importorskip("torch")
    source = vllm_release_package("0.34.0")
    package = tmp_path / "vllm"
    shutil.copytree(source / "model_executor" / "models", package / "model_executor" / "models")
    code, out, err = run_cli(capsys, "apply", str(package), "--engine", "vllm", "--model", "deepseek_v2")
    assert code == 1, (code, out + err)
    said = " ".join((out + err).split())
    assert f"unsupported {GLM} this vLLM tree serves GlmMoeDsaForCausalLM from vllm/models/deepseek_v32" in said
    assert "patched deepseek_v2.DeepseekV3ForCausalLM" in said
    assert (package / "model_executor" / "models" / "deepseek_v2.py").read_bytes() != (
        source / "model_executor" / "models" / "deepseek_v2.py"
    ).read_bytes()
