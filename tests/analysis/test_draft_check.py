"""``patchcraft check-draft``: draft configs written here, one per convention, on real releases.

The weights are safetensors files holding only a header (``fc.weight``'s
shape is all the check reads), so no torch is needed to write them.
"""

from __future__ import annotations

import json
import struct
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import copy_release, release_package, run_cli as cli
from patchcraft.analysis.draft_check import check_draft
from patchcraft.reading.draft_config import read_draft, read_target
from patchcraft.engine.tree_run import run, write_changes
from patchcraft.base.errors import PatchcraftError
from patchcraft.analysis.target_model import Model, load_model
from patchcraft.engine.records import Mode
from patchcraft.analysis.training import Training, parse_training
from patchcraft.base.target import resolve_target

from drafts import FC_IN, HIDDEN, LAYERS, kimi_target, sglang_draft, speculators_draft, write_weights  # noqa: F401


@lru_cache(maxsize=None)
def model(version: str, name: str) -> Model:
    return load_model(resolve_target(str(release_package(version))), name)


def check(tmp_path, mdl: Model, draft_dir: Path, trained_on: str | None, cuda_graph: bool = True, hidden: int = HIDDEN):
    target = read_target(kimi_target(tmp_path / "target", hidden))
    training = parse_training(trained_on) if trained_on else None
    return check_draft(mdl, read_draft(draft_dir), target, training, LAYERS, cuda_graph=cuda_graph)


def failed(report) -> list[str]:
    return [c.name for c in report.checks if c.ok is False]


# -- the Kimi-K2.5 scenario ---------------------------------------------------------


def test_kimi_ids_2_30_58_against_training_on_hs0_hs3_hs31_are_flagged(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58])
    report = check(tmp_path, model("0.5.10", "kimi_k25"), draft, "hf:0,3,31", cuda_graph=False)
    assert not report.ok
    assert failed(report) == ["convention"]
    assert report.explanation.served == (3, 31, 59)
    assert "SGLang will feed hs[3], hs[31], hs[59] but the draft was trained on hs[0], hs[3], hs[31]" in report.verdict
    assert report.suggestion is not None and report.suggestion.ids == (-1, 2, 30)
    assert report.suggestion.after_apply  # -1 needs the patch on this install
    fc = next(c for c in report.checks if c.name == "fc-width")
    assert fc.ok and fc.message == "fc input width 21504 = 3 x 7168"


def patched(version: str, directory: Path, names: tuple[str, ...], runner: bool = True) -> Path:
    """A private copy of ``version`` after ``patchcraft apply`` of ``names`` (and the runner)."""
    package = copy_release(version, directory)
    write_changes(run(resolve_target(str(package)), Mode.APPLY, names, runner=runner).changes)
    return package


@pytest.fixture(scope="module")
def patched_0_5_10(tmp_path_factory) -> Path:
    """0.5.10 with kimi_k25 patched but not the runner (one copy for the module)."""
    return patched("0.5.10", tmp_path_factory.mktemp("patched"), ("kimi_k25",), runner=False)


def test_kimi_minus_1_2_30_on_a_patched_install_passes(tmp_path, patched_0_5_10):
    draft = sglang_draft(tmp_path / "draft", [-1, 2, 30])
    report = check(
        tmp_path, load_model(resolve_target(str(patched_0_5_10)), "kimi_k25"), draft, "hf:0,3,31", cuda_graph=False
    )
    assert report.ok, report.checks
    assert report.explanation.served == (0, 3, 31)
    assert all(c.ok for c in report.checks if c.name not in ("ids", "cuda-graph"))
    assert next(c for c in report.checks if c.name == "cuda-graph").ok is None  # --no-cuda-graph
    assert report.suggestion_text == ""


def test_kimi_minus_1_2_30_with_cuda_graphs_needs_the_runner_patched_too(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [-1, 2, 30])
    package = patched("0.5.10", tmp_path / "sg", ("kimi_k25", "runner"))
    report = check(tmp_path, load_model(resolve_target(str(package)), "kimi_k25"), draft, "hf:0,3,31")
    assert report.ok, report.checks
    assert all(c.ok for c in report.checks if c.name != "ids")


def test_kimi_minus_1_on_an_unpatched_install_is_flagged(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [-1, 2, 30])
    report = check(tmp_path, model("0.5.10", "kimi_k25"), draft, "hf:0,3,31", cuda_graph=False)
    assert "embedding" in failed(report)
    assert report.suggestion is not None and report.suggestion.after_apply


def test_unpatched_runner_fails_the_cuda_graph_check(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58])
    report = check(tmp_path, model("0.5.10", "kimi_k25"), draft, "specforge@0.5.6")
    # The ids are right for eager mode (SpecForge on SGLang 0.5.6: +1 = SGLang +1), but graphs replay the defaults.
    assert failed(report) == ["cuda-graph"]
    assert "CUDA-graph decode will capture the default layers (hs[2], hs[30], hs[58])" in report.verdict


# -- one draft per convention -------------------------------------------------------------


def test_specforge_ids_match_the_plus_one_rule(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [1, 30, 58])
    report = check(tmp_path, model("0.5.15", "deepseek_v2"), draft, "specforge")
    assert report.ok, report.checks
    assert report.expected is not None and report.expected.states == (2, 31, 59)


def test_specforge_ids_on_the_first_id_heuristic_are_flagged(tmp_path):
    # Captured through SGLang 0.5.6's +1 setter, served by 0.5.15's first-id heuristic.
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58])
    report = check(tmp_path, model("0.5.15", "deepseek_v2"), draft, "specforge@0.5.6")
    assert failed(report) == ["convention"]
    assert report.explanation.served == (2, 30, 58)
    assert "ids kept raw" in report.verdict
    # Raw ids are what this release wants for hs[3], hs[31], hs[59].
    assert report.suggestion is not None and report.suggestion.ids == (3, 31, 59)


def test_speculators_v1_drops_the_verifier_state(tmp_path):
    draft = speculators_draft(tmp_path / "draft", [0, 3, 31, 59])
    report = check(tmp_path, model("0.5.10", "kimi_k25"), draft, None, cuda_graph=False)
    assert report.expected is not None and report.expected.states == (0, 3, 31)
    assert "verifier" in report.expected.how
    # SGLang reads no eagle_config: it captures its defaults.
    assert report.explanation.served == (2, 30, 58)
    assert next(c for c in report.checks if c.name == "ids").ok is None
    assert failed(report) == ["convention"]
    assert report.suggestion is not None and report.suggestion.ids == (-1, 2, 30)


def test_explicit_speculators_preset_reads_sglang_ids_as_hs_indices(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [3, 31, 59])
    report = check(tmp_path, model("0.5.10", "kimi_k25"), draft, "speculators", cuda_graph=False)
    assert report.expected is not None and report.expected.states == (3, 31, 59)
    assert report.explanation.served == (4, 32, 60)
    assert failed(report) == ["convention"]
    assert report.suggestion is not None and report.suggestion.ids == (2, 30, 58)


def test_hf_states_out_of_layer_order_cannot_be_served(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58])
    report = check(tmp_path, model("0.5.10", "kimi_k25"), draft, "hf:31,3,59", cuda_graph=False)
    assert failed(report) == ["convention"]
    assert "layer order" in report.verdict
    assert report.suggestion is None


# -- shapes and ranges ------------------------------------------------------------------


def test_fc_width_must_match_the_states_fed(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58], fc_in=2 * HIDDEN)
    report = check(tmp_path, model("0.5.10", "kimi_k25"), draft, None, cuda_graph=False)
    assert failed(report) == ["fc-width"]
    assert report.verdict.startswith("the draft's fc takes 14336 inputs (2 states) but SGLang will feed 3 states")


def test_target_hidden_size_must_match_the_target(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58], target_hidden=4096, fc_in=3 * 4096)
    report = check(tmp_path, model("0.5.10", "kimi_k25"), draft, None, cuda_graph=False)
    assert "hidden-size" in failed(report)
    assert "fc-width" in failed(report)  # 12288 is no 3 x 7168 either


def test_id_past_the_last_layer_is_flagged(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [2, 30, 60])
    report = check(tmp_path, model("0.5.10", "kimi_k25"), draft, None, cuda_graph=False)
    assert failed(report) == ["fc-width", "range"]
    assert report.explanation.served == (3, 31)


def test_sharded_weights_are_read_through_the_index(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58], fc_in=None)
    write_weights(draft / "model-00001-of-00002.safetensors", {"embed_tokens.weight": [163840, HIDDEN]})
    write_weights(draft / "model-00002-of-00002.safetensors", {"fc.weight": [HIDDEN, FC_IN]})
    index = {
        "weight_map": {
            "embed_tokens.weight": "model-00001-of-00002.safetensors",
            "fc.weight": "model-00002-of-00002.safetensors",
        }
    }
    (draft / "model.safetensors.index.json").write_text(json.dumps(index))
    parsed = read_draft(draft)
    assert parsed.fc_in == FC_IN and "model-00002-of-00002" in parsed.fc_source


def test_missing_weights_skip_the_width_check(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58], fc_in=None)
    report = check(tmp_path, model("0.5.10", "kimi_k25"), draft, None, cuda_graph=False)
    assert report.ok
    assert next(c for c in report.checks if c.name == "fc-width").ok is None


# -- bad input -----------------------------------------------------------------------------


def test_parse_training():
    assert parse_training("hf:0,3,31") == Training("hf", (0, 3, 31))
    assert parse_training("SpecForge").kind == "specforge"
    for bad in ("hf:", "hf:a,b", "hf:-1,3", "eagle3", "specforge@latest"):
        with pytest.raises(PatchcraftError, match="--trained-on"):
            parse_training(bad)


def test_truncated_safetensors_header_is_a_clear_error(tmp_path):
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58], fc_in=None)
    (draft / "model.safetensors").write_bytes(struct.pack("<Q", 500) + b'{"fc.weight": ')
    with pytest.raises(PatchcraftError, match="truncated safetensors header"):
        read_draft(draft)


def test_cli_kimi_mismatch_exits_1_and_suggests(tmp_path, capsys):
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58])
    target = kimi_target(tmp_path / "target")
    package = str(release_package("0.5.10"))
    code, out, _ = cli(capsys, "check-draft", str(draft), package, "--target", str(target), "--trained-on", "hf:0,3,31")
    assert code == 1
    assert "mismatch: SGLang will feed hs[3], hs[31], hs[59] but the draft was trained on hs[0], hs[3], hs[31]" in out
    assert "suggested: set eagle_config.eagle_aux_hidden_state_layer_ids = [-1, 2, 30] after `patchcraft apply`" in out
    code, out, _ = cli(
        capsys,
        "check-draft",
        str(draft),
        package,
        "--target",
        str(target),
        "--trained-on",
        "hf:0,3,31",
        "--format",
        "json",
    )
    document = json.loads(out)
    assert code == 1 and document["exit_code"] == 1
    assert document["suggested_ids"] == [-1, 2, 30] and document["suggested_after_apply"] is True
    assert {c["name"]: c["ok"] for c in document["checks"]}["convention"] is False


def test_cli_patched_kimi_exits_0(tmp_path, capsys, patched_0_5_10):
    draft = sglang_draft(tmp_path / "draft", [-1, 2, 30])
    target = kimi_target(tmp_path / "target")
    args = ["check-draft", str(draft), str(patched_0_5_10), "--target", str(target), "--trained-on", "hf:0,3,31"]
    code, out, _ = cli(capsys, *args)
    assert code == 1 and "FAIL  cuda-graph" in out  # the runner still resets the ids
    code, out, _ = cli(capsys, *args, "--no-cuda-graph")
    assert code == 0, out
    assert "ok: SGLang will feed the draft the states it was trained on" in out


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        ("none", [], "config.json: no such file"),
        ("badjson", [], "not valid JSON"),
        ("badids", [], "expected a list of integers"),
        ("ok", ["--trained-on", "layers"], "--trained-on"),
        ("ok", ["--no-target"], "pass --target TARGET_MODEL_DIR or --num-layers"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, setup, args, message):
    draft = tmp_path / "draft"
    draft.mkdir()
    if setup == "badjson":
        (draft / "config.json").write_text("{not json")
    elif setup == "badids":
        (draft / "config.json").write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": "2,30"}}))
    elif setup == "ok":
        sglang_draft(draft, [2, 30, 58])
    target = [] if "--no-target" in args else ["--target", str(kimi_target(tmp_path / "target"))]
    extra = [a for a in args if a != "--no-target"]
    code, _, err = cli(capsys, "check-draft", str(draft), str(release_package("0.5.10")), *target, *extra)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
