"""patchcraft.ui.vllm_explain_text: the text and the JSON of ``explain --engine vllm`` from its record."""

from __future__ import annotations

import json

from patchcraft.analysis.vllm_explain import Finding, FindingKind, IdAlone, VllmExplanation
from patchcraft.reading.vllm_runner import EAGLE_CONFIG, TOP_LEVEL, Gate, RunnerIds
from patchcraft.ui.vllm_explain_text import vllm_explanation_json, vllm_explanation_text

RESULT = VllmExplanation(
    version="0.18.0",
    package="/x/vllm",
    model="llama.LlamaForCausalLM",
    model_type="llama",
    num_layers=6,
    layer_ids=(0, 2, 3),
    gate=Gate(("llama", "qwen"), "config/speculative.py:780"),
    runners=(
        RunnerIds("old runner a.py", True, "a.py:1", "get_x", ((TOP_LEVEL, (0, 2, 3)), (EAGLE_CONFIG, None))),
        RunnerIds("V2 runner b.py", False, "", "get_y"),
    ),
    defaults=(2, 3, 3),
    served_ids=(0, 2, 3),
    fed="hs[0] (not a copy), hs[2], hs[3]",
    fed_states=(0, 2, 3),
    alone=(IdAlone(0, "hs[0] (not a copy)", (0,), False, ""),),
    findings=(Finding(FindingKind.ALIAS, "entry 0 is the embedding"),),
    ran=True,
    notes=(Finding(FindingKind.PLACE, "no runner reads eagle_config"),),
)


def test_text() -> None:
    text = vllm_explanation_text(RESULT)
    assert "'llama': admitted" in text
    assert "old runner a.py [default]: a.py:1; top-level eagle_aux_hidden_state_layer_ids: [0, 2, 3]" in text
    assert "eagle_config.eagle_aux_hidden_state_layer_ids: not read" in text
    assert "V2 runner b.py: never reads the draft's ids" in text
    assert "vLLM feeds the draft (ids [0, 2, 3] set by the old runner a.py): hs[0] (not a copy)" in text
    assert text.endswith("warning: entry 0 is the embedding\nnote: no runner reads eagle_config\n")


def test_json() -> None:
    document = json.loads(json.dumps(vllm_explanation_json(RESULT, 1)))
    assert document["engine"] == "vllm" and document["exit_code"] == 1
    assert document["runners"][0]["reads"] == {TOP_LEVEL: [0, 2, 3], EAGLE_CONFIG: None}
    assert document["runners"][1]["function"] is None
    assert document["warnings"] == [{"kind": "alias", "text": "entry 0 is the embedding"}]
    assert document["gate"] == {"names": ["llama", "qwen"], "where": "config/speculative.py:780", "admits": True}


def test_a_wrapper_is_named_with_its_line() -> None:
    from dataclasses import replace

    text = vllm_explanation_text(replace(RESULT, via="kimi_k25.py:376 KimiK25ForConditionalGeneration"))
    assert "llama.LlamaForCausalLM, the language model of KimiK25ForConditionalGeneration (kimi_k25.py:376)" in text
    assert vllm_explanation_json(replace(RESULT, via="x.py:1 W"), 0)["via"] == "x.py:1 W"
    assert vllm_explanation_json(RESULT, 0)["via"] is None
