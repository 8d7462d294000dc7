"""The allreduce-fusion row: captured layer states stay reduced at TP > 1.

- the row: would-patch / patched / already-patched / reverted byte for byte
  on releases whose models capture ``hidden_states + residual`` before a
  deferred all-reduce; not-needed where none does (0.5.23); golden diffs
  under golden/<release>/layers/communicator.diff;
- check-draft and explain ``--tp``;
- which models the detection lists (patchcraft.reading.fusion_reading), and, per
  model on applied 0.5.14 and 0.5.20 trees, each layer's decision after the
  patched setter ran: the release's own where the capture reads the reduced
  state, unfused only on the layers a capture reads where it reads a
  deferred sum;
- proof on CPU: two gloo ranks run stand-in layers with the release's own
  decision function and the patched setter's marks, unpatched and patched,
  for EAGLE-3, EAGLE and MTP.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from patchcraft.engine.diffs import unified_diff
from patchcraft.engine.extra_rows import KEEP_REDUCED, PARTIAL_SUMS
from patchcraft.engine.tree_run import run, write_changes
from patchcraft.engine.file_patch import patch_text, revert_text
from patchcraft.engine.records import Mode
from patchcraft.base.status import ModelStatus
from patchcraft.transforms import keep_captured_states_reduced as fusion
from patchcraft.base.target import resolve_target

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
    """0.5.23: not-needed because no model's capture reads a deferred sum, which the models say (not the directory)."""
    tree = resolve_target(str(fusion_copy("0.5.23", tmp_path)))
    result = row(run(tree, Mode.CHECK, names=[fusion.ROW]))
    assert result.status == ModelStatus.NOT_NEEDED and "no decoder layer defers its all-reduce" in result.message, (
        result
    )


def test_boundary_release_with_a_deferring_model_is_not_called_not_needed(tmp_path: Path) -> None:
    """Plant 0.5.20's glm4_moe.py (it defers and captures hidden_states + residual) into 0.5.23: no longer not-needed."""
    package = fusion_copy("0.5.23", tmp_path)
    (package / "srt" / "models" / "glm4_moe.py").write_bytes(
        (release_package("0.5.20") / "srt" / "models" / "glm4_moe.py").read_bytes()
    )
    result = row(run(resolve_target(str(package)), Mode.CHECK, names=[fusion.ROW]))
    assert result.status == ModelStatus.UNSUPPORTED and "Glm4MoeForCausalLM" in result.message, result


def _names(version: str) -> set[str]:
    return {c.model.rpartition(".")[2] for c in fusion.affected_models(release_package(version))}


#: DFLASH-only setters (laguna, mimo_v2, nemotron_h) and no setter at all (bailing_moe_v3): never listed.
NOT_EAGLE3 = ("laguna", "mimo_v2", "nemotron_h", "bailing_moe_v3")


@pytest.mark.parametrize(
    "version,affected,reduced",
    [
        ("0.5.2", {"GptOssForCausalLM", "Qwen3MoeForCausalLM"}, set()),  # qwen3_moe's loop is qwen2_moe.py's
        (
            "0.5.10",
            {"DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "Glm4MoeForCausalLM", "GptOssForCausalLM"},
            {"Qwen3MoeForCausalLM"},
        ),
        (
            "0.5.14",
            {
                "Glm4MoeForCausalLM",
                "GptOssForCausalLM",
                "BailingMoeV2ForCausalLM",
                "Qwen3VLMoeForConditionalGeneration",
            },
            {"DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "Qwen3MoeForCausalLM", "MiniMaxM2ForCausalLM"},
        ),
        (
            "0.5.20",
            {
                "Glm4MoeForCausalLM",
                "GptOssForCausalLM",
                "BailingMoeV2ForCausalLM",
                "Qwen3VLMoeForConditionalGeneration",
                "Glm5NextForConditionalGeneration",
            },
            {"DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "Qwen3MoeForCausalLM", "MiniMaxM2ForCausalLM"},
        ),
    ],
)
def test_affected_models_follow_structure(version: str, affected: set, reduced: set) -> None:
    """deepseek_v2 moves its capture after the reduction in 0.5.14; glm4_moe keeps it before, on to 0.5.20;
    inherited layers (qwen3_vl_moe), helpers (glm5_next) and loops in another file (qwen3_moe on 0.5.2) count."""
    found = fusion.affected_models(release_package(version))
    names = {c.model.rpartition(".")[2] for c in found}
    assert affected <= names and not (reduced & names), sorted(names)
    assert not {c.path.stem for c in found} & set(NOT_EAGLE3)


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
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": 7168,
        "target_hidden_size": 7168,
        "num_hidden_layers": 1,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_check_draft_tp(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Kimi / DeepSeek-V3 at TP 8 on 0.5.10: partial sums until apply; nothing about fusion at TP 1."""
    package = fusion_copy("0.5.10", tmp_path / "tree")
    draft = _draft(tmp_path / "draft", [2, 29, 57])
    args = (
        "check-draft",
        str(draft),
        str(package),
        "--model",
        "DeepseekV3ForCausalLM",
        "--num-layers",
        "61",
        "--no-cuda-graph",
    )
    code, out, _ = run_cli(capsys, *args, "--tp", "8")
    assert code == 1 and fusion.PARTIAL_SUMS in out and "--enforce-disable-flashinfer-allreduce-fusion" in out, out
    assert "mismatch: " + fusion.PARTIAL_SUMS in out
    code, out, _ = run_cli(capsys, *args, "--tp", "1")
    assert code == 0 and fusion.PARTIAL_SUMS not in out and "  fusion  " not in out, out
    code, out, _ = run_cli(
        capsys,
        "explain",
        str(package),
        "--model",
        "DeepseekV3ForCausalLM",
        "--num-layers",
        "61",
        "--layer-ids",
        "2,29,57",
        "--tp",
        "8",
    )
    assert code == 1 and "warning: " + fusion.PARTIAL_SUMS in out
    code, _, _ = run_cli(capsys, "apply", str(package), "--no-smoke")
    assert code == 0
    code, out, _ = run_cli(capsys, *args, "--tp", "8")
    assert code == 0 and fusion.PARTIAL_SUMS not in out and "ok    fusion" in out, out


def test_release_without_enforce_flag_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    package = fusion_copy("0.5.6", tmp_path / "tree")
    code, out, _ = run_cli(
        capsys,
        "explain",
        str(package),
        "--model",
        "DeepseekV3ForCausalLM",
        "--num-layers",
        "61",
        "--layer-ids",
        "2,29,57",
        "--tp",
        "8",
    )
    assert code == 1 and "does not exist in this release" in out


# -- per model, on an applied tree: the patched setter's marks and the patched decision --------------

PER_MODEL = {
    "0.5.14": (
        "DeepseekV3ForCausalLM",
        "KimiK25ForConditionalGeneration",
        "Qwen3MoeForCausalLM",
        "MiniMaxM2ForCausalLM",
        "Glm4MoeForCausalLM",
        "GptOssForCausalLM",
        "BailingMoeV2ForCausalLM",
        "Qwen3VLMoeForConditionalGeneration",
    ),
    "0.5.20": (
        "DeepseekV3ForCausalLM",
        "KimiK25ForConditionalGeneration",
        "Qwen3MoeForCausalLM",
        "MiniMaxM2ForCausalLM",
        "Glm4MoeForCausalLM",
        "GptOssForCausalLM",
        "BailingMoeV2ForCausalLM",
        "Qwen3VLMoeForConditionalGeneration",
        "Glm5NextForConditionalGeneration",
    ),
}
#: The models whose capture reads the deferred sum (the review's list, checked here against the run).
DEFERRED = {
    "Glm4MoeForCausalLM",
    "GptOssForCausalLM",
    "BailingMoeV2ForCausalLM",
    "Qwen3VLMoeForConditionalGeneration",
    "Glm5NextForConditionalGeneration",
}
NUM_LAYERS, IDS = 12, [-1, 2, 6]


def _layer_decisions(graph, cls, communicator: str, decide, monkeypatch) -> tuple[tuple[int, ...], list[bool]]:
    """Run the (patched) setter with IDS on stand-ins whose layers have communicators; then each layer's decision."""
    from types import SimpleNamespace

    import fusion_standins
    from patchcraft.reading import setter_sandbox

    algo = fusion_standins.Algo("EAGLE3")

    class Layer:
        def __init__(self) -> None:
            setattr(
                self,
                communicator,
                SimpleNamespace(
                    _speculative_algo=algo,
                    is_last_layer=False,
                    _context=SimpleNamespace(tp_size=8),
                    layer_scatter_modes=SimpleNamespace(mlp_mode="full"),
                ),
            )

    layers: list = []

    def make() -> list:
        layers[:] = [Layer() for _ in range(NUM_LAYERS)]
        for index, layer in enumerate(layers):
            getattr(layer, communicator).is_last_layer = index == NUM_LAYERS - 1
        return layers

    make()  # a setter that never reads ``layers`` leaves them unmarked
    original = setter_sandbox._attribute
    monkeypatch.setattr(
        setter_sandbox,
        "_attribute",
        lambda owner, ev, c, name: layers if name == "layers" else original(owner, ev, c, name),
    )
    result = setter_sandbox.run_setter(graph, cls, IDS, NUM_LAYERS)
    assert result.error is None and result.layers_to_capture, result
    batch = SimpleNamespace(input_ids=SimpleNamespace(shape=(4,)))
    return result.layers_to_capture, [bool(decide(getattr(layer, communicator), batch)) for layer in layers]


@pytest.mark.parametrize("version", sorted(PER_MODEL))
def test_each_model_keeps_the_release_decision_unless_its_capture_reads_a_deferred_sum(
    version: str, tmp_path: Path, monkeypatch
) -> None:
    """After `apply`: the patched setter of each model runs, then each layer's patched decision (TP 8, EAGLE-3).

    Reduced-state models: the release's own decision on every layer (fused but for the last). Deferred-sum models:
    unfused exactly on the layers whose output a capture reads (layer i-1 for a capture at the top of layer i).
    """
    pytest.importorskip("torch")
    import fusion_standins
    from patchcraft.reading.fusion_reading import read_capture
    from patchcraft.planning.model_plans import scan

    package = fusion_copy(version, tmp_path)
    pristine = (package / fusion.COMMUNICATOR).read_text()
    applied = run(resolve_target(str(package)), Mode.APPLY)
    write_changes(applied.changes)
    patched = (package / fusion.COMMUNICATOR).read_text()
    algo = fusion_standins.Algo("EAGLE3")
    release = fusion_standins.compile_decision(fusion_standins.decision_source(pristine), 8, algo)
    decide = fusion_standins.compile_decision(fusion_standins.decision_source(patched), 8, algo)
    graph = scan(package / "srt" / "models")
    seen = {}
    for name in PER_MODEL[version]:
        cls = next(c for c in graph.classes.values() if c.name == name)
        capture = read_capture(graph, cls)
        assert capture is not None and capture.communicator, name
        ids, decisions = _layer_decisions(graph, cls, capture.communicator, decide, monkeypatch)
        _, own = _layer_decisions(graph, cls, capture.communicator, release, monkeypatch)
        assert own == [i != NUM_LAYERS - 1 for i in range(NUM_LAYERS)], (
            name,
            own,
        )  # the release fuses every layer but the last
        read = {i - 1 for i in ids if i >= 1}
        expected = [d and i not in read for i, d in enumerate(own)] if name in DEFERRED else own
        seen[name] = (decisions == expected, sorted(read))
        assert decisions == expected, (name, ids, decisions)
    assert all(ok for ok, _ in seen.values()), seen


# -- proof on CPU: two gloo ranks ---------------------------------------------------


def _two_ranks(source: str, algo: str = "EAGLE3", mark: str = ""):
    import torch
    import torch.multiprocessing as mp

    import fusion_standins

    with tempfile.TemporaryDirectory() as out:
        init = f"file://{out}/rendezvous"
        mp.spawn(fusion_standins.worker, args=(2, source, init, out, algo, mark), nprocs=2, join=True)
        return [torch.load(f"{out}/rank{r}.pt") for r in range(2)]


#: Each decision shape: 0.5.2 (gpt-oss, global_server_args_dict), 0.5.6, 0.5.10, 0.5.14 (moe-cp), 0.5.20 (EP x TP).
PROOF_RELEASES = ("0.5.2", "0.5.6", "0.5.10", "0.5.14", "0.5.20")


def patched_decision(version: str, communicator: str | None = None) -> tuple[str, str]:
    """The release's decision, and the decision as `apply` writes it (``communicator``: that text instead)."""
    import fusion_standins

    package = release_package(version)
    path = package / fusion.COMMUNICATOR
    text = path.read_text()
    plan = fusion.plan(package)
    assert plan.site is not None, plan
    patched = patch_text(text, path, [plan.site], {fusion.KIND: fusion}).after if communicator is None else communicator
    assert revert_text(patch_text(text, path, [plan.site], {fusion.KIND: fusion}).after, path) == text
    return fusion_standins.decision_source(text), fusion_standins.decision_source(patched)


def setter_marks(version: str) -> str:
    """The marking loop `apply` writes into the setter of the first affected model (gpt_oss on 0.5.2, ...)."""
    import ast

    from patchcraft.planning.model_plans import plan_models, scan
    from patchcraft.transforms import mark_captured_outputs as marks

    graph = scan(release_package(version) / "srt" / "models")
    [plan] = [p for p in plan_models(graph) if any(s.kind == marks.KIND for s in p.sites)][:1]
    site = next(s for s in plan.sites if s.kind == marks.KIND)
    text = site.path.read_text()
    patched = patch_text(text, site.path, [s for s in plan.sites if s.path == site.path]).after
    lines = patched.splitlines(keepends=True)
    loop = next(
        n
        for n in ast.walk(ast.parse(patched))
        if isinstance(n, ast.For) and lines[n.lineno - 2].strip() == marks.COMMENT
    )
    return "".join(lines[loop.lineno - 1 : loop.end_lineno])


def check_proof(version: str, communicator: str | None = None) -> None:
    """Two gloo ranks, TP 2: the patched decision with the patched setter's marks, for EAGLE-3, EAGLE and MTP."""
    import torch

    import fusion_standins

    before, after = patched_decision(version, communicator)
    mark = setter_marks(version)
    last = fusion_standins.LAYERS - 1
    release = fusion_standins.decisions(before, 2, "EAGLE3", mark)
    assert release == [i != last for i in range(fusion_standins.LAYERS)], release  # the release fuses all but the last
    # EAGLE-3: unfused exactly where a capture reads the output, fused everywhere else.
    r0, r1 = _two_ranks(after, "EAGLE3", mark)
    wanted = [i != last and i not in fusion_standins.READ for i in range(fusion_standins.LAYERS)]
    assert r0["fused"] == r1["fused"] == wanted, (r0["fused"], wanted)
    ref = fusion_standins.reference(after, "EAGLE3", mark)
    assert torch.equal(ref, fusion_standins.reference(before, "EAGLE3", mark))  # TP 1: nothing to fuse either way
    assert torch.allclose(r0["aux"], ref) and torch.allclose(r1["aux"], ref), (
        "patched: every capture (embedding too) is reduced"
    )
    # EAGLE and MTP: the release's own decision on every layer, even with the marks set.
    for algo in ("EAGLE", "MTP"):
        assert fusion_standins.decisions(after, 2, algo, mark) == release, algo
    # Unpatched: the captures at the tops of layers 2 and 4 are per-rank partial sums (the embedding is not).
    u0, u1 = _two_ranks(before, "EAGLE3", mark)
    assert torch.allclose(u0["aux"][0], ref[0]), "the embedding is replicated"
    assert not torch.allclose(u0["aux"][1:], u1["aux"][1:]) and not torch.allclose(u0["aux"][1:], ref[1:]), (
        "unpatched: partial sums"
    )


#: The fast tier proves the guard on the release before the deepseek fix and the one after; the full tier on all.
PROOF_FAST = ("0.5.10", "0.5.14")


@pytest.mark.parametrize(
    "version", [v if v in PROOF_FAST else pytest.param(v, marks=pytest.mark.slow) for v in PROOF_RELEASES]
)
def test_gloo_capture_is_reduced_only_where_read_when_patched(version: str) -> None:
    pytest.importorskip("torch")
    check_proof(version)


#: The guard `apply` writes, and three broken ones the proof must reject.
_GUARD = '.is_eagle3() and getattr(self, "patchcraft_output_captured", False)'
BROKEN = {
    "never-fires": ".is_eagle3() and False",
    "all-eagle": '.is_eagle() and getattr(self, "patchcraft_output_captured", False)',
    "every-layer": ".is_eagle3()",
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_gloo_proof_rejects_a_broken_guard(broken: str) -> None:
    """The proof fails both ways: a guard that never fires, one that fires for all EAGLE, one that fires on every layer."""
    pytest.importorskip("torch")
    version = "0.5.10"
    path = release_package(version) / fusion.COMMUNICATOR
    site = fusion.plan(release_package(version)).site
    patched = patch_text(path.read_text(), path, [site], {fusion.KIND: fusion}).after
    assert patched.count(_GUARD) == 1
    with pytest.raises(AssertionError):
        check_proof(version, patched.replace(_GUARD, BROKEN[broken]))


@pytest.mark.parametrize(
    "version,model,layers",
    [("0.5.14", "Qwen3VLMoeForConditionalGeneration", "48"), ("0.5.20", "Glm5NextForConditionalGeneration", "48")],
)
def test_explain_tp_warns_for_models_found_through_the_graph(
    version: str, model: str, layers: str, tmp_path: Path, capsys
) -> None:
    """qwen3_vl_moe runs Qwen3MoeDecoderLayer from another file; glm5_next captures through a helper: both warn until apply."""
    package = fusion_copy(version, tmp_path)
    args = ("explain", str(package), "--model", model, "--num-layers", layers, "--layer-ids", "1,23,44")
    code, out, _ = run_cli(capsys, *args, "--tp", "8")
    assert code == 1 and "warning: " + fusion.PARTIAL_SUMS in out, out
    code, out, _ = run_cli(capsys, *args, "--tp", "1")
    assert fusion.PARTIAL_SUMS not in out, out
    code, _, _ = run_cli(capsys, "apply", str(package), "--no-smoke")
    assert code == 0
    code, out, _ = run_cli(capsys, *args, "--tp", "8")
    assert fusion.PARTIAL_SUMS not in out, out


def test_override_that_returns_early_is_reported(tmp_path: Path) -> None:
    """0.5.20's Qwen35FlashInferLayerCommunicator returns True before super(): named, and harmless for qwen3_5."""
    package = copy_release("0.5.20", tmp_path, extra=(*EXTRA, "srt/layers/moe/qwen35_flashinfer_fusion.py"))
    result = row(run(resolve_target(str(package)), Mode.CHECK, names=[fusion.ROW]))
    [note] = [n for n in result.notes if "Qwen35FlashInferLayerCommunicator" in n]
    assert "harmless" in note and "qwen3_5" in note, note
    # The same override used by an affected model (glm4_moe names it): the guard cannot help, so unsupported.
    glm = package / "srt" / "models" / "glm4_moe.py"
    glm.write_text(glm.read_text() + "\n_USES = 'Qwen35FlashInferLayerCommunicator'\n")
    result = row(run(resolve_target(str(package)), Mode.CHECK, names=[fusion.ROW]))
    assert result.status == ModelStatus.UNSUPPORTED and "bypasses the guard" in result.message, result


def test_an_earlier_all_layer_guard_is_narrowed(tmp_path: Path) -> None:
    """A tree patched by an earlier patchcraft (guard on every EAGLE-3 layer): `apply` replaces it, once."""
    package = fusion_copy("0.5.10", tmp_path)
    path = package / fusion.COMMUNICATOR
    pristine = path.read_text()
    site = fusion.plan(package).site
    algo = site.params.algo
    new = patch_text(pristine, path, [site], {fusion.KIND: fusion}).after
    old_guard = (
        f"{fusion.OLD_COMMENT}\n        if {algo} is not None and {algo}.is_eagle3():\n            return False\n"
    )
    new_guard = f'{fusion.COMMENT}\n        if {algo} is not None and {algo}.is_eagle3() and getattr(self, "patchcraft_output_captured", False):\n            return False\n'
    assert new.count(new_guard) == 1
    path.write_text(new.replace(new_guard, old_guard))
    tree = resolve_target(str(package))
    result = run(tree, Mode.APPLY, names=[fusion.ROW])
    assert (
        row(result).status == ModelStatus.PATCHED
        and row(result).edits[0].detail == "replaced the all-layer EAGLE-3 guard"
    ), row(result)
    write_changes(result.changes)
    assert path.read_text() == new
    assert row(run(tree, Mode.CHECK, names=[fusion.ROW])).status == ModelStatus.ALREADY


def test_a_whole_tree_apply_claims_the_subclasses_its_written_setters_mark(tmp_path: Path, capsys) -> None:
    """0.5.10: ``DeepseekV3ForCausalLM`` and six more have no row of their own in a whole-tree apply (each is folded
    into its parent's, whose setter it inherits, and which marks its layers): the fusion row claims them, and
    ``verify --model`` finds each one's mark present. A run that writes none of those setters claims none of them."""
    package = fusion_copy("0.5.10", tmp_path / "whole")
    code, out, _ = run_cli(capsys, "apply", "--no-smoke", "--format", "json", str(package))
    doc = json.loads(out)
    rows = {m["model"]: m for m in doc["models"]}
    fusion_row = rows[fusion.ROW]
    affected = [n[len(PARTIAL_SUMS) :].split(" (", 1)[0] for n in fusion_row["notes"] if n.startswith(PARTIAL_SUMS)]
    folded = [label for label in affected if label not in rows]
    assert code == 0 and "deepseek_v2.DeepseekV3ForCausalLM" in folded and len(folded) == 7, (code, folded)
    assert fusion_row["status"] == "patched" and "not written" not in fusion_row["message"], fusion_row["message"]
    assert fusion_row["message"].startswith(f"added: {KEEP_REDUCED} (") and "and 10 more)" in fusion_row["message"]
    for label in folded:
        code, out, _ = run_cli(capsys, "verify", "--no-smoke", "--format", "json", "--model", label, str(package))
        # --model matches without case: bailing_moe.BailingMoeForCausalLM is answered by BailingMoEForCausalLM's row
        [own] = [m for m in json.loads(out)["models"] if m["model"].lower() == label.lower()]
        marks = [e["status"] for e in own["edits"] if e["kind"] == "fusion-mark"]
        assert code == 0 and marks == ["present"], (label, own)
    package = fusion_copy("0.5.10", tmp_path / "glm")
    code, out, _ = run_cli(capsys, "apply", "--no-smoke", "--format", "json", "--model", "glm4_moe", str(package))
    message = next(m for m in json.loads(out)["models"] if m["model"] == fusion.ROW)["message"]
    assert code == 0 and message.startswith(f"added: {KEEP_REDUCED} (Glm4MoeForCausalLM); not for "), message
