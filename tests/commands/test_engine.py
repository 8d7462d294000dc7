"""engine check's report (patchcraft/commands/engine.py): what ran, what it was fed, what explain said.

The runs themselves are the engine tier (tests/real_engine/test_vllm_engine.py, ``-m engine``); these tests
read the lines a result gives, with no engine.
"""

from __future__ import annotations

from patchcraft.commands.engine import outcome_lines
from patchcraft.real_engine.check import Case, Outcome, Prediction


def _outcome(result: dict) -> Outcome:
    case = Case(engine="vllm", release="0.32.0", model="DeepseekV4ForCausalLM", layer_ids=(0, 2, 4))
    prediction = Prediction(fed=("hs[2]", "hs[4]"), setting="cpu eager")
    return Outcome(case, result, prediction, True, "agree", "/env", "/tree", "the install")


def test_a_run_that_failed_before_reading_its_kernels_shows_no_kernel_line() -> None:
    failed = {
        "error": {"type": "RuntimeError", "message": "mat1 and mat2", "file": "vllm/x.py", "line": 1},
        "fed": [{"state": "hs[2]"}, {"state": "hs[4]"}],
        "standins": ["hash_topk_cpu"],
        "standin_kernels": ["hash_topk_cpu"],
    }
    lines = outcome_lines(_outcome(failed))
    assert not [line for line in lines if line.startswith("kernels")], lines
    assert any("1 stand-in CPU kernels" in line and "the real engine" not in line for line in lines), lines
    assert any(line.startswith("fed        hs[2], hs[4] (the draft's input before the failure") for line in lines)


def test_a_run_that_read_its_kernels_shows_them() -> None:
    ran = {"kernels": {"rms_norm": ["native"]}, "fed": [{"state": "hs[0]"}]}
    lines = outcome_lines(_outcome(ran))
    assert "kernels    {'rms_norm': ['native']}" in lines
    assert "the real engine" in lines[0]
