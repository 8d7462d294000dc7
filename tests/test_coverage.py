"""The coverage matrix: every EAGLE-3 model class of each release is patched or justly unsupported.

Reuses the session's apply/verify runs of tests/engine/test_golden.py (one
per release, tests/applied_releases.py), so this adds next to no time:

- each release has the number of files defining the setter the issue
  names, and every class defining it is a model row or a class one of
  the rows edits (no silent gaps);
- the unsupported models are exactly the justified set below, each with
  its justification in docs/coverage.md, and no model ends in ``error``
  (in the JSON document ``verify --format json`` prints, too);
- docs/coverage.md is what scripts/coverage_table.py generates.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tools import coverage
from patchcraft.ui import machine_output
from patchcraft.base.releases import BETWEEN, MATRIX
from patchcraft.base.status import ModelStatus

from applied_releases import GROUP, applied, on_one_worker
from conftest import release_package

ROOT = Path(__file__).resolve().parent.parent
SETTER = "set_eagle3_layers_to_capture"

#: Files defining the setter, per release (the issue's 1, 4, 8, 13, 18, 24, 27, 29).
SETTER_FILES = {
    "0.4.6": 1,
    "0.4.10": 4,
    "0.5.2": 8,
    "0.5.6": 13,
    "0.5.10": 18,
    "0.5.15": 24,
    "0.5.20": 27,
    "0.5.23": 29,
}

#: EAGLE and NextN/MTP draft modules: they inherit a target's setter, but their inner model
#: captures nothing (EAGLE-3 itself does not apply to them).
_DRAFTS_0_4 = {"llama_eagle.LlamaForCausalLMEagle", "llama_eagle3.LlamaForCausalLMEagle3"}
_DRAFTS_0_5_2 = _DRAFTS_0_4 | {"qwen2_eagle.Qwen2ForCausalLMEagle"}
_DRAFTS_0_5_6 = _DRAFTS_0_5_2 | {
    "deepseek_nextn.DeepseekV3ForCausalLMNextN",
    "glm4_moe_nextn.Glm4MoeForCausalLMNextN",
    "longcat_flash_nextn.LongcatFlashForCausalLMNextN",
}
_DRAFTS_0_5_13 = _DRAFTS_0_5_6 | {
    "glm4_moe_lite_nextn.Glm4MoeLiteForCausalLMNextN",
    "mistral_eagle.MistralForCausalLMEagle",
}
_DRAFTS_0_5_18 = _DRAFTS_0_5_13 | {"glm4_moe.GlmMoeDsaForCausalLMNextN"}
_DRAFTS_0_5_20 = _DRAFTS_0_5_18 | {"glm5_next_nextn.Glm5NextForConditionalGenerationNextN"}
#: The inner model of MindSporeForCausalLM comes from MindSpore's own registry at run time.
_MINDSPORE = {"mindspore.MindSporeForCausalLM"}
#: 0.5.13-0.5.20: the Qwen3-VL setter never flags the layers the Qwen3.5 body's forward captures.
_UNFLAGGED_0_5_13 = {
    "qwen3_5.Qwen3_5ForConditionalGeneration",
    "qwen3_5.Qwen3_5MoeForConditionalGeneration",
    "interns2preview.InternS2PreviewForConditionalGeneration",
}
_UNFLAGGED_0_5_18 = _UNFLAGGED_0_5_13 | {"interns2_mobius.InternS2MobiusForConditionalGeneration"}
_UNFLAGGED_0_5_20 = _UNFLAGGED_0_5_18 | {"qwen4_exp.Qwen4ExpForConditionalGeneration"}
#: The only models patchcraft may leave unsupported, per release (reasons: docs/coverage.md).
EXPECTED_UNSUPPORTED = {
    "0.4.6": {"llama.LlamaForCausalLM"},  # legacy setter without ids
    "0.4.10": _DRAFTS_0_4,
    # GLM-4.1V: the Qwen2.5-VL setter, but a GLM-4 inner model without any capture
    "0.5.2": _DRAFTS_0_5_2 | {"glm4v.Glm4vForConditionalGeneration", "glm4v_moe.Glm4vMoeForConditionalGeneration"},
    "0.5.6": _DRAFTS_0_5_6,
    "0.5.10": _DRAFTS_0_5_6 | _MINDSPORE,
    "0.5.13": _DRAFTS_0_5_13 | _MINDSPORE | _UNFLAGGED_0_5_13,
    "0.5.15": _DRAFTS_0_5_13 | _MINDSPORE | _UNFLAGGED_0_5_13,
    "0.5.18": _DRAFTS_0_5_18 | _MINDSPORE | _UNFLAGGED_0_5_18,
    "0.5.20": _DRAFTS_0_5_20 | _MINDSPORE | _UNFLAGGED_0_5_20,
    "0.5.23": _DRAFTS_0_5_20 | _MINDSPORE | {"qwen4_exp.Qwen4ExpForConditionalGeneration"},
}
ALL = MATRIX + BETWEEN


def setter_classes(version: str) -> dict[str, set[str]]:
    """``{file stem: {classes defining the setter}}`` in the pristine release."""
    found: dict[str, set[str]] = {}
    for path in sorted((release_package(version) / "srt" / "models").glob("*.py")):
        data = path.read_bytes()
        if f"def {SETTER}".encode() not in data:
            continue
        tree = ast.parse(data.decode("utf-8-sig"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                isinstance(f, ast.FunctionDef) and f.name == SETTER for f in node.body
            ):
                found.setdefault(path.stem, set()).add(node.name)
    return found


@pytest.mark.parametrize("version", MATRIX)
def test_matrix_has_the_setter_files_the_issue_names(version: str) -> None:
    assert len(setter_classes(version)) == SETTER_FILES[version]


@pytest.mark.parametrize("version", [on_one_worker(v) for v in ALL])
def test_no_silent_gaps(version: str, session_tmp: Path) -> None:
    """Every class defining the setter is a model row, or a class a row edits (an inner helper)."""
    models = applied(version, session_tmp).verify.models
    rows = {m.model for m in models}
    edited = {(Path(e.file).stem, e.cls) for m in models for e in m.edits}
    missing = [
        f"{stem}.{cls}"
        for stem, classes in setter_classes(version).items()
        for cls in classes
        if f"{stem}.{cls}" not in rows and (stem, cls) not in edited
    ]
    assert not missing


@pytest.mark.parametrize("version", [on_one_worker(v) for v in ALL])
def test_unsupported_is_exactly_the_justified_set(version: str, session_tmp: Path) -> None:
    models = applied(version, session_tmp).verify.models
    # not-applicable rows (drafts, NextN heads) are listed here too: neither is patched.
    unsupported = {
        m.model: m.message for m in models if m.status in (ModelStatus.UNSUPPORTED, ModelStatus.NOT_APPLICABLE)
    }
    assert set(unsupported) == EXPECTED_UNSUPPORTED[version]
    page = (ROOT / "docs" / "coverage.md").read_text(encoding="utf-8")
    for model, reason in unsupported.items():
        justification = coverage.justification(reason)
        assert justification, f"{model}: no justification in scripts/coverage_table.py for: {reason}"
        assert justification in page and reason in page


@pytest.mark.parametrize("version", [on_one_worker(v) for v in ALL])
def test_verify_json_lists_every_model_and_no_error(version: str, session_tmp: Path) -> None:
    state = applied(version, session_tmp)
    document = machine_output.to_json([state.verify], machine_output.exit_code([state.verify]))
    statuses = {m["model"]: m["status"] for m in document["models"]}
    assert set(statuses) == {m.model for m in state.first.models}
    assert ModelStatus.ERROR not in statuses.values()
    assert set(statuses.values()) <= {"already-patched", ModelStatus.UNSUPPORTED, ModelStatus.NOT_APPLICABLE}
    for entry in document["models"]:
        if entry["status"] not in (ModelStatus.UNSUPPORTED, ModelStatus.NOT_APPLICABLE):
            assert entry["files"] and all(f.startswith("sglang/srt/models/") for f in entry["files"])


@pytest.mark.xdist_group(GROUP)  # it reads every release's applied state: the worker that holds them
def test_coverage_page_is_generated(session_tmp: Path) -> None:
    def cov(version: str):
        state = applied(version, session_tmp)
        return coverage.coverage(version, state.first, state.verify)

    text = coverage.render([cov(v) for v in MATRIX], [cov(v) for v in BETWEEN])
    page = ROOT / "docs" / "coverage.md"
    assert page.read_text(encoding="utf-8") == text, "docs/coverage.md is stale: run python scripts/coverage_table.py"


def test_both_generators_keep_each_others_part(tmp_path: Path) -> None:
    """scripts/coverage_table.py keeps the release history scripts/sweep.py writes, and the other way round."""
    from tools.sweep import END, START, history_rows, split_page, write_history

    page = (ROOT / "docs" / "coverage.md").read_text(encoding="utf-8")
    _, section, after = split_page(page)
    assert section and section.startswith(START) and section.rstrip().endswith(END) and after == ""
    assert page.count(START) == 1 and coverage.history() == section
    # coverage_table.render puts the section it is given at the end, the one on the page by default
    assert coverage.render([], [], history_section=section).endswith("\n" + section)
    assert coverage.render([], []) == coverage.render([], [], history_section=section)
    # the sweep rewrites the section and nothing else; rewriting with no new rows changes nothing
    copy = tmp_path / "coverage.md"
    copy.write_text(page, encoding="utf-8")
    write_history(copy, [])
    assert copy.read_text(encoding="utf-8") == page
    # a page without the section (as coverage_table wrote it before any sweep) gets it appended
    bare = coverage.render([], [], history_section="")
    copy.write_text(bare, encoding="utf-8")
    write_history(copy, [])
    written = copy.read_text(encoding="utf-8")
    assert written.startswith(bare) and history_rows(written) == {}
    assert coverage.render([], [], history_section=split_page(written)[1]) == written
