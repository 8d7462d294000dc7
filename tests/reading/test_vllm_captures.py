"""reading.vllm_captures: captures found by what they do, on real forwards (0.32.0, 0.33.0)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import vllm_release_package

from patchcraft.reading.vllm_captures import AFTER, ALIAS, BEFORE, COPY, CRASH, DROPPED, TOP, read_captures


def _forward(path: Path, cls: str) -> ast.FunctionDef:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return next(m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == "forward")
    raise AssertionError(cls)


def test_captures_before_the_loop_and_after_each_layer() -> None:
    path = vllm_release_package("0.32.0") / "model_executor" / "models" / "cohere2_moe.py"
    reading = read_captures(_forward(path, "Cohere2MoeModel"))
    assert [(c.place, c.line, c.id0) for c in reading.captures] == [(BEFORE, 442, ALIAS), (AFTER, 449, None)]
    assert reading.id0 == ALIAS


def test_each_kind_of_id_0() -> None:
    package = vllm_release_package("0.33.0")
    deepseek = read_captures(_forward(package / "model_executor" / "models" / "deepseek_v2.py", "DeepseekV2Model"))
    assert [(c.place, c.id0) for c in deepseek.captures] == [
        (TOP, CRASH)
    ]  # aux_hidden_state = hidden_states + residual
    minimax = read_captures(_forward(package / "models" / "minimax_m3" / "nvidia" / "model.py", "MiniMaxM3Model"))
    assert minimax.id0 == COPY  # aux_hidden_states[0] = aux_hidden_states[0].clone() after the mixin's capture
    v4 = read_captures(_forward(package / "models" / "deepseek_v4" / "cpu" / "model.py", "DeepseekV4Model"))
    assert v4.id0 == DROPPED and {c.place for c in v4.captures} == {AFTER}
