"""reading.capture_reading: which boundaries a forward captures, and what the setter that ran did with the ids.

Each case is a small model file read from source (no release): its setter
runs on stand-ins (reading.setter_sandbox), its forward is read by rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from patchcraft.reading.capture_reading import (
    conversion_rule,
    reachable,
    sets_marks,
    setter_variant,
    static_unknown,
)
from patchcraft.reading.class_graph import ModelGraph
from patchcraft.reading.setter_sandbox import SetterRun, run_setter

PLUS_ONE = """
        if layer_ids is None:
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
"""
FIRST_ID = """
        if layer_ids[0] == 1:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
        else:
            self.model.layers_to_capture = list(layer_ids)
"""


def model_file(forward: str, setter: str = PLUS_ONE, inner_setter: str = "") -> str:
    return f"""
class InnerModel:
    def __init__(self, config):
        self.layers_to_capture = []

    def forward(self, input_ids, positions):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
{forward}
        return hidden_states, aux_hidden_states
{inner_setter}

class Model:
    def __init__(self, config):
        self.model = InnerModel(config)

    def set_eagle3_layers_to_capture(self, layer_ids=None):
{setter}
"""


IN_LOOP_TOP = """
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, residual)
"""
AFTER_EACH = """
        for i in range(len(self.layers)):
            hidden_states, residual = self.layers[i](positions, hidden_states, residual)
            if i + 1 in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
"""
AFTER_THE_LOOP = (
    IN_LOOP_TOP
    + """
        if self.end_layer in self.layers_to_capture:
            aux_hidden_states.append(hidden_states + residual)
"""
)
MARKED = """
        for i in range(len(self.layers)):
            layer = self.layers[i]
            if layer._is_layer_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = layer(positions, hidden_states, residual)
"""
BARE = """
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states)
            hidden_states, residual = self.layers[i](positions, hidden_states, residual)
"""


def read(tmp_path: Path, text: str, ids: list[int] | None, num_layers: int = 8) -> tuple[ModelGraph, SetterRun]:
    graph = ModelGraph(models_dir=tmp_path)
    assert graph.load("m", text.encode("utf-8"))
    return graph, run_setter(graph, graph.classes[("m", "Model")], ids, num_layers)


@pytest.mark.parametrize(
    ("forward", "expected"),
    [(IN_LOOP_TOP, range(8)), (AFTER_EACH, range(1, 9)), (AFTER_THE_LOOP, range(9)), (MARKED, range(8))],
)
def test_each_capture_test_is_evaluated_over_the_layer_loop(tmp_path: Path, forward: str, expected: range) -> None:
    graph, run = read(tmp_path, model_file(forward), [1, 4])
    assert run.holder is not None and run.holder.label == "m.InnerModel"
    assert reachable(graph, run.holder, 8) == frozenset(expected)


def test_marks_reach_nothing_when_the_setter_that_ran_sets_none(tmp_path: Path) -> None:
    graph, run = read(tmp_path, model_file(MARKED), [1, 4])
    assert not sets_marks(run)
    assert reachable(graph, run.holder, 8, marks=sets_marks(run)) == frozenset()


def test_a_forward_that_never_captures_reaches_nothing_and_no_forward_is_the_loop_top(tmp_path: Path) -> None:
    graph, run = read(tmp_path, model_file("        pass"), [1, 4])
    assert reachable(graph, run.holder, 8) == frozenset()
    assert reachable(graph, None, 8) == frozenset(range(8))


def test_the_static_reading_says_where_it_cannot_tell(tmp_path: Path) -> None:
    graph, run = read(tmp_path, model_file(IN_LOOP_TOP), [-1, 4])
    assert run.layers_to_capture == (0, 5)
    assert static_unknown(graph, run, reachable(graph, run.holder, 8)).startswith(
        "layers_to_capture 0 is a capture at the top of layer 0"
    )
    graph, run = read(tmp_path, model_file(IN_LOOP_TOP), [1, 4])
    assert static_unknown(graph, run, reachable(graph, run.holder, 8)) == ""
    graph, run = read(tmp_path, model_file(BARE), [1, 4])
    assert "without the residual" in static_unknown(graph, run, reachable(graph, run.holder, 8))


def test_the_conversion_is_named_by_what_the_setter_set(tmp_path: Path) -> None:
    _, run = read(tmp_path, model_file(IN_LOOP_TOP), [1, 4])
    assert setter_variant(run) == ("plain", "")
    assert conversion_rule((1, 4), run, "") == "+1 rule"
    assert conversion_rule(None, run, "") == "no ids: the default layers"


def test_a_heuristic_setter_names_its_test(tmp_path: Path) -> None:
    _, raw = read(tmp_path, model_file(IN_LOOP_TOP, FIRST_ID), [2, 4])
    variant, test = setter_variant(raw)
    assert (variant, test) == ("first-id-heuristic", "layer_ids[0] == 1")
    assert conversion_rule((2, 4), raw, test) == "ids kept raw (heuristic `layer_ids[0] == 1`)"
    _, shifted = read(tmp_path, model_file(IN_LOOP_TOP, FIRST_ID), [1, 4])
    assert conversion_rule((1, 4), shifted, test) == "+1 rule (heuristic `layer_ids[0] == 1`)"


def test_a_setter_without_ids_always_sets_the_defaults(tmp_path: Path) -> None:
    legacy = "        self.model.layers_to_capture = [2, 4, 5]\n"
    text = model_file(IN_LOOP_TOP, legacy).replace("(self, layer_ids=None)", "(self)")
    _, run = read(tmp_path, text, [1, 4])
    assert not run.takes_ids and run.layers_to_capture == (2, 4, 5)
    assert setter_variant(run)[0] == "legacy"
    assert conversion_rule((1, 4), run, "") == "the setter takes no ids: always the default layers"
