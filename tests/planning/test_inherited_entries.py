"""Entry classes that inherit a setter unchanged get a row when asked for.

A fork ships ``mellum.py`` with ``class MellumForCausalLM(LlamaForCausalLM)``
and nothing else: the setter, init and forward patched for Llama are the
ones Mellum runs. The fork here is a real release with such a file written
by the test (a subclass, no SGLang code copied), and the rows come from the
real CLI: ``verify mellum.py``, ``--model mellum``, ``explain``, and
``apply`` followed by ``verify``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import copy_release, run_cli as cli
from patchcraft.planning.model_plans import plan_models, scan
from patchcraft.planning.selection import plan_tree
from patchcraft.base.target import resolve_target

MELLUM = '''"""A fork's model: Mellum runs Llama's layers, setter and forward unchanged."""

from sglang.srt.models.llama import LlamaForCausalLM


class MellumForCausalLM(LlamaForCausalLM):
    pass


class MellumHelper(LlamaForCausalLM):
    """Not an entry class: SGLang never serves it, so it gets no row."""


EntryClass = MellumForCausalLM
'''

ROW = "mellum.MellumForCausalLM"


def fork(tmp_path: Path, version: str) -> Path:
    package = copy_release(version, tmp_path / "fork")
    (package / "srt" / "models" / "mellum.py").write_text(MELLUM)
    return package


def verify_rows(capsys, *argv: str) -> tuple[int, dict[str, str]]:
    code, out, _ = cli(capsys, "verify", *argv, "--format", "json")
    return code, {m["model"]: m["status"] for m in json.loads(out)["models"]}


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_verify_the_file_and_the_name_give_mellum_a_row(tmp_path, capsys, version):
    package = fork(tmp_path, version)
    code, rows = verify_rows(capsys, str(package / "srt" / "models" / "mellum.py"))
    assert code == 1 and rows[ROW] == "would-patch"
    assert rows["llama.LlamaForCausalLM"] == "would-patch"  # the file Mellum's edits live in
    assert "mellum.MellumHelper" not in rows
    code, rows = verify_rows(capsys, str(package), "--model", "mellum")
    assert code == 1 and rows[ROW] == "would-patch"


def test_apply_then_verify_confirms_mellum_is_covered(tmp_path, capsys):
    package = fork(tmp_path, "0.5.10")
    code, _, err = cli(capsys, "apply", str(package), "--model", "mellum")
    assert code == 0, err
    code, rows = verify_rows(capsys, str(package / "srt" / "models" / "mellum.py"))
    assert code == 0 and rows[ROW] == "already-patched", rows


def test_explain_answers_for_mellum(tmp_path, capsys):
    package = fork(tmp_path, "0.5.10")
    code, out, err = cli(
        capsys, "explain", str(package), "--model", "mellum", "--layer-ids", "2,16,29", "--num-layers", "32"
    )
    assert f"model    {ROW}, 32 layers" in out, err
    assert "LlamaForCausalLM.set_eagle3_layers_to_capture" in out
    assert "SGLang feeds the draft: hs[3], hs[17], hs[30]" in out


def test_inherited_rows_stay_out_of_a_whole_tree_run_and_of_named_models(tmp_path):
    tree = resolve_target(str(fork(tmp_path, "0.5.10")))
    labels = [p.label for p in plan_tree(tree)]
    assert labels == [p.label for p in plan_models(scan(tree.models_dir))]  # the rows a whole tree had before
    assert ROW not in labels
    # llama.py's own inheriting entry classes (Phi3ForCausalLM, ...) stay folded into Llama's row.
    assert [p.label for p in plan_tree(tree, ["llama"])] == [
        "llama.LlamaForCausalLM",
        "llama4.Llama4ForCausalLM",
        "mllama4.Llama4ForConditionalGeneration",
    ]
    assert any(
        p.inherits == "llama.LlamaForCausalLM" and p.label == ROW
        for p in plan_models(scan(tree.models_dir), inheriting=True)
    )
