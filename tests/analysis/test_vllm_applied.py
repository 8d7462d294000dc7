"""patchcraft.analysis.vllm_applied: a vLLM tree as `patchcraft apply --engine vllm` would leave it, in a private copy."""

from __future__ import annotations

import pytest

from conftest import vllm_release_package
from patchcraft.analysis.vllm_applied import applied_vllm_tree
from patchcraft.base.vllm_tree import resolve_vllm_target

pytest.importorskip("libcst")

MODEL = "model_executor/models/deepseek_v2.py"


@pytest.mark.slow
def test_deepseek_is_patched_in_a_copy_and_the_tree_is_not_written() -> None:
    package = vllm_release_package("0.34.0")
    before = (package / MODEL).read_bytes()
    applied = applied_vllm_tree(resolve_vllm_target(str(package)), "deepseek_v2.DeepseekV2ForCausalLM")
    assert applied.tree is not None and applied.why == ""
    assert applied.written == ("vllm/" + MODEL,)
    assert applied.tree.package != package and applied.tree.version == "0.34.0"
    assert b"patchcraft" in (applied.tree.package / MODEL).read_bytes()
    assert (package / MODEL).read_bytes() == before


def test_a_model_apply_does_not_patch_says_why() -> None:
    """MiMo has no layer loop that captures on 0.34.0: apply writes nothing for it, so no patched fix is tried."""
    tree = resolve_vllm_target(str(vllm_release_package("0.34.0")))
    applied = applied_vllm_tree(tree, "mimo.MiMoForCausalLM")
    assert applied.tree is None and "would write nothing for mimo.MiMoForCausalLM" in applied.why
