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
def test_deepseek_family_gets_one_site_and_the_mixin_models_are_not_planned(version: str) -> None:
    plans = {p.label: p for p in plan_vllm(_tree(vllm_release_package(version)))}
    deepseek = plans["deepseek_v2.DeepseekV3ForCausalLM"]
    assert [(s.kind, s.cls, s.method) for s in deepseek.sites] == [
        (EditKind.VLLM_FORWARD, "DeepseekV2Model", "forward")
    ]
    kimi = plans["kimi_k25.KimiK25ForConditionalGeneration"]
    assert kimi.sites == deepseek.sites and "its language model deepseek_v2.DeepseekV2ForCausalLM" in kimi.notes[0]
    llama = plans["llama.LlamaForCausalLM"]
    assert llama.not_applicable and not llama.sites
    assert "EagleModelMixin, which captures id 0 (hs[0]) itself" in (llama.unsupported or "")


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
