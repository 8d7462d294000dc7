"""Every suggestion proven: check-draft offers a fix only once the whole check passes with it applied.

The fast slice of the fix grid (tests/fix_grid.py; the whole grid is
tests/analysis/test_fixes_grid.py, full tier), and the cases of issue 32:
GLM-4.5 at TP 8 told "no patch needed" while its fusion check fails, a
portability claim made for a list that keeps each release's rule, and
``--trained-on speculators`` whose training states moved with the config
it was asked to fix.
"""

from __future__ import annotations

import json

import pytest

from conftest import release_package
from drafts import kimi_target, sglang_draft, speculators_draft
from fix_grid import (
    CUDA_GRAPH_FLAG,
    FUSION_FLAG,
    Cell,
    applied,
    check,
    fix_lines,
    parse_fix,
    pristine,
    run_cell,
    served_after_apply,
)
from patchcraft.analysis.draft_check import check_draft
from patchcraft.reading.draft_config import read_draft, read_target
from patchcraft.analysis.target_model import load_model
from patchcraft.analysis.training import parse_training
from patchcraft.base.target import resolve_target

pytest.importorskip("torch")

GLM = Cell("0.5.18", "GLM-4-MoE", "outputs", "specforge", 8, True)  # [1, 45, 88] on a 92-layer GLM-4.5


def failed(report) -> list[str]:
    return [c.name for c in report.checks if c.ok is False]


# -- the fast slice of the grid ------------------------------------------------------------

SLICE = [
    GLM,
    Cell("0.5.18", "GLM-4-MoE", "with -1", "hf", 8, False),
    Cell("0.5.10", "DeepseekV2", "outputs", "speculators", 1, True),
    Cell("0.5.10", "DeepseekV2", "with -1", "specforge@0.5.6", 8, True),
    Cell("0.5.18", "gpt-oss", "with -1", "hf", 1, True),
]


@pytest.mark.parametrize("cell", SLICE, ids=str)
def test_every_printed_fix_applied_as_printed_passes(cell, tmp_path):
    run_cell(cell, tmp_path)


# -- GLM-4.5 [1, 45, 88] on 0.5.18 at TP 8 ----------------------------------------------------


def test_glm_at_tp_8_is_never_told_no_patch_is_needed(tmp_path):
    report = check(GLM, tmp_path, [1, 45, 88], pristine("0.5.18", "glm4_moe.Glm4MoeForCausalLM"), "specforge")
    assert failed(report) == ["fusion"]
    first = fix_lines(report)[0]
    assert "no patch needed" not in first and "`patchcraft apply`" in first, report.suggestion_text
    assert report.fixes[0].after_apply and report.fixes[0].ids == (1, 45, 88)
    # The flag is the other way, proven too; never the ids alone.
    assert [(f.after_apply, f.flags) for f in report.fixes] == [(True, ()), (False, (FUSION_FLAG,))]


def test_a_list_without_minus_one_is_never_claimed_the_same_on_every_release(tmp_path):
    report = check(GLM, tmp_path, [1, 45, 88], pristine("0.5.18", "glm4_moe.Glm4MoeForCausalLM"), "specforge")
    assert "same on every release" not in report.suggestion_text
    assert "release-specific" in report.suggestion_text and "+1 rule" in report.suggestion_text
    assert not any(f.portable for f in report.fixes)


def test_the_claim_for_minus_one_after_apply_holds_on_the_releases_tried(tmp_path):
    cell = Cell("0.5.18", "GLM-4-MoE", "with -1", "hf", 1, True)
    claims = run_cell(cell, tmp_path)
    assert claims == [("GLM-4-MoE", (-1, 2, 45))]
    served = served_after_apply("GLM-4-MoE", (-1, 2, 45), ("0.5.10", "0.5.18"))
    assert set(served.values()) == {(0, 3, 46)}, served


# -- training states pinned ------------------------------------------------------------------

INCIDENT = [2, 30, 58]  # the Kimi config, trained on hs[0], hs[3], hs[31]


def kimi(version: str):
    return load_model(resolve_target(str(release_package(version))), "kimi_k25")


def kimi_check(tmp_path, model, ids, trained_on, name="draft", cuda_graph=True):
    draft = read_draft(sglang_draft(tmp_path / name, ids))
    target = read_target(kimi_target(tmp_path / "target"))
    return check_draft(model, draft, target, parse_training(trained_on), 61, cuda_graph=cuda_graph)


def test_following_a_speculators_suggestion_never_fails_again(tmp_path):
    report = kimi_check(tmp_path, kimi("0.5.10"), INCIDENT, "speculators")
    assert report.expected is not None and report.expected.states == (2, 30, 58)
    assert report.fixes, report.suggestion_text
    for index, line in enumerate(fix_lines(report)):
        action = parse_fix(line)
        # The ids change, so the states are pinned: from then on --trained-on names them.
        assert action.trained_on == "hf:2,30,58", line
        model = applied("0.5.10", "kimi_k25.KimiK25ForConditionalGeneration") if action.apply else kimi("0.5.10")
        again = kimi_check(
            tmp_path, model, list(action.ids), action.trained_on, f"fix{index}", CUDA_GRAPH_FLAG not in action.flags
        )
        assert again.ok, (line, [c.message for c in again.checks if c.ok is False])
        assert again.suggestion_text == ""


def test_a_convention_read_from_the_config_says_it_cannot_catch_a_wrong_config(tmp_path):
    report = kimi_check(tmp_path, kimi("0.5.13"), INCIDENT, "speculators")
    assert report.ok  # the config's own ids are the training states: the wrong config is not caught ...
    assert report.verdict == "ok: SGLang will feed the draft the states its config's ids say it was trained on"
    assert any("not caught" in note and "--trained-on hf:I,J,K" in note for note in report.training_notes)
    explicit = kimi_check(tmp_path, kimi("0.5.13"), INCIDENT, "hf:0,3,31")
    assert not explicit.ok and explicit.training_notes == ()  # ... the states themselves catch it


def test_minus_one_under_speculators_names_what_is_missing(tmp_path):
    report = kimi_check(tmp_path, kimi("0.5.10"), [-1, 2, 30], "speculators")
    assert "convention" in failed(report) and not report.fixes
    assert report.suggestion_text.startswith("no fix: the training states are not known")
    assert "--trained-on hf:I,J,K" in report.suggestion_text


def test_a_speculators_config_says_which_convention_was_assumed(tmp_path):
    draft = read_draft(speculators_draft(tmp_path / "draft", [0, 3, 31, 59]))
    target = read_target(kimi_target(tmp_path / "target"))
    report = check_draft(kimi("0.5.10"), draft, target, None, 61, cuda_graph=False)
    assert report.expected is not None and report.expected.states == (0, 3, 31)
    assert any("assumed" in note and "speculators_config" in note for note in report.training_notes)
    # eagle_config's ids are what the fix changes; the top-level ids, the training states, stay: nothing to pin.
    assert report.fixes and all(not f.trained_on for f in report.fixes)


# -- what the proof finds --------------------------------------------------------------------


def test_the_runner_left_unpatched_is_fixed_by_apply_or_the_flag_each_proven(tmp_path, release_copy):
    from patchcraft.engine.records import Mode
    from patchcraft.engine.tree_run import run, write_changes

    package = release_copy("0.5.10")
    write_changes(run(resolve_target(str(package)), Mode.APPLY, ("kimi_k25",), runner=False).changes)
    report = kimi_check(tmp_path, load_model(resolve_target(str(package)), "kimi_k25"), [-1, 2, 30], "hf:0,3,31")
    assert failed(report) == ["cuda-graph"]
    assert [(f.ids, f.after_apply, f.flags) for f in report.fixes] == [
        ((-1, 2, 30), True, ()),  # apply patches the runner too
        ((-1, 2, 30), False, (CUDA_GRAPH_FLAG,)),
    ]
    assert "keep eagle_config.eagle_aux_hidden_state_layer_ids = [-1, 2, 30] and run `patchcraft apply`" in (
        report.suggestion_text
    )


def test_when_no_fix_passes_each_way_says_what_blocks_it(tmp_path):
    # A draft for another target: its fc takes 2 states; no id list fixes a width.
    draft = read_draft(sglang_draft(tmp_path / "draft", INCIDENT, fc_in=2 * 7168))
    target = read_target(kimi_target(tmp_path / "target"))
    report = check_draft(kimi("0.5.10"), draft, target, parse_training("hf:0,3,31"), 61)
    assert not report.ok and not report.fixes and report.suggestion is None
    assert report.suggestion_text.startswith("no fix passes the whole check once applied")
    assert report.blocked and all("fc-width" in b.why for b in report.blocked if b.why.startswith(("fc", "run")))
    assert any(b.way == "[-1, 2, 30] after `patchcraft apply`" for b in report.blocked), report.blocked
    # One line per way: the first id list tried, the first failing check in full, the others by name.
    assert len(report.blocked) == 2 and report.blocked[0].others == 3, report.blocked
    assert "(also failing: fc-width" in report.blocked[0].why and "3 more id lists" in report.suggestion_text


def test_json_lists_each_fix_with_what_it_needs(tmp_path, capsys):
    from conftest import run_cli

    draft = sglang_draft(tmp_path / "draft", [1, 45, 88], fc_in=3 * 7168)
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"num_hidden_layers": 92, "hidden_size": 7168}))
    args = ["check-draft", str(draft), "--target", str(target), "--release", "0.5.18", "--model", "glm4_moe"]
    code, out, _ = run_cli(capsys, *args, "--trained-on", "specforge", "--tp", "8", "--format", "json")
    data = json.loads(out)
    assert code == 1
    assert [(f["after_apply"], f["flags"], f["same_on_every_release"]) for f in data["fixes"]] == [
        (True, [], False),
        (False, [FUSION_FLAG], False),
    ]
    assert data["suggested_after_apply"] is True and data["blocked"] == []
