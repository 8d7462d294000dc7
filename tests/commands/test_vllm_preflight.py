"""``patchcraft run``'s vLLM preflight, in process, on the fetched 0.34.0 tree as released (no overlay, no vLLM).

The end-to-end runs, with the overlay and a stand-in server, are tests/commands/test_run_vllm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import vllm_release_package
from drafts import kimi_target, speculators_draft
from patchcraft.base.errors import PatchcraftError
from patchcraft.commands._vllm_preflight import run_vllm_preflight


def _argv(tmp_path: Path, ids: list[int], **speculative) -> list[str]:
    config = {"method": "eagle3", "model": str(speculators_draft(tmp_path / "draft", ids)), **speculative}
    return ["vllm", "serve", str(kimi_target(tmp_path / "kimi")), "--speculative-config", json.dumps(config)]


def test_the_unpatched_release_is_refused_for_id_0(tmp_path: Path, capsys) -> None:
    pytest.importorskip("torch")
    code = run_vllm_preflight(_argv(tmp_path, [0, 3, 31]), vllm_release_package("0.34.0"), None)
    err = capsys.readouterr().err
    assert code == 1 and "id 0 crashes the forward" in err and "refused to launch" in err, err


def test_a_launch_without_eagle3_has_nothing_to_check(tmp_path: Path) -> None:
    package = vllm_release_package("0.34.0")
    assert run_vllm_preflight(["vllm", "serve", "m"], package, None) == 0
    ngram = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    assert run_vllm_preflight(["vllm", "serve", "m", "--speculative-config", ngram], package, None) == 0


@pytest.mark.parametrize(
    "change, words",
    [
        ({"method": None}, "names no method"),
        ({"model": None}, "names no draft"),
        ({"model": "org/not-cached"}, "not in the local Hugging Face cache"),
    ],
)
def test_what_cannot_be_checked_is_never_ok(tmp_path: Path, monkeypatch, change: dict, words: str) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    argv = _argv(tmp_path, [2, 30, 58])
    config = {k: v for k, v in {**json.loads(argv[-1]), **change}.items() if v is not None}
    argv[-1] = json.dumps(config)
    with pytest.raises(PatchcraftError) as raised:
        run_vllm_preflight(argv, vllm_release_package("0.34.0"), None)
    assert words in str(raised.value) and "--no-preflight" in str(raised.value)


def test_pipeline_parallel_is_not_read(tmp_path: Path) -> None:
    with pytest.raises(PatchcraftError, match="--pipeline-parallel-size 2.*--no-preflight"):
        run_vllm_preflight(_argv(tmp_path, [2, 30, 58]) + ["-pp", "2"], vllm_release_package("0.34.0"), None)
