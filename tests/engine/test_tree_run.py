"""engine.py: a file is written whole or not at all, to a fixpoint.

``_failed_models`` (a patch error) and ``withhold`` (a harness failure) both
spread a failure along shared files until nothing changes. The models are
listed so that one pass over them is not enough: the failure must travel
back up the list, so a loop that stops after one round leaves a model
half-written.
"""

from __future__ import annotations

from pathlib import Path

from dataclasses import replace

from patchcraft.engine.tree_run import _failed_models, claim_written, withhold, withhold_unnamed
from patchcraft.planning.records import EditSite, ModelPlan
from patchcraft.engine.file_patch import FilePatch
from patchcraft.engine.records import FileChange, Mode, ModelResult, ProofVerdict, RunResult
from patchcraft.base.sources import Source
from patchcraft.base.status import ModelStatus, Proof
from patchcraft.base.target import SglangTree


def _site(kind: str, file: str, cls: str) -> EditSite:
    return EditSite(
        kind=kind,
        path=Path(file),
        module=Path(file).stem,
        cls=cls,
        method="forward" if kind == "forward" else "__init__",
    )


def _plan(name: str, init: str, forward: str, setter: str | None = None) -> ModelPlan:
    sites = [_site("init", init, f"{name}Model"), _site("forward", forward, f"{name}Model")]
    if setter is not None:
        sites.append(
            EditSite(
                kind="setter",
                path=Path(setter),
                module=Path(setter).stem,
                cls=f"{name}ForCausalLM",
                method="set_eagle3_layers_to_capture",
            )
        )
    return ModelPlan(module=name.lower(), cls=name, path=Path(init), sites=tuple(sites))


#: C needs b.py, which B needs with shared.py, which A needs with a.py, whose patch fails.
CHAIN = (
    _plan("C", "c.py", "b.py"),
    _plan("B", "b.py", "shared.py"),
    _plan("A", "a.py", "shared.py"),
    _plan("D", "d.py", "d.py"),
)
A_BROKEN = {Path("a.py"): "a.py: syntax error at line 3: bad; nothing was changed"}


def test_a_failed_file_blocks_every_model_sharing_a_capture_file_transitively() -> None:
    failed, blocked = _failed_models(CHAIN, {}, A_BROKEN)
    assert set(failed) == {"a.A", "b.B", "c.C"}
    assert blocked == {Path("a.py"), Path("shared.py"), Path("b.py"), Path("c.py")}


def test_a_model_blocked_by_a_shared_file_names_that_file_and_the_model_that_failed() -> None:
    failed, _ = _failed_models(CHAIN, {}, A_BROKEN)
    assert failed["a.A"] == A_BROKEN[Path("a.py")]
    assert failed["b.B"] == "shared.py: not written because a.A failed in the same file; fix that first"
    assert failed["c.C"] == "b.py: not written because b.B failed in the same file; fix that first"


def test_a_site_error_blocks_like_a_file_error() -> None:
    errors = FilePatch(after="", errors={_site("init", "a.py", "AModel").key: "a.py: AModel.__init__: anchor missing"})
    failed, blocked = _failed_models(CHAIN, {Path("a.py"): errors}, {})
    assert set(failed) == {"a.A", "b.B", "c.C"} and Path("c.py") in blocked
    assert failed["a.A"] == "a.py: AModel.__init__: anchor missing"


def test_a_model_sharing_nothing_with_a_failed_one_is_not_blocked() -> None:
    failed, blocked = _failed_models(CHAIN, {}, A_BROKEN)
    assert "d.D" not in failed and Path("d.py") not in blocked


def test_a_blocked_setter_file_fails_its_model_but_does_not_spread_to_others() -> None:
    """The setter block refuses -1 at run time without the flag, so its file blocks no capture file."""
    plans = (_plan("E", "e.py", "e.py", setter="s.py"), _plan("F", "f.py", "e.py"), _plan("A", "a.py", "s.py"))
    failed, blocked = _failed_models(plans, {}, A_BROKEN)
    assert failed["e.E"] == "s.py: not written because a.A failed in the same file; fix that first"
    assert "f.F" not in failed and blocked == {Path("a.py"), Path("s.py")}


def test_nothing_fails_when_every_file_patches() -> None:
    assert _failed_models(CHAIN, {}, {}) == ({}, set())


# -- withhold: the harness verdicts -------------------------------------------


def _result(*models: ModelResult) -> RunResult:
    files = sorted({f for m in models for f in m.files})
    changes = tuple(FileChange(source=Source(path=Path(f), text=""), rel=f, after="patched") for f in files)
    return RunResult(Mode.APPLY, SglangTree.__new__(SglangTree), "0", models, changes)


def _patched(name: str, *files: str) -> ModelResult:
    return ModelResult(name, files[0], ModelStatus.PATCHED, message="added: setter, init, forward", files=files)


#: Listed so that the failure must travel back up: C <- b.py <- B <- shared.py <- A.
MODELS = (
    _patched("c.C", "c.py", "b.py"),
    _patched("b.B", "b.py", "shared.py"),
    _patched("a.A", "a.py", "shared.py"),
    _patched("d.D", "d.py"),
)
VERDICTS = {
    "a.A": ProofVerdict(Proof.FAILED, "harness fail: capture: 2 of 4 states"),
    "b.B": ProofVerdict(Proof.PASSED, ""),
    "c.C": ProofVerdict(Proof.PASSED, ""),
    "d.D": ProofVerdict(Proof.PASSED, ""),
}


def test_withhold_drops_every_change_of_a_model_chained_to_a_failed_one() -> None:
    out = withhold(_result(*MODELS), VERDICTS)
    assert [c.rel for c in out.changes] == ["d.py"]


def test_withheld_models_are_would_patch_and_say_which_file_and_model_hold_them() -> None:
    rows = {m.model: m for m in withhold(_result(*MODELS), VERDICTS).models}
    assert (
        rows["a.A"].status == ModelStatus.WOULD
        and rows["a.A"].message == "not written: harness fail: capture: 2 of 4 states"
    )
    assert (
        rows["b.B"].status == ModelStatus.WOULD
        and rows["b.B"].message == "not written: shared.py is withheld because the harness did not prove a.A"
    )
    assert (
        rows["c.C"].status == ModelStatus.WOULD
        and rows["c.C"].message == "not written: b.py is withheld because the harness did not prove b.B"
    )
    assert rows["d.D"].status == ModelStatus.PATCHED and rows["d.D"].message == "added: setter, init, forward"


def test_withheld_models_keep_their_own_proof_the_failed_one_says_harness_failed() -> None:
    rows = {m.model: m for m in withhold(_result(*MODELS), VERDICTS).models}
    assert [rows[n].proof for n in ("a.A", "b.B", "c.C", "d.D")] == [
        "harness-failed",
        "harness-passed",
        "harness-passed",
        "harness-passed",
    ]


def test_a_model_already_patched_is_not_withheld_and_does_not_carry_the_block_on() -> None:
    """Only a model that would write something is held back; an already-patched one writes nothing."""
    already = ModelResult("b.B", "b.py", ModelStatus.ALREADY, message="patched", files=("b.py", "shared.py"))
    models = (_patched("c.C", "c.py", "b.py"), already, _patched("a.A", "a.py", "shared.py"))
    out = withhold(_result(*models), VERDICTS)
    rows = {m.model: m for m in out.models}
    assert rows["b.B"].status == ModelStatus.ALREADY and rows["b.B"].message == "patched"
    assert rows["c.C"].status == ModelStatus.PATCHED
    assert [c.rel for c in out.changes] == ["b.py", "c.py"]


def test_withhold_without_a_failure_changes_nothing_but_the_proofs() -> None:
    passed = {name: ProofVerdict(Proof.PASSED, "") for name in VERDICTS}
    out = withhold(_result(*MODELS), passed)
    assert [c.rel for c in out.changes] == ["a.py", "b.py", "c.py", "d.py", "shared.py"]
    assert all(m.status == ModelStatus.PATCHED and m.proof == "harness-passed" for m in out.models)


def test_a_file_with_a_failed_setter_edit_blocks_the_models_that_capture_in_it() -> None:
    """A setter file with an error is not written, whoever it serves; the failed model's init and forward file
    (a.py) is not blocked by it: A's setter is never written, so A never sets the flag there."""
    setter = EditSite(
        kind="setter", path=Path("s.py"), module="s", cls="AForCausalLM", method="set_eagle3_layers_to_capture"
    )
    plans = (_plan("A", "a.py", "a.py", setter="s.py"), _plan("G", "s.py", "s.py"))
    failed, blocked = _failed_models(
        plans, {Path("s.py"): FilePatch(after="", errors={setter.key: "s.py: setter: anchor missing"})}, {}
    )
    assert failed == {
        "a.A": "s.py: setter: anchor missing",
        "g.G": "s.py: not written because a.A failed in the same file; fix that first",
    }
    assert blocked == {Path("s.py")}


# -- with --model: what is written serves a named model; a row claims only what is written --


def _tree_row(
    name: str, file: str, message: str = "added: configured ids reach graph capture", notes=()
) -> ModelResult:
    return ModelResult(name, file, ModelStatus.PATCHED, message=message, files=(file,), notes=tuple(notes))


def test_with_model_a_named_model_held_by_a_shared_file_leaves_nothing_else_written() -> None:
    """The named model passed the harness, but a model it shares a file with failed: it is not written,
    so neither are the runner and the communicator it alone was to serve."""
    models = (
        _patched("deepseek_v2.DeepseekV2ForCausalLM", "deepseek_v2.py"),
        _patched("glm4_moe_lite.Glm4MoeLiteForCausalLM", "glm4_moe_lite.py", "deepseek_v2.py"),
        _tree_row("runner", "model_executor/cuda_graph_runner.py"),
        _tree_row("allreduce-fusion", "layers/communicator.py"),
    )
    verdicts = {
        "deepseek_v2.DeepseekV2ForCausalLM": ProofVerdict(Proof.PASSED, ""),
        "glm4_moe_lite.Glm4MoeLiteForCausalLM": ProofVerdict(Proof.FAILED, "harness fail: capture"),
    }
    out = withhold_unnamed(withhold(_result(*models), verdicts), ("deepseek_v2",))
    assert out.changes == ()
    rows = {m.model: m for m in out.models}
    assert rows["deepseek_v2.DeepseekV2ForCausalLM"].proof == "harness-passed"
    for row in ("runner", "allreduce-fusion"):
        assert rows[row].status == ModelStatus.WOULD and "not written: it serves deepseek_v2" in rows[row].message


def test_the_fusion_row_names_only_the_models_whose_layer_marks_are_written() -> None:
    notes = (
        "captures partial sums: deepseek_v2.DeepseekV2ForCausalLM (srt/models/deepseek_v2.py)",
        "captures partial sums: glm4_moe.Glm4MoeForCausalLM (srt/models/glm4_moe.py)",
    )
    fusion = _tree_row(
        "allreduce-fusion",
        "srt/layers/communicator.py",
        "added: the layers whose output a capture reads keep it reduced (DeepseekV2ForCausalLM, Glm4MoeForCausalLM)",
        notes,
    )
    deepseek = _patched("deepseek_v2.DeepseekV2ForCausalLM", "deepseek_v2.py")
    out = claim_written(_result(deepseek, fusion))
    message = next(m for m in out.models if m.model == "allreduce-fusion").message
    assert "keep it reduced (DeepseekV2ForCausalLM)" in message and "not for Glm4MoeForCausalLM" in message
    held = replace(deepseek, status=ModelStatus.WOULD, message="not written: harness fail")
    message = next(m for m in claim_written(_result(held, fusion)).models if m.model == "allreduce-fusion").message
    assert "DeepseekV2ForCausalLM" not in message.split("no layer is marked yet")[0]
    assert message.startswith("added: the guard in communicator.py only; no layer is marked yet")
    assert claim_written(_result(deepseek, replace(fusion, notes=notes[:1]))).models[1] == replace(
        fusion, notes=notes[:1]
    )


def test_a_run_planned_from_a_model_s_files_writes_what_the_whole_tree_s_run_writes():
    """``reaching``: qwen2's forward is shared by qwen3 and qwen2_5_vl, whose own ``__init__`` must then set the flag;
    planned from qwen2.py alone, the run still reaches them (their files import qwen2), and writes the same."""
    from conftest import release_package
    from patchcraft.base.target import resolve_target
    from patchcraft.engine.tree_run import run
    from patchcraft.planning.selection import plan_tree

    tree = resolve_target(str(release_package("0.5.10")))
    (plan,) = plan_tree(tree, ("qwen2.Qwen2ForCausalLM",))[:1]
    assert [tree.relative(f) for f in plan.files] == ["sglang/srt/models/qwen2.py"]
    whole = run(tree, Mode.APPLY, (plan.label,))
    scoped = run(tree, Mode.APPLY, (plan.label,), reaching=plan.files)
    written = [c.rel for c in scoped.changes]
    assert "sglang/srt/models/qwen3.py" in written and "sglang/srt/models/qwen2_5_vl.py" in written
    assert [(c.rel, c.after) for c in scoped.changes] == [(c.rel, c.after) for c in whole.changes]
    assert [m.model for m in scoped.models] == [m.model for m in whole.models] and scoped.tree == whole.tree
