"""The harness's own parts: extraction, free names, layer conventions, stand-in math."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from patchcraft.harness.extract import ModelSource, init_attributes, literal_init, top_level_literals  # noqa: E402
from patchcraft.harness.scenarios import _difference  # noqa: E402
from patchcraft.harness.shapes import LayerCall, layer_call  # noqa: E402
from patchcraft.harness.standins import (  # noqa: E402
    ForwardBatch,
    Nothing,
    ResidualBatch,
    StandInLayer,
    mix,
    reference_states,
)

MODEL = """\
import torch
from sglang.srt.distributed import get_pp_group
from sglang.srt.utils import RMSNorm  # any name imported from sglang: a stand-in

_FLAG_DEFAULT = False


class TinyModel(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.pp_group = get_pp_group()
        self.layers_to_capture = []
        # patchcraft: EAGLE-3 layer id -1 captures the embedding output
        self.capture_embedding_for_eagle3 = False
        if config.tie:
            self.scale = 2
        self.norm = RMSNorm(config.hidden_size)

    @property
    def width(self):
        return 3

    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
        if self.capture_embedding_for_eagle3:
            aux_hidden_states.append(hidden_states.clone())
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
        return hidden_states, aux_hidden_states
"""


@pytest.fixture
def source(tmp_path: Path) -> ModelSource:
    path = tmp_path / "tiny.py"
    path.write_text(MODEL, encoding="utf-8")
    return ModelSource.read(path)


def test_methods_come_out_with_their_real_line_numbers(source: ModelSource) -> None:
    forward = source.method("TinyModel", "forward")
    assert forward is not None and forward.text.startswith("def forward(")
    assert MODEL.splitlines()[forward.line - 1].strip().startswith("def forward(")
    width = source.method("TinyModel", "width")
    assert width is not None and width.decorators == ("property",)
    assert source.method("TinyModel", "missing") is None


def test_revert_of_a_method_removes_exactly_the_marked_statements(source: ModelSource) -> None:
    forward = source.method("TinyModel", "forward")
    original = forward.reverted().text
    assert "capture_embedding_for_eagle3" not in original
    assert "aux_hidden_states.append(hidden_states + residual)" in original
    width = source.method("TinyModel", "width")
    assert width.reverted() is width  # nothing of ours in it: the same method


def test_literal_init_runs_only_the_literal_assignments(source: ModelSource) -> None:
    init = source.method("TinyModel", "__init__")
    namespace: dict = {}
    exec(literal_init(init), namespace)
    obj = type("Obj", (), {})()
    namespace["__init_literals__"](obj)
    assert vars(obj) == {"layers_to_capture": [], "capture_embedding_for_eagle3": False, "scale": 2}
    assert top_level_literals(init) == {"layers_to_capture", "capture_embedding_for_eagle3"}  # scale only in a branch
    assert init_attributes(init) == {"pp_group", "layers_to_capture", "capture_embedding_for_eagle3", "scale", "norm"}


def test_free_names_resolve_to_real_torch_stand_ins_or_name_error(source: ModelSource) -> None:
    from patchcraft.reading.class_graph import ModelGraph
    from patchcraft.harness.assemble import _MISSING, Program, Sources

    program = Program(ModelGraph(source.path.parent), Sources(source.path.parent), "patched")
    resolved = {
        name: program._resolve(name, source)
        for name in ("torch", "get_pp_group", "RMSNorm", "_FLAG_DEFAULT", "undefined_name", "len")
    }
    assert resolved["torch"] is torch
    assert callable(resolved["get_pp_group"]) and resolved["get_pp_group"]().is_first_rank
    assert isinstance(resolved["RMSNorm"], Nothing) and isinstance(resolved["_FLAG_DEFAULT"], Nothing)
    assert (
        resolved["undefined_name"] is _MISSING and resolved["len"] is _MISSING
    )  # builtins, or a NameError as in SGLang


def test_nothing_is_falsy_callable_and_a_context_manager() -> None:
    helper = Nothing("get_global_server_args")
    assert not helper and not helper().enable_x and len(helper) == 0 and 3 not in helper
    with helper.with_current_layer(1) as ctx:
        assert isinstance(ctx, Nothing)
    assert not isinstance(torch.zeros(1), helper)  # isinstance(x, SGLangClass) is False


def test_the_layer_call_convention_is_read_from_the_forward(source: ModelSource) -> None:
    call = layer_call(source.method("TinyModel", "forward"))
    assert (call.hidden, call.residual, call.batch) == ((1, None), (3, None), (2, None))
    assert call.residual_kind == "pair" and call.outputs == ("hidden_states", "residual") and call.captures == ()


def test_stand_in_layers_add_the_residual_in_place_like_fused_kernels() -> None:
    call = LayerCall(
        hidden=(0, None), residual=(1, None), batch=None, residual_kind="pair", outputs=("hidden_states", "residual")
    )
    embedding = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    first, second = StandInLayer(0, call), StandInLayer(1, call)
    hidden, residual = first(embedding, None)
    assert residual is embedding  # layer 0 takes the embedding itself as its residual
    snapshot = embedding.clone()
    second(hidden, residual)
    assert not torch.equal(embedding, snapshot)  # ... and layer 1 overwrites it in place


def test_reference_states_match_the_stand_in_layers_bit_for_bit() -> None:
    call = LayerCall(
        hidden=(0, None), residual=(1, None), batch=None, residual_kind="pair", outputs=("hidden_states", "residual")
    )
    embedding = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    states = reference_states(embedding, 4)
    hidden, residual = embedding.clone(), None
    for index in range(4):
        if residual is not None:
            assert torch.equal(hidden + residual, states[index])
        hidden, residual = StandInLayer(index, call)(hidden, residual)
    assert torch.equal(hidden + residual, states[4])
    assert all(not torch.equal(states[k], states[k + 1]) for k in range(4))


def test_the_layer_boundary_residual_lives_on_the_forward_batch() -> None:
    call = LayerCall(
        hidden=(0, None),
        residual=None,
        batch=(1, None),
        residual_kind="stream",
        outputs=None,
        captures=("capture_output",),
    )
    batch, captured = ForwardBatch(), []
    ResidualBatch.start(batch)
    embedding = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    out = StandInLayer(0, call)(embedding, batch, capture_output=captured.append)
    assert batch.residual_stream.residual is embedding and torch.equal(captured[0], embedding)
    assert torch.equal(ResidualBatch.snapshot(out, batch), embedding + mix(embedding, 0))


def test_differences_name_the_tensors() -> None:
    states = [torch.full((1, 2), float(k)) for k in range(4)]
    known = {f"hs[{k}]": t for k, t in enumerate(states)}
    assert _difference([states[0], states[2]], [states[0], states[2]], known) is None
    assert _difference([states[2]], [states[0]], known) == "aux[0] is hs[2], expected hs[0] (got [hs[2]])"
    assert "expected 1 aux states [hs[0]], got 2 [hs[0], hs[0]]" in _difference(
        [states[0], states[0]], [states[0]], known
    )


def test_a_bom_and_crlf_file_keeps_its_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "tiny_crlf.py"
    path.write_bytes(("\ufeff" + MODEL.replace("\n", "\r\n")).encode("utf-8"))
    forward = ModelSource.read(path).method("TinyModel", "forward")
    assert (
        forward is not None
        and forward.line == MODEL.splitlines().index("    def forward(self, input_ids, positions, forward_batch):") + 1
    )
    assert "capture_embedding_for_eagle3" not in forward.reverted().text
    assert layer_call(forward).residual_kind == "pair"
