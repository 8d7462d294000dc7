"""patching.py: ``patch_text``, ``revert_text`` and ``compiles`` on real model files, in memory.

Patch then revert gives the bytes back, a second patch changes nothing,
and a syntax error or a missing anchor is an error with the documented
message, never a half-edited text taken for a good one.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from conftest import release_package
from patchcraft import MARKER
from patchcraft.base.errors import PatchcraftError
from patchcraft.reading.class_graph import ModelGraph
from patchcraft.planning.records import EditSite
from patchcraft.engine.file_patch import compiles, patch_text, revert_text
from patchcraft.planning.model_plans import plan_model
from patchcraft.base.sources import Source
from patchcraft.base.status import EDIT_IN_PLACE, EditStatus

#: Plain +1 with all three sites in one file; an inner helper; the preallocating packer.
MODELS = [
    ("0.5.10", "llama", "LlamaForCausalLM"),
    ("0.5.10", "qwen2_moe", "Qwen2MoeForCausalLM"),
    ("0.5.20", "deepseek_v2", "DeepseekV2ForCausalLM"),
]


@functools.lru_cache(maxsize=None)
def _model(version: str, module: str, cls: str) -> tuple[Path, str, tuple[EditSite, ...], str]:
    """The file, its text, the model's sites in it and the patched text."""
    path = release_package(version) / "srt" / "models" / f"{module}.py"
    graph = ModelGraph(models_dir=path.parent)
    graph.load(module)
    plan = plan_model(graph, graph.classes[(module, cls)])
    assert not plan.unsupported, plan.unsupported
    sites = tuple(s for s in plan.sites if s.path == path)
    text = path.read_text(encoding="utf-8")
    return path, text, sites, patch_text(text, path, sites).after


@pytest.mark.parametrize("model", MODELS, ids=lambda m: f"{m[0]}-{m[1]}")
def test_patch_then_revert_gives_the_same_bytes(model: tuple[str, str, str]) -> None:
    path, text, sites, patched = _model(*model)
    assert patched != text and MARKER in patched and {s.kind for s in sites} == {"setter", "init", "forward"}
    assert revert_text(patched, path).encode("utf-8") == text.encode("utf-8")


@pytest.mark.parametrize("model", MODELS, ids=lambda m: f"{m[0]}-{m[1]}")
def test_a_second_patch_changes_nothing_and_finds_every_edit_in_place(model: tuple[str, str, str]) -> None:
    path, _, sites, patched = _model(*model)
    again = patch_text(patched, path, sites)
    assert again.after is patched and again.errors == {}  # the text itself: libcst never printed it back
    assert {o.status for o in again.outcomes.values()} <= EDIT_IN_PLACE and len(again.outcomes) == len(sites)


def test_a_first_patch_reports_each_site_applied() -> None:
    path, text, sites, _ = _model(*MODELS[0])
    patch = patch_text(text, path, sites)
    assert patch.errors == {} and [patch.outcomes[s.key].status for s in sites] == [EditStatus.APPLIED] * 3


def test_patched_and_pristine_texts_compile_and_a_broken_one_does_not() -> None:
    path, text, _, patched = _model(*MODELS[0])
    assert compiles(Source(path=path, text=text)) and compiles(Source(path=path, text=patched))
    assert not compiles(Source(path=path, text=text.replace("class LlamaModel(", "class LlamaModel((", 1)))


def _broken_in_inner_forward(text: str) -> tuple[str, int]:
    """``x = = 1`` just above ``LlamaModel.forward``: (text, line of the error)."""
    at = text.index("    def forward", text.index("class LlamaModel"))
    return text[:at] + "    x = = 1\n" + text[at:], text[:at].count("\n") + 1


def test_a_syntax_error_raises_with_its_line_and_no_text() -> None:
    path, text, sites, _ = _model(*MODELS[0])
    broken, line = _broken_in_inner_forward(text)
    with pytest.raises(PatchcraftError) as info:
        patch_text(broken, path, sites)
    assert str(info.value) == f"{path}: syntax error at line {line}: invalid syntax; nothing was changed"


def test_reverting_a_patched_file_with_a_syntax_error_raises_too() -> None:
    path, _, _, patched = _model(*MODELS[0])
    broken, _ = _broken_in_inner_forward(patched)
    with pytest.raises(PatchcraftError, match=r"^.*llama\.py: syntax error at line \d+: .*; nothing was changed$"):
        revert_text(broken, path)


def test_a_syntax_error_found_by_libcst_names_the_line_it_is_on() -> None:
    with pytest.raises(PatchcraftError, match="^m.py: syntax error at line 2: invalid syntax; nothing was changed$"):
        revert_text(f"a = 1  # {MARKER}\nx = = 1\nb = 2\n", Path("m.py"))


def test_reverting_a_file_patchcraft_never_touched_returns_it_as_is() -> None:
    path, text, _, _ = _model(*MODELS[0])
    assert revert_text(text, path) is text


def test_a_missing_anchor_is_that_sites_error_and_the_file_is_left_untouched() -> None:
    path, text, sites, _ = _model(*MODELS[0])
    assert text.count("self.layers_to_capture = []") == 1
    patch = patch_text(text.replace("self.layers_to_capture = []", "self.other = []"), path, sites)
    init = next(s for s in sites if s.kind == "init")
    assert patch.errors == {
        init.key: f"{path}: LlamaModel.__init__: expected `self.layers_to_capture = []` in __init__; file left untouched"
    }
    assert init.key not in patch.outcomes


def test_an_ambiguous_class_is_an_error_for_each_of_its_sites() -> None:
    path, text, sites, _ = _model(*MODELS[0])
    patch = patch_text(text + "\n\nclass LlamaModel:\n    pass\n", path, sites)
    message = f"{path}: LlamaModel.{{}}: expected exactly one top-level class LlamaModel, found 2; file left untouched"
    assert sorted(patch.errors.values()) == [message.format("__init__"), message.format("forward")]
