"""The harness's rows as plain records (patchcraft.harness.rows): kept by their bytes, and a proof answered from them.

On the real release of conftest.SMALL_RELEASE: nothing kept, no answer;
once apply has proven its rows, a second apply of another copy of the same
release is answered from the kept rows, with the same records and without
importing torch; a copy with one byte changed in a patched file runs again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import flip_one_byte, run_reporting_torch
from patchcraft.base.status import HarnessStatus
from patchcraft.base.target import resolve_target
from patchcraft.harness.rows import Check, SmokeResult, kept_rows, row_data, row_of

pytest.importorskip("torch")


def test_a_row_comes_back_as_it_was() -> None:
    row = SmokeResult(
        "llama.LlamaForCausalLM",
        "srt/models/llama.py",
        HarnessStatus.FAIL,
        "capture: aux[0] is hs[2], expected hs[0]",
        (Check("init", HarnessStatus.PASS), Check("capture", HarnessStatus.FAIL, "aux[0] is hs[2]", "a note")),
        0.25,
        "list, residual none",
        "init: a note",
    )
    assert row_of(json.loads(json.dumps(row_data(row)))) == row


def test_nothing_kept_is_no_answer(package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PATCHCRAFT_NO_CACHE", raising=False)
    from patchcraft.engine.records import Mode
    from patchcraft.engine.tree_run import run

    result = run(resolve_target(str(package)), Mode.APPLY, names=["llama"], runner=False)
    texts = {change.source.path: change.after for change in result.changes}
    assert kept_rows(result.tree, [m for m in result.models if m.is_model_class], texts) is None


def test_a_second_copy_is_proven_from_the_kept_rows_without_torch(package: Path, tmp_path: Path) -> None:

    def apply(tree: Path) -> tuple[dict, str]:
        argv = ["apply", str(tree), "--no-runner", "--model", "llama", "--format", "json"]
        done = run_reporting_torch(argv, tmp_path / "cache")
        document = json.loads(done.stdout)
        for model in document["models"]:
            model.pop("seconds", None)
        return document, done.stderr

    copies = []
    for name in ("first", "second", "third"):
        copies.append(shutil.copytree(package, tmp_path / name / "sglang"))
    first, said = apply(copies[0])
    proofs = {m["model"]: m["proof"] for m in first["models"] if m["status"] == "patched"}
    assert proofs and set(proofs.values()) == {"harness-passed"}, first
    assert "torch imported: True" in said
    second, said = apply(copies[1])
    assert "torch imported: False" in said, said
    assert second["models"] == first["models"] and second["summary"]["exit_code"] == first["summary"]["exit_code"]
    flip_one_byte(copies[2] / "srt" / "models" / "llama.py", b"Copyright", b"CopyrighT")  # a comment: still other bytes
    _, said = apply(copies[2])
    assert "torch imported: True" in said, "one byte changed: the harness runs again"
