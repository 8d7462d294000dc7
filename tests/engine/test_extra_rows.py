"""tree_rows.py: the ``runner`` row (docs/runner.md) on real ``model_executor/`` folders.

0.4.10 and 0.5.10 reset the ids before graph capture (two edits each);
from 0.5.13 the ids are configured once, before capture, so nothing is
needed. Only ``model_executor/`` is copied: the row reads nothing else.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import release_package
from patchcraft.base.fetch import copy_parts
from patchcraft.engine.records import Mode
from patchcraft.base.status import EditStatus, ModelStatus
from patchcraft.base.target import SglangTree
from patchcraft.engine.extra_rows import runner_row

EXECUTOR = "sglang/srt/model_executor"
#: The methods each release's fix edits (docs/runner.md: pass-ids, and remember-ids up to 0.5.6).
EDITED = {
    "0.4.10": [("ModelRunner", "initialize"), ("CudaGraphRunner", "__init__")],
    "0.5.10": [("CudaGraphRunner", "__init__"), ("ModelRunner", "_dummy_run")],
}


def _tree(version: str, tmp_path: Path) -> SglangTree:
    package = copy_parts(release_package(version), tmp_path / "sglang", ("srt/model_executor", "version.py"))
    return SglangTree(package=package, root=tmp_path)


def _texts(tree: SglangTree) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(tree.executor_dir.rglob("*.py"))}


@pytest.mark.parametrize("version", sorted(EDITED))
def test_a_release_that_resets_the_ids_would_patch_both_runner_files(version: str, tmp_path: Path) -> None:
    row, changes = runner_row(_tree(version, tmp_path), Mode.CHECK)
    assert row is not None and row.status == ModelStatus.WOULD
    assert row.message == "missing: graph capture resets the ids to the defaults (2 of 2 edits to make)"
    assert row.path == f"{EXECUTOR}/model_runner.py"
    assert sorted(c.rel for c in changes) == [f"{EXECUTOR}/cuda_graph_runner.py", f"{EXECUTOR}/model_runner.py"]
    assert [(e.cls, e.method, e.status) for e in row.edits] == [(c, m, EditStatus.APPLIED) for c, m in EDITED[version]]


@pytest.mark.parametrize("version", sorted(EDITED))
def test_applied_runner_row_is_then_already_patched_and_reverts_to_the_same_bytes(version: str, tmp_path: Path) -> None:
    tree = _tree(version, tmp_path)
    pristine = _texts(tree)
    row, changes = runner_row(tree, Mode.APPLY)
    assert row is not None and (row.status, row.message) == (
        ModelStatus.PATCHED,
        "added: configured ids reach graph capture",
    )
    for change in changes:
        change.source.path.write_text(change.after, encoding="utf-8")
    row, changes = runner_row(tree, Mode.VERIFY)
    assert row is not None and changes == ()
    assert (row.status, row.message, row.compiles, row.idempotent) == (
        ModelStatus.ALREADY,
        "configured ids reach graph capture",
        True,
        True,
    )
    row, changes = runner_row(tree, Mode.REVERT)
    assert row is not None and (row.status, len(changes)) == (ModelStatus.REVERTED, 2)
    for change in changes:
        change.source.path.write_text(change.after, encoding="utf-8")
    assert _texts(tree) == pristine


@pytest.mark.parametrize("version", ["0.5.13", "0.5.23"])
def test_a_release_that_configures_the_ids_once_needs_no_runner_fix(version: str, tmp_path: Path) -> None:
    tree = _tree(version, tmp_path)
    for mode in (Mode.CHECK, Mode.APPLY):
        row, changes = runner_row(tree, mode)
        assert row is not None and changes == () and row.edits == ()
        assert (row.status, row.message) == (
            ModelStatus.NOT_NEEDED,
            "not needed: no call in model_executor/ resets the ids (every call passes the configured ids)",
        )


def test_reverting_a_runner_patchcraft_never_touched_is_clean(tmp_path: Path) -> None:
    row, changes = runner_row(_tree("0.5.10", tmp_path), Mode.REVERT)
    assert row is not None and (row.status, row.message, changes) == (
        ModelStatus.NOT_PATCHED,
        "no patchcraft edits found",
        (),
    )


def test_a_syntax_error_in_one_runner_file_is_an_error_row_and_writes_neither(tmp_path: Path) -> None:
    """Planning the runner reads both files, so the error comes before any edit."""
    tree = _tree("0.5.10", tmp_path)
    graph_runner = tree.executor_dir / "cuda_graph_runner.py"
    text = graph_runner.read_text(encoding="utf-8")
    at = text.index("    def __init__", text.index("class CudaGraphRunner"))
    graph_runner.write_text(text[:at] + "    x = = 1\n" + text[at:], encoding="utf-8")
    row, changes = runner_row(tree, Mode.APPLY)
    assert row is not None and row.status == ModelStatus.ERROR and changes == ()
    assert row.message.startswith(f"{graph_runner}: syntax error at line ") and row.message.endswith(
        "; nothing was changed"
    )


def test_a_tree_without_model_executor_has_no_runner_row(tmp_path: Path) -> None:
    (tmp_path / "sglang" / "srt" / "models").mkdir(parents=True)
    assert runner_row(SglangTree(package=tmp_path / "sglang", root=tmp_path), Mode.CHECK) == (None, ())


def test_a_hand_changed_edit_in_one_runner_file_leaves_the_other_unwritten(tmp_path: Path) -> None:
    """The plan still reads both files; the patch of one refuses, so the other's edit is not written either."""
    tree = _tree("0.5.10", tmp_path)
    _, changes = runner_row(tree, Mode.APPLY)
    graph_runner = next(c for c in changes if c.rel.endswith("cuda_graph_runner.py"))
    configured = 'getattr(self.model_runner, "eagle_aux_hidden_state_layer_ids", None)'
    assert graph_runner.after.count(configured) == 1
    graph_runner.source.path.write_text(
        graph_runner.after.replace(configured, configured.replace("None)", "[])")), encoding="utf-8"
    )
    row, changes = runner_row(tree, Mode.APPLY)
    assert row is not None and row.status == ModelStatus.ERROR and changes == ()
    assert row.message == (
        f"{graph_runner.source.path}: CudaGraphRunner.__init__: the ids passed to set_eagle3_layers_to_capture were changed by hand; "
        "fix or remove that block by hand, then re-run (file left untouched)"
    )
    assert [(e.method, e.status) for e in row.edits] == [
        ("__init__", EditStatus.MODIFIED),
        ("_dummy_run", EditStatus.APPLIED),
    ]


def test_a_half_patched_runner_would_patch_only_the_file_left(tmp_path: Path) -> None:
    tree = _tree("0.5.10", tmp_path)
    _, changes = runner_row(tree, Mode.APPLY)
    graph_runner = next(c for c in changes if c.rel.endswith("cuda_graph_runner.py"))
    graph_runner.source.path.write_text(graph_runner.after, encoding="utf-8")
    row, changes = runner_row(tree, Mode.CHECK)
    assert row is not None and row.status == ModelStatus.WOULD
    assert row.message == "missing: graph capture resets the ids to the defaults (1 of 2 edits to make)"
    assert [c.rel for c in changes] == [f"{EXECUTOR}/model_runner.py"]
    assert [e.status for e in row.edits] == [EditStatus.PRESENT, EditStatus.APPLIED]
