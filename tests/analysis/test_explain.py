"""``patchcraft explain`` on the real setter code of real releases.

Read-only cases use the pristine cached release (loaded once per model);
cases that patch or mutate work on a private copy.
"""

from __future__ import annotations

import importlib.util
import json
from functools import lru_cache
from pathlib import Path

import pytest

from patchcraft.engine.tree_run import run, write_changes
from patchcraft.base.errors import PatchcraftError
import patchcraft.analysis.explain as explain_module
from patchcraft.analysis.explain import NOT_RUN, explain, explanation, read_ids, run_harness
from patchcraft.analysis.target_model import Model, load_model
from patchcraft.planning.runner_resets import runner_resets
from patchcraft.reading.capture_reading import reachable
from patchcraft.engine.file_patch import patch_text
from patchcraft.engine.records import Mode
from patchcraft.base.target import resolve_target
from conftest import release_package, run_cli as cli

KIMI_LAYERS = 61
RUNNER = importlib.util.find_spec("patchcraft.transforms.configure_ids_before_graphs")


@lru_cache(maxsize=None)
def model(version: str, name: str) -> Model:
    return load_model(resolve_target(str(release_package(version))), name)


def patched_copy(release_copy, version: str, names: tuple[str, ...] = (), runner: bool = True) -> Path:
    """A private copy of ``version`` after ``patchcraft apply`` (whole tree unless ``names``)."""
    package = release_copy(version)
    write_changes(run(resolve_target(str(package)), Mode.APPLY, names, runner=runner).changes)
    return package


def kinds(result) -> set[str]:
    return {w.kind for w in result.warnings}


# -- the +1 rule ---------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.6", "0.5.10"])
def test_plus_one_rule_serves_the_next_state(version):
    result = explain(model(version, "deepseek_v2"), [2, 30, 58], KIMI_LAYERS)
    assert result.rule == "+1 rule"
    assert result.variant == "plain"
    assert result.layers_to_capture == (3, 31, 59)
    assert [(r.layer_id, r.value, r.state) for r in result.rows] == [(2, 3, 3), (30, 31, 31), (58, 59, 59)]
    assert result.served == (3, 31, 59)
    assert not result.patched
    assert result.setter.startswith("deepseek_v2.py:") and "DeepseekV2ForCausalLM" in result.setter


def test_no_ids_gives_the_defaults():
    result = explain(model("0.5.10", "deepseek_v2"), None, KIMI_LAYERS)
    assert result.layers_to_capture == (2, 30, 58)
    assert result.served == result.default_served == (2, 30, 58)


def test_minus_one_on_an_unpatched_install_is_flagged():
    result = explain(model("0.5.10", "deepseek_v2"), [-1, 2, 30], KIMI_LAYERS)
    assert result.layers_to_capture == (0, 3, 31)  # the +1 rule turns -1 into 0
    assert result.rows[0].value == 0
    # Running the code shows what the static reading cannot: `hidden_states + residual` at layer 0.
    assert result.source == "run"
    assert result.rows[0].note.startswith("crash: TypeError") and "deepseek_v2.py:" in result.rows[0].note
    assert "crash" in kinds(result) and result.served == ()
    static = explain(model("0.5.10", "deepseek_v2"), [-1, 2, 30], KIMI_LAYERS, run_code=False)
    assert "unknown statically" in static.rows[0].note and "unknown" in kinds(static)
    assert "embedding" in kinds(result)


def test_minus_one_on_a_patched_install_is_the_embedding(release_copy):
    package = patched_copy(release_copy, "0.5.10", ("deepseek_v2",), runner=False)
    result = explain(load_model(resolve_target(str(package)), "deepseek_v2"), [-1, 2, 30], KIMI_LAYERS)
    assert result.patched
    assert result.embedding and result.layers_to_capture == (3, 31)
    assert [(r.layer_id, r.value, r.state) for r in result.rows] == [(-1, None, 0), (2, 3, 3), (30, 31, 31)]
    assert result.served == (0, 3, 31)
    assert "embedding" not in kinds(result)
    # The runner was left alone: graph replays still get the defaults.
    assert "cuda-graph" in kinds(result)


# -- heuristics ------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.15", "0.5.20"])
def test_first_id_heuristic_keeps_ids_raw_unless_the_first_is_one(version):
    raw = explain(model(version, "deepseek_v2"), [2, 30, 58], KIMI_LAYERS)
    assert raw.variant == "first-id-heuristic"
    assert raw.layers_to_capture == (2, 30, 58) and raw.served == (2, 30, 58)
    # The setter's test is said with its value for these ids, never quoted as if it held.
    assert raw.rule == "ids kept raw (the setter's test `layer_ids and layer_ids[0] == 1` is false for these ids)"
    assert "heuristic" in kinds(raw)
    shifted = explain(model(version, "deepseek_v2"), [1, 30, 58], KIMI_LAYERS)
    assert shifted.layers_to_capture == (2, 31, 59)
    assert shifted.rule.startswith("+1 rule")
    assert not shifted.warnings
    assert any(
        "`layer_ids and layer_ids[0] == 1` is true for these ids, so the +1 rule applies" in n for n in shifted.notes
    )


def _setter_edited(release_copy, version: str, stem: str):
    """Only the init and setter edits; these tests read the setter's conversion (``run_code=False``).

    Run, such a half-patched file feeds no embedding: its forward has no capture for the flag.
    """
    package = release_copy(version)
    loaded = load_model(resolve_target(str(package)), stem)
    # Only the init and setter edits: the conversion does not depend on the forward.
    for site in (s for s in loaded.plan.sites if s.kind != "forward"):
        text = site.path.read_text(encoding="utf-8")
        patch = patch_text(text, site.path, [site])
        assert not patch.errors and patch.outcomes[site.key].status == "applied"
        site.path.write_text(patch.after, encoding="utf-8")
    return load_model(resolve_target(str(package)), stem)


def test_first_id_heuristic_after_the_setter_edit_means_plus_one_with_minus_one(release_copy):
    edited = _setter_edited(release_copy, "0.5.15", "deepseek_v2")
    # -1 exists only in the +1 convention: [2, 30] beside it are layer outputs, hs[3], hs[31],
    # although the release's test would keep [2, 30] raw on its own.
    result = explain(edited, [-1, 2, 30], KIMI_LAYERS, run_code=False)
    assert result.embedding and result.layers_to_capture == (3, 31)
    assert result.served == (0, 3, 31)
    assert "heuristic" not in kinds(result)
    assert any("one config one meaning" in n for n in result.notes)
    assert explain(edited, [-1, 0, 30], KIMI_LAYERS, run_code=False).served == (0, 1, 31)
    # Without -1, the release's own choice stands.
    assert explain(edited, [2, 30, 58], KIMI_LAYERS, run_code=False).served == (2, 30, 58)


@pytest.mark.parametrize("version", ["0.5.10", "0.5.15", "0.5.23"])
def test_a_config_for_0_5_10_serves_the_same_states_on_every_release(release_copy, version):
    """[-1, 2, 30] serves hs[0], hs[3], hs[31] on the +1-rule release and on the first-id-heuristic ones."""
    edited = _setter_edited(release_copy, version, "deepseek_v2")
    assert explain(edited, [-1, 2, 30], KIMI_LAYERS, run_code=False).served == (0, 3, 31)
    if version == "0.5.23":  # without -1, upstream's own choice: raw
        assert explain(edited, [2, 30, 58], KIMI_LAYERS, run_code=False).served == (2, 30, 58)


def test_max_heuristic_after_the_setter_edit_means_plus_one_with_minus_one(release_copy):
    edited = _setter_edited(release_copy, "0.5.20", "gpt_oss")
    assert explain(edited, [-1, 2, 30], KIMI_LAYERS, run_code=False).served == (0, 3, 31)
    # The test alone would keep [2, 30, 61] raw (61 = num_layers); with -1 they are +1.
    assert explain(edited, [-1, 2, 30, 61], KIMI_LAYERS, run_code=False).layers_to_capture == (3, 31, 62)
    assert explain(edited, [2, 30, 61], KIMI_LAYERS, run_code=False).served == (2, 30, 61)


def test_max_heuristic_keeps_ids_raw_when_the_last_layer_is_named():
    gpt_oss = model("0.5.20", "gpt_oss")
    raw = explain(gpt_oss, [2, 30, 61], KIMI_LAYERS)
    assert raw.variant == "max-heuristic"
    assert raw.layers_to_capture == (2, 30, 61)
    # gpt_oss captures boundaries 0..n (after each layer), so hs[61] is reachable.
    assert raw.served == (2, 30, 61)
    assert "heuristic" in kinds(raw) and "range" not in kinds(raw)
    assert explain(gpt_oss, [2, 30, 58], KIMI_LAYERS).layers_to_capture == (3, 31, 59)


# -- delegation and inner helpers -------------------------------------------------


def test_kimi_k25_delegates_to_deepseek():
    result = explain(model("0.5.10", "kimi_k25"), [2, 30, 58], KIMI_LAYERS)
    assert len(result.calls) == 2
    assert "KimiK25ForConditionalGeneration" in result.calls[0]
    assert result.calls[1].startswith("deepseek_v2.py:") and "DeepseekV2ForCausalLM" in result.calls[1]
    assert result.variant == "delegation"
    assert result.served == (3, 31, 59)


def test_mllama4_delegates_to_the_llama_setter():
    result = explain(model("0.5.10", "mllama4"), [2, 30, 44], 48)
    assert result.calls[0].startswith("mllama4.py:")
    assert result.calls[-1].startswith("llama.py:")
    assert result.served == (3, 31, 45)


def test_architecture_name_finds_an_inheriting_class():
    result = explain(model("0.5.10", "DeepseekV3ForCausalLM"), [2, 30, 58], KIMI_LAYERS)
    assert result.model == "deepseek_v2.DeepseekV3ForCausalLM"
    assert result.served == (3, 31, 59)


def test_inner_helper_raises_for_an_id_past_the_last_layer():
    qwen2_moe = model("0.5.10", "qwen2_moe")
    assert explain(qwen2_moe, [2, 30, 58], KIMI_LAYERS).served == (3, 31, 59)
    result = explain(qwen2_moe, [2, 30, 60], KIMI_LAYERS)
    assert "startup" in kinds(result)
    assert "IndexError" in result.warnings[0].message


# -- ranges, legacy, the runner ----------------------------------------------------


def test_an_id_past_the_last_layer_is_never_captured():
    result = explain(model("0.5.10", "deepseek_v2"), [2, 30, 60], KIMI_LAYERS)
    assert result.rows[-1].value == 61 and result.rows[-1].state is None
    assert result.served == (3, 31)
    assert "range" in kinds(result)


def test_duplicate_ids_are_captured_once():
    result = explain(model("0.5.10", "deepseek_v2"), [2, 2, 30], KIMI_LAYERS)
    assert result.served == (3, 31)
    assert "range" in kinds(result)


def test_legacy_setter_ignores_the_ids():
    result = explain(model("0.4.6", "llama"), [2, 30, 58], KIMI_LAYERS)
    assert "legacy" in kinds(result)
    assert result.served == (2, 30, 58)


def test_runner_resets_warn_that_cuda_graphs_capture_the_defaults():
    result = explain(model("0.5.10", "deepseek_v2"), [2, 30, 58], KIMI_LAYERS)
    assert {r.function for r in result.resets} == {"__init__", "_dummy_run"}
    warning = result.findings("cuda-graph")[0].message
    assert warning.startswith("CUDA-graph decode will capture the default layers (hs[2], hs[30], hs[58])")


@pytest.mark.skipif(RUNNER is None, reason="needs the runner transform (configure_ids_before_graphs)")
def test_patched_runner_clears_the_cuda_graph_warning(release_copy):
    package = patched_copy(release_copy, "0.5.10", ("kimi_k25", "runner"))
    assert runner_resets(resolve_target(str(package))) == ()
    result = explain(load_model(resolve_target(str(package)), "kimi_k25"), [-1, 2, 30], KIMI_LAYERS)
    assert result.served == (0, 3, 31)
    assert not result.warnings


# -- the setter is really executed ----------------------------------------------------


def test_a_mutated_setter_changes_the_answer(release_copy):
    """Proof that the release's code runs, not a pattern: +1 edited to +2 shows up."""
    package = release_copy("0.5.10")
    path = package / "srt" / "models" / "deepseek_v2.py"
    text = path.read_text(encoding="utf-8")
    assert text.count("[val + 1 for val in layer_ids]") == 1
    path.write_text(text.replace("[val + 1 for val in layer_ids]", "[val + 2 for val in layer_ids]"), encoding="utf-8")
    result = explain(load_model(resolve_target(str(package)), "deepseek_v2"), [2, 30, 58], KIMI_LAYERS)
    assert result.layers_to_capture == (4, 32, 60)
    assert result.rule == "another conversion"


def test_an_unknown_class_is_never_guessed_even_behind_hasattr(release_copy):
    """mllama4 asks `hasattr(self.language_model, ...)`: on a class outside the graph
    that must not silently read as "no setter" (a no-op that captures nothing)."""
    package = release_copy("0.5.10")
    path = package / "srt" / "models" / "mllama4.py"
    text = path.read_text(encoding="utf-8")
    assert text.count("self.language_model = Llama4ForCausalLM(") == 1
    path.write_text(
        text.replace("self.language_model = Llama4ForCausalLM(", "self.language_model = ExternalLanguageModel("),
        encoding="utf-8",
    )
    with pytest.raises(PatchcraftError, match="outside sglang/srt/models"):
        explain(load_model(resolve_target(str(package)), "mllama4"), [2, 30, 44], 48)


def test_a_setter_outside_the_model_graph_is_a_clear_error():
    with pytest.raises(PatchcraftError, match="cannot evaluate the setter statically"):
        explain(model("0.5.10", "mindspore"), [2, 30, 58], KIMI_LAYERS)


# -- the command -------------------------------------------------------------------


def test_cli_explains_and_exits_1_on_a_warning(capsys):
    package = str(release_package("0.5.10"))
    code, out, _ = cli(
        capsys, "explain", package, "--model", "kimi_k25", "--layer-ids", "2,30,58", "--num-layers", "61"
    )
    assert code == 1
    assert "hs[3], hs[31], hs[59]" in out
    assert "warning: CUDA-graph decode will capture the default layers" in out


def test_cli_exits_0_without_warnings_and_speaks_json(capsys):
    package = str(release_package("0.5.15"))
    code, out, _ = cli(
        capsys,
        "explain",
        package,
        "--model",
        "deepseek_v2",
        "--layer-ids",
        "1,30,58",
        "--num-layers",
        "61",
        "--format",
        "json",
    )
    assert code == 0
    document = json.loads(out)
    assert document["command"] == "explain"
    assert document["served"] == [2, 31, 59]
    assert [row["hs"] for row in document["ids"]] == [2, 31, 59]
    assert document["warnings"] == [] and document["exit_code"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layer-ids", "2,x", "--num-layers", "61", "--model", "deepseek_v2"], "expected comma-separated integers"),
        (["--layer-ids", "2,30", "--num-layers", "0", "--model", "deepseek_v2"], "--num-layers must be positive"),
        (
            ["--layer-ids", "2,30", "--num-layers", "61", "--model", "no_such_model"],
            "no model matches --model no_such_model: no model file no_such_model.py",
        ),
        (["--layer-ids", "2,30", "--num-layers", "61"], "pass --model NAME"),
        (["--layer-ids", "2,30", "--num-layers", "61", "--model", "llama", "--release", "0.5.10"], "not both"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(capsys, args, message):
    code, out, err = cli(capsys, "explain", str(release_package("0.5.10")), *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


# -- which boundaries a forward reaches ---------------------------------------------------


def test_capture_after_the_loop_reaches_the_last_layer_output():
    gemma = model("0.5.15", "gemma3_causal")
    result = explain(gemma, [2, 30, 60], KIMI_LAYERS)
    assert result.layers_to_capture == (3, 31, 61)
    assert result.served == (3, 31, 61)  # `num_layers in self.layers_to_capture` after the loop
    assert "range" not in kinds(result)


def test_boundary_zero_before_the_loop_is_an_uncloned_embedding():
    result = explain(model("0.5.20", "gpt_oss"), [-1, 2, 30], KIMI_LAYERS)
    assert result.layers_to_capture == (0, 3, 31)  # `self.start_layer in self.layers_to_capture`
    assert result.served == (0, 3, 31)
    assert "not a copy" in result.rows[0].note  # the run saw the embedding tensor itself appended
    assert result.outcome is not None and not result.outcome.fed[0].copy
    assert "embedding" in kinds(result)


def test_layer_marks_capture_at_the_top_and_no_capture_means_none():
    qwen2_moe = model("0.5.10", "qwen2_moe")
    holder = qwen2_moe.graph.classes[("qwen2_moe", "Qwen2MoeModel")]
    assert reachable(qwen2_moe.graph, holder, KIMI_LAYERS) == frozenset(range(KIMI_LAYERS))
    eagle = explain(model("0.5.10", "mistral_large_3_eagle"), [2, 30, 58], KIMI_LAYERS)
    assert eagle.served == ()
    assert "range" in kinds(eagle)


# -- advice only where it helps, and real class names ------------------------------------


def test_the_legacy_setter_never_sends_users_to_apply():
    result = explain(model("0.4.6", "llama"), [-1, 2, 30], 32)
    assert {"legacy", "embedding"} <= kinds(result)
    for warning in result.warnings:
        assert "run `patchcraft apply`" not in warning.message, warning.message
    assert "cannot" in " ".join(w.message for w in result.warnings if w.kind == "legacy")
    assert "`patchcraft apply` cannot help here" in result.findings("embedding")[0].message


@pytest.mark.parametrize("run_code", [True, False])
def test_an_unsupported_qwen3_5_on_a_patched_tree_names_its_class_and_no_apply(release_copy, run_code):
    package = patched_copy(release_copy, "0.5.15", ("qwen3_vl",), runner=False)
    qwen35 = load_model(resolve_target(str(package)), "qwen3_5.Qwen3_5ForConditionalGeneration")
    assert "qwen3_vl.py" in qwen35.patch_detail and qwen35.plan.unsupported
    result = explain(qwen35, [-1, 2, 20], 40, run_code=run_code)
    startup = result.findings("startup")
    assert startup and "not supported by Qwen3_5ForCausalLM" in startup[0].message
    text = " ".join(w.message for w in result.warnings)
    assert "StandIn" not in text
    assert "run `patchcraft apply`" not in text and "`patchcraft apply` cannot help here" in text


# -- read, run, compose: the harness runs only in run_harness ------------------------------


def test_the_explanation_runs_nothing_it_is_handed_what_ran(monkeypatch):
    deepseek = model("0.5.10", "deepseek_v2")
    reading = read_ids(deepseek, [-1, 2, 30], KIMI_LAYERS)

    def no_run(*args, **kwargs):
        raise AssertionError("explanation() ran the harness")

    monkeypatch.setattr(explain_module, "run_served", no_run)
    static = explanation(reading, NOT_RUN)
    assert static == explain(deepseek, [-1, 2, 30], KIMI_LAYERS, run_code=False)
    assert static.source == "static" and static.outcome is None
    assert "after `patchcraft apply`, these ids serve hs[0], hs[3], hs[31]" in static.notes


def test_run_harness_runs_the_ids_the_default_and_after_apply_only_where_asked():
    pytest.importorskip("torch")
    deepseek = model("0.5.10", "deepseek_v2")
    runs = run_harness(read_ids(deepseek, [-1, 2, 30], KIMI_LAYERS))
    assert runs.ids is not None and runs.ids.ran
    assert runs.default is not None  # 0.5.10's runner resets the ids before graph capture
    assert runs.after_apply is not None and runs.after_apply.states == (0, 3, 31)
    plain = run_harness(read_ids(model("0.5.23", "deepseek_v2"), [2, 30, 58], KIMI_LAYERS))
    assert plain.ids is not None and plain.default is None and plain.after_apply is None


def test_without_torch_nothing_runs(monkeypatch):
    import patchcraft.harness

    monkeypatch.setattr(patchcraft.harness, "torch_problem", lambda: "is not installed")
    # without torch its version is part of the run cache's key ("none"): a run kept with torch never answers
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    assert run_harness(read_ids(model("0.5.10", "deepseek_v2"), [2, 30, 58], KIMI_LAYERS)) == NOT_RUN


@pytest.mark.parametrize(
    ("tp", "num_layers", "message"),
    [(0, 61, "--tp must be positive, not 0"), (1, 0, "--num-layers must be positive, not 0")],
)
def test_the_reading_refuses_sizes_below_one(tp, num_layers, message):
    with pytest.raises(PatchcraftError, match=message):
        read_ids(model("0.5.10", "deepseek_v2"), [2], num_layers, tp=tp)


# -- plain words: what a user can act on (issue 32, item 8) -------------------------------


def test_the_setter_s_test_is_said_with_its_value_never_quoted_as_if_it_held():
    raw = explain(model("0.5.14", "deepseek_v2"), [2, 30, 58], KIMI_LAYERS)
    assert raw.rule == "ids kept raw (the setter's test `layer_ids and layer_ids[0] == 1` is false for these ids)"
    assert "is false for these ids, so it keeps them raw" in raw.findings("heuristic")[0].message
    shifted = explain(model("0.5.14", "deepseek_v2"), [1, 29, 57], KIMI_LAYERS)
    assert shifted.rule.endswith("is true for these ids)")


def test_id_minus_one_is_never_an_example_of_a_state():
    result = explain(model("0.5.14", "deepseek_v2"), [-1, 2, 30], KIMI_LAYERS)  # unpatched: -1 kept raw too
    text = " ".join(w.message for w in result.warnings) + " ".join(result.notes)
    assert "hs[-1]" not in text and "id 2 means hs[2]" in text


def test_the_fusion_mark_is_not_part_of_being_patched_for_minus_one():
    glm = model("0.5.18", "glm4_moe")
    assert glm.patch_detail == "not patched for -1: forward, init, setter edit missing"
    assert "fusion-mark" not in explain(glm, [1, 45, 88], 92).patch_detail


def test_a_draft_head_is_not_a_target_not_eagle_3_unavailable():
    head = model("0.5.10", "LlamaForCausalLMEagle3")
    assert head.patch_detail.startswith("not a target: llama_eagle3.LlamaForCausalLMEagle3 is an EAGLE-3 draft head")
    result = explain(head, [2, 15, 28], 32, run_code=False)
    assert not any("EAGLE-3 itself" in n for n in result.notes) and "EAGLE-3 itself" not in result.patch_detail


def test_the_fusion_cost_names_the_layers_that_lose_the_fused_kernel(capsys):
    deepseek = model("0.5.10", "deepseek_v2")
    assert explain(deepseek, [2, 30, 58], KIMI_LAYERS).fusion_cost is None  # TP 1: no fusion
    result = explain(deepseek, [2, 30, 58], KIMI_LAYERS, tp=8)
    assert result.fusion_cost is not None and result.fusion_cost.layers == (2, 30, 58)
    assert not result.fusion_cost.all_layers and "fusion" in kinds(result)
    off = explain(deepseek, [2, 30, 58], KIMI_LAYERS, tp=8, allreduce_fusion=False)
    assert off.fusion_cost is not None and off.fusion_cost.all_layers and len(off.fusion_cost.layers) == KIMI_LAYERS
    assert "fusion" not in kinds(off)  # the server reduces every layer: no partial sums
    qwen = explain(model("0.5.10", "qwen3_moe"), [2, 20, 37], 48, tp=8)  # its capture reads the reduced state
    assert qwen.fusion_cost is not None and qwen.fusion_cost.layers == ()
    args = ("explain", "--release", "0.5.10", "--model", "deepseek_v2", "--layer-ids", "2,30,58", "--num-layers", "61")
    code, out, err = cli(capsys, *args, "--tp", "8", "--format", "json")
    cost = json.loads(out)["fusion_cost"]
    assert cost["layers"] == [2, 30, 58] and cost["all_layers"] is False and "layers 2, 30, 58" in cost["text"]
    code, out, err = cli(capsys, *args, "--tp", "8", "--no-allreduce-fusion")
    assert "fusion cost: the server runs with --enforce-disable-flashinfer-allreduce-fusion: all 61 layers" in out + err
    assert "partial sums" not in out + err


def test_no_allreduce_fusion_on_a_release_without_the_flag_is_a_refused_start():
    result = explain(model("0.5.6", "deepseek_v2"), [2, 30, 58], KIMI_LAYERS, tp=8, allreduce_fusion=False)
    assert any("refuse to start" in w.message for w in result.findings("fusion"))
