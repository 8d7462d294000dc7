"""check-draft's rows say only what the code showed: no "range ok" next to a crash, the ids read
where this tree's runner reads them, and the server's all-reduce fusion setting taken into account."""

from __future__ import annotations

import pytest

from conftest import release_package, run_cli as cli
from drafts import kimi_target, sglang_draft
from patchcraft.analysis.draft_check import check_draft
from patchcraft.reading.draft_config import read_draft, read_target
from patchcraft.analysis.target_model import load_model
from patchcraft.analysis.training import parse_training
from patchcraft.base.target import resolve_target

LAYERS = 61


def row(report, name: str):
    return next(c for c in report.checks if c.name == name)


def kimi(tmp_path, package, ids, trained="hf:0,3,31", **kwargs):
    model = load_model(resolve_target(str(package)), "kimi_k25")
    draft = read_draft(sglang_draft(tmp_path / "draft", ids))
    target = read_target(kimi_target(tmp_path / "target"))
    return check_draft(model, draft, target, parse_training(trained), LAYERS, **kwargs)


def test_the_range_row_is_not_ok_next_to_a_crash(tmp_path):
    pytest.importorskip("torch")
    report = kimi(tmp_path, release_package("0.5.13"), [0, 3, 31])
    assert row(report, "run").ok is False and "crash" in row(report, "run").message
    assert row(report, "range").ok is None and "crashes" in row(report, "range").message


def test_the_ids_row_names_where_this_tree_reads_the_ids(tmp_path, release_copy):
    report = kimi(tmp_path, release_package("0.5.14"), [0, 3, 31], cuda_graph=False)
    assert "eagle_config.eagle_aux_hidden_state_layer_ids [0, 3, 31]" in row(report, "ids").message
    assert "model_runner.py:467" in row(report, "ids").message
    package = release_copy("0.5.14")
    runner = package / "srt" / "model_executor" / "model_runner.py"
    text = runner.read_text(encoding="utf-8")
    old = """self.eagle_aux_hidden_state_layer_ids = eagle_config[
                        "eagle_aux_hidden_state_layer_ids"
                    ]"""
    assert text.count(old) == 1
    runner.write_text(
        text.replace(old, "self.eagle_aux_hidden_state_layer_ids = server_args.speculative_eagle_aux_layer_ids"),
        encoding="utf-8",
    )
    fork = kimi(tmp_path / "fork", package, [2, 30, 58], cuda_graph=False)
    ids = row(fork, "ids")
    assert ids.ok is None and "SGLang reads eagle_config" not in ids.message
    assert "the server flag --speculative-eagle-aux-layer-ids" in ids.message
    first = fork.suggestion_text.splitlines()[0]
    assert first.startswith("serve with --speculative-eagle-aux-layer-ids 0,3,31"), fork.suggestion_text
    assert "eagle_config" not in fork.suggestion_text


def test_check_draft_takes_the_server_s_fusion_switch(tmp_path, capsys):
    draft, target = sglang_draft(tmp_path / "d", [2, 30, 58]), kimi_target(tmp_path / "t")
    args = ("check-draft", str(draft), "--target", str(target), "--release", "0.5.10", "--trained-on", "hf:3,31,59")
    args += ("--tp", "8", "--no-cuda-graph")
    code, out, err = cli(capsys, *args)
    assert code == 1 and "FAIL  fusion" in out + err
    assert "fusion   cost: with patchcraft's allreduce-fusion edit, layers 2, 30, 58" in out + err
    code, out, err = cli(capsys, *args, "--no-allreduce-fusion")
    assert code == 0, out + err
    assert "ok    fusion" in out + err and "all 61 layers run a separate all-reduce" in out + err


def test_the_same_ids_are_not_offered_twice(tmp_path):
    """0.5.14's Llama reads [2, 15, 28] by the +1 rule with or without the patch: one fix, not two."""
    pytest.importorskip("torch")
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096}'
    )
    model = load_model(resolve_target(str(release_package("0.5.14"))), "llama")
    draft = read_draft(sglang_draft(tmp_path / "draft", [1, 2, 3], fc_in=3 * 4096, target_hidden=4096))
    report = check_draft(model, draft, read_target(target), parse_training("hf:3,16,29"), 32)
    assert [fix.ids for fix in report.fixes] == [(2, 15, 28)], report.suggestion_text
    assert "or:" not in report.suggestion_text
