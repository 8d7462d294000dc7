"""``vllm_capture_embedding``'s before/after examples: its unit tests (tests/transforms/test_vllm_capture_embedding.py)
and its section of docs/transforms.md (scripts/document_transforms.py)."""

from __future__ import annotations

from .. import vllm_capture_embedding
from .._base import Example, example_site
from .._contract import Transform

TRANSFORM: Transform = vllm_capture_embedding

_SITE = example_site(vllm_capture_embedding.KIND, "DeepseekV2Model", "forward", path="deepseek_v2.py")

_HEAD = """\
class DeepseekV2Model(nn.Module):
    def forward(self, input_ids, positions, intermediate_tensors, inputs_embeds=None):
        if get_pp_group().is_first_rank:
            hidden_states = self.embed_input_ids(input_ids)
            residual = None
        else:
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
"""

_GPT_OSS_SITE = example_site(vllm_capture_embedding.KIND, "GptOssModel", "forward", path="gpt_oss.py")

_GPT_OSS_HEAD = """\
class GptOssModel(nn.Module):
    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        if get_pp_group().is_first_rank:
            if inputs_embeds is not None:
                x = inputs_embeds
            else:
                x = self.embed_input_ids(input_ids)

            residual = None
        else:
            assert intermediate_tensors is not None
            x = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]

"""

_PATCHED_0_18 = (
    _HEAD
    + """\
        aux_hidden_states = []
        # patchcraft: vLLM id 0 is hs[0], the embedding output: a copy (layer 0 adds into it in place), first pipeline stage only
        if residual is None and 0 in self.aux_hidden_state_layers:
            aux_hidden_states.append(hidden_states.clone())
        for idx, layer in enumerate(
            islice(self.layers, self.start_layer, self.end_layer),
            start=self.start_layer,
        ):
            if idx in self.aux_hidden_state_layers and residual is not None:  # patchcraft: id 0 is captured before the loop
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = layer(positions, hidden_states, residual, llama_4_scaling)
        hidden_states, _ = self.norm(hidden_states, residual)
        if len(aux_hidden_states) > 0:
            return hidden_states, aux_hidden_states
        return hidden_states
"""
)

EXAMPLES = [
    Example(
        title="0.18's DeepseekV2Model.forward: a copy before the loop, the loop's capture skipped at layer 0",
        site=_SITE,
        before=_HEAD
        + """\
        aux_hidden_states = []
        for idx, layer in enumerate(
            islice(self.layers, self.start_layer, self.end_layer),
            start=self.start_layer,
        ):
            if idx in self.aux_hidden_state_layers:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = layer(positions, hidden_states, residual, llama_4_scaling)
        hidden_states, _ = self.norm(hidden_states, residual)
        if len(aux_hidden_states) > 0:
            return hidden_states, aux_hidden_states
        return hidden_states
""",
        after=_PATCHED_0_18,
    ),
    Example(
        title="0.34's: other statements in the loop body, a capture of several lines, one after the loop",
        site=_SITE,
        before=_HEAD
        + """\
        llama_4_scaling = None

        aux_hidden_states = []
        for idx, layer in enumerate(
            islice(self.layers, self.start_layer, self.end_layer),
            start=self.start_layer,
        ):
            if hidden_states.shape[0] != positions.shape[0] and not layer.use_sequence_parallel_moe:
                hidden_states, residual = gather(hidden_states, residual)
            if idx in self.aux_hidden_state_layers:
                aux_hidden_state = hidden_states + residual
                if aux_hidden_state.shape[0] != positions.shape[0]:
                    aux_hidden_state = tensor_model_parallel_all_gather(aux_hidden_state, 0)
                aux_hidden_states.append(aux_hidden_state)
            hidden_states, residual = layer(positions, hidden_states, residual, llama_4_scaling)

        if self.end_layer in self.aux_hidden_state_layers:
            aux_hidden_states.append(hidden_states + residual)
        return hidden_states, aux_hidden_states
""",
        after=_HEAD
        + """\
        llama_4_scaling = None

        aux_hidden_states = []
        # patchcraft: vLLM id 0 is hs[0], the embedding output: a copy (layer 0 adds into it in place), first pipeline stage only
        if residual is None and 0 in self.aux_hidden_state_layers:
            aux_hidden_states.append(hidden_states.clone())
        for idx, layer in enumerate(
            islice(self.layers, self.start_layer, self.end_layer),
            start=self.start_layer,
        ):
            if hidden_states.shape[0] != positions.shape[0] and not layer.use_sequence_parallel_moe:
                hidden_states, residual = gather(hidden_states, residual)
            if idx in self.aux_hidden_state_layers and residual is not None:  # patchcraft: id 0 is captured before the loop
                aux_hidden_state = hidden_states + residual
                if aux_hidden_state.shape[0] != positions.shape[0]:
                    aux_hidden_state = tensor_model_parallel_all_gather(aux_hidden_state, 0)
                aux_hidden_states.append(aux_hidden_state)
            hidden_states, residual = layer(positions, hidden_states, residual, llama_4_scaling)

        if self.end_layer in self.aux_hidden_state_layers:
            aux_hidden_states.append(hidden_states + residual)
        return hidden_states, aux_hidden_states
""",
    ),
    Example(
        title=(
            "0.11-0.17's GptOssModel.forward: the loop threads `x`, not `hidden_states` (found by structure); "
            "its capture at layer 0 was the embedding tensor itself"
        ),
        site=_GPT_OSS_SITE,
        before=_GPT_OSS_HEAD
        + """\
        aux_hidden_states = []
        for i in range(self.start_layer, self.end_layer):
            layer = self.layers[i]
            if i in self.aux_hidden_state_layers:
                aux_hidden_states.append(x if residual is None else x + residual)
            x, residual = layer(x, positions, residual)
        x, _ = self.norm(x, residual)
        if len(aux_hidden_states) > 0:
            return x, aux_hidden_states
        return x
""",
        after=_GPT_OSS_HEAD
        + """\
        aux_hidden_states = []
        # patchcraft: vLLM id 0 is hs[0], the embedding output: a copy (layer 0 adds into it in place), first pipeline stage only
        if residual is None and 0 in self.aux_hidden_state_layers:
            aux_hidden_states.append(x.clone())
        for i in range(self.start_layer, self.end_layer):
            layer = self.layers[i]
            if i in self.aux_hidden_state_layers and residual is not None:  # patchcraft: id 0 is captured before the loop
                aux_hidden_states.append(x if residual is None else x + residual)
            x, residual = layer(x, positions, residual)
        x, _ = self.norm(x, residual)
        if len(aux_hidden_states) > 0:
            return x, aux_hidden_states
        return x
""",
    ),
    Example.unchanged(title="already patched: recognised by its marks, not doubled", site=_SITE, text=_PATCHED_0_18),
]
