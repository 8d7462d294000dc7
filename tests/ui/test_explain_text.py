"""ui.explain_text: explain's text from its record, byte for byte."""

from __future__ import annotations

from dataclasses import replace

import pytest

from patchcraft.analysis.explain import Explanation
from patchcraft.analysis.explain_findings import Finding, IdRow
from patchcraft.planning.runner_resets import RunnerReset
from patchcraft.ui.explain_text import explanation_text, fed_line, source_line

RESULT = Explanation(
    version="0.5.10",
    package="/tmp/sglang",
    model="deepseek_v2.DeepseekV2ForCausalLM",
    setter="deepseek_v2.py:2295 DeepseekV2ForCausalLM.set_eagle3_layers_to_capture",
    calls=("deepseek_v2.py:2295 DeepseekV2ForCausalLM.set_eagle3_layers_to_capture",),
    variant="plain",
    rule="+1 rule",
    patched=True,
    patch_detail="patched for -1",
    num_layers=61,
    layer_ids=(-1, 2),
    layers_to_capture=(3,),
    embedding=True,
    rows=(IdRow(-1, None, 0, "embedding output (patchcraft capture)"), IdRow(2, 3, 3, "output of layer 2")),
    served=(0, 3),
    default_served=(2, 30, 58),
    resets=(RunnerReset("sglang/srt/model_executor/cuda_graph_runner.py", 648, "__init__"),),
    warnings=(Finding("cuda-graph", "CUDA-graph decode will capture the default layers"),),
    notes=("assumes one pipeline stage",),
)


def test_the_text_has_the_header_one_row_per_id_the_fed_line_warnings_and_notes() -> None:
    assert explanation_text(RESULT) == (
        "sglang 0.5.10 at /tmp/sglang\n"
        "model    deepseek_v2.DeepseekV2ForCausalLM, 61 layers\n"
        "setter   deepseek_v2.py:2295 DeepseekV2ForCausalLM.set_eagle3_layers_to_capture\n"
        "rule     +1 rule\n"
        "install  patched for -1\n"
        "\n"
        "    id  layers_to_capture  captures\n"
        "    -1  (embedding flag)   hs[0]   embedding output (patchcraft capture)\n"
        "     2  3                  hs[3]   output of layer 2\n"
        "\n"
        "SGLang feeds the draft: hs[0], hs[3] (2 states, in layer order; static reading)\n"
        "warning: CUDA-graph decode will capture the default layers\n"
        "note: assumes one pipeline stage\n"
    )


def test_without_rows_the_values_are_printed_and_a_delegation_shows_each_call() -> None:
    result = replace(RESULT, rows=(), calls=("kimi_k25.py:10 A", "deepseek_v2.py:20 B"), served=(3,), warnings=())
    text = explanation_text(result)
    assert "setter   kimi_k25.py:10 A\n      -> deepseek_v2.py:20 B\n" in text
    assert "layers_to_capture = [3]\nSGLang feeds the draft: hs[3] (1 state, in layer order; static reading)\n" in text


def test_the_static_reading_says_unknown_where_it_cannot_tell() -> None:
    assert fed_line(replace(RESULT, static_unknown="layers_to_capture 0 ...")) == "unknown"
    assert source_line(RESULT) == "static reading"
    assert source_line(replace(RESULT, source="run")) == "by running the code on the CPU harness"


def test_a_run_names_each_state_fed() -> None:
    served = pytest.importorskip("patchcraft.harness.served")
    outcome = served.RunOutcome(fed=(served.Fed(0, False), served.Fed(3, True)))
    assert fed_line(replace(RESULT, outcome=outcome, source="run")) == served.fed_text(outcome)
