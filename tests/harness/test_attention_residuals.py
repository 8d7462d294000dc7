"""patchcraft.harness.attention_residuals: Kimi-K3's config switch, one side run and said (issue 46).

Real vLLM 0.34.0: ``models/kimi_k3/amd/linear.py`` (ROCm; XPU builds the same
class) tests ``self.config.attn_res_block_size is None`` in its forward, and
``models/kimi_k3/nvidia/model.py`` (CUDA, CPU) derives ``self.use_attn_res`` from
it in ``__init__``. The harness runs the residual-stream side on every platform
(the field ``None``) and says so; before, ROCm and XPU failed on the block
count and CUDA took that side without saying it.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from conftest import vllm_release_package
from patchcraft.harness import attention_residuals
from patchcraft.harness.served import Fed
from patchcraft.harness.vllm_served import find_model, run_ids
from patchcraft.harness.vllm_runs import class_runs

pytest.importorskip("torch")

K3 = "KimiK3ForConditionalGeneration"
GETTER = "get_eagle3_default_aux_hidden_state_layers"


@pytest.mark.parametrize("platform", ("rocm", "xpu"))
def test_0_34_0_rocm_and_xpu_run_the_residual_stream_side(platform: str) -> None:
    model = find_model(vllm_release_package("0.34.0"), K3, platform=platform)
    run = run_ids(model, (0, 2, 4), 8)
    assert run.outcome.fed == (Fed(0, False), Fed(2, True), Fed(4, True))  # id 0: the embedding itself
    assert run.aliased_holds == ((0, "hs[7]"),)  # the in-place add-norm's doing, as on CUDA eager


@pytest.mark.parametrize("platform", ("cuda", "rocm", "xpu", "cpu"))
def test_every_platform_says_which_side_ran(platform: str) -> None:
    runs = class_runs(vllm_release_package("0.34.0"), K3, platform, 8, (0, 2, 4), GETTER)
    assert not runs.error
    assert runs.assumed == attention_residuals.condition()
    assert "attn_res_block_size = None" in runs.assumed and "not shown" in runs.assumed


def test_a_model_without_the_switch_assumes_nothing() -> None:
    runs = class_runs(vllm_release_package("0.34.0"), "LlamaForCausalLM", None, 8, (0, 2, 4), GETTER)
    assert not runs.error and runs.assumed == ""


def test_nvidia_derives_its_flags_from_the_field() -> None:
    """``self.use_attn_res = self.attn_res_block_size is not None`` and the block count, from ``None``."""
    model = find_model(vllm_release_package("0.34.0"), K3, platform="cuda")
    assert attention_residuals.reads_switch(model.graph, model.inner)
    config = type("Config", (), {attention_residuals.FIELD: None})()
    found = attention_residuals.derived(model.graph, model.inner, config, 0, 8)
    assert found["attn_res_block_size"] is None
    assert found["use_attn_res"] is False
    assert found["num_attn_res_blocks"] == 0


def test_the_side_run_is_the_config_s(tmp_path: Path) -> None:
    """The ROCm forward's test flipped: the run now takes the attention-residual side, which the harness does
    not model, and says it did not run; the file as released runs."""
    package = tmp_path / "vllm"
    shutil.copytree(vllm_release_package("0.34.0"), package)
    path = package / "models/kimi_k3/amd/linear.py"
    old = "        if self.config.attn_res_block_size is None:\n            for layer_idx"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, old.replace("is None", "is not None"), 1))
    run = run_ids(find_model(package, K3, platform="rocm"), (0, 2, 4), 8)
    assert run.outcome.not_run and not run.outcome.fed


def test_explain_says_it_on_every_platform() -> None:
    """The note reaches explain's answer once, for the four platforms, and is a note: it does not change the
    exit code (the answer is what ran, under the condition it names)."""
    from patchcraft.analysis.vllm_explain import FindingKind, explain_vllm
    from patchcraft.base.vllm_tree import resolve_vllm_target

    tree = resolve_vllm_target(str(vllm_release_package("0.34.0")))
    result = explain_vllm(tree, K3, (0, 2, 4), 8, per_platform=True)
    assumed = [n for n in result.notes if n.kind is FindingKind.ASSUMED]
    assert len(assumed) == 1 and assumed[0].text.startswith("cuda, rocm, xpu, cpu: run with config.attn_res")
    assert not [f for f in result.findings if f.kind is FindingKind.ASSUMED]
    assert "rocm: hs[0] (not a copy: hs[7]" in result.fed


def test_a_model_s_own_block_size_is_no_switch() -> None:
    """0.34.0's AliceAI always runs attention residuals and keeps its block size as ``self.attn_res_block_size``
    (from ``block_attn_res_block_size``): no config switch, nothing assumed; Kimi-K3's reads the config's."""
    from patchcraft.reading.vllm_graph import VllmGraph

    graph = VllmGraph(vllm_release_package("0.34.0") / "model_executor" / "models")
    assert graph.load("alice_ai")
    alice = graph.classes[("alice_ai", "AliceAIModel")]
    assert "attn_res_block_size" in ast.dump(alice.node)
    assert not attention_residuals.reads_switch(graph, alice)
