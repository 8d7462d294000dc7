"""analysis.target_model: the model explained, its patch state, and the states it serves (read, or run)."""

from __future__ import annotations

from functools import lru_cache

import pytest

import patchcraft.harness
from conftest import release_package
from patchcraft.analysis.target_model import (
    Model,
    apply_helps,
    describe_state,
    hs,
    load_model,
    run_served,
    serve,
    states_text,
)
from patchcraft.base.target import resolve_target
from patchcraft.engine.records import Mode
from patchcraft.engine.tree_run import run, write_changes

KIMI_LAYERS = 61


@lru_cache(maxsize=None)
def model(version: str, name: str) -> Model:
    return load_model(resolve_target(str(release_package(version))), name)


def test_states_are_numbered_as_hugging_face_does() -> None:
    assert hs(0) == "hs[0]"
    assert [describe_state(i) for i in (0, 1, 31)] == ["embedding output", "output of layer 0", "output of layer 30"]
    assert states_text((0, 3, 31)) == "hs[0], hs[3], hs[31]"
    assert states_text(()) == "nothing"


def test_an_unpatched_install_says_which_edits_are_missing_and_holds_what_apply_writes() -> None:
    deepseek = model("0.5.10", "deepseek_v2")
    assert deepseek.label == "deepseek_v2.DeepseekV2ForCausalLM"
    assert not deepseek.patched
    assert deepseek.patch_detail == "not patched for -1: forward, init, setter edit missing"  # fusion-mark: TP > 1 only
    assert apply_helps(deepseek) and deepseek.patched_texts
    assert all(path.name == "deepseek_v2.py" for path in deepseek.patched_texts)


def test_a_patched_install_is_patched_and_apply_has_nothing_to_write(release_copy) -> None:
    package = release_copy("0.5.10")
    write_changes(run(resolve_target(str(package)), Mode.APPLY, ("deepseek_v2",), runner=False).changes)
    patched = load_model(resolve_target(str(package)), "deepseek_v2")
    assert (patched.patched, patched.patch_detail, patched.patched_texts) == (True, "patched for -1", {})
    assert not apply_helps(patched)
    assert patched.patched_graph() is patched.graph


def test_serve_reads_the_states_by_rules_before_and_after_apply() -> None:
    deepseek = model("0.5.10", "deepseek_v2")
    plain = serve(deepseek, [2, 30, 58], KIMI_LAYERS)
    assert plain.states == (3, 31, 59) and plain.unknown == "" and not plain.unsafe_embedding
    before = serve(deepseek, [-1, 2, 30], KIMI_LAYERS)
    assert before.run.layers_to_capture == (0, 3, 31) and before.unsafe_embedding
    assert before.unknown.startswith("layers_to_capture 0 is a capture at the top of layer 0")
    after = serve(deepseek, [-1, 2, 30], KIMI_LAYERS, after_apply=True)
    assert after.run.embedding and after.states == (0, 3, 31) and not after.unsafe_embedding
    assert serve(deepseek, None, KIMI_LAYERS).states == (2, 30, 58)


def test_run_served_is_none_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(patchcraft.harness, "torch_problem", lambda: "is not installed")
    # without torch its version is part of the run cache's key ("none"): a run kept with torch never answers
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    assert run_served(model("0.5.10", "deepseek_v2"), [2, 30, 58], KIMI_LAYERS) is None


def test_run_served_runs_the_installs_setter_and_forward() -> None:
    pytest.importorskip("torch")
    outcome = run_served(model("0.5.10", "deepseek_v2"), [2, 30, 58], KIMI_LAYERS)
    assert outcome is not None and outcome.ran and not outcome.crash
    assert outcome.states == (3, 31, 59)
