"""patchcraft.harness.vllm_served: a vLLM release's own setter, getter and forward on the CPU harness.

Fast tier: 0.11.2 (Llama captures at the top of each layer: id 0 crashes,
id n is dropped) and 0.34.0 (Llama through EagleModelMixin: id 0 aliases
the embedding and is overwritten in place; DeepSeek top-of-layer with an
end-of-loop capture). Planted copies show the checks failing on what they
must catch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import planted_vllm, vllm_release_package
from patchcraft.base.errors import PatchcraftError
from patchcraft.harness.served import Fed
from patchcraft.harness.standins import HarnessError
from patchcraft.harness.vllm_served import default_ids, eagle3_classes, find_model, run_ids

pytest.importorskip("torch")


def _line(package: Path, stem: str, text: str) -> int:
    lines = (package / "model_executor" / "models" / f"{stem}.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_0_11_2_llama_top_of_layer() -> None:
    package = vllm_release_package("0.11.2")
    model = find_model(package, "llama")
    assert model.label == "llama.LlamaForCausalLM" and model.inner.label == "llama.LlamaModel"
    assert run_ids(model, (2, 3, 6), 6).outcome.states == (2, 3)  # id n: dropped
    assert run_ids(model, (3, 3, 4), 6).outcome.states == (3, 4)  # duplicates collapse
    assert run_ids(model, (-1, 2, 3), 6).outcome.states == (2, 3)  # -1: accepted, captures nothing
    crash = run_ids(model, (0, 2, 3), 6).outcome
    line = _line(package, "llama", "aux_hidden_states.append(hidden_states + residual)")
    assert (
        crash.stage == "forward"
        and crash.crash.startswith("TypeError")
        and f"llama.py:{line} in forward" in crash.crash
    )
    assert default_ids(model, "get_eagle3_aux_hidden_state_layers", 6) == ((2, 3, 3), "")


def test_0_11_2_deepseek_is_no_eagle3_target() -> None:
    with pytest.raises(HarnessError, match="has no set_aux_hidden_state_layers"):
        find_model(vllm_release_package("0.11.2"), "DeepseekV3ForCausalLM")


def test_0_34_0_llama_mixin_aliases_the_embedding() -> None:
    model = find_model(vllm_release_package("0.34.0"), "LlamaForCausalLM")
    run = run_ids(model, (0, 2, 3), 6)
    assert run.outcome.fed == (Fed(0, False), Fed(2, True), Fed(3, True))
    assert run.aliased_holds == ((0, "hs[6]"),)  # overwritten in place: the draft reads the last pre-norm stream
    assert run_ids(model, (2, 3, 6), 6).outcome.states == (2, 3, 6)  # id n is hs[n] with the mixin
    assert run_ids(model, (4, 3, 3), 6).outcome.states == (3, 4)  # the mixin sorts and dedups
    assert default_ids(model, "get_eagle3_default_aux_hidden_state_layers", 6) == ((2, 3, 3), "")


def test_0_34_0_deepseek_crashes_on_0_and_captures_n_after_the_loop() -> None:
    package = vllm_release_package("0.34.0")
    model = find_model(package, "DeepseekV3ForCausalLM")
    assert model.inner.label == "deepseek_v2.DeepseekV2Model"
    crash = run_ids(model, (0, 3, 31), 61).outcome
    assert (
        f"deepseek_v2.py:{_line(package, 'deepseek_v2', 'aux_hidden_state = hidden_states + residual')}" in crash.crash
    )
    assert run_ids(model, (3, 31, 61), 61).outcome.states == (3, 31, 61)


def test_unknown_names_are_one_line() -> None:
    package = vllm_release_package("0.34.0")
    with pytest.raises(PatchcraftError, match="NoSuchForCausalLM: no such model class"):
        find_model(package, "NoSuchForCausalLM")
    with pytest.raises(PatchcraftError, match="no_such: no model file"):
        find_model(package, "no_such")


# -- planted copies: the checks fail on what they must catch -------------------------------------


def _planted(tmp_path: Path, version: str, stem: str, old: str, new: str) -> Path:
    source = vllm_release_package(version)
    package = tmp_path / "vllm"
    shutil.copytree(source / "model_executor" / "models", package / "model_executor" / "models")
    path = package / "model_executor" / "models" / f"{stem}.py"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return package


def test_a_copying_capture_is_no_alias(tmp_path: Path) -> None:
    package = _planted(tmp_path, "0.34.0", "interfaces", "else hidden_states\n", "else hidden_states.clone()\n")
    run = run_ids(find_model(package, "LlamaForCausalLM"), (0, 2, 3), 6)
    assert run.outcome.fed == (Fed(0, True), Fed(2, True), Fed(3, True)) and run.aliased_holds == ()


def test_a_none_safe_top_of_layer_capture_does_not_crash(tmp_path: Path) -> None:
    package = _planted(
        tmp_path,
        "0.11.2",
        "llama",
        "aux_hidden_states.append(hidden_states + residual)",
        "aux_hidden_states.append(hidden_states + residual if residual is not None else hidden_states)",
    )
    run = run_ids(find_model(package, "llama"), (0, 2, 3), 6)
    assert not run.outcome.crash and run.outcome.fed[0] == Fed(0, False)  # no crash, and the alias is seen


def test_a_forward_reading_a_missing_attribute_is_a_crash_with_its_line(tmp_path: Path) -> None:
    package = _planted(
        tmp_path, "0.11.2", "llama", "if idx in self.aux_hidden_state_layers:", "if idx in self.aux_layers_typo:"
    )
    crash = run_ids(find_model(package, "llama"), (2, 3), 6).outcome
    assert crash.crash.startswith("AttributeError") and "llama.py:" in crash.crash


# -- the embedding capture vLLM lacks (issue 34, step 3): the edit a transform is to make, run first -----------

EMBEDDING_CAPTURE = (
    "        aux_hidden_states = []\n",
    "        aux_hidden_states = []\n"
    "        if residual is None and 0 in self.aux_hidden_state_layers:  # the embedding, on the first stage\n"
    "            aux_hidden_states.append(hidden_states.clone())\n",
)
SKIP_LAYER_0 = (
    "if idx in self.aux_hidden_state_layers:",
    "if idx in self.aux_hidden_state_layers and residual is not None:",
)


@pytest.mark.parametrize("version", ["0.34.0", pytest.param("0.18.0", marks=pytest.mark.slow)])
def test_the_planned_deepseek_edit_makes_id_0_a_copy_of_the_embedding(tmp_path: Path, version: str) -> None:
    package = _planted(tmp_path, version, "deepseek_v2", *EMBEDDING_CAPTURE)
    path = package / "model_executor" / "models" / "deepseek_v2.py"
    path.write_text(path.read_text().replace(*SKIP_LAYER_0))
    model = find_model(package, "DeepseekV3ForCausalLM")
    assert run_ids(model, (0, 3, 31), 61).outcome.fed == (Fed(0, True), Fed(3, True), Fed(31, True))
    unpatched = find_model(vllm_release_package(version), "DeepseekV3ForCausalLM")
    for ids in ((3, 31, 58), (2, 30, 58)):  # without id 0: exactly what the release feeds
        assert run_ids(model, ids, 61).outcome.fed == run_ids(unpatched, ids, 61).outcome.fed


@pytest.mark.slow  # parses every model file of the release: about 7 s
def test_eagle3_classes_are_those_with_the_setter() -> None:
    found = eagle3_classes(vllm_release_package("0.11.2"))
    assert "llama.LlamaForCausalLM" in found and "qwen3_moe.Qwen3MoeForCausalLM" in found
    assert "qwen3_vl_moe.Qwen3MoeLLMForCausalLM" in found and "qwen3_omni_moe_thinker.Qwen3MoeLLMForCausalLM" in found
    assert "deepseek_v2.DeepseekV3ForCausalLM" not in found
    assert "mistral.MistralForCausalLM" not in found  # 0.11.2's registry maps it to llama's class: no class of its own
    assert not [label for label in found if "Eagle" in label]  # the drafts inherit the setter, they are no targets
    assert (
        find_model(vllm_release_package("0.11.2"), "qwen3_vl_moe.Qwen3MoeLLMForCausalLM").outer.module == "qwen3_vl_moe"
    )


def test_an_architecture_of_the_registry_names_its_class() -> None:
    assert find_model(vllm_release_package("0.11.2"), "MistralForCausalLM").label == "llama.LlamaForCausalLM"
    assert find_model(vllm_release_package("0.34.0"), "MistralForCausalLM").label == "mistral.MistralForCausalLM"


# -- what the harness lacks is never the release's crash (issue 46: Beam's family module) -------------------------

BEAM = "models/beam/nvidia/model.py"
BEAM_LOOP = "        normalized_states = None\n        for index in range(self.start_layer, self.end_layer):\n"


@pytest.mark.parametrize("platform", ("cuda", "rocm"))
def test_0_34_0_beam_runs_its_sibling_helpers_as_stand_ins(platform: str) -> None:
    """Beam's forward calls `beam_rms_norm` (`from .layernorm import ...`) with `self.norm.weight` after its loop:
    both were harness gaps reported as the release's crash (NameError, then AttributeError on the stand-in norm)."""
    run = run_ids(find_model(vllm_release_package("0.34.0"), "BeamForCausalLM", platform=platform), (0, 2, 4), 8)
    assert not run.outcome.crash and not run.outcome.not_run
    assert run.outcome.fed == (Fed(0, False), Fed(2, True), Fed(4, True))


def test_a_sibling_helper_before_the_captures_is_not_run_not_a_crash(tmp_path: Path) -> None:
    """A relative import's helper is a stand-in (`Nothing`), as any helper: a forward that feeds its answer to the
    layers is beyond the harness ("not run"), not a NameError of the release's."""
    new = "        hidden_states = beam_rms_norm(hidden_states, None, 0.0)\n" + BEAM_LOOP
    package = planted_vllm(tmp_path, BEAM, BEAM_LOOP, new)
    outcome = run_ids(find_model(package, "BeamForCausalLM", platform="cuda"), (0, 2, 4), 8).outcome
    assert outcome.not_run and not outcome.crash


def test_a_name_the_release_never_binds_is_still_its_crash(tmp_path: Path) -> None:
    new = "        hidden_states = beam_rms_norm_typo(hidden_states, None, 0.0)\n" + BEAM_LOOP
    package = planted_vllm(tmp_path, BEAM, BEAM_LOOP, new)
    outcome = run_ids(find_model(package, "BeamForCausalLM", platform="cuda"), (0, 2, 4), 8).outcome
    assert outcome.crash.startswith("NameError: name 'beam_rms_norm_typo' is not defined at model.py:")


def test_an_attribute_the_stand_in_norm_lacks_is_not_the_release_s_crash(tmp_path: Path) -> None:
    old = "        if aux_hidden_states:\n            return hidden_states, aux_hidden_states\n        return hidden_states\n"
    new = "        _ = self.norm.scale_bias\n" + old
    package = planted_vllm(tmp_path, BEAM, old, new)
    outcome = run_ids(find_model(package, "BeamForCausalLM", platform="cuda"), (0, 2, 4), 8).outcome
    assert not outcome.crash and "'VllmNorm' object has no attribute 'scale_bias'" in outcome.not_run
