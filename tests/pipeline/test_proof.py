"""Proof before write: ``apply`` runs the CPU harness on what it would write, and withholds what fails.

The faults planted here are runtime-only: every static check passes (the
blocks are present, in place, compile, and are idempotent), only running
the patched methods shows the draft would get the wrong tensors.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import run_cli

pytest.importorskip("torch")

MODELS = "srt/models"


def _digests(package: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((package / MODELS).glob("*.py"))}


def _apply_json(capsys, *argv: str) -> tuple[int, dict]:
    code, out, _ = run_cli(capsys, "apply", "--format", "json", "--no-runner", *argv)
    return code, json.loads(out)


def test_a_runtime_fault_in_the_release_is_not_written(release_copy, capsys) -> None:
    """The layer loop empties the collector on its first layer: harmless unpatched (nothing is
    captured yet), fatal to the embedding capture before the loop; only running it shows that."""
    package = release_copy("0.5.10")
    path = package / MODELS / "deepseek_v2.py"
    text = path.read_text(encoding="utf-8")
    anchor = "        for i in range(normal_start_layer, normal_end_layer):\n"
    assert text.count(anchor) == 1
    planted = "            if i == normal_start_layer:\n                aux_hidden_states.clear()\n"
    path.write_text(text.replace(anchor, anchor + planted), encoding="utf-8")
    before = _digests(package)

    code, document = _apply_json(capsys, str(package))
    assert code == 1
    rows = {m["model"]: m for m in document["models"]}
    failed = rows["deepseek_v2.DeepseekV2ForCausalLM"]
    assert failed["proof"] == "harness-failed" and failed["status"] == "would-patch"
    assert "capture:" in failed["message"] and "expected 3 aux states" in failed["message"], failed["message"]
    # Models sharing its files are withheld with it; the rest are proven and written.
    for shared in ("glm4_moe_lite.Glm4MoeLiteForCausalLM", "kimi_k25.KimiK25ForConditionalGeneration"):
        assert rows[shared]["status"] == "would-patch" and rows[shared]["proof"] == "harness-failed", rows[shared]
    assert (
        rows["llama.LlamaForCausalLM"]["proof"] == "harness-passed"
        and rows["llama.LlamaForCausalLM"]["status"] == "patched"
    )
    after = _digests(package)
    for name in ("deepseek_v2.py", "glm4_moe_lite.py", "mistral_large_3_eagle.py"):
        assert after[name] == before[name], name
    assert after["llama.py"] != before["llama.py"]


def test_a_runtime_fault_in_a_transform_is_not_written(release_copy, capsys, monkeypatch) -> None:
    """A transform that forgets the copy: the block is patchcraft's own, so verify-style checks pass."""
    from patchcraft.transforms import capture_embedding_output as forward

    monkeypatch.setattr(forward, "NO_RESIDUAL_EXPRESSION", "hidden_states")
    monkeypatch.setattr(forward, "SEED_EXPRESSION", "hidden_states if residual is None else hidden_states + residual")
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    package = release_copy("0.5.10")
    before = _digests(package)
    code, document = _apply_json(capsys, str(package), "--model", "llama")
    assert code == 1
    llama = next(m for m in document["models"] if m["model"] == "llama.LlamaForCausalLM")
    assert llama["proof"] == "harness-failed" and "shares storage with the embedding output" in llama["message"], llama
    assert _digests(package) == before


def test_no_smoke_writes_without_the_harness(release_copy, capsys) -> None:
    package = release_copy("0.5.10")
    code, document = _apply_json(capsys, str(package), "--model", "llama", "--no-smoke")
    assert code == 0
    llama = next(m for m in document["models"] if m["model"] == "llama.LlamaForCausalLM")
    assert llama["status"] == "patched" and llama["proof"] == "skipped (--no-smoke)"


def test_a_hand_fix_is_run_by_verify(release_copy, capsys) -> None:
    """verify runs the harness on hand-made edits whatever --smoke says: the field fix has no
    first-stage gate, so on a later pipeline stage it captures the received tensor."""
    package = release_copy("0.5.10")
    path = package / MODELS / "exaone_moe.py"
    text = path.read_text(encoding="utf-8")
    for old, new in (
        (
            "        self.layers_to_capture = []\n",
            "        self.layers_to_capture = []\n        self.capture_embedding_for_eagle3 = False\n",
        ),
        (
            "            self.model.layers_to_capture = [val + 1 for val in layer_ids]\n",
            "            self.model.capture_embedding_for_eagle3 = (-1 in layer_ids)\n"
            "            self.model.layers_to_capture = [val + 1 for val in layer_ids if val >= 0]\n",
        ),
        (
            "        aux_hidden_states = []\n",
            "        aux_hidden_states = []\n        if self.capture_embedding_for_eagle3:\n"
            "            aux_hidden_states.append(hidden_states.clone() if residual is None else hidden_states + residual)\n",
        ),
    ):
        assert text.count(old) == 1
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
    code, out, _ = run_cli(capsys, "verify", "--format", "json", "--no-runner", str(package), "--model", "exaone_moe")
    row = next(m for m in json.loads(out)["models"] if m["model"] == "exaone_moe.ExaoneMoEForCausalLM")
    assert code == 1 and row["proof"] == "harness-failed" and "pipeline:" in row["message"], row
    code, out, _ = run_cli(
        capsys, "verify", "--format", "json", "--no-runner", "--no-smoke", str(package), "--model", "exaone_moe"
    )
    assert code == 0


def test_withhold_takes_every_model_sharing_a_file_of_a_failed_one() -> None:
    """A file is written whole or not at all: B shares a file with failed A, C shares one with B."""
    from patchcraft.engine.tree_run import withhold
    from patchcraft.engine.records import FileChange, Mode, ModelResult, ProofVerdict, RunResult
    from patchcraft.base.status import ModelStatus, Proof
    from patchcraft.base.sources import Source
    from patchcraft.base.target import SglangTree

    def change(rel: str) -> FileChange:
        return FileChange(source=Source(path=Path(rel), text=""), rel=rel, after="x")

    models = (
        ModelResult("a.A", "a.py", ModelStatus.PATCHED, files=("a.py", "shared.py")),
        ModelResult("b.B", "b.py", ModelStatus.PATCHED, files=("b.py", "shared.py")),
        ModelResult("c.C", "c.py", ModelStatus.PATCHED, files=("c.py", "b.py")),
        ModelResult("d.D", "d.py", ModelStatus.PATCHED, files=("d.py",)),
    )
    tree = SglangTree.__new__(SglangTree)
    result = RunResult(
        Mode.APPLY, tree, "0", models, tuple(change(f) for f in ("a.py", "b.py", "c.py", "d.py", "shared.py"))
    )
    verdicts = {
        "a.A": ProofVerdict(Proof.FAILED, "harness fail: capture: ..."),
        "b.B": ProofVerdict(Proof.PASSED, ""),
        "c.C": ProofVerdict(Proof.PASSED, ""),
        "d.D": ProofVerdict(Proof.PASSED, ""),
    }
    out = withhold(result, verdicts)
    rows = {m.model: m for m in out.models}
    assert [c.rel for c in out.changes] == ["d.py"]
    assert rows["a.A"].status == ModelStatus.WOULD and rows["a.A"].message == "not written: harness fail: capture: ..."
    assert (
        rows["b.B"].status == ModelStatus.WOULD
        and rows["b.B"].message == "not written: shared.py is withheld because the harness did not prove a.A"
    )
    assert (
        rows["c.C"].status == ModelStatus.WOULD
        and "b.py is withheld because the harness did not prove b.B" in rows["c.C"].message
    )
    assert rows["d.D"].status == ModelStatus.PATCHED and rows["d.D"].proof == "harness-passed"


def test_a_patched_row_the_harness_skipped_says_so_and_why() -> None:
    """A written model the harness could not run itself is ``harness-skipped`` with the harness's words, never bare.

    (A vLLM mixin class whose one shared edit other classes proved; an unpatched row's skip records nothing.)
    """
    from patchcraft.base.status import HarnessStatus, ModelStatus, Proof
    from patchcraft.base.target import SglangTree
    from patchcraft.engine.records import Mode, ModelResult, RunResult
    from patchcraft.harness.runner import SmokeResult, SmokeRun
    from patchcraft.pipeline.proof import record
    from patchcraft.ui.console import message_of

    models = (
        ModelResult("m.Skipped", "m.py", ModelStatus.PATCHED, message="added: vllm-mixin"),
        ModelResult("m.Proven", "m.py", ModelStatus.PATCHED, message="added: vllm-mixin"),
        ModelResult("n.Other", "n.py", ModelStatus.UNSUPPORTED, message="no capture"),
    )
    tree = SglangTree.__new__(SglangTree)
    run = SmokeRun(
        tree,
        "0",
        (
            SmokeResult("m.Skipped", "m.py", HarnessStatus.SKIPPED, "cannot show the edit here; proven on m.Proven"),
            SmokeResult("m.Proven", "m.py", HarnessStatus.PASS),
            SmokeResult("n.Other", "n.py", HarnessStatus.SKIPPED, "unsupported: no capture"),
        ),
    )
    rows = {m.model: m for m in record(RunResult(Mode.APPLY, tree, "0", models, ()), run).models}
    assert rows["m.Skipped"].status == ModelStatus.PATCHED and rows["m.Skipped"].proof == Proof.HARNESS_SKIPPED
    assert message_of(rows["m.Skipped"]) == (
        "added: vllm-mixin; proof: harness-skipped (cannot show the edit here; proven on m.Proven)"
    )
    assert message_of(rows["m.Proven"]) == "added: vllm-mixin; proof: harness-passed"
    assert rows["n.Other"].proof is None


def test_a_named_class_that_inherits_its_parents_edits_is_proven_itself(release_copy, capsys) -> None:
    """0.5.10: ``DeepseekV3ForCausalLM`` inherits DeepseekV2ForCausalLM's setter and edit sites; named with
    ``--model`` it has a row of its own, and the harness runs that class too, as it runs the rows brought along."""
    package = release_copy("0.5.10")
    code, doc = _apply_json(capsys, "--no-fusion-fix", "--model", "DeepseekV3ForCausalLM", str(package))
    rows = {m["model"]: m for m in doc["models"]}
    named = rows["deepseek_v2.DeepseekV3ForCausalLM"]
    assert code == 0 and named["status"] == "patched" and named["included_by"] is None, named
    assert {label: m["proof"] for label, m in rows.items()} == {label: "harness-passed" for label in rows}, rows
