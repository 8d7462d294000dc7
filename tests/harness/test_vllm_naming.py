"""patchcraft.harness.vllm_naming: captured tensors named, and a failure told as the release's or the harness's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from patchcraft.harness.served import Fed
from patchcraft.harness.standins import RecordingEmbedding, StandInNorm, mix, reference_states
from patchcraft.harness.subject import HIDDEN, VOCAB, input_ids
from patchcraft.harness.vllm_naming import by_value, failed, name_captures

FILES = {__file__}


def _states(layers: int = 4) -> list:
    reference = RecordingEmbedding(VOCAB, HIDDEN, torch.Generator().manual_seed(0))
    return reference_states(reference(input_ids()), layers)


def test_a_state_a_branch_output_and_an_unknown_tensor_are_named() -> None:
    states = _states()
    assert by_value(states[2].clone(), states) == Fed(2, True)
    assert by_value(mix(states[1], 1), states) == Fed(None, True, "layer 1's output without its residual")
    assert by_value(torch.zeros(3, 3), states).what == "an unknown tensor (3, 3)"


def test_the_embedding_itself_is_an_alias_and_says_what_it_holds() -> None:
    embedding = RecordingEmbedding(VOCAB, HIDDEN, torch.Generator().manual_seed(0))
    out = embedding(input_ids())
    states = _states()
    out.copy_(states[3])  # overwritten in place by a later layer
    fed, holds = name_captures([out, states[2].clone()], embedding, 4)
    assert fed == (Fed(0, False), Fed(2, True)) and holds == ((0, "hs[3]"),)


def test_an_attribute_a_harness_stand_in_lacks_is_not_run() -> None:
    norm = StandInNorm()
    try:
        norm.weight_scale  # noqa: B018
    except AttributeError as exc:
        outcome = failed(exc, FILES, "forward")
    assert not outcome.crash and outcome.not_run.startswith("not run: the forward uses a value the harness")


def test_an_attribute_the_release_s_own_object_lacks_is_its_crash() -> None:
    class Released:  # a release's class, assembled by the harness under the release's module name
        pass

    Released.__module__ = "vllm.model_executor.models.llama"
    try:
        Released().aux_layers_typo  # noqa: B018
    except AttributeError as exc:
        outcome = failed(exc, FILES, "forward")
    assert outcome.crash.startswith("AttributeError") and outcome.stage == "forward" and not outcome.not_run
