"""``patchcraft list`` and ``patchcraft smoke --device cpu`` on vLLM trees (issue 34 item 1).

list names vLLM's two transforms and the places they match in a real release;
smoke runs the patched setter and forward of a real release on the harness
(the proof apply runs), passes on what apply wrote and fails, naming the
scenario, when the written capture is broken by hand.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import cli_code, release_package, run_cli, vllm_release_package

DEEPSEEK = "vllm/model_executor/models/deepseek_v2.py:DeepseekV2Model.forward"
MIXIN = "vllm/model_executor/models/interfaces.py:EagleModelMixin._maybe_add_hidden_state"


def test_list_names_vllms_transforms_and_their_sites(capsys) -> None:
    code, out, _ = run_cli(capsys, "list", str(vllm_release_package("0.34.0")))
    assert code == 0
    assert (
        "vllm_capture_embedding (vllm-forward, vllm)" in out and "vllm_copy_mixin_embedding (vllm-mixin, vllm)" in out
    )
    assert f"    - {DEEPSEEK}\n" in out and f"    - {MIXIN}\n" in out
    assert "init_capture_flag" not in out  # SGLang's transforms are not this tree's


def test_list_json_says_each_transforms_engine(capsys) -> None:
    code, out, _ = run_cli(capsys, "list", "--format", "json", str(vllm_release_package("0.11.2")))
    document = {entry["name"]: entry for entry in json.loads(out)}
    assert code == 0 and set(document) == {
        "vllm_capture_embedding",
        "vllm_copy_mixin_embedding",
        "vllm_copy_before_loop_capture",
        "vllm_add_embedding_capture",
    }
    assert {entry["engine"] for entry in document.values()} == {"vllm"}
    # 0.11.2 has no EagleModelMixin: Llama's own forward crashes on id 0, and is the forward edit's site.
    assert "vllm/model_executor/models/llama.py:LlamaModel.forward" in document["vllm_capture_embedding"]["matches"]
    assert document["vllm_copy_mixin_embedding"]["matches"] == []


def test_list_without_target_is_sglangs_and_engine_vllm_lists_vllms(capsys) -> None:
    _, sglang, _ = run_cli(capsys, "list")
    _, vllm, _ = run_cli(capsys, "list", "--engine", "vllm")
    assert "init_capture_flag (init)" in sglang and "vllm_" not in sglang
    assert "vllm_capture_embedding" in vllm and "init_capture_flag" not in vllm


def test_list_engine_vllm_on_an_sglang_tree_is_one_line(capsys) -> None:
    code, out, err = run_cli(capsys, "list", "--engine", "vllm", str(release_package("0.5.2")))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "not a vLLM tree" in err


@pytest.fixture
def patched_0_34(tmp_path: Path) -> Path:
    """A copy of vLLM 0.34.0 with DeepSeek's forward patched by apply."""
    pytest.importorskip("torch")
    package = tmp_path / "vllm"
    shutil.copytree(vllm_release_package("0.34.0"), package)
    code = cli_code("apply", str(package), "--model", "DeepseekV3ForCausalLM")
    assert code == 0
    return package


def test_smoke_runs_vllms_patched_forward_and_passes(capsys, patched_0_34: Path) -> None:
    code, out, err = run_cli(capsys, "smoke", str(patched_0_34), "--model", "DeepseekV3ForCausalLM")
    assert code == 0, out + err
    text = out + err
    assert "smoke (cpu) vllm 0.34.0 at" in text
    assert (
        "PASS  deepseek_v2.DeepseekV3ForCausalLM" in text and "PASS  kimi_k25.KimiK25ForConditionalGeneration" in text
    )


def test_smoke_fails_naming_the_scenario_when_a_capture_is_wrong(capsys, patched_0_34: Path) -> None:
    # Outside patchcraft's marked lines (verify still says patched): the state the capture copies is no
    # longer the embedding output.
    model = patched_0_34 / "model_executor" / "models" / "deepseek_v2.py"
    text = model.read_text()
    mark = "        # patchcraft: vLLM id 0 is hs[0]"
    broken = text.replace(mark, "        hidden_states = hidden_states * 2\n" + mark, 1)
    assert broken != text
    model.write_text(broken)
    code, out, err = run_cli(capsys, "smoke", str(patched_0_34), "--model", "DeepseekV3ForCausalLM", "--format", "json")
    document = json.loads(out)
    row = next(r for r in document["smoke"]["models"] if r["model"] == "deepseek_v2.DeepseekV3ForCausalLM")
    assert code == 1 and row["status"] == "fail", row
    assert row["checks"][0]["name"] == "vllm-id-0" and row["checks"][0]["status"] == "fail"
    assert document["smoke"]["targets"][0]["engine"] == "vllm"


def test_smoke_on_an_unpatched_vllm_tree_runs_nothing_and_says_why(capsys) -> None:
    pytest.importorskip("torch")
    code, out, err = run_cli(capsys, "smoke", str(vllm_release_package("0.11.2")), "--model", "llama")
    assert code == 1
    assert "skip  llama.LlamaForCausalLM" in out + err and "would-patch: missing: vllm-forward" in out + err


@pytest.mark.parametrize("extra", [("--device", "cuda"), ("--compile",)])
def test_smoke_cuda_or_compile_on_a_vllm_tree_is_one_line(capsys, extra: tuple[str, ...]) -> None:
    code, out, err = run_cli(capsys, "smoke", "--engine", "vllm", str(vllm_release_package("0.34.0")), *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "CPU harness" in err
