"""The stand-ins of the layer-boundary residual API as 0.5.21 names it, on the real 0.5.21 release.

0.5.21 is the first release with ``sglang.srt.layers.layer_boundary``, and
names some of its functions differently from 0.5.22 and later:

- ``residual_batch.norm(h, batch, norm, capture_output=...)`` is the final
  norm (``final_norm(..., capture=...)`` from 0.5.22): deepseek_v2, gpt_oss,
  the Qwen MoE family and most others;
- ``qwen2.py`` keeps ``residual`` as a local tensor and imports
  ``finish_layer_stack``, ``from_pp`` and ``snapshot`` from
  ``layer_boundary.residual.access``;
- ``longcat_flash.py`` captures with ``self.layers[i].attn_boundary.snapshot``.

Each stand-in must give the harness's reference states (``hs``), not merely
run: a capture that runs but holds the wrong tensor would turn a row into a
"the release numbers its states in another way" pass with a note.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from harness_support import patched  # noqa: E402

from patchcraft.harness.assemble import Program, Sources  # noqa: E402
from patchcraft.harness.extract import ORIGINAL, PATCHED  # noqa: E402
from patchcraft.harness.runner import PASS, _planned, smoke_tree  # noqa: E402
from patchcraft.harness.scenarios import Scenarios, _difference  # noqa: E402
from patchcraft.harness.shapes import LayerCall  # noqa: E402
from patchcraft.harness.standins import (  # noqa: E402
    ForwardBatch,
    HarnessError,
    PPProxyTensors,
    ResidualAccess,
    ResidualBatch,
    StandInLayer,
    StandInNorm,
    World,
    reference_states,
    standin_import,
)
from patchcraft.harness.subject import LAYERS, Subject, subjects  # noqa: E402

VERSION = "0.5.21"
_RUN: list = []

#: Model classes of 0.5.21 whose forward runs one of the stand-ins this file is about.
USERS = {
    "deepseek_v2.DeepseekV2ForCausalLM": "residual_batch.norm",
    "gpt_oss.GptOssForCausalLM": "residual_batch.norm",
    "qwen3_moe.Qwen3MoeForCausalLM": "residual_batch.norm",
    "qwen2.Qwen2ForCausalLM": "layer_boundary.residual.access",
    "qwen2_5_vl.Qwen2_5_VLForConditionalGeneration": "layer_boundary.residual.access",
    "longcat_flash.LongcatFlashForCausalLM": "attn_boundary.snapshot",
}


def _run():
    if not _RUN:
        state = patched(VERSION)
        # Every patched class of the release: test_release_history.py's sweep (test_release_smoke[0.5.21]).
        _RUN.append(smoke_tree(state.tree, sorted(USERS), texts=state.texts))
    return _RUN[0]


@pytest.mark.parametrize("label", sorted(USERS))
def test_the_new_stand_ins_give_the_reference_states(label: str) -> None:
    """Patched and run, with the release's own numbering: ids [1, 4] give hs[2], hs[5] (no note)."""
    rows = [r for r in _run().results if r.model == label]
    assert rows and rows[0].status == PASS, rows and rows[0].message
    assert rows[0].notes == "", f"{label} ({USERS[label]}): {rows[0].notes}"
    capture = next(c for c in rows[0].checks if c.name == "capture")
    assert capture.detail == "[hs[0], hs[2], hs[5]]", capture.detail


def _subject(label: str) -> Subject:
    state = patched(VERSION)
    graph, plans = _planned(state.tree.models_dir)
    plan = next(p for p in plans if p.label == label)
    sources = Sources(state.tree.package, state.texts)
    programs = {variant: Program(graph, sources, variant) for variant in (PATCHED, ORIGINAL)}
    return subjects(graph, plan, programs)[0]


class ScalingNorm(StandInNorm):
    """A final norm whose output is not its residual (StandInNorm's is, bit for bit)."""

    def forward(self, hidden_states, residual=None, *args, **kwargs):
        out = super().forward(hidden_states, residual)
        return (out[0] * 3.0, out[1]) if residual is not None else out * 3.0


@pytest.mark.parametrize("variant, ids, want", [(ORIGINAL, [1, 7], [2, 8]), (PATCHED, [-1, 1, 7], [0, 2, 8])])
def test_a_capture_at_the_final_norm_gets_the_last_state(variant: str, ids: list, want: list) -> None:
    """gpt_oss 0.5.21 captures id n-1 through ``residual_batch.norm(..., capture_output=...)``: hs[n], not the normed output."""
    subject = _subject("gpt_oss.GptOssForCausalLM")
    world = World()
    with torch.no_grad():
        instance = subject.build(variant, world)
        instance.inner.norm = ScalingNorm()
        subject.set_ids(instance, ids, world)
        assert LAYERS in instance.inner.layers_to_capture  # the capture is the final norm's
        aux = subject.run(instance, world)
        states = Scenarios(subject).states
    known = {f"hs[{k}]": t for k, t in enumerate(states)}
    assert _difference(aux, [states[k] for k in want], known) is None, _difference(
        aux, [states[k] for k in want], known
    )


# -- the stand-ins' math, against reference_states -----------------------------------

STREAM = LayerCall(hidden=(0, None), residual=None, batch=(1, None), residual_kind="stream", outputs=None)
PAIR = LayerCall(
    hidden=(0, None), residual=(1, None), batch=None, residual_kind="pair", outputs=("hidden_states", "residual")
)


def _embedding() -> torch.Tensor:
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("final", ["norm", "final_norm"])
def test_residual_batch_snapshots_and_the_final_norm_follow_hs(final: str) -> None:
    embedding = _embedding()
    states = reference_states(embedding, 4)
    batch = ForwardBatch()
    ResidualBatch.start(batch)
    hidden = embedding.clone()
    for index in range(4):
        assert torch.equal(ResidualBatch.snapshot(hidden, batch), states[index])
        assert torch.equal(StandInLayer(0, STREAM).attn_boundary.snapshot(hidden, batch), states[index])
        hidden = StandInLayer(index, STREAM)(hidden, batch)
    hidden = ResidualBatch.complete_output(hidden, batch)
    captured: list = []
    keyword = "capture_output" if final == "norm" else "capture"
    normed = getattr(ResidualBatch, final)(hidden, batch, ScalingNorm(), **{keyword: captured.append})
    assert len(captured) == 1 and torch.equal(captured[0], states[4])  # the updated residual, not the normed output
    assert torch.equal(normed, states[4] * 3.0)
    assert batch.residual_stream is None  # the terminal norm owns the pair, as in the release


def test_residual_batch_final_norm_of_a_fresh_stream_captures_its_input() -> None:
    embedding = _embedding()
    batch, captured = ForwardBatch(), []
    ResidualBatch.start(batch)
    normed = ResidualBatch.norm(embedding, batch, ScalingNorm(), capture_output=captured.append)
    assert torch.equal(captured[0], embedding) and torch.equal(normed, embedding * 3.0)


def test_residual_access_follows_hs_with_a_local_residual() -> None:
    embedding = _embedding()
    states = reference_states(embedding, 4)
    hidden, residual = embedding.clone(), None
    for index in range(4):
        snap = ResidualAccess.snapshot(hidden, residual)
        assert torch.equal(snap, states[index]) and snap.data_ptr() not in (hidden.data_ptr(), embedding.data_ptr())
        hidden, residual = StandInLayer(index, PAIR)(hidden, residual)
    finished = ResidualAccess.finish_layer_stack(hidden, residual, ForwardBatch())
    assert finished[0] is hidden and finished[1] is residual
    assert torch.equal(finished[0] + finished[1], states[4])


def test_residual_access_from_pp_returns_the_received_pair() -> None:
    pair = {"hidden_states": torch.ones(2), "residual": torch.zeros(2)}
    assert ResidualAccess.from_pp(PPProxyTensors(pair)) == (pair["hidden_states"], pair["residual"])
    assert ResidualAccess.from_pp(PPProxyTensors(pair), residual_in_hidden=True)[1] is None
    assert (
        ResidualAccess.from_pp(PPProxyTensors({"hidden_states": pair["hidden_states"]}), allow_missing_residual=True)[1]
        is None
    )
    with pytest.raises(KeyError):
        ResidualAccess.from_pp(PPProxyTensors({"hidden_states": pair["hidden_states"]}))


def test_the_modules_resolve_by_dotted_name_and_unknown_functions_say_so() -> None:
    assert isinstance(standin_import("sglang.srt.layers.layer_boundary.residual", "batch"), ResidualBatch)
    assert isinstance(standin_import("sglang.srt.layers.layer_boundary.residual", "access"), ResidualAccess)
    assert standin_import("sglang.srt.layers.layer_boundary.residual.access", "snapshot") == ResidualAccess.snapshot
    assert standin_import("sglang.srt.layers.layernorm", "RMSNorm") is None
    fold = standin_import("sglang.srt.layers.layer_boundary.residual.access", "fold")
    with pytest.raises(HarnessError, match="access.fold has no stand-in"):
        fold(torch.ones(1), None)
