"""`patchcraft smoke --device cuda` passes its options to the GPU smoke run (no GPU needed)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from patchcraft.cli import cli
from patchcraft.errors import PatchcraftError


def test_options_reach_run_cuda_smoke(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    seen: dict = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return 0

    monkeypatch.setattr("patchcraft.gpu_smoke.run.run_cuda_smoke", fake)
    (tmp_path / "target").mkdir()
    (tmp_path / "draft").mkdir()
    args = ["smoke", "--device", "cuda", "--tp", "8", "--model-path", str(tmp_path / "target"),
            "--draft-path", str(tmp_path / "draft"), "--layer-ids", "-1,2,30", "--format", "json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert seen == {"tp": 8, "model_path": str(tmp_path / "target"), "draft_path": str(tmp_path / "draft"),
                    "layer_ids": [-1, 2, 30], "output_format": "json"}


def test_bad_tp_and_layer_ids_are_usage_errors() -> None:
    assert CliRunner().invoke(cli, ["smoke", "--device", "cuda", "--tp", "9"]).exit_code == 2
    result = CliRunner().invoke(cli, ["smoke", "--device", "cuda", "--layer-ids", "a,b"])
    assert isinstance(result.exception, PatchcraftError)  # main() turns it into one line, exit 2
    assert "--layer-ids 'a,b'" in str(result.exception)
