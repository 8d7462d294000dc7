"""`patchcraft smoke --device cuda` passes its options to the GPU smoke run (no GPU needed)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from patchcraft.cli import cli
from patchcraft.base.errors import PatchcraftError


def test_options_reach_run_cuda_smoke(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    seen: dict = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return 0

    monkeypatch.setattr("patchcraft.gpu_smoke.cuda_smoke.run_cuda_smoke", fake)
    (tmp_path / "target").mkdir()
    (tmp_path / "draft").mkdir()
    args = [
        "smoke",
        "--device",
        "cuda",
        "--tp",
        "8",
        "--model-path",
        str(tmp_path / "target"),
        "--draft-path",
        str(tmp_path / "draft"),
        "--layer-ids",
        "-1,2,30",
        "--format",
        "json",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert seen == {
        "tp": 8,
        "model_path": str(tmp_path / "target"),
        "draft_path": str(tmp_path / "draft"),
        "layer_ids": [-1, 2, 30],
        "output_format": "json",
    }


def test_timeout_and_out_reach_run_cuda_smoke(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    seen: dict = {}
    monkeypatch.setattr("patchcraft.gpu_smoke.cuda_smoke.run_cuda_smoke", lambda **kwargs: seen.update(kwargs) or 0)
    result = CliRunner().invoke(cli, ["smoke", "--device", "cuda", "--timeout", "150", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert seen["timeout_s"] == 150 and seen["out_dir"] == str(tmp_path / "out")


def test_smoke_overlay_runs_the_harness_on_the_overlay_tree(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    seen: dict = {}

    def fake(options, **kwargs):
        seen["targets"] = options.targets
        return 0

    monkeypatch.setattr("patchcraft.commands.smoke.smoke_command", fake)
    # A directory that is not an overlay is refused before the harness (tests/overlay/test_overlay_integrity.py: damaged ones).
    refused = CliRunner().invoke(cli, ["smoke", "--overlay", str(tmp_path)])
    assert isinstance(refused.exception, PatchcraftError) and "not an overlay" in str(refused.exception)
    assert seen == {}
    (tmp_path / "patchcraft_overlay.json").write_text("{}\n")  # an overlay; its checks stubbed out here
    monkeypatch.setattr("patchcraft.overlay.check.require_usable", lambda directory: None)
    result = CliRunner().invoke(cli, ["smoke", "--overlay", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert seen["targets"] == (str(tmp_path / "tree" / "sglang"),)


def test_bad_tp_and_layer_ids_are_usage_errors() -> None:
    assert CliRunner().invoke(cli, ["smoke", "--device", "cuda", "--tp", "9"]).exit_code == 2
    result = CliRunner().invoke(cli, ["smoke", "--device", "cuda", "--layer-ids", "a,b"])
    assert isinstance(result.exception, PatchcraftError)  # main() turns it into one line, exit 2
    assert "--layer-ids 'a,b'" in str(result.exception)


def test_layer_ids_below_minus_one_are_usage_errors() -> None:
    result = CliRunner().invoke(cli, ["smoke", "--device", "cuda", "--layer-ids=-3,1,2"])
    assert isinstance(result.exception, PatchcraftError)
    assert "--layer-ids '-3,1,2': layer id -3 is invalid" in str(result.exception)


def test_via_run_and_mem_fraction_reach_run_cuda_smoke(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}
    monkeypatch.setattr("patchcraft.gpu_smoke.cuda_smoke.run_cuda_smoke", lambda **kwargs: seen.update(kwargs) or 0)
    result = CliRunner().invoke(cli, ["smoke", "--device", "cuda", "--via-run", "--mem-fraction-static", "0.5"])
    assert result.exit_code == 0, result.output
    assert seen["via_run"] is True and seen["mem_fraction_static"] == 0.5
    assert CliRunner().invoke(cli, ["smoke", "--device", "cuda", "--mem-fraction-static", "0"]).exit_code == 2
