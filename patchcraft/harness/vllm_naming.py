"""What reached the draft in a vLLM harness run, named; and whose a failure is, the release's or the harness's.

:func:`name_captures` names each captured tensor against the harness's reference
states (an alias of the embedding output first, with what it holds after the
forward); :func:`failed` tells the release's crash (its file and line) from a
gap of the harness's: arithmetic on a ``Nothing`` stand-in, or an attribute one
of the harness's own stand-ins (its norm, a layer) lacks, is "not run".
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from patchcraft.harness.scenarios import located_in
from patchcraft.harness.served import Fed, RunOutcome, _by_value
from patchcraft.harness.standins import RecordingEmbedding, reference_states
from patchcraft.harness.subject import HIDDEN, VOCAB, input_ids


def name_captures(
    aux: Sequence[Any], embedding: RecordingEmbedding, num_layers: int
) -> tuple[tuple[Fed, ...], tuple[tuple[int, str], ...]]:
    """Name each captured tensor (an alias of the embedding output first), and what each alias holds now."""
    reference = RecordingEmbedding(VOCAB, HIDDEN, torch.Generator().manual_seed(0))
    states = reference_states(reference(input_ids()), num_layers)
    pointers = {t.untyped_storage().data_ptr() for t in embedding.outputs}
    fed: list[Fed] = []
    holds: list[tuple[int, str]] = []
    for position, tensor in enumerate(aux):
        if not isinstance(tensor, torch.Tensor):
            fed.append(Fed(None, True, type(tensor).__name__))
            continue
        named = by_value(tensor, states)
        if tensor.untyped_storage().data_ptr() in pointers:
            fed.append(Fed(0, False))
            holds.append((position, f"hs[{named.state}]" if named.state is not None else named.what))
        else:
            fed.append(named)
    return tuple(fed), tuple(holds)


#: A tensor named by value against the reference states: the SGLang harness's own rule, shared.
by_value = _by_value


def failed(exc: BaseException, files: set[str], stage: str) -> RunOutcome:
    """The release's crash, or "not run" where a stand-in caused it (a setting the harness gives as ``Nothing``).

    ``config.embedding_multiplier`` (Granite) or ``config.scale_emb`` (MiniCPM) multiplied into the
    embedding is arithmetic on a stand-in: that model's forward is beyond the harness, not broken.
    """
    located = located_in(exc, files)
    on_standin = isinstance(exc, AttributeError) and type(getattr(exc, "obj", None)).__module__.startswith(
        "patchcraft.harness"
    )  # an attribute the harness's stand-in (its norm, a layer) lacks: the harness's gap, not the release's crash
    if on_standin or "'Nothing'" in str(exc) or "<stand-in " in str(exc) or "got Nothing" in str(exc):
        return RunOutcome(not_run=f"not run: the {stage} uses a value the harness does not model ({located})")
    return RunOutcome(crash=located, stage=stage)
