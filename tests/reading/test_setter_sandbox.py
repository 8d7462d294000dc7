"""setter_eval.py: a release's own setter, run on stand-ins, gives SGLang's ``layers_to_capture``.

One real release per setter shape (docs: "Setter variants"): plain +1,
inner helper, the first-id and max heuristics, delegation and the legacy
setter without ids. Each is called with no ids and with three id lists;
the expected lists are read off the release's code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import release_package
from patchcraft.reading.class_graph import ModelGraph
from patchcraft.engine.file_patch import patch_text
from patchcraft.planning.model_plans import plan_model
from patchcraft.reading.setter_sandbox import NotEvaluable, SetterRun, run_setter

IDS = (None, [-1, 2, 30], [0, 3, 31], [1, 29, 57])


def _run(version: str, module: str, cls: str, layer_ids: list[int] | None, num_layers: int) -> SetterRun:
    graph = ModelGraph(models_dir=release_package(version) / "srt" / "models")
    assert graph.load(module)
    return run_setter(graph, graph.classes[(module, cls)], layer_ids, num_layers)


def _captured(version: str, module: str, cls: str, num_layers: int) -> list[tuple[int, ...] | None]:
    return [_run(version, module, cls, ids, num_layers).layers_to_capture for ids in IDS]


def test_plain_plus_one_llama_shifts_every_id_and_defaults_to_2_half_and_n_minus_3() -> None:
    assert _captured("0.5.10", "llama", "LlamaForCausalLM", 32) == [(2, 16, 29), (0, 3, 31), (1, 4, 32), (2, 30, 58)]


def test_plain_plus_one_sets_the_inner_model_and_reports_no_embedding_before_apply() -> None:
    run = _run("0.5.10", "llama", "LlamaForCausalLM", [-1, 2, 30], 32)
    assert run.holder is not None and run.holder.label == "llama.LlamaModel"
    assert run.embedding is False and run.takes_ids and run.error is None
    assert [f"{c.owner.label}.{c.func.name}" for c in run.calls] == [
        "llama.LlamaForCausalLM.set_eagle3_layers_to_capture"
    ]


def test_inner_helper_qwen2_moe_runs_the_inner_setter_too() -> None:
    run = _run("0.5.10", "qwen2_moe", "Qwen2MoeForCausalLM", [-1, 2, 30], 32)
    assert (
        run.layers_to_capture == (0, 3, 31) and run.holder is not None and run.holder.label == "qwen2_moe.Qwen2MoeModel"
    )
    assert [c.owner.label for c in run.calls] == ["qwen2_moe.Qwen2MoeForCausalLM", "qwen2_moe.Qwen2MoeModel"]
    assert _run("0.5.10", "qwen2_moe", "Qwen2MoeForCausalLM", None, 32).layers_to_capture == (2, 16, 29)


@pytest.mark.parametrize("ids", [[0, 3, 31], [1, 29, 57]])
def test_inner_helper_marking_a_layer_past_the_last_raises_as_sglang_would(ids: list[int]) -> None:
    """``self.layers[32]`` on 32 layers: SGLang fails at start-up with the same IndexError."""
    run = _run("0.5.10", "qwen2_moe", "Qwen2MoeForCausalLM", ids, 32)
    assert run.error == "IndexError: list index out of range"
    assert run.layers_to_capture == tuple(i + 1 for i in ids)


@pytest.mark.parametrize("version", ["0.5.13", "0.5.15"])
def test_first_id_heuristic_deepseek_v2_shifts_only_when_the_first_id_is_1(version: str) -> None:
    """Unpatched, [-1, 2, 30] keeps -1 raw: the shift is skipped for every id."""
    assert _captured(version, "deepseek_v2", "DeepseekV2ForCausalLM", 61) == [
        (2, 30, 58),
        (-1, 2, 30),
        (0, 3, 31),
        (2, 30, 58),
    ]


def test_max_heuristic_gpt_oss_keeps_ids_raw_only_when_the_largest_is_the_layer_count() -> None:
    assert _captured("0.5.20", "gpt_oss", "GptOssForCausalLM", 31) == [(2, 15, 28), (0, 3, 31), (0, 3, 31), (2, 30, 58)]
    assert _captured("0.5.20", "gpt_oss", "GptOssForCausalLM", 32) == [(2, 16, 29), (0, 3, 31), (1, 4, 32), (2, 30, 58)]


def test_delegation_kimi_k25_runs_deepseek_v2s_setter_on_its_language_model() -> None:
    assert _captured("0.5.15", "kimi_k25", "KimiK25ForConditionalGeneration", 61) == [
        (2, 30, 58),
        (-1, 2, 30),
        (0, 3, 31),
        (2, 30, 58),
    ]
    run = _run("0.5.15", "kimi_k25", "KimiK25ForConditionalGeneration", [0, 3, 31], 61)
    assert [c.owner.label for c in run.calls] == [
        "kimi_k25.KimiK25ForConditionalGeneration",
        "deepseek_v2.DeepseekV2ForCausalLM",
    ]
    assert run.holder is not None and run.holder.label == "deepseek_v2.DeepseekV2Model"


def test_legacy_llama_0_4_6_takes_no_ids_and_always_captures_the_defaults() -> None:
    assert _captured("0.4.6", "llama", "LlamaForCausalLM", 32) == [(2, 16, 29)] * 4
    assert _run("0.4.6", "llama", "LlamaForCausalLM", [-1, 2, 30], 32).takes_ids is False


def test_a_class_without_the_setter_is_not_evaluable() -> None:
    graph = ModelGraph(models_dir=release_package("0.5.10") / "srt" / "models")
    graph.load("llama")
    with pytest.raises(NotEvaluable, match="has no set_eagle3_layers_to_capture"):
        run_setter(graph, graph.classes[("llama", "LlamaMLP")], None, 32)


def _patched_run(version: str, module: str, cls: str, layer_ids: list[int] | None, num_layers: int) -> SetterRun:
    """The setter after ``patchcraft apply`` of that one model (its file patched in memory)."""
    models = release_package(version) / "srt" / "models"
    graph = ModelGraph(models_dir=models)
    graph.load(module)
    plan = plan_model(graph, graph.classes[(module, cls)])
    path = models / f"{module}.py"
    patched = ModelGraph(models_dir=models)
    patched.load(
        module,
        patch_text(path.read_text(encoding="utf-8"), path, [s for s in plan.sites if s.path == path]).after.encode(),
    )
    return run_setter(patched, patched.classes[(module, cls)], layer_ids, num_layers)


def test_patched_plain_setter_drops_minus_one_sets_the_flag_and_shifts_the_rest() -> None:
    run = _patched_run("0.5.10", "llama", "LlamaForCausalLM", [-1, 2, 30], 32)
    assert (run.layers_to_capture, run.embedding) == ((3, 31), True)
    assert [
        (r.layers_to_capture, r.embedding)
        for r in (_patched_run("0.5.10", "llama", "LlamaForCausalLM", ids, 32) for ids in (None, [0, 3, 31]))
    ] == [((2, 16, 29), False), ((1, 4, 32), False)]


def test_patched_first_id_heuristic_shifts_the_other_ids_whenever_minus_one_is_given() -> None:
    """With -1 the other ids are layer outputs (+1), whatever the first-id test chose; without it, the release's rule."""
    runs = [
        _patched_run("0.5.15", "deepseek_v2", "DeepseekV2ForCausalLM", ids, 61)
        for ids in ([-1, 2, 30], [-1, 1, 29], [0, 3, 31], [1, 29, 57])
    ]
    assert [(r.layers_to_capture, r.embedding) for r in runs] == [
        ((3, 31), True),
        ((2, 30), True),
        ((0, 3, 31), False),
        ((2, 30, 58), False),
    ]


def test_guarded_delegation_mllama4_reaches_the_inherited_llama_setter() -> None:
    run = _run("0.5.10", "mllama4", "Llama4ForConditionalGeneration", [-1, 2, 30], 48)
    assert run.layers_to_capture == (0, 3, 31) and run.holder is not None and run.holder.label == "llama4.Llama4Model"
    assert [c.owner.label for c in run.calls] == ["mllama4.Llama4ForConditionalGeneration", "llama.LlamaForCausalLM"]


GUARDED = """
class Wrapper:
    def __init__(self, config):
        self.language_model = build_language_model(config)

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if hasattr(self.language_model, "set_eagle3_layers_to_capture"):
            self.language_model.set_eagle3_layers_to_capture(layer_ids)
"""


def test_a_hasattr_that_swallowed_an_unknown_is_not_evaluable(tmp_path: Path) -> None:
    """A delegate built outside the model graph: taking the silent no-op branch would be a guess."""
    (tmp_path / "wrapper.py").write_text(GUARDED, encoding="utf-8")
    graph = ModelGraph(models_dir=tmp_path)
    graph.load("wrapper")
    with pytest.raises(NotEvaluable, match="outside sglang/srt/models; its `set_eagle3_layers_to_capture` is unknown"):
        run_setter(graph, graph.classes[("wrapper", "Wrapper")], [-1, 2, 30], 32)
