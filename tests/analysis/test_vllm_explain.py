"""patchcraft.analysis.vllm_explain: the findings of ``explain --engine vllm``, from what running the release showed."""

from __future__ import annotations

import pytest

from conftest import vllm_release_package
from patchcraft.analysis.vllm_explain import NO_TARGET, FindingKind, explain_vllm, model_type_of
from patchcraft.base.vllm_tree import resolve_vllm_target
from patchcraft.reading.vllm_runner import TOP_LEVEL

pytest.importorskip("torch")


def _explain(version: str, model: str, ids, layers: int):  # type: ignore[no-untyped-def]
    return explain_vllm(resolve_vllm_target(str(vllm_release_package(version))), model, ids, layers)


def _kinds(result) -> list[FindingKind]:  # type: ignore[no-untyped-def]
    return [f.kind for f in result.findings]


def test_model_types() -> None:
    assert model_type_of("DeepseekV3ForCausalLM") == "deepseek_v3" and model_type_of("LlamaForCausalLM") == "llama"
    assert model_type_of("Qwen2MoeForCausalLM") == "qwen2_moe"


def test_0_11_2_llama() -> None:
    dropped = _explain("0.11.2", "llama", (2, 3, 6), 6)
    assert dropped.fed == "hs[2], hs[3]" and _kinds(dropped) == [FindingKind.DROPPED, FindingKind.COUNT]
    assert [n.kind for n in dropped.notes] == [FindingKind.PLACE]  # eagle_config is read by no runner: a note
    collapsed = _explain("0.11.2", "llama", (3, 3, 4), 6)
    assert _kinds(collapsed) == [FindingKind.COLLAPSED, FindingKind.COUNT]
    crash = _explain("0.11.2", "llama", (0, 2, 3), 6)
    assert _kinds(crash) == [FindingKind.CRASH] and "llama.py:" in crash.findings[0].text
    clean = _explain("0.11.2", "llama", (2, 3, 4), 6)
    assert clean.findings == () and clean.fed_states == (2, 3, 4) and clean.defaults == (2, 3, 3)


def test_0_11_2_deepseek_is_gated_and_no_target() -> None:
    result = _explain("0.11.2", "DeepseekV3ForCausalLM", (0, 3, 31), 61)
    assert result.fed == NO_TARGET and _kinds(result) == [FindingKind.GATE, FindingKind.NOT_RUN]


def test_0_34_0_llama_alias_and_the_defaults() -> None:
    alias = _explain("0.34.0", "LlamaForCausalLM", (0, 2, 3), 6)
    assert _kinds(alias) == [FindingKind.ALIAS] and "reads hs[6] instead of hs[0]" in alias.findings[0].text
    defaults = _explain("0.34.0", "LlamaForCausalLM", None, 6)
    assert defaults.served_ids == (2, 3, 3) and _kinds(defaults) == [FindingKind.COLLAPSED, FindingKind.COUNT]


@pytest.mark.slow
@pytest.mark.parametrize(
    "version, ids, fed, kinds",
    [
        ("0.17.0", (0, 2, 3), "crash", [FindingKind.CRASH]),
        ("0.17.0", (2, 3, 6), "hs[2], hs[3]", [FindingKind.DROPPED, FindingKind.COUNT]),
        ("0.17.0", (3, 3, 4), "hs[3], hs[4]", [FindingKind.COLLAPSED, FindingKind.COUNT]),
        ("0.18.0", (0, 2, 3), "hs[0] (not a copy", [FindingKind.ALIAS]),
        ("0.18.0", (2, 3, 6), "hs[2], hs[3], hs[6]", []),
        ("0.18.0", (3, 3, 4), "hs[3], hs[4]", [FindingKind.COLLAPSED, FindingKind.COUNT]),
        ("0.34.0", (2, 3, 6), "hs[2], hs[3], hs[6]", []),
        ("0.34.0", (3, 3, 4), "hs[3], hs[4]", [FindingKind.COLLAPSED, FindingKind.COUNT]),
    ],
)
def test_llama_matrix(version: str, ids, fed: str, kinds) -> None:  # type: ignore[no-untyped-def]
    result = _explain(version, "LlamaForCausalLM", ids, 6)
    assert result.fed.startswith(fed) and _kinds(result) == kinds


@pytest.mark.slow
@pytest.mark.parametrize("version, gated", [("0.17.0", True), ("0.18.0", False), ("0.34.0", False)])
def test_deepseek_v3_0_3_31(version: str, gated: bool) -> None:
    result = _explain(version, "DeepseekV3ForCausalLM", (0, 3, 31), 61)
    if gated:
        assert result.fed == NO_TARGET and FindingKind.GATE in _kinds(result)
    else:
        assert _kinds(result) == [FindingKind.CRASH] and "deepseek_v2.py:" in result.findings[0].text
        assert [(a.layer_id, a.states) for a in result.alone][1:] == [(3, (3,)), (31, (31,))]


@pytest.mark.slow
def test_0_10_2_never_reads_the_draft_s_ids() -> None:
    result = _explain("0.10.2", "llama", (0, 3, 4), 6)
    assert result.served_ids == (2, 3, 3) and _kinds(result)[0] is FindingKind.IGNORED


def test_a_wrapper_the_harness_cannot_follow_is_not_run_not_no_target() -> None:
    result = _explain("0.34.0", "Qwen3VLForConditionalGeneration", (0, 3, 5), 8)  # its architecture is the config's
    assert result.fed.startswith("not run: cannot tell which class `self.model`") and result.fed != NO_TARGET


def test_kimi_k25_is_run_through_the_language_model_it_names() -> None:
    result = _explain("0.34.0", "KimiK25ForConditionalGeneration", (0, 3, 31), 61)
    assert result.model == "deepseek_v2.DeepseekV2ForCausalLM" and result.via.endswith(
        " KimiK25ForConditionalGeneration"
    )
    assert result.via.startswith("kimi_k25.py:") and result.model_type == "kimi_k25"
    assert _kinds(result) == [FindingKind.CRASH] and "deepseek_v2.py:" in result.findings[0].text


def test_tp_above_1_is_a_note() -> None:
    package = resolve_vllm_target(str(vllm_release_package("0.34.0")))
    result = explain_vllm(package, "llama", (2, 3, 4), 6, tp=8)
    assert result.findings == () and FindingKind.TP in [n.kind for n in result.notes]


def test_a_forward_beyond_the_harness_is_not_run_never_a_crash_or_a_drop() -> None:
    result = _explain("0.34.0", "GraniteForCausalLM", (2, 3, 4), 6)  # config.embedding_multiplier: a stand-in
    assert result.fed.startswith("not run: the forward uses a value the harness does not model")
    assert _kinds(result) == [FindingKind.NOT_RUN] and all(a.not_run for a in result.alone)


def test_the_architecture_named_gives_the_gate_its_model_type() -> None:
    result = _explain("0.11.2", "MistralForCausalLM", (2, 3, 4), 6)  # llama.LlamaForCausalLM's code, model_type mistral
    assert result.model == "llama.LlamaForCausalLM" and result.model_type == "mistral"
    assert _kinds(result) == [FindingKind.GATE] and result.fed == "hs[2], hs[3], hs[4]"


def test_without_torch_the_runners_and_gate_are_still_read(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    result = _explain("0.11.2", "llama", (2, 3, 4), 6)
    assert not result.ran and result.fed == "not run" and result.runners[0].ids_for(TOP_LEVEL) == (2, 3, 4)
    assert _kinds(result) == [FindingKind.NOT_RUN] and result.gate.names is not None


def test_kimi_k25_by_its_label_too() -> None:
    result = _explain("0.34.0", "kimi_k25.KimiK25ForConditionalGeneration", (3, 31), 61)
    assert result.via.endswith(" KimiK25ForConditionalGeneration") and result.fed == "hs[3], hs[31]"


def test_0_32_0_llama_id_0_is_judged_per_platform_and_compilation() -> None:
    """The embedding entry is no copy: kept where the add-norm runs out of place (cpu; cuda compiled), overwritten
    where it runs in place (cuda eager), and every platform judged when none is named. As the real engine showed."""
    tree = resolve_vllm_target(str(vllm_release_package("0.32.0")))
    cpu = explain_vllm(tree, "LlamaForCausalLM", (0, 2, 3), 6, platform="cpu")
    assert FindingKind.ALIAS not in _kinds(cpu) and FindingKind.ALIAS_KEPT in [n.kind for n in cpu.notes]
    assert cpu.fed.startswith("hs[0] (not a copy; kept") and cpu.aliases == ((0, "hs[6]"),)
    assert next(r for r in cpu.runners if r.default).name.startswith("old runner")  # no Triton on the CPU: V1
    eager = explain_vllm(tree, "LlamaForCausalLM", (0, 2, 3), 6, platform="cuda", compilation="eager")
    alias = [f.text for f in eager.findings if f.kind is FindingKind.ALIAS]
    assert len(alias) == 1 and "cuda eager: vllm_c" in alias[0] and "hs[6]" in alias[0]
    compiled = explain_vllm(tree, "LlamaForCausalLM", (0, 2, 3), 6, platform="cuda", compilation="compiled")
    assert FindingKind.ALIAS not in _kinds(compiled)
    every = explain_vllm(tree, "LlamaForCausalLM", (0, 2, 3), 6)
    assert FindingKind.ALIAS in _kinds(every) and next(r for r in every.runners if r.default).name.startswith("V2")


def test_a_build_serving_tpu_from_outside_the_tree_says_it_is_not_judged(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """vllm-tpu's platforms/tpu.py takes TPU from tpu_inference, outside the tree: the platforms judged are said."""
    import shutil

    site = tmp_path / "site"
    shutil.copytree(vllm_release_package("0.32.0"), site / "vllm")
    plain = explain_vllm(resolve_vllm_target(str(site / "vllm")), "LlamaForCausalLM", (0, 2, 3), 6)
    assert FindingKind.PLATFORM not in [n.kind for n in plain.notes]
    (site / "vllm_tpu-0.32.0.dist-info").mkdir()
    built = explain_vllm(resolve_vllm_target(str(site / "vllm")), "LlamaForCausalLM", (0, 2, 3), 6)
    (note,) = [n for n in built.notes if n.kind == FindingKind.PLATFORM]
    assert "vllm_tpu-0.32.0" in note.text and "tpu_inference" in note.text and "not judged" in note.text
    assert built.findings == plain.findings and built.fed == plain.fed  # nothing else changes


@pytest.mark.slow  # 0.25.0 is fetched for this test alone
def test_0_25_0_deepseek_v4_answers_each_platform_a_platform_without_the_setter_included() -> None:
    """0.25.0 serves DeepseekV4ForCausalLM per platform: nvidia/model.py (CUDA and CPU) has the setter, amd/ and xpu/
    do not. explain answers each platform (it was one usage error for all), and a row label of a module without the
    setter says it is no target there (it was "not followed")."""
    tree = resolve_vllm_target(str(vllm_release_package("0.25.0")))
    result = explain_vllm(tree, "DeepseekV4ForCausalLM", (0, 2, 4), 8, per_platform=True)
    said = dict(part.split(": ", 1) for part in result.fed.split("; "))
    assert said["cuda"] == "hs[2], hs[4]" and said["cpu"] == "hs[2], hs[4]", result.fed  # id 0: never captured
    assert said["rocm"] == "no EAGLE-3 draft (not an EAGLE-3 target on rocm on this release)", result.fed
    assert any(f.text.startswith("rocm: ") and "has no set_aux_hidden_state_layers" in f.text for f in result.findings)
    label = explain_vllm(tree, "deepseek_v4.amd.DeepseekV4ForCausalLM", (0, 2, 4), 8)
    assert label.fed == NO_TARGET and any("not an EAGLE-3 target on rocm" in f.text for f in label.findings)
