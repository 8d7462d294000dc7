"""Served states by running the code: the Kimi-K2.5 draft across releases, nothing captured, broken files.

The draft was trained on ``hf:0,3,31`` for a 61-layer target. On each
release check-draft must name the least invasive fix, proven by running
the release's own setter and forward on the CPU harness, and check-draft
must pass once that fix is applied (the ids set, and ``patchcraft apply``
run when the fix says so).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import release_package, run_cli as cli
from patchcraft.analysis.draft_check import check_draft
from patchcraft.reading.draft_config import read_draft, read_target
from patchcraft.analysis.training import parse_training
from patchcraft.engine.tree_run import run, write_changes
from patchcraft.analysis.explain import explain
from patchcraft.analysis.target_model import load_model
from patchcraft.analysis.fixes import Fix
from patchcraft.engine.records import Mode
from patchcraft.base.target import resolve_target
from drafts import HIDDEN, LAYERS, kimi_target, sglang_draft

pytest.importorskip("torch")

TRAINED = "hf:0,3,31"


def kimi_check(tmp_path: Path, package: Path, ids: list[int]):
    model = load_model(resolve_target(str(package)), "kimi_k25")
    draft = read_draft(sglang_draft(tmp_path / f"draft-{'_'.join(map(str, ids))}", ids))
    target = read_target(kimi_target(tmp_path / "target"))
    return check_draft(model, draft, target, parse_training(TRAINED), LAYERS)


def applied(release_copy, version: str) -> Path:
    package = release_copy(version)
    write_changes(run(resolve_target(str(package)), Mode.APPLY, ("kimi_k25", "runner")).changes)
    return package


def check_by_name(report, name: str):
    return next(c for c in report.checks if c.name == name)


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_native_ids_come_first_where_the_release_already_feeds_them(tmp_path, release_copy, version):
    report = kimi_check(tmp_path, release_package(version), [2, 30, 58])
    assert not report.ok
    assert report.fixes == (Fix((0, 3, 31), False, "run"), Fix((-1, 2, 30), True, "run"))
    first, *rest = report.suggestion_text.splitlines()
    assert "[0, 3, 31]" in first and "no patch needed" in first
    # Each fix says what it means elsewhere: the native ids keep this release's rule, -1 after apply does not.
    assert "[0, 3, 31] is release-specific" in rest[0] and "ids kept raw" in rest[0]
    assert "[-1, 2, 30]" in rest[1] and "after `patchcraft apply`" in rest[1]
    assert "[-1, 2, 30] after `patchcraft apply` means the same on every release" in rest[2]
    # The fix applied: the native ids on the install as it is.
    fixed = kimi_check(tmp_path, release_package(version), [0, 3, 31])
    assert fixed.ok, fixed.verdict
    assert check_by_name(fixed, "run").ok and fixed.explanation.outcome.fed[0].copy
    # The other way holds too: -1 after apply.
    assert kimi_check(tmp_path, applied(release_copy, version), [-1, 2, 30]).ok


def test_native_ids_crash_on_0_5_13_at_layer_0(tmp_path, release_copy):
    report = kimi_check(tmp_path, release_package("0.5.13"), [0, 3, 31])
    run_check = check_by_name(report, "run")
    assert run_check.ok is False
    assert "TypeError" in run_check.message and "deepseek_v2.py:2453 in forward" in run_check.message
    assert report.verdict == run_check.message
    assert "range" not in {w.kind for w in report.explanation.warnings}  # a crash, not an id out of range
    assert report.fixes == (Fix((-1, 2, 30), True, "run"),)
    assert "[-1, 2, 30] after `patchcraft apply`" in report.suggestion_text
    assert kimi_check(tmp_path, applied(release_copy, "0.5.13"), [-1, 2, 30]).ok


def test_0_5_10_needs_the_patch(tmp_path, release_copy):
    report = kimi_check(tmp_path, release_package("0.5.10"), [2, 30, 58])
    assert report.fixes == (Fix((-1, 2, 30), True, "run"),)
    assert "release-specific" not in report.suggestion_text
    fixed = kimi_check(tmp_path, applied(release_copy, "0.5.10"), [-1, 2, 30])
    assert fixed.ok, fixed.verdict


def test_json_lists_every_fix(tmp_path, capsys):
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58])
    target = kimi_target(tmp_path / "target")
    code, out, _ = cli(
        capsys,
        "check-draft",
        str(draft),
        "--target",
        str(target),
        "--trained-on",
        TRAINED,
        "--release",
        "0.5.23",
        "--format",
        "json",
    )
    data = json.loads(out)
    assert code == 1
    assert [
        {k: f[k] for k in ("ids", "after_apply", "proof", "flags", "same_on_every_release")} for f in data["fixes"]
    ] == [
        {"ids": [0, 3, 31], "after_apply": False, "proof": "run", "flags": [], "same_on_every_release": False},
        {"ids": [-1, 2, 30], "after_apply": True, "proof": "run", "flags": [], "same_on_every_release": True},
    ]
    assert data["suggested_ids"] == [0, 3, 31] and data["suggested_after_apply"] is False
    assert data["explain"]["served_source"] == "run"
    assert data["explain"]["run"]["fed"][0] == {"hs": 2, "copy": True, "what": ""}


# -- nothing captured ----------------------------------------------------------------

QWEN35 = "qwen3_5.Qwen3_5ForConditionalGeneration"


@pytest.mark.parametrize("version", ["0.5.12", "0.5.15", "0.5.21"])
def test_a_forward_that_captures_nothing_never_passes(tmp_path, capsys, version):
    model = load_model(resolve_target(str(release_package(version))), QWEN35)
    result = explain(model, [2, 20, 37], 40)
    assert result.served == () and result.outcome is not None and result.outcome.nothing
    assert "nothing" in {w.kind for w in result.warnings}
    static = explain(model, [2, 20, 37], 40, run_code=False)
    assert static.served == ()  # the static reading: the EAGLE-3 setter sets no layer mark
    draft = sglang_draft(tmp_path / "draft", [2, 20, 37], fc_in=3 * HIDDEN)
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen3_5ForConditionalGeneration"],
                "text_config": {"num_hidden_layers": 40, "hidden_size": HIDDEN},
            }
        )
    )
    code, out, _ = cli(
        capsys, "check-draft", str(draft), "--target", str(target), "--release", version, "--model", QWEN35
    )
    assert code == 1
    assert "FAIL  run          nothing is captured" in out
    code, out, _ = cli(
        capsys, "explain", "--release", version, "--model", QWEN35, "--layer-ids", "2,20,37", "--num-layers", "40"
    )
    assert code == 1 and "SGLang feeds the draft: nothing" in out and "nothing is captured" in out


# -- the verdict follows the code: broken and mended copies of 0.5.13 --------------------

CAPTURE_0_5_13 = "                        aux_hidden_states.append(hidden_states + residual)\n"


def mutated(release_copy, replacement: str) -> Path:
    package = release_copy("0.5.13")
    path = package / "srt" / "models" / "deepseek_v2.py"
    text = path.read_text(encoding="utf-8")
    assert text.count(CAPTURE_0_5_13) == 1
    path.write_text(text.replace(CAPTURE_0_5_13, replacement), encoding="utf-8")
    return package


def test_an_uncloned_layer_zero_capture_fails_and_is_never_suggested(tmp_path, release_copy):
    package = mutated(
        release_copy,
        "                        aux_hidden_states.append(hidden_states if residual is None else hidden_states + residual)\n",
    )
    report = kimi_check(tmp_path, package, [0, 3, 31])
    assert check_by_name(report, "run").ok is False
    assert "not a copy" in check_by_name(report, "run").message
    assert all(not fix.native for fix in report.fixes)


def test_a_cloned_layer_zero_capture_is_offered_natively(tmp_path, release_copy):
    package = mutated(
        release_copy,
        "                        aux_hidden_states.append(hidden_states.clone() if residual is None else hidden_states + residual)\n",
    )
    report = kimi_check(tmp_path, package, [2, 30, 58])
    assert report.fixes[0] == Fix((0, 3, 31), False, "run")
    assert kimi_check(tmp_path, package, [0, 3, 31]).ok


# -- the overlay: the files `patchcraft run` serves ------------------------------------------


def test_check_draft_runs_the_overlay_files_and_the_preflight_shares_the_verdict(tmp_path, release_copy, capsys):
    from patchcraft.commands.run import parse_server_args, preflight

    package = release_copy("0.5.10")
    overlay = tmp_path / "overlay"
    code, _, err = cli(capsys, "overlay", "build", str(package), "--out", str(overlay), "--no-smoke")
    assert code == 0, err
    draft, target = sglang_draft(tmp_path / "draft", [-1, 2, 30]), kimi_target(tmp_path / "target")
    args = ("check-draft", str(draft), "--target", str(target), "--trained-on", TRAINED, "--format", "json")
    code, out, _ = cli(capsys, *args, str(package))
    assert code == 1  # the install itself: -1 crashes at layer 0
    assert "crash" in {w["kind"] for w in json.loads(out)["explain"]["warnings"]}
    code, out, _ = cli(capsys, *args, "--overlay", str(overlay))
    data = json.loads(out)
    assert code == 0, data["verdict"]
    assert data["explain"]["served_source"] == "run" and data["explain"]["run"]["fed"][0] == {
        "hs": 0,
        "copy": True,
        "what": "",
    }
    argv = [
        "--model-path",
        str(target),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
    ]
    assert preflight(parse_server_args(argv), overlay / "tree" / "sglang", TRAINED) == 0
    assert "by running the code on the CPU harness" in capsys.readouterr().out


def test_a_directory_that_is_no_overlay_is_one_line_exit_2(tmp_path, capsys):
    draft = sglang_draft(tmp_path / "draft", [-1, 2, 30])
    code, out, err = cli(
        capsys, "check-draft", str(draft), "--num-layers", "61", "--model", "kimi_k25", "--overlay", str(tmp_path)
    )
    assert code == 2 and "not an overlay" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    code, _, err = cli(
        capsys,
        "explain",
        "--layer-ids",
        "0,3,31",
        "--num-layers",
        "61",
        "--overlay",
        str(tmp_path),
        "--release",
        "0.5.23",
    )
    assert code == 2 and "--overlay is the target" in err


# -- without torch: the static reading, and it says so -------------------------------------


def test_without_torch_the_static_reading_answers_and_says_so(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    report = kimi_check(tmp_path, release_package("0.5.23"), [2, 30, 58])
    assert report.explanation.source == "static" and report.explanation.outcome is None
    assert check_by_name(report, "run").ok is None and "static reading" in check_by_name(report, "run").message
    # [0, 3, 31] is unknown to the rules (a capture at layer 0 without the flag): never offered unproven.
    assert report.fixes == (Fix((-1, 2, 30), True, "static"),)
    native = kimi_check(tmp_path, release_package("0.5.23"), [0, 3, 31])
    assert not native.ok and check_by_name(native, "run").ok is False and "install torch" in native.verdict
    draft, target = sglang_draft(tmp_path / "d", [2, 30, 58]), kimi_target(tmp_path / "t")
    code, out, _ = cli(
        capsys, "check-draft", str(draft), "--target", str(target), "--trained-on", TRAINED, "--release", "0.5.23"
    )
    assert code == 1 and "(static reading)" in out and "[static reading]" in out


# -- a limit of the harness is no fact about SGLang ------------------------------------------

#: 0.5.10's LlamaModel.forward, after the layer call: a fork's decoder layer step that calls a
#: communicator method the stand-ins do not model (SGLang returns a pair there, the stand-in nothing).
LAYER_CALL_0_5_10 = "                residual,\n            )\n\n        if not self.pp_group.is_last_rank:\n"
COMMUNICATOR_CALL = (
    "                residual,\n            )\n"
    "            hidden_states, residual = layer.layer_communicator.postprocess_layer(\n"
    "                hidden_states, residual, forward_batch\n"
    "            )\n\n        if not self.pp_group.is_last_rank:\n"
)


def communicator_fork(release_copy) -> Path:
    package = release_copy("0.5.10")
    path = package / "srt" / "models" / "llama.py"
    text = path.read_text(encoding="utf-8")
    assert text.count(LAYER_CALL_0_5_10) == 1
    path.write_text(text.replace(LAYER_CALL_0_5_10, COMMUNICATOR_CALL), encoding="utf-8")
    return package


def llama_draft(tmp_path: Path) -> tuple[Path, Path]:
    target = tmp_path / "llama-target"
    target.mkdir()
    (target / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096})
    )
    return sglang_draft(tmp_path / "llama-draft", [2, 15, 28], fc_in=3 * 4096, target_hidden=4096), target


def test_a_method_the_stand_ins_do_not_model_is_no_crash_claim(tmp_path, release_copy, capsys):
    package = communicator_fork(release_copy)
    result = explain(load_model(resolve_target(str(package)), "llama"), [2, 15, 28], 32)
    assert result.source == "static" and result.outcome is None
    assert result.not_run.startswith("cannot be run here") and "layer_communicator.postprocess_layer" in result.not_run
    assert result.served == (3, 16, 29)  # the static reading, labelled as such
    assert not any("SGLang will crash" in w.message for w in result.warnings)
    assert {"crash", "startup"}.isdisjoint(w.kind for w in result.warnings)
    code, out, err = cli(
        capsys, "explain", str(package), "--model", "llama", "--layer-ids", "2,15,28", "--num-layers", "32"
    )
    out += err
    assert "SGLang will crash" not in out and "crash in the forward" not in out
    assert "static reading: the code could not be run on the CPU harness" in out
    assert "note: static reading, not a run" in out and "no claim about SGLang" in out
    draft, target = llama_draft(tmp_path)
    args = ("check-draft", str(draft), str(package), "--target", str(target), "--model", "llama", "--no-cuda-graph")
    code, out, err = cli(capsys, *args, "--trained-on", "hf:0,3,16")
    out += err
    assert code == 1 and "no id list makes" not in out and "SGLang will crash" not in out
    assert "skip  run          static reading: cannot be run here" in out
    assert "[-1, 2, 15] after `patchcraft apply`" in out and "[static reading]" in out
    code, out, _ = cli(capsys, *args, "--trained-on", "hf:3,16,29")
    assert code == 0, out


def test_a_crash_on_the_release_s_own_values_stays_a_crash(tmp_path, release_copy):
    # The same fork's line, made to unpack a value the release itself produces: SGLang's crash.
    package = communicator_fork(release_copy)
    path = package / "srt" / "models" / "llama.py"
    text = path.read_text(encoding="utf-8")
    path.write_text(
        text.replace("layer.layer_communicator.postprocess_layer(\n", "(lambda *a: a[:1])(\n"), encoding="utf-8"
    )
    result = explain(load_model(resolve_target(str(package)), "llama"), [2, 15, 28], 32)
    assert result.source == "run" and result.outcome is not None
    assert "ValueError: not enough values to unpack" in result.outcome.crash
    assert any(w.message.startswith("SGLang will crash on its first forward") for w in result.warnings)
