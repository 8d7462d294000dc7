"""The harness catches the bugs users hit: each case breaks a correctly patched real file one way.

A case takes a release file as ``patchcraft apply`` leaves it, breaks it
(see harness_support.MUTATIONS), and asserts that the harness fails that
model class with a message naming the problem. One file per forward
shape: list with ``hidden_states + residual`` (L1), None-safe list (L2),
collector passed into layers (L3, and gated on ``_is_layer_to_capture``),
no residual (Gemma 3), ``AuxHiddenStatePacker``, and the layer-boundary
era (``AuxHiddenStateList`` with a residual kept on the batch).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from harness_support import mutate, patched, row  # noqa: E402

from patchcraft.harness.runner import FAIL, PASS, smoke_tree  # noqa: E402

FLAG = "capture_embedding_for_eagle3"
NO_FLAG = ("init:", f"__init__ does not set {FLAG}")
NONE_ADD = ("capture:", "TypeError", "NoneType")
ALIASED = ("capture:", "shares storage with the embedding output", "not a copy")
AFTER_LOOP = ("capture:", "aux[0] is hs[2], expected hs[0]")
TWO_EMBEDDINGS = ("capture:", "expected 3 aux states [hs[0], hs[2], hs[5]], got 4 [hs[0], ")
PACKER_SIZE = ("capture:", "more captures than the AuxHiddenStatePacker was sized for")
PIPELINE = ("pipeline:", "-1 was accepted", "got 3 [")

# (release, file, model class, mutation, what the message must say)
CASES = [
    # L1: deepseek_v2 0.5.10, the file of the hand fix from the field.
    ("0.5.10", "deepseek_v2", "DeepseekV2ForCausalLM", "a-no-flag-init", NO_FLAG),
    ("0.5.10", "deepseek_v2", "DeepseekV2ForCausalLM", "b-add-none", NONE_ADD),
    ("0.5.10", "deepseek_v2", "DeepseekV2ForCausalLM", "c-no-clone", ALIASED),
    ("0.5.10", "deepseek_v2", "DeepseekV2ForCausalLM", "d-after-loop", AFTER_LOOP),
    ("0.5.10", "deepseek_v2", "DeepseekV2ForCausalLM", "d-keep-minus-one", NONE_ADD),  # -1 -> layer 0: hs + None
    ("0.5.10", "deepseek_v2", "DeepseekV2ForCausalLM", "pp-no-guard", PIPELINE),
    # L2: None-safe, un-cloned capture in the loop.
    ("0.5.10", "qwen2", "Qwen2ForCausalLM", "a-no-flag-init", NO_FLAG),
    ("0.5.10", "qwen2", "Qwen2ForCausalLM", "b-add-none", NONE_ADD),
    ("0.5.10", "qwen2", "Qwen2ForCausalLM", "c-no-clone", ALIASED),
    ("0.5.10", "qwen2", "Qwen2ForCausalLM", "d-after-loop", AFTER_LOOP),
    ("0.5.10", "qwen2", "Qwen2ForCausalLM", "d-keep-minus-one", TWO_EMBEDDINGS),
    ("0.5.10", "qwen2", "Qwen2ForCausalLM", "pp-no-guard", PIPELINE),
    # Inner helper setter; the collector goes into layers marked _is_layer_to_capture.
    ("0.5.10", "qwen2_moe", "Qwen2MoeForCausalLM", "a-no-flag-init", NO_FLAG),
    ("0.5.10", "qwen2_moe", "Qwen2MoeForCausalLM", "c-no-clone", ALIASED),
    ("0.5.10", "qwen2_moe", "Qwen2MoeForCausalLM", "d-after-loop", AFTER_LOOP),
    ("0.5.10", "qwen2_moe", "Qwen2MoeForCausalLM", "d-keep-minus-one", TWO_EMBEDDINGS),
    # L3: deepseek_v2 0.5.15, collector passed into the layers.
    ("0.5.15", "deepseek_v2", "DeepseekV2ForCausalLM", "a-no-flag-init", NO_FLAG),
    ("0.5.15", "deepseek_v2", "DeepseekV2ForCausalLM", "b-add-none", NONE_ADD),
    ("0.5.15", "deepseek_v2", "DeepseekV2ForCausalLM", "c-no-clone", ALIASED),
    ("0.5.15", "deepseek_v2", "DeepseekV2ForCausalLM", "d-after-loop", AFTER_LOOP),
    # First-id heuristic: with -1 still first, no id is shifted (the trap the setter block avoids).
    ("0.5.15", "deepseek_v2", "DeepseekV2ForCausalLM", "d-keep-minus-one", TWO_EMBEDDINGS),
    # -1 means +1 for the rest: without patchcraft's block after the test, [-1, 2, 4] would stay raw.
    (
        "0.5.15",
        "deepseek_v2",
        "DeepseekV2ForCausalLM",
        "no-plus-one-block",
        ("capture:", "ids [-1, 2, 4]: aux[1] is hs[2], expected hs[3]"),
    ),
    ("0.5.20", "gpt_oss", "GptOssForCausalLM", "d-keep-minus-one", ("capture:",)),
    # Gemma 3 before 0.5.20: no residual at all.
    ("0.5.15", "gemma3_causal", "Gemma3ForCausalLM", "a-no-flag-init", NO_FLAG),
    ("0.5.15", "gemma3_causal", "Gemma3ForCausalLM", "b-add-none", ("capture:", "NameError", "residual")),
    ("0.5.15", "gemma3_causal", "Gemma3ForCausalLM", "c-no-clone", ALIASED),
    ("0.5.15", "gemma3_causal", "Gemma3ForCausalLM", "d-after-loop", ("capture:", "aux[0] is hs[2], expected hs[0]")),
    ("0.5.15", "gemma3_causal", "Gemma3ForCausalLM", "d-keep-minus-one", TWO_EMBEDDINGS),
    # Stand-in parts exist only where the real __init__ assigns them: no pp_group here.
    (
        "0.5.15",
        "gemma3_causal",
        "Gemma3ForCausalLM",
        "gate-missing-group",
        ("capture:", "AttributeError", "no attribute 'pp_group'"),
    ),
    # AuxHiddenStatePacker: deepseek_v2 0.5.20 and 0.5.23.
    ("0.5.20", "deepseek_v2", "DeepseekV2ForCausalLM", "a-no-flag-init", NO_FLAG),
    ("0.5.20", "deepseek_v2", "DeepseekV2ForCausalLM", "b-add-none", NONE_ADD),
    ("0.5.20", "deepseek_v2", "DeepseekV2ForCausalLM", "d-after-loop", AFTER_LOOP),
    ("0.5.20", "deepseek_v2", "DeepseekV2ForCausalLM", "d-keep-minus-one", TWO_EMBEDDINGS),
    ("0.5.20", "deepseek_v2", "DeepseekV2ForCausalLM", "e-packer-count", PACKER_SIZE),
    ("0.5.23", "deepseek_v2", "DeepseekV2ForCausalLM", "a-no-flag-init", NO_FLAG),
    ("0.5.23", "deepseek_v2", "DeepseekV2ForCausalLM", "d-after-loop", AFTER_LOOP),
    ("0.5.23", "deepseek_v2", "DeepseekV2ForCausalLM", "e-packer-count", PACKER_SIZE),
    ("0.5.23", "deepseek_v2", "DeepseekV2ForCausalLM", "pp-no-guard", PIPELINE),
    # Layer-boundary era: AuxHiddenStateList, capture_output=aux.capture, no residual variable.
    ("0.5.23", "llama", "LlamaForCausalLM", "a-no-flag-init", NO_FLAG),
    ("0.5.23", "llama", "LlamaForCausalLM", "c-no-clone", ALIASED),
    ("0.5.23", "llama", "LlamaForCausalLM", "d-after-loop", AFTER_LOOP),
    ("0.5.23", "llama", "LlamaForCausalLM", "d-keep-minus-one", TWO_EMBEDDINGS),
    ("0.5.23", "llama", "LlamaForCausalLM", "pp-no-guard", PIPELINE),
]


def _smoke(version: str, stem: str, cls: str, texts: dict):
    state = patched(version)
    label = f"{stem}.{cls}"
    return row(smoke_tree(state.tree, [label], texts=texts), label)


@pytest.mark.parametrize(
    "version, stem, cls, mutation, expected",
    CASES,
    ids=[f"{v}/{s}/{m}" for v, s, _, m, _ in CASES],
)
def test_mutation_fails_naming_the_problem(version: str, stem: str, cls: str, mutation: str, expected: tuple) -> None:
    result = _smoke(version, stem, cls, mutate(version, stem, mutation))
    assert result.status == FAIL, result
    for words in expected:
        assert words in result.message, f"{words!r} not in {result.message!r}"


@pytest.mark.parametrize("version, stem, cls", sorted({(v, s, c) for v, s, c, _, _ in CASES}))
def test_the_unbroken_file_passes(version: str, stem: str, cls: str) -> None:
    """The control: each file above, as apply leaves it, passes every scenario."""
    result = _smoke(version, stem, cls, patched(version).texts)
    assert result.status == PASS, result
    assert {c.name for c in result.checks} == {"init", "capture", "same", "default", "pipeline"}


@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_a_copying_packer_gets_no_second_copy(version: str) -> None:
    """``AuxHiddenStatePacker.append`` copies into its buffer: patchcraft's block does not clone first,
    and the embedding entry is still no alias of the embedding (the harness checks storage)."""
    state = patched(version)
    text = state.texts[state.path("deepseek_v2")]
    copying = {
        "0.5.20": "aux_hidden_states.append(\n                hidden_states if residual is None else hidden_states + residual",
        "0.5.23": "aux_hidden_states.append(hidden_states)\n",  # no local residual there
    }
    assert copying[version] in text
    assert "hidden_states.clone()" not in text.split("# patchcraft: layer id -1 captures")[1][:400]
    result = _smoke(version, "deepseek_v2", "DeepseekV2ForCausalLM", dict(state.texts))
    assert result.status == PASS, result


@pytest.mark.parametrize(
    "mutation, failing, words",
    [
        ("init-flag-true", {"init"}, "__init__ sets capture_embedding_for_eagle3 = True, expected False"),
        ("else-flag-true", {"same", "default"}, "capture_embedding_for_eagle3 is True, expected False"),
        ("flag-in-branch", {"init"}, "sets capture_embedding_for_eagle3 only inside a branch"),
    ],
)
def test_each_scenario_fails_on_its_own_bug(mutation: str, failing: set, words: str) -> None:
    """The flag checks of init, same and default, each shown red on a file broken their way."""
    result = _smoke("0.5.10", "qwen2", "Qwen2ForCausalLM", mutate("0.5.10", "qwen2", mutation))
    statuses = {c.name: c.status for c in result.checks}
    assert {name for name, status in statuses.items() if status == FAIL} == failing, result.checks
    assert words in result.message
