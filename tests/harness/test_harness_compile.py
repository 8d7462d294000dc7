"""``torch.compile(fullgraph=True)`` over every patched forward's capture path (patchcraft.harness.compiled).

Every patched forward of every minor release is compiled by the release
sweep (tests/test_release_history.py ``test_release_smoke``, ``smoke
--compile``); ``python -m tools.sweep_compile`` runs it alone. Mutation cases put a graph break into patchcraft's block
(a ``print()``, an ``.item()``-driven branch): the eager harness still
passes them, the compile check must fail them and say it is the block.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from harness_support import mutate, patched, row  # noqa: E402

from patchcraft.harness.compiled import compiler  # noqa: E402
from patchcraft.harness.runner import FAIL, PASS, smoke_tree  # noqa: E402

#: One capture shape in the fast tier (L1), the others in the full tier.
CASES = [
    ("0.5.10", "deepseek_v2", "deepseek_v2.DeepseekV2ForCausalLM"),
    pytest.param("0.5.15", "gemma3_causal", "gemma3_causal.Gemma3ForCausalLM", marks=pytest.mark.slow),
    pytest.param("0.5.20", "deepseek_v2", "deepseek_v2.DeepseekV2ForCausalLM", marks=pytest.mark.slow),
    pytest.param("0.5.23", "deepseek_v2", "deepseek_v2.DeepseekV2ForCausalLM", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(
    "mutation, says", [("compile-print", "Failed to trace builtin operator"), ("compile-item-branch", "data-dependent")]
)
@pytest.mark.parametrize("version, stem, label", CASES)
def test_a_graph_break_in_the_block_fails(version: str, stem: str, label: str, mutation: str, says: str) -> None:
    state = patched(version)
    texts = mutate(version, stem, mutation)
    eager = row(smoke_tree(state.tree, [label], texts=texts), label)
    assert eager.status == PASS, eager.message  # the scenarios cannot see it
    result = row(smoke_tree(state.tree, [label], texts=texts, check=compiler()), label)
    assert result.status == FAIL, result.message
    assert "capture block" in result.message and says in result.message, result.message
