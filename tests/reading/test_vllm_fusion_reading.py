"""vllm_fusion_reading: whether a vLLM EAGLE-3 capture reads a reduced state at TP > 1, on real releases."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import vllm_release_package

from patchcraft.reading.vllm_fusion_reading import NOT_READ, PARTIAL, REDUCED, read_model, read_tree

LLAMA_MLP = """        self.mlp = LlamaMLP(
            hidden_size=self.hidden_size,"""


def _verdicts(version: str) -> dict[str, str]:
    return {r.model: r.verdict for r in read_tree(vllm_release_package(version))}


@pytest.mark.parametrize("version", ["0.11.2", "0.34.0"])
def test_no_target_of_a_release_captures_a_partial_sum(version: str) -> None:
    verdicts = _verdicts(version)
    assert verdicts and PARTIAL not in verdicts.values()
    assert verdicts["llama.LlamaForCausalLM"] == REDUCED


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.9.2", "0.17.0", "0.18.0"])
def test_no_target_of_a_spread_captures_a_partial_sum(version: str) -> None:
    assert PARTIAL not in _verdicts(version).values()


def test_the_evidence_names_the_layer_and_the_capture_line() -> None:
    found = read_model(vllm_release_package("0.11.2"), "LlamaForCausalLM")
    assert found is not None and found.verdict == REDUCED
    assert found.capture.startswith("llama.py:") and "LlamaDecoderLayer" in found.evidence
    moe = read_model(vllm_release_package("0.34.0"), "DeepseekV3ForCausalLM")
    assert moe is not None and moe.verdict == REDUCED and "DeepseekV2DecoderLayer" in moe.layers[-1]


def test_a_wrapper_is_read_through_the_language_model_its_code_names() -> None:
    found = read_model(vllm_release_package("0.11.2"), "Qwen2_5_VLForConditionalGeneration")
    assert found is not None and found.verdict == REDUCED and "through its language model" in found.evidence


def test_a_model_whose_forward_captures_nothing_is_not_read() -> None:
    found = read_model(vllm_release_package("0.11.2"), "MiMoForCausalLM")
    assert found is not None and found.verdict == NOT_READ and "no forward that captures" in found.evidence


def _broken_release(tmp_path: Path) -> Path:
    """0.11.2 with Llama's decoder layer building its MLP with reduce_results=False and no all-reduce after it."""
    package = tmp_path / "vllm"
    shutil.copytree(vllm_release_package("0.11.2"), package)
    llama = package / "model_executor" / "models" / "llama.py"
    text = llama.read_text()
    assert text.count(LLAMA_MLP) == 1
    llama.write_text(text.replace(LLAMA_MLP, LLAMA_MLP + "\n            reduce_results=False,"))
    return package


def test_a_layer_leaving_its_mlp_unreduced_flips_the_verdict(tmp_path: Path) -> None:
    found = read_model(_broken_release(tmp_path), "LlamaForCausalLM")
    assert found is not None and found.verdict == PARTIAL
    assert [u.layer for u in found.unreduced] == ["llama.LlamaDecoderLayer"] and found.unreduced[0].attr == "mlp"
    assert "llama.py:" in found.unreduced[0].where() and "hidden_states + residual" in found.evidence


def test_an_all_reduce_after_the_unreduced_mlp_keeps_it_reduced(tmp_path: Path) -> None:
    package = _broken_release(tmp_path)
    llama = package / "model_executor" / "models" / "llama.py"
    call = "        hidden_states = self.mlp(hidden_states)\n"
    text = llama.read_text()
    assert call in text
    llama.write_text(
        text.replace(call, call + "        hidden_states = tensor_model_parallel_all_reduce(hidden_states)\n", 1)
    )
    found = read_model(package, "LlamaForCausalLM")
    assert found is not None and found.verdict == REDUCED


def test_a_record_is_kept_until_a_file_it_read_changes(tmp_path: Path) -> None:
    """check-draft reads the record once per fix it proves: the second read is the first's, and an edit reads again."""
    import time

    from patchcraft.base.memo import RACY_NS

    package = _broken_release(tmp_path)
    time.sleep(RACY_NS / 1e9 + 0.02)  # a stamp this close to the copy is not trusted (base.memo), so nothing is kept
    first = read_model(package, "LlamaForCausalLM")
    assert first is not None and first.verdict == PARTIAL
    assert read_model(package, "LlamaForCausalLM") is first
    llama = package / "model_executor" / "models" / "llama.py"
    call = "        hidden_states = self.mlp(hidden_states)\n"
    llama.write_text(
        llama.read_text().replace(
            call, call + "        hidden_states = tensor_model_parallel_all_reduce(hidden_states)\n", 1
        )
    )
    again = read_model(package, "LlamaForCausalLM")
    assert again is not None and again.verdict == REDUCED


def test_explain_at_tp_8_warns_on_the_broken_tree_and_notes_the_real_one(tmp_path: Path) -> None:
    from patchcraft.analysis.vllm_explain import FindingKind, tp_finding
    from patchcraft.base.vllm_tree import VllmTree

    release = vllm_release_package("0.11.2")
    real = tp_finding(VllmTree(release, release.parent), "LlamaForCausalLM", 8)
    assert real.kind is FindingKind.TP and real.text.startswith("TP 8: every captured state is reduced")
    broken = tp_finding(VllmTree(_broken_release(tmp_path), tmp_path), "LlamaForCausalLM", 8)
    assert broken.kind is FindingKind.PARTIAL and "per-rank partial sums" in broken.text
