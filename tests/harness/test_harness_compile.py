"""``torch.compile(fullgraph=True)`` over every patched forward's capture path (patchcraft.harness.compiled).

The suite runs the coverage matrix (about 20 s a release on one core with
the ``eager`` backend); ``python tests/harness/sweep_compile.py`` runs every
minor release. Mutation cases put a graph break into patchcraft's block
(a ``print()``, an ``.item()``-driven branch): the eager harness still
passes them, the compile check must fail them and say it is the block.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from harness_support import MATRIX, mutate, patched, row  # noqa: E402

from patchcraft.harness.compiled import compiler  # noqa: E402
from patchcraft.harness.runner import FAIL, PASS, SKIPPED, smoke_tree  # noqa: E402

RELEASES = [v for v in MATRIX if v != "0.4.6"]  # 0.4.6 patches nothing


@pytest.mark.parametrize("version", RELEASES)
def test_every_patched_forward_compiles_fullgraph(version: str) -> None:
    state = patched(version)
    run = smoke_tree(state.tree, models=state.applied.models, texts=state.texts, check=compiler())
    problems = [f"{r.model}: {r.status}: {r.message}" for r in run.results if r.status not in (PASS, SKIPPED)]
    assert not problems, problems
    assert any(r.status == PASS for r in run.results)


CASES = [
    ("0.5.10", "deepseek_v2", "deepseek_v2.DeepseekV2ForCausalLM"),
    ("0.5.15", "gemma3_causal", "gemma3_causal.Gemma3ForCausalLM"),
    ("0.5.20", "deepseek_v2", "deepseek_v2.DeepseekV2ForCausalLM"),
    ("0.5.23", "deepseek_v2", "deepseek_v2.DeepseekV2ForCausalLM"),
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
