"""The allreduce-fusion row: captured layer states stay reduced at TP > 1.

- the row: would-patch / patched / already-patched / reverted byte for byte
  on releases whose models capture ``hidden_states + residual`` before a
  deferred all-reduce; not-needed where none does (0.5.23); golden diffs
  under golden/<release>/layers/communicator.diff;
- check-draft and explain ``--tp``;
- proof on CPU: two gloo ranks run stand-in layers with the release's own
  decision function, unpatched and patched.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from patchcraft.diffs import unified_diff
from patchcraft.engine import run, write_changes
from patchcraft.patching import patch_text, revert_text
from patchcraft.results import Mode
from patchcraft.status import ModelStatus
from patchcraft.transforms import keep_captured_states_reduced as fusion
from patchcraft.tree import resolve_target

from conftest import GOLDEN, copy_release, release_package, run_cli

GOLDEN_RELEASES = ("0.5.6", "0.5.10")
#: What the fusion row reads beyond conftest.COPIED.
EXTRA = ("srt/layers/communicator.py", "srt/layers/layer_boundary", "srt/server_args.py")


def fusion_copy(version: str, dest: Path) -> Path:
    return copy_release(version, dest, extra=EXTRA)


def row(result):
    return next(m for m in result.models if m.model == fusion.ROW)


@pytest.mark.parametrize("version", GOLDEN_RELEASES)
def test_fusion_row_golden_idempotent_revert(version: str, tmp_path: Path, update_golden: bool) -> None:
    package = fusion_copy(version, tmp_path)
    tree = resolve_target(str(package))
    pristine = (package / fusion.COMMUNICATOR).read_bytes()
    assert row(run(tree, Mode.CHECK, runner=False)).status == ModelStatus.WOULD
    first = run(tree, Mode.APPLY, names=[fusion.ROW])
    assert [m.model for m in first.models] == [fusion.ROW] and row(first).status == ModelStatus.PATCHED
    [change] = first.changes
    golden = GOLDEN / version / "layers" / "communicator.diff"
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_bytes(unified_diff(change).encode("utf-8"))
    assert unified_diff(change) == golden.read_bytes().decode("utf-8")
    write_changes(first.changes)
    verify = run(tree, Mode.VERIFY, names=[fusion.ROW])
    assert row(verify).status == ModelStatus.ALREADY and row(verify).compiles and not verify.changes
    reverted = run(tree, Mode.REVERT, names=[fusion.ROW])
    assert row(reverted).status == ModelStatus.REVERTED
    write_changes(reverted.changes)
    assert (package / fusion.COMMUNICATOR).read_bytes() == pristine


def test_fusion_row_skipped_with_flag(tmp_path: Path) -> None:
    tree = resolve_target(str(fusion_copy("0.5.10", tmp_path)))
    assert fusion.ROW not in [m.model for m in run(tree, Mode.CHECK, fusion=False).models]
    assert fusion.ROW in [m.model for m in run(tree, Mode.CHECK).models]


def test_not_needed_where_layers_reduce_at_the_boundary(tmp_path: Path) -> None:
    tree = resolve_target(str(fusion_copy("0.5.23", tmp_path)))
    result = row(run(tree, Mode.CHECK, names=[fusion.ROW]))
    assert result.status == ModelStatus.NOT_NEEDED, result


def test_affected_models_follow_structure() -> None:
    """deepseek_v2 moves its capture after the reduction in 0.5.14; glm4_moe keeps it before, on to 0.5.20."""
    names = lambda v: {p.stem for p in fusion.plan(release_package(v)).affected}  # noqa: E731
    assert {"deepseek_v2", "glm4_moe", "gpt_oss"} <= names("0.5.10")
    assert "deepseek_v2" not in names("0.5.15") and "glm4_moe" in names("0.5.15")
    assert "qwen3_moe" not in names("0.5.10")  # captures after prepare_attn: reduced


def test_broken_decision_is_reported_not_patched(tmp_path: Path) -> None:
    """A decision without the EAGLE guard to anchor on: unsupported, nothing written."""
    package = fusion_copy("0.5.10", tmp_path)
    path = package / fusion.COMMUNICATOR
    text = path.read_text()
    path.write_text(text.replace(".is_eagle()", ".is_standalone()", 1))
    tree = resolve_target(str(package))
    result = run(tree, Mode.APPLY, names=[fusion.ROW])
    assert row(result).status == "unsupported" and not result.changes


def _draft(directory: Path, ids: list[int]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168, "target_hidden_size": 7168, "num_hidden_layers": 1,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_check_draft_tp(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Kimi / DeepSeek-V3 at TP 8 on 0.5.10: partial sums until apply; nothing about fusion at TP 1."""
    package = fusion_copy("0.5.10", tmp_path / "tree")
    draft = _draft(tmp_path / "draft", [2, 29, 57])
    args = ("check-draft", str(draft), str(package), "--model", "DeepseekV3ForCausalLM", "--num-layers", "61", "--no-cuda-graph")
    code, out, _ = run_cli(capsys, *args, "--tp", "8")
    assert code == 1 and fusion.PARTIAL_SUMS in out and "--enforce-disable-flashinfer-allreduce-fusion" in out, out
    assert "mismatch: " + fusion.PARTIAL_SUMS in out
    code, out, _ = run_cli(capsys, *args, "--tp", "1")
    assert code == 0 and "fusion" not in out, out
    code, out, _ = run_cli(capsys, "explain", str(package), "--model", "DeepseekV3ForCausalLM", "--num-layers", "61", "--layer-ids", "2,29,57", "--tp", "8")
    assert code == 1 and "warning: " + fusion.PARTIAL_SUMS in out
    code, _, _ = run_cli(capsys, "apply", str(package), "--no-smoke")
    assert code == 0
    code, out, _ = run_cli(capsys, *args, "--tp", "8")
    assert code == 0 and fusion.PARTIAL_SUMS not in out and "ok    fusion" in out, out


def test_release_without_enforce_flag_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    package = fusion_copy("0.5.6", tmp_path / "tree")
    code, out, _ = run_cli(capsys, "explain", str(package), "--model", "DeepseekV3ForCausalLM", "--num-layers", "61", "--layer-ids", "2,29,57", "--tp", "8")
    assert code == 1 and "does not exist in this release" in out


# -- proof on CPU: two gloo ranks ---------------------------------------------------

def _two_ranks(source: str):
    import torch
    import torch.multiprocessing as mp

    import fusion_standins

    with tempfile.TemporaryDirectory() as out:
        init = f"file://{out}/rendezvous"
        mp.spawn(fusion_standins.worker, args=(2, source, init, out), nprocs=2, join=True)
        return [torch.load(f"{out}/rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("version", ("0.5.10", "0.5.6"))
def test_gloo_capture_is_reduced_only_when_patched(version: str) -> None:
    pytest.importorskip("torch")
    import torch

    import fusion_standins

    path = release_package(version) / fusion.COMMUNICATOR
    text = path.read_text()
    site = fusion.plan(release_package(version)).site
    patched = patch_text(text, path, [site], {fusion.KIND: fusion}).after
    assert revert_text(patched, path) == text
    before, after = fusion_standins.decision_source(text), fusion_standins.decision_source(patched)
    assert before != after
    ref = fusion_standins.reference(before)
    assert torch.equal(ref, fusion_standins.reference(after))  # TP 1: nothing to fuse either way
    r0, r1 = _two_ranks(before)
    assert not torch.allclose(r0, r1) and not torch.allclose(r0, ref), "unpatched: the capture should be a per-rank partial sum"
    # The embedding (hidden at layer 1 is layer 0's MLP output): every capture after layer 0 is partial.
    r0, r1 = _two_ranks(after)
    assert torch.allclose(r0, ref) and torch.allclose(r1, ref)
