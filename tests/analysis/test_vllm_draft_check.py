"""patchcraft.analysis.vllm_draft_check: check-draft on vLLM trees, and ``--engine sglang,vllm``, on real releases.

The drafts are configs written here (tests/drafts.py: header-only
safetensors); the vLLM releases are the slim fetched ones (0.34.0, the
newest; 0.18.0; 0.11.2 for its model-type gate), SGLang's 0.5.23. Each
check is shown failing on a draft that breaks it.
"""

from __future__ import annotations

import json
import shutil
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import cli_code, release_package, run_cli as cli, vllm_release_package
from drafts import HIDDEN, LAYERS, kimi_target, sglang_draft
from patchcraft.analysis.vllm_draft_check import VllmDraftReport, check_vllm_draft, with_top_level
from patchcraft.analysis.training import parse_training
from patchcraft.base.vllm_tree import VllmTree, resolve_vllm_target
from patchcraft.reading.draft_config import read_draft, read_target
from patchcraft.reading.vllm_runner import EAGLE_CONFIG_LAYER_IDS, TOP_LEVEL

pytest.importorskip("torch")

KIMI = "KimiK25ForConditionalGeneration"


@lru_cache(maxsize=None)
def tree(version: str) -> VllmTree:
    return resolve_vllm_target(str(vllm_release_package(version)))


def draft_dir(directory: Path, top: list[int] | None, eagle: list[int] | None = None, fc_states: int = 3) -> Path:
    """An SGLang-format draft (``eagle`` in eagle_config) with ``top`` at the top level, as vLLM reads it."""
    sglang_draft(directory, eagle, fc_in=fc_states * HIDDEN)
    config = json.loads((directory / "config.json").read_text())
    if top is not None:
        config["eagle_aux_hidden_state_layer_ids"] = top
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def check(
    tmp_path: Path,
    draft: Path,
    trained_on: str | None,
    version: str = "0.34.0",
    model: str = KIMI,
    hidden: int = HIDDEN,
) -> VllmDraftReport:
    target = read_target(kimi_target(tmp_path / "target", hidden))
    training = parse_training(trained_on) if trained_on else None
    return check_vllm_draft(tree(version), model, read_draft(draft), target, training, LAYERS)


def verdicts(report: VllmDraftReport) -> dict[str, bool | None]:
    return {c.name: c.ok for c in report.checks}


def failed(report: VllmDraftReport) -> list[str]:
    return [c.name for c in report.checks if c.ok is False]


# -- each check, passing and failing -----------------------------------------------------------


def test_top_level_ids_as_trained_pass(tmp_path: Path) -> None:
    report = check(tmp_path, draft_dir(tmp_path / "d", [2, 30, 58], [1, 29, 57]), "hf:2,30,58")
    assert report.ok, report.checks
    assert report.ids == (2, 30, 58) and report.read_from == TOP_LEVEL
    assert verdicts(report) == dict.fromkeys(
        ("ids", "gate", "hidden-size", "run", "fc-width", "range", "convention"), True
    )
    assert report.fixes == () and report.verdict.startswith("ok: vLLM 0.34.0 will feed")


def test_ids_only_in_sglang_s_place_are_not_read(tmp_path: Path) -> None:
    """eagle_config's SGLang key: the default runner reads none, the defaults (2, 30, 58) are served."""
    report = check(tmp_path, draft_dir(tmp_path / "d", None, [-1, 2, 30]), None)
    ids = next(c for c in report.checks if c.name == "ids")
    assert ids.ok is None and "only in eagle_config.eagle_aux_hidden_state_layer_ids [-1, 2, 30]" in ids.message
    assert report.ids is None and report.explanation.fed_states == (2, 30, 58)
    assert "vLLM serves its defaults [2, 30, 58]" in ids.message and report.ok


def test_v2_runner_reads_eagle_config_layer_ids(tmp_path: Path) -> None:
    """0.34.0's V2 runner reads its own key eagle_config.layer_ids (the runner's function run on the whole config)."""
    directory = sglang_draft(tmp_path / "d", None)
    config = json.loads((directory / "config.json").read_text())
    config["eagle_config"] = {"layer_ids": [2, 30, 58]}
    (directory / "config.json").write_text(json.dumps(config))
    report = check(tmp_path, directory, "hf:2,30,58")
    assert report.ok and report.ids == (2, 30, 58) and report.read_from == EAGLE_CONFIG_LAYER_IDS


def test_id_0_crashes_the_unpatched_deepseek_forward(tmp_path: Path) -> None:
    report = check(tmp_path, draft_dir(tmp_path / "d", [0, 3, 31]), None)
    assert failed(report) == ["run"]
    assert "TypeError" in report.verdict and "deepseek_v2.py:1562" in report.verdict
    assert verdicts(report)["fc-width"] is None and verdicts(report)["convention"] is None


def test_range_fails_on_an_id_that_captures_nothing(tmp_path: Path) -> None:
    report = check(tmp_path, draft_dir(tmp_path / "d", [-1, 3, 31], fc_states=2), None)
    assert failed(report) == ["range"]
    assert "id -1 is accepted and captures nothing" in report.verdict


def test_fc_width_fails_on_a_two_state_fc(tmp_path: Path) -> None:
    report = check(tmp_path, draft_dir(tmp_path / "d", [2, 30, 58], fc_states=2), None)
    assert failed(report) == ["fc-width"]
    assert "fc takes 14336 inputs but vLLM will feed 3 states" in report.verdict


def test_hidden_size_fails_for_another_target(tmp_path: Path) -> None:
    report = check(tmp_path, draft_dir(tmp_path / "d", [2, 30, 58]), None, hidden=4096)
    assert failed(report) == ["hidden-size", "fc-width"] and "trained for another target" in report.verdict


def test_gate_fails_where_the_release_refuses_the_model_type(tmp_path: Path) -> None:
    """0.11.2 admits llama, qwen, minicpm and gpt_oss targets only: GLM is refused."""
    report = check(tmp_path, draft_dir(tmp_path / "d", [2, 3, 4]), None, "0.11.2", "glm.GlmForCausalLM")
    assert "gate" in failed(report) and "refuses EAGLE-3 for model_type 'glm'" in report.verdict


def test_with_top_level_sets_only_the_top_level(tmp_path: Path) -> None:
    draft = read_draft(draft_dir(tmp_path / "d", None, [2, 30, 58]))
    fixed = with_top_level(draft, (0, 3, 31))
    assert fixed.top_level_ids == (0, 3, 31) and fixed.raw["eagle_aux_hidden_state_layer_ids"] == [0, 3, 31]
    assert fixed.layer_ids == (2, 30, 58) and "eagle_aux_hidden_state_layer_ids" not in draft.raw


# -- the fixes ------------------------------------------------------------------------------


def test_ids_alone_fix_without_the_patch(tmp_path: Path) -> None:
    """hs[3], hs[31], hs[59] wanted, the defaults served: [3, 31, 59] at the top level, proven on the tree as it is."""
    report = check(tmp_path, draft_dir(tmp_path / "d", None, [2, 30, 58]), "hf:3,31,59")
    assert [(f.ids, f.after_apply) for f in report.fixes] == [((3, 31, 59), False)]
    assert report.fixes[0].fed == "hs[3], hs[31], hs[59]"


@pytest.mark.slow
@pytest.mark.parametrize("version, line", [("0.34.0", 1562), ("0.18.0", 1240)])
def test_kimi_id_0_fix_needs_the_vllm_patch(tmp_path: Path, version: str, line: int) -> None:
    """The issue's Kimi draft: hs[0] only through `patchcraft apply --engine vllm` (the tree as it is crashes)."""
    report = check(tmp_path, draft_dir(tmp_path / "d", None, [2, 30, 58]), "hf:0,3,31", version)
    assert [(f.ids, f.after_apply, f.apply_model) for f in report.fixes] == [
        ((0, 3, 31), True, "deepseek_v2.DeepseekV2ForCausalLM")
    ]
    assert report.fixes[0].fed == "hs[0], hs[3], hs[31]"  # a copy: no "(not a copy" in it
    (native,) = report.blocked
    assert native.way == "[0, 3, 31] this vLLM tree as it is"
    assert f"deepseek_v2.py:{line}" in native.why and native.others == 7
    assert (
        vllm_release_package(version).joinpath("model_executor/models/deepseek_v2.py").read_text().count("patchcraft")
        == 0
    )  # the tree itself is never written
    # The printed command, run as printed on a copy, writes the patch and exits 0 (on 0.34.0 the file stem
    # `--model deepseek_v2` also names the unsupported GlmMoeDsaForCausalLM row: exit 1).
    copy = tmp_path / "copy" / "vllm"
    shutil.copytree(vllm_release_package(version), copy)
    model = report.fixes[0].apply_model
    assert cli_code("apply", "--engine", "vllm", str(copy), "--model", model) == 0
    assert cli_code("verify", "--engine", "vllm", str(copy), "--model", model) == 0


# -- the command: --engine ---------------------------------------------------------------------


def _kimi_args(tmp_path: Path, *more: str) -> tuple[str, ...]:
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58])
    target = kimi_target(tmp_path / "target")
    return ("check-draft", str(draft), "--target", str(target), "--trained-on", "hf:0,3,31", *more)


def test_default_and_engine_sglang_are_the_sglang_check(capsys, tmp_path: Path) -> None:
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58])
    target = kimi_target(tmp_path / "target")
    args = ("check-draft", str(draft), "--target", str(target), "--trained-on", "hf:2,30,58", "--release", "0.5.23")
    code, out, _ = cli(capsys, *args, "--format", "json")
    code_sglang, out_sglang, _ = cli(capsys, *args, "--format", "json", "--engine", "sglang")
    assert code == code_sglang == 0 and out == out_sglang
    assert "engines" not in json.loads(out)


@pytest.mark.parametrize(
    "more, said",
    [
        (("--engine", "sglang,trt"), "--engine sglang,trt: expected sglang, vllm or sglang,vllm ('trt' is no engine)"),
        (("--engine", "vllm,vllm"), "--engine vllm,vllm: expected sglang, vllm or sglang,vllm"),
        (("--vllm-release", "0.34.0"), "--vllm-target, --vllm-release and --vllm-model need --engine vllm"),
        (
            ("--engine", "sglang,vllm", "--vllm-release", "0.34.0", "--vllm-target", "x"),
            "give either --vllm-target or --vllm-release",
        ),
        (("--engine", "vllm", "--release", "0.34.0", "--vllm-release", "0.34.0"), "give vLLM's tree once"),
    ],
)
def test_bad_engine_input_is_one_line_exit_2(capsys, tmp_path: Path, more: tuple[str, ...], said: str) -> None:
    code, out, err = cli(capsys, *_kimi_args(tmp_path, *more))
    assert code == 2 and out == "" and said in err and err.count("\n") == 1 and "Traceback" not in err


def test_engine_vllm_alone_json(capsys, tmp_path: Path) -> None:
    """--engine vllm: --release is vLLM's (as on explain --engine vllm); ids alone fix, exit 1 (a mismatch)."""
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58])
    target = kimi_target(tmp_path / "target")
    args = ("check-draft", str(draft), "--target", str(target), "--trained-on", "hf:3,31,59")
    code, out, _ = cli(capsys, *args, "--engine", "vllm", "--release", "0.34.0", "--format", "json")
    document = json.loads(out)
    assert code == document["exit_code"] == 1 and document["engines"] == ["vllm"] and document["sglang"] is None
    vllm = document["vllm"]
    assert vllm["version"] == "0.34.0" and vllm["ids"] is None and vllm["exit_code"] == 1
    assert vllm["fixes"] == [
        {
            "field": "eagle_aux_hidden_state_layer_ids",
            "ids": [3, 31, 59],
            "after_apply": False,
            "apply_model": None,
            "proof": "run",
            "fed": "hs[3], hs[31], hs[59]",
            "trained_on": None,
        }
    ]
    assert vllm["explain"]["engine"] == "vllm" and document["one_config"] is None


def test_both_engines_pass_exit_0(capsys, tmp_path: Path) -> None:
    """eagle_config [2, 30, 58] on SGLang 0.5.23 (raw: hs[2], hs[30], hs[58]), the same at the top level for vLLM."""
    draft = draft_dir(tmp_path / "draft", [2, 30, 58], [2, 30, 58])
    target = kimi_target(tmp_path / "target")
    code, out, _ = cli(
        capsys,
        *("check-draft", str(draft), "--target", str(target), "--trained-on", "hf:2,30,58"),
        *("--engine", "sglang,vllm", "--release", "0.5.23", "--vllm-release", "0.34.0"),
    )
    assert code == 0, out
    assert "engines: SGLang 0.5.23 ok, vLLM 0.34.0 ok" in out and "one config" not in out


@pytest.mark.slow
def test_kimi_both_engines(capsys, tmp_path: Path) -> None:
    """The issue's done-when: SGLang 0.5.23 and vLLM 0.34.0, each verdict, proven ids for each, one config for both."""
    release_package("0.5.23")
    args = _kimi_args(tmp_path, "--engine", "sglang,vllm", "--release", "0.5.23", "--vllm-release", "0.34.0")
    code, out, _ = cli(capsys, *args)
    assert code == 1
    assert "== SGLang 0.5.23 ==" in out and "== vLLM 0.34.0 ==" in out
    assert "suggested: set eagle_config.eagle_aux_hidden_state_layer_ids = [0, 3, 31] (this install as it is" in out
    assert (
        "suggested: set top-level eagle_aux_hidden_state_layer_ids = [0, 3, 31] after `patchcraft apply --engine "
        "vllm --release 0.34.0 --model deepseek_v2.DeepseekV2ForCausalLM` [proven by running the code on the CPU harness: vLLM 0.34.0 "
        "feeds hs[0], hs[3], hs[31]]"
    ) in out
    assert "[0, 3, 31] this vLLM tree as it is: run: vLLM will crash in the forward: TypeError" in out
    assert "engines: SGLang 0.5.23 mismatch, vLLM 0.34.0 mismatch" in out
    assert "one config for both engines (both checks run again on it: pass):" in out
    code, out, _ = cli(capsys, *args, "--format", "json")
    document = json.loads(out)
    assert code == document["exit_code"] == 1 and document["engines"] == ["sglang", "vllm"]
    assert document["sglang"]["suggested_ids"] == [0, 3, 31] and document["sglang"]["exit_code"] == 1
    assert document["one_config"] == {
        "sglang": {
            "field": "eagle_config.eagle_aux_hidden_state_layer_ids",
            "ids": [0, 3, 31],
            "after_apply": False,
            "flags": [],
        },
        "vllm": {
            "field": "eagle_aux_hidden_state_layer_ids",
            "ids": [0, 3, 31],
            "after_apply": True,
            "apply_model": "deepseek_v2.DeepseekV2ForCausalLM",
        },
        "ok": True,
        "why": None,
    }


def test_engine_vllm_takes_a_vllm_overlay_once_it_is_safe_to_serve(capsys, tmp_path: Path) -> None:
    """--engine vllm --overlay DIR: the overlay's patched tree feeds hs[0] (exit 0); a missing bootstrap: exit 2."""
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58])
    (tmp_path / "draft" / "config.json").write_text(
        json.dumps(
            {
                **json.loads((tmp_path / "draft" / "config.json").read_text()),
                "eagle_aux_hidden_state_layer_ids": [0, 3, 31],
            }
        )
    )
    overlay = tmp_path / "overlay"
    code, _, err = cli(
        capsys, "overlay", "build", str(vllm_release_package("0.34.0")), "--out", str(overlay), "--no-smoke"
    )
    assert code == 0, err
    target = kimi_target(tmp_path / "target")
    args = ("check-draft", str(draft), "--target", str(target), "--trained-on", "hf:0,3,31", "--engine", "vllm")
    code, out, err = cli(capsys, *args, "--overlay", str(overlay), "--format", "json")
    assert code == 0 and json.loads(out)["vllm"]["exit_code"] == 0, (out, err)
    (overlay / "sitecustomize.py").unlink()
    code, out, err = cli(capsys, *args, "--overlay", str(overlay))
    assert code == 2 and out == "" and "sitecustomize.py" in err and err.count("\n") == 1


# -- a config switch the harness ran one side of (Kimi-K3's attention residuals) -----------------------------------


def _k3_target(directory: Path, fields: dict) -> Path:
    kimi_target(directory)
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = ["KimiK3ForConditionalGeneration"]
    config["text_config"].update(fields)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    "fields, ok",
    [({}, True), ({"attn_res_block_size": None}, True), ({"attn_res_block_size": 6}, False)],
    ids=["unset", "null", "set"],
)
def test_kimi_k3_the_target_config_says_whether_the_side_run_is_its_own(tmp_path: Path, fields: dict, ok: bool) -> None:
    """The harness runs Kimi-K3 without attention residuals (harness.attention_residuals): a target whose
    config.json sets ``attn_res_block_size`` runs the other side, and check-draft fails rather than pass on a
    run that is not that target's."""
    draft = draft_dir(tmp_path / "draft", [2, 30, 58])
    target = read_target(_k3_target(tmp_path / "target", fields))
    report = check_vllm_draft(
        tree("0.34.0"), "KimiK3ForConditionalGeneration", read_draft(draft), target, None, LAYERS, platform="cuda"
    )
    assert verdicts(report)["config"] is ok
    if not ok:
        assert report.verdict.startswith(f"{target.path} sets attn_res_block_size = 6")
        assert "not shown" in report.verdict


def test_kimi_k3_without_a_target_config_is_unknown(tmp_path: Path) -> None:
    draft = draft_dir(tmp_path / "draft", [2, 30, 58])
    report = check_vllm_draft(
        tree("0.34.0"), "KimiK3ForConditionalGeneration", read_draft(draft), None, None, LAYERS, platform="cuda"
    )
    assert verdicts(report)["config"] is None


def test_a_target_without_the_switch_has_no_config_check(tmp_path: Path) -> None:
    draft = draft_dir(tmp_path / "draft", [2, 30, 58])
    assert "config" not in verdicts(check(tmp_path, draft, None))


@pytest.mark.parametrize("fields, ok", [({"mhc": True}, True), ({"mhc": False}, False), ({}, None)])
def test_glm5_next_the_target_config_says_whether_its_layers_are_the_ones_run(
    tmp_path: Path, fields: dict, ok: bool | None
) -> None:
    """The harness runs GLM-5-Next's mHC layers: `mhc: false` (its 70B model) is the other side, a config without
    the field does not say."""
    draft = draft_dir(tmp_path / "draft", [2, 30, 58])
    target_dir = _k3_target(tmp_path / "target", fields)
    config = json.loads((target_dir / "config.json").read_text())
    config["architectures"] = ["Glm5NextForCausalLM"]
    (target_dir / "config.json").write_text(json.dumps(config))
    report = check_vllm_draft(
        tree("0.34.0"), "Glm5NextForCausalLM", read_draft(draft), read_target(target_dir), None, LAYERS, platform="cuda"
    )
    assert verdicts(report)["config"] is ok
    assert verdicts(report)["run"] is True  # hs[2], hs[30], hs[58] on the mHC side


def test_a_family_architecture_without_a_platform_is_checked_on_every_platform(tmp_path: Path) -> None:
    """Kimi-K3 is served from each platform's own module: with no platform named (a GPU build's `run` preflight),
    every platform that serves it is checked, and the verdict names them (before: a usage error)."""
    draft = draft_dir(tmp_path / "draft", [2, 30, 58])
    target = read_target(_k3_target(tmp_path / "target", {}))
    report = check_vllm_draft(tree("0.34.0"), "KimiK3ForConditionalGeneration", read_draft(draft), target, None, LAYERS)
    assert report.ok
    assert report.verdict.endswith("(on every platform that serves it: cuda, rocm, xpu, cpu)")
    bad = read_target(_k3_target(tmp_path / "bad", {"attn_res_block_size": 6}))
    failed_report = check_vllm_draft(
        tree("0.34.0"), "KimiK3ForConditionalGeneration", read_draft(draft), bad, None, LAYERS
    )
    assert failed_report.verdict.startswith("on cuda: ") and failed_report.verdict.endswith(
        "; also failing on rocm, xpu, cpu"
    )
