"""``capture_embedding_output``'s before/after examples: its unit tests (tests/transforms/test_capture_embedding_output.py)
and its section of docs/transforms.md (scripts/document_transforms.py)."""

from __future__ import annotations

from patchcraft.planning.records import EditSite, ForwardParams
from .. import capture_embedding_output
from .._base import Example, example_site
from .._contract import Transform

TRANSFORM: Transform = capture_embedding_output


def _site(cls: str, gate: str = "self.pp_group.is_first_rank", copies: bool = False) -> EditSite:
    return example_site(capture_embedding_output.KIND, cls, "forward", ForwardParams(gate=gate, copies=copies))


EXAMPLES = [
    Example(
        title="list collector with `hidden_states + residual` at the loop top",
        site=_site("DeepseekV2Model"),
        before="""\
class DeepseekV2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        if self.pp_group.is_first_rank:
            hidden_states = self.embed_tokens(input_ids)
            residual = None
        else:
            hidden_states, residual = pp_proxy_tensors["hidden_states"], pp_proxy_tensors["residual"]
        aux_hidden_states = []
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
        return hidden_states, aux_hidden_states
""",
        after="""\
class DeepseekV2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        if self.pp_group.is_first_rank:
            hidden_states = self.embed_tokens(input_ids)
            residual = None
        else:
            hidden_states, residual = pp_proxy_tensors["hidden_states"], pp_proxy_tensors["residual"]
        aux_hidden_states = []
        # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
        if getattr(self, "capture_embedding_for_eagle3", False) and self.pp_group.is_first_rank:
            aux_hidden_states.append(
                hidden_states.clone() if residual is None else hidden_states + residual
            )
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
        return hidden_states, aux_hidden_states
""",
    ),
    Example(
        title="collector created before the embedding: the capture goes after it, right before the loop",
        site=_site("LlamaModel", gate=""),
        before="""\
class LlamaModel(nn.Module):
    def forward(self, input_ids):
        aux_hidden_states = []
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual if residual is not None else hidden_states)
            hidden_states, residual = self.layers[i](hidden_states, residual)
        return hidden_states, aux_hidden_states
""",
        after="""\
class LlamaModel(nn.Module):
    def forward(self, input_ids):
        aux_hidden_states = []
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
        if getattr(self, "capture_embedding_for_eagle3", False):
            aux_hidden_states.append(
                hidden_states.clone() if residual is None else hidden_states + residual
            )
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual if residual is not None else hidden_states)
            hidden_states, residual = self.layers[i](hidden_states, residual)
        return hidden_states, aux_hidden_states
""",
    ),
    Example(
        title="two-batch overlap: the loop sits in the non-TBO branch, and so does the capture",
        site=_site("MiniMaxM2Model"),
        before="""\
class MiniMaxM2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        if self.pp_group.is_first_rank:
            hidden_states = self.get_input_embeddings(input_ids)
            residual = None
        else:
            hidden_states, residual = pp_proxy_tensors["hidden_states"], pp_proxy_tensors["residual"]
        aux_hidden_states = []
        if forward_batch.can_run_tbo:
            hidden_states, residual = model_forward_maybe_tbo(layers=self.layers, hidden_states=hidden_states, residual=residual)
        else:
            for i in range(self.start_layer, self.end_layer):
                with ctx:
                    if i in self.layers_to_capture:
                        aux_hidden_states.append(hidden_states + residual)
                    hidden_states, residual = self.layers[i](hidden_states=hidden_states, residual=residual)
        return hidden_states, aux_hidden_states
""",
        after="""\
class MiniMaxM2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        if self.pp_group.is_first_rank:
            hidden_states = self.get_input_embeddings(input_ids)
            residual = None
        else:
            hidden_states, residual = pp_proxy_tensors["hidden_states"], pp_proxy_tensors["residual"]
        aux_hidden_states = []
        if forward_batch.can_run_tbo:
            hidden_states, residual = model_forward_maybe_tbo(layers=self.layers, hidden_states=hidden_states, residual=residual)
        else:
            # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
            if getattr(self, "capture_embedding_for_eagle3", False) and self.pp_group.is_first_rank:
                aux_hidden_states.append(
                    hidden_states.clone() if residual is None else hidden_states + residual
                )
            for i in range(self.start_layer, self.end_layer):
                with ctx:
                    if i in self.layers_to_capture:
                        aux_hidden_states.append(hidden_states + residual)
                    hidden_states, residual = self.layers[i](hidden_states=hidden_states, residual=residual)
        return hidden_states, aux_hidden_states
""",
    ),
    Example(
        title="collector passed into the layers, gated on the layer's `_is_layer_to_capture` flag",
        site=_site("Qwen3NextModel", gate=""),
        before="""\
class Qwen3NextModel(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        for i in range(len(self.layers)):
            layer = self.layers[i]
            hidden_states, residual = layer(
                hidden_states=hidden_states,
                residual=residual,
                captured_last_layer_outputs=(
                    aux_hidden_states if getattr(layer, "_is_layer_to_capture", False) else None
                ),
            )
        return hidden_states, aux_hidden_states
""",
        after="""\
class Qwen3NextModel(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
        if getattr(self, "capture_embedding_for_eagle3", False):
            aux_hidden_states.append(
                hidden_states.clone() if residual is None else hidden_states + residual
            )
        for i in range(len(self.layers)):
            layer = self.layers[i]
            hidden_states, residual = layer(
                hidden_states=hidden_states,
                residual=residual,
                captured_last_layer_outputs=(
                    aux_hidden_states if getattr(layer, "_is_layer_to_capture", False) else None
                ),
            )
        return hidden_states, aux_hidden_states
""",
    ),
    Example(
        title="Gemma: bare hidden_states in two alternative loops and a post-loop capture",
        site=_site("Gemma3TextModel", gate=""),
        before="""\
class Gemma3TextModel(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        aux_hidden_states = []
        if _is_cpu:
            for i, layer in enumerate(self.layers):
                if i in self.layers_to_capture:
                    aux_hidden_states.append(hidden_states)
                hidden_states = layer(hidden_states=hidden_states)[0]
        else:
            position_embeddings = self.rotary_emb(hidden_states, positions)
            for i, layer in enumerate(self.layers):
                if i in self.layers_to_capture:
                    aux_hidden_states.append(hidden_states)
                hidden_states = layer(position_embeddings, hidden_states=hidden_states)[0]
        if len(self.layers) in self.layers_to_capture:
            aux_hidden_states.append(hidden_states)
        return self.norm(hidden_states), aux_hidden_states
""",
        after="""\
class Gemma3TextModel(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        aux_hidden_states = []
        # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
        if getattr(self, "capture_embedding_for_eagle3", False):
            aux_hidden_states.append(hidden_states.clone())
        if _is_cpu:
            for i, layer in enumerate(self.layers):
                if i in self.layers_to_capture:
                    aux_hidden_states.append(hidden_states)
                hidden_states = layer(hidden_states=hidden_states)[0]
        else:
            position_embeddings = self.rotary_emb(hidden_states, positions)
            for i, layer in enumerate(self.layers):
                if i in self.layers_to_capture:
                    aux_hidden_states.append(hidden_states)
                hidden_states = layer(position_embeddings, hidden_states=hidden_states)[0]
        if len(self.layers) in self.layers_to_capture:
            aux_hidden_states.append(hidden_states)
        return self.norm(hidden_states), aux_hidden_states
""",
    ),
    Example(
        title="boundary captures: an existing boundary-0 capture before the loop stays after ours",
        site=_site("GptOssModel"),
        before="""\
class GptOssModel(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        if self.start_layer in self.layers_to_capture:
            aux_hidden_states.append(hidden_states + residual if residual is not None else hidden_states)
        for i in range(self.start_layer, self.end_layer):
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
            if i + 1 in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual if residual is not None else hidden_states)
        return hidden_states, aux_hidden_states
""",
        after="""\
class GptOssModel(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
        if getattr(self, "capture_embedding_for_eagle3", False) and self.pp_group.is_first_rank:
            aux_hidden_states.append(
                hidden_states.clone() if residual is None else hidden_states + residual
            )
        if self.start_layer in self.layers_to_capture:
            aux_hidden_states.append(hidden_states + residual if residual is not None else hidden_states)
        for i in range(self.start_layer, self.end_layer):
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
            if i + 1 in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual if residual is not None else hidden_states)
        return hidden_states, aux_hidden_states
""",
    ),
    Example(
        title="AuxHiddenStatePacker: the count includes the embedding, and its `append` copies (no second copy)",
        site=_site("DeepseekV2Model", copies=True),
        before="""\
class DeepseekV2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = AuxHiddenStatePacker(len(self.layers_to_capture))
        for i in range(normal_start_layer, normal_end_layer):
            hidden_states, residual, topk_indices = self.layers[i](
                positions,
                hidden_states,
                captured_last_layer_outputs=(
                    aux_hidden_states if i in self.layers_to_capture else None
                ),
            )
        if len(aux_hidden_states) == 0:
            return hidden_states
        return hidden_states, aux_hidden_states.finalize()
""",
        after="""\
class DeepseekV2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = AuxHiddenStatePacker(len(self.layers_to_capture) + int(getattr(self, "capture_embedding_for_eagle3", False)))
        # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
        if getattr(self, "capture_embedding_for_eagle3", False) and self.pp_group.is_first_rank:
            aux_hidden_states.append(
                hidden_states if residual is None else hidden_states + residual
            )
        for i in range(normal_start_layer, normal_end_layer):
            hidden_states, residual, topk_indices = self.layers[i](
                positions,
                hidden_states,
                captured_last_layer_outputs=(
                    aux_hidden_states if i in self.layers_to_capture else None
                ),
            )
        if len(aux_hidden_states) == 0:
            return hidden_states
        return hidden_states, aux_hidden_states.finalize()
""",
    ),
    Example(
        title="layer-boundary forward: no local `residual`, so the release's own `aux.capture` (which copies)",
        site=_site("Qwen2Model"),
        before="""\
class Qwen2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        if self.pp_group.is_first_rank:
            hidden_states = self.embed_tokens(input_ids)
            residual_batch.start(forward_batch)
        else:
            hidden_states = self.layers[self.start_layer].attn_boundary.from_pp(pp_proxy_tensors, forward_batch)
        aux_hidden_states = AuxHiddenStateList()
        for i in range(self.start_layer, self.end_layer):
            hidden_states = self.layers[i](
                positions,
                hidden_states,
                forward_batch,
                capture_output=aux_hidden_states.capture
                if i in self.layers_to_capture
                else None,
            )
        return hidden_states, aux_hidden_states
""",
        after="""\
class Qwen2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        if self.pp_group.is_first_rank:
            hidden_states = self.embed_tokens(input_ids)
            residual_batch.start(forward_batch)
        else:
            hidden_states = self.layers[self.start_layer].attn_boundary.from_pp(pp_proxy_tensors, forward_batch)
        aux_hidden_states = AuxHiddenStateList()
        # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
        if getattr(self, "capture_embedding_for_eagle3", False) and self.pp_group.is_first_rank:
            aux_hidden_states.capture(hidden_states)
        for i in range(self.start_layer, self.end_layer):
            hidden_states = self.layers[i](
                positions,
                hidden_states,
                forward_batch,
                capture_output=aux_hidden_states.capture
                if i in self.layers_to_capture
                else None,
            )
        return hidden_states, aux_hidden_states
""",
    ),
    Example(
        title="`residual` first bound inside the loop (0.5.12 Gemma4): the capture never reads it",
        site=_site("Gemma4TextModel", gate=""),
        before="""\
class Gemma4TextModel(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        aux_hidden_states = []
        for layer_idx, layer in enumerate(self.layers):
            if layer_idx in self.layers_to_capture:
                aux_hidden_states.append(hidden_states)
            hidden_states, residual = layer(positions, hidden_states, forward_batch)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states, aux_hidden_states
""",
        after="""\
class Gemma4TextModel(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        aux_hidden_states = []
        # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
        if getattr(self, "capture_embedding_for_eagle3", False):
            aux_hidden_states.append(hidden_states.clone())
        for layer_idx, layer in enumerate(self.layers):
            if layer_idx in self.layers_to_capture:
                aux_hidden_states.append(hidden_states)
            hidden_states, residual = layer(positions, hidden_states, forward_batch)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states, aux_hidden_states
""",
    ),
    Example(
        title="`residual` bound in one branch only: not bound on every path, so not read",
        site=_site("LlamaModel"),
        before="""\
class LlamaModel(nn.Module):
    def forward(self, input_ids, positions, forward_batch, pp_proxy_tensors=None):
        if self.pp_group.is_first_rank:
            hidden_states = self.embed_tokens(input_ids)
            residual = None
        else:
            hidden_states = pp_proxy_tensors["hidden_states"]
        aux_hidden_states = []
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch)
        return hidden_states, aux_hidden_states
""",
        after="""\
class LlamaModel(nn.Module):
    def forward(self, input_ids, positions, forward_batch, pp_proxy_tensors=None):
        if self.pp_group.is_first_rank:
            hidden_states = self.embed_tokens(input_ids)
            residual = None
        else:
            hidden_states = pp_proxy_tensors["hidden_states"]
        aux_hidden_states = []
        # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
        if getattr(self, "capture_embedding_for_eagle3", False) and self.pp_group.is_first_rank:
            aux_hidden_states.append(hidden_states.clone())
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch)
        return hidden_states, aux_hidden_states
""",
    ),
    Example.unchanged(
        title="the sed fix from the field is recognised as hand-applied",
        site=_site("DeepseekV2Model"),
        text="""\
class DeepseekV2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        # Capture embedding output for EAGLE3 if requested (layer_id=-1)
        if self.capture_embedding_for_eagle3:
            # At this point hidden_states = embed_output, residual = None
            aux_hidden_states.append(hidden_states.clone() if residual is None else hidden_states + residual)
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
        return hidden_states, aux_hidden_states
""",
    ),
]
