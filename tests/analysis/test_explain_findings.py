"""analysis.explain_findings: the rows, warnings and notes, worded from the facts handed in (nothing read, nothing run)."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import pytest

from conftest import release_package
from patchcraft.analysis.explain_findings import Facts, Finding, IdRow, id_rows, judge
from patchcraft.analysis.target_model import Model, load_model, serve
from patchcraft.base.target import resolve_target
from patchcraft.reading.setter_sandbox import SetterRun

KIMI_LAYERS = 61
REACH = frozenset(range(8))


def setter_run(values: tuple[int, ...] | None, embedding: bool = False, takes_ids: bool = True) -> SetterRun:
    return SetterRun(values, embedding, None, (), takes_ids)


def test_each_id_is_paired_with_its_value_and_the_state_it_captures() -> None:
    rows = id_rows((1, 4, 9), setter_run((2, 5, 10)), REACH)
    assert rows == (
        IdRow(1, 2, 2, "output of layer 1"),
        IdRow(4, 5, 5, "output of layer 4"),
        IdRow(9, 10, None, "never captured"),
    )


def test_minus_one_as_the_embedding_flag_is_patchcrafts_capture() -> None:
    rows = id_rows((-1, 2), setter_run((3,), embedding=True), REACH)
    assert rows == (IdRow(-1, None, 0, "embedding output (patchcraft capture)"), IdRow(2, 3, 3, "output of layer 2"))


def test_layer_zero_is_unknown_statically_and_a_run_says_what_it_is() -> None:
    (row,) = id_rows((-1,), setter_run((0,)), REACH)
    assert (row.state, row.note) == (
        0,
        "embedding output if the capture at layer 0 survives residual None (unknown statically)",
    )
    served = pytest.importorskip("patchcraft.harness.served")
    copied = served.RunOutcome(fed=(served.Fed(0, True),))
    aliased = served.RunOutcome(fed=(served.Fed(0, False),))
    crashed = served.RunOutcome(crash="TypeError: residual is None", stage="forward")
    assert id_rows((-1,), setter_run((0,)), REACH, copied)[0].note == "embedding output, a copy"
    assert id_rows((-1,), setter_run((0,)), REACH, aliased)[0].note.startswith("embedding output, not a copy")
    assert id_rows((-1,), setter_run((0,)), REACH, crashed)[0] == IdRow(
        -1, 0, None, "crash: TypeError: residual is None"
    )


def test_no_rows_without_ids_without_values_or_when_the_counts_differ() -> None:
    assert id_rows(None, setter_run((2,)), REACH) == ()
    assert id_rows((1,), setter_run(None), REACH) == ()
    assert id_rows((1,), setter_run((2,), takes_ids=False), REACH) == ()
    assert id_rows((1, 2), setter_run((2, 3, 4)), REACH) == ()


def test_a_finding_prints_as_its_message() -> None:
    assert str(Finding("range", "id 70 is out of range")) == "id 70 is out of range"


@lru_cache(maxsize=None)
def model(version: str, name: str) -> Model:
    return load_model(resolve_target(str(release_package(version))), name)


def facts(ids: tuple[int, ...], **changes) -> Facts:
    deepseek = model("0.5.10", "deepseek_v2")
    static, default = serve(deepseek, ids, KIMI_LAYERS), serve(deepseek, None, KIMI_LAYERS)
    base = Facts(
        model=deepseek,
        ids=ids,
        run=static.run,
        rows=id_rows(ids, static.run, static.reachable),
        served=static,
        default=default,
        variant="plain",
        test="",
        rule="+1 rule",
        resets=(),
        num_layers=KIMI_LAYERS,
        states=static.states,
        default_states=default.states,
    )
    return replace(base, **changes)


def test_what_apply_would_serve_is_said_only_from_the_reading_handed_in() -> None:
    deepseek = model("0.5.10", "deepseek_v2")
    without = facts((-1, 2, 30))
    warnings, notes = judge(without)
    assert [w.kind for w in warnings] == ["unknown", "embedding"]
    assert not any(n.startswith("after `patchcraft apply`") for n in notes)
    after = serve(deepseek, (-1, 2, 30), KIMI_LAYERS, after_apply=True)
    _, notes = judge(replace(without, after_static=after))
    assert "after `patchcraft apply`, these ids serve hs[0], hs[3], hs[31]" in notes
    assert notes[-2:] == [
        "static reading: the served states are read from the code by rules (with torch, the code is run instead)",
        "assumes one pipeline stage (setters return early on all but the last one)",
    ]


def test_ids_in_range_on_a_plain_setter_warn_of_nothing() -> None:
    warnings, notes = judge(facts((2, 30, 58)))
    assert warnings == []
    assert len(notes) == 2
