"""``vllm_copy_before_loop_capture``'s before/after examples: its unit tests
(tests/transforms/test_vllm_copy_before_loop_capture.py) and its section of docs/transforms.md
(scripts/document_transforms.py)."""

from __future__ import annotations

from .. import vllm_copy_before_loop_capture
from .._base import Example, example_site
from .._contract import Transform

TRANSFORM: Transform = vllm_copy_before_loop_capture

_KIMI = example_site(vllm_copy_before_loop_capture.KIND, "KimiLinearModel", "forward", path="model.py")
_COHERE = example_site(vllm_copy_before_loop_capture.KIND, "Cohere2MoeModel", "forward", path="cohere2_moe.py")

_BEFORE_KIMI = """\
class KimiLinearModel(nn.Module, EagleModelMixin):
    def forward(self, input_ids, positions, intermediate_tensors, inputs_embeds=None, **kwargs):
        if get_pp_group().is_first_rank:
            hidden_states = self.embed_input_ids(input_ids)
            residual = None
        else:
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]

        aux_hidden_states: list[torch.Tensor] = []
        if (
            get_pp_group().is_first_rank
            and self.start_layer in self.aux_hidden_state_layers
        ):
            if self.use_attn_res or residual is None:
                aux_hidden_states.append(hidden_states)
            else:
                aux_hidden_states.append(hidden_states + residual)

        prefix_sum = None
        for layer_idx, layer in enumerate(
            self.layers[self.start_layer : self.end_layer],
            start=self.start_layer,
        ):
            hidden_states, prefix_sum, residual = layer(
                positions=positions,
                hidden_states=hidden_states,
                prefix_sum=prefix_sum,
                residual=residual,
            )
            if (layer_idx + 1) in self.aux_hidden_state_layers:
                aux_hidden_states.append(hidden_states + residual)
        return hidden_states + residual, aux_hidden_states
"""

_AFTER_KIMI = """\
class KimiLinearModel(nn.Module, EagleModelMixin):
    def forward(self, input_ids, positions, intermediate_tensors, inputs_embeds=None, **kwargs):
        if get_pp_group().is_first_rank:
            hidden_states = self.embed_input_ids(input_ids)
            residual = None
        else:
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]

        aux_hidden_states: list[torch.Tensor] = []
        if (
            get_pp_group().is_first_rank
            and self.start_layer in self.aux_hidden_state_layers
        ):
            if self.use_attn_res or residual is None:
                aux_hidden_states.append(hidden_states)
                # patchcraft: vLLM id 0 is hs[0]: the entry just captured a copy, not the embedding tensor itself (layer 0 takes it as its residual and its fused add-norm adds into it in place)
                aux_hidden_states[-1] = aux_hidden_states[-1].clone()
            else:
                aux_hidden_states.append(hidden_states + residual)

        prefix_sum = None
        for layer_idx, layer in enumerate(
            self.layers[self.start_layer : self.end_layer],
            start=self.start_layer,
        ):
            hidden_states, prefix_sum, residual = layer(
                positions=positions,
                hidden_states=hidden_states,
                prefix_sum=prefix_sum,
                residual=residual,
            )
            if (layer_idx + 1) in self.aux_hidden_state_layers:
                aux_hidden_states.append(hidden_states + residual)
        return hidden_states + residual, aux_hidden_states
"""

_BEFORE_COHERE = """\
class Cohere2MoeModel(nn.Module):
    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        hidden_states = self.get_input_embeddings(input_ids)
        residual = None
        aux_hidden_states = []
        if self.start_layer in self.aux_hidden_state_layers:
            aux_hidden_states.append(hidden_states)
        for layer_idx, layer in enumerate(
            islice(self.layers, self.start_layer, self.end_layer),
            start=self.start_layer,
        ):
            hidden_states, residual = layer(positions, hidden_states, residual)
            if layer_idx + 1 in self.aux_hidden_state_layers:
                aux_hidden_states.append(hidden_states)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states, aux_hidden_states
"""

_AFTER_COHERE = """\
class Cohere2MoeModel(nn.Module):
    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        hidden_states = self.get_input_embeddings(input_ids)
        residual = None
        aux_hidden_states = []
        if self.start_layer in self.aux_hidden_state_layers:
            aux_hidden_states.append(hidden_states)
            # patchcraft: vLLM id 0 is hs[0]: the entry just captured a copy, not the embedding tensor itself (layer 0 takes it as its residual and its fused add-norm adds into it in place)
            aux_hidden_states[-1] = aux_hidden_states[-1].clone()
        for layer_idx, layer in enumerate(
            islice(self.layers, self.start_layer, self.end_layer),
            start=self.start_layer,
        ):
            hidden_states, residual = layer(positions, hidden_states, residual)
            if layer_idx + 1 in self.aux_hidden_state_layers:
                aux_hidden_states.append(hidden_states)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states, aux_hidden_states
"""

EXAMPLES = [
    Example(
        title="0.33-0.34's Kimi-Linear (vllm/models/kimi_k3/nvidia/model.py): the entry appended by name is a copy, "
        "the sum on a later pipeline stage is left alone",
        site=_KIMI,
        before=_BEFORE_KIMI,
        after=_AFTER_KIMI,
    ),
    Example(
        title="0.32's Cohere2-MoE: the capture's one append, under the first layer's index",
        site=_COHERE,
        before=_BEFORE_COHERE,
        after=_AFTER_COHERE,
    ),
    Example.unchanged(title="already patched: recognised by its mark, not doubled", site=_KIMI, text=_AFTER_KIMI),
]
