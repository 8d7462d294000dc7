"""Rows that stay true on trees shaped like forks (issue: forks that diverge from upstream).

Each case is a real release changed the way a fork changes it: a model
whose original file does not run under the harness's stand-ins (a vendor
communicator), a ``--model`` naming a file without an EAGLE-3 setter or no
file at all, and wrapper models whose edits go into another file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

VENDOR_CALL = "        self.vendor_communicator.prepare()\n"


def _json(capsys, *argv: str) -> tuple[int, dict]:
    code, out, _ = run_cli(capsys, *argv, "--format", "json")
    return code, json.loads(out)


def with_a_vendor_communicator(package: Path) -> Path:
    """LlamaModel.forward calls a method of the fork's own (the stand-ins do not model it)."""
    path = package / "srt" / "models" / "llama.py"
    text = path.read_text(encoding="utf-8")
    anchor = "        aux_hidden_states = []\n"
    assert text.count(anchor) == 1
    path.write_text(text.replace(anchor, anchor + VENDOR_CALL), encoding="utf-8")
    return path


def test_a_row_withheld_by_a_harness_error_says_so_and_names_no_smoke(package: Path, capsys) -> None:
    pytest.importorskip("torch")
    path = with_a_vendor_communicator(package)
    before = path.read_bytes()
    code, document = _json(capsys, "apply", "--model", "llama", str(package))
    rows = {m["model"]: m for m in document["models"]}
    llama = rows["llama.LlamaForCausalLM"]
    assert code == 1 and llama["status"] == "would-patch" and llama["proof"] == "harness-error", llama
    assert "harness error:" in llama["message"] and "`--no-smoke` writes it" in llama["message"], llama["message"]
    assert "harness-failed" not in json.dumps(llama)
    # Every model named with --model was withheld: the runner and the fusion edit are not written either.
    assert document["summary"]["written"] == [] and path.read_bytes() == before
    assert rows["runner"]["status"] != "patched" and "which the harness did not prove" in rows["runner"]["message"]
    # The way out it names works.
    code, document = _json(capsys, "apply", "--no-smoke", "--model", "llama", str(package))
    assert code == 0 and "sglang/srt/models/llama.py" in document["summary"]["written"]


def test_a_harness_fail_is_still_labelled_harness_failed(package: Path, capsys) -> None:
    """The patch itself is broken (the capture raises): a ``fail``, not an ``error``."""
    pytest.importorskip("torch")
    from patchcraft.pipeline import proof as _proof

    row = {"model": "m.M", "status": "fail", "message": "capture: x", "scenario": "capture"}
    run = type("Run", (), {"results": [type("Row", (), row)]})
    from patchcraft.engine.records import Mode, ModelResult, RunResult
    from patchcraft.base.status import ModelStatus

    model = ModelResult("m.M", "m.py", ModelStatus.PATCHED, files=("m.py",))
    result = RunResult(mode=Mode.APPLY, tree=None, version="x", models=(model,), changes=())  # type: ignore[arg-type]
    proved = _proof.record(result, run())
    assert proved.models[0].proof == "harness-failed" and "--no-smoke" not in proved.models[0].message


def test_model_naming_a_file_without_a_setter_says_so(package: Path, capsys) -> None:
    (package / "srt" / "models" / "deepseek_v2.py").write_text("class DeepseekV2ForCausalLM:\n    pass\n")
    for command in (("verify",), ("apply", "--check")):
        code, _, err = run_cli(capsys, *command, "--model", "deepseek_v2", str(package))
        assert code == 2 and err.count("\n") == 1, err
        assert "deepseek_v2.py is in this tree, but none of its classes has set_eagle3_layers_to_capture" in err, err
    code, _, err = run_cli(
        capsys, "explain", str(package), "--model", "deepseek_v2", "--layer-ids", "-1,2,3", "--num-layers", "8"
    )
    assert code == 2 and "deepseek_v2.py is in this tree, but none of its classes" in err, err


def test_model_naming_no_file_gives_the_nearest_names(package: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "verify", "--model", "qwen3_mo", str(package))
    assert code == 2 and "no model file qwen3_mo.py and no model class qwen3_mo in this tree" in err, err
    assert "the nearest names: qwen3_moe" in err, err


def test_wrapper_rows_say_where_each_edit_went(release_copy, capsys) -> None:
    package = release_copy("0.5.10")
    code, document = _json(capsys, "apply", "--no-smoke", str(package))
    rows = {m["model"]: m["message"] for m in document["models"]}
    kimi = rows["kimi_k25.KimiK25ForConditionalGeneration"]
    assert kimi.startswith("added: setter via deepseek_v2.py DeepseekV2ForCausalLM, "), kimi
    assert "forward via deepseek_v2.py DeepseekV2Model" in kimi, kimi
    assert "sglang/srt/models/kimi_k25.py" not in document["summary"]["written"]
    assert rows["qwen3_moe.Qwen3MoeForCausalLM"].startswith(
        "added: setter, init via qwen2_moe.py Qwen2MoeModel, forward via qwen2_moe.py Qwen2MoeModel"
    ), rows["qwen3_moe.Qwen3MoeForCausalLM"]
    assert rows["llama.LlamaForCausalLM"].startswith("added: setter, init, forward"), rows["llama.LlamaForCausalLM"]


def test_the_harness_docs_say_what_the_row_withheld_by_a_harness_error_is() -> None:
    """docs/harness.md said a ``harness-error`` row "is an `error`"; its status is ``would-patch`` (the test above)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "harness.md").read_text(encoding="utf-8")
    assert (
        "`harness-error` (the row is an `error`" not in text
    )  # the smoke row (harness status) is `error`; the model row is not
    assert "`harness-error` (the harness could not run the class: the row stays `would-patch`" in text
