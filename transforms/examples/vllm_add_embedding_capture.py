"""``vllm_add_embedding_capture``'s before/after examples: its unit tests
(tests/transforms/test_vllm_add_embedding_capture.py) and its section of docs/transforms.md
(scripts/document_transforms.py)."""

from __future__ import annotations

from .. import vllm_add_embedding_capture
from .._base import Example, example_site
from .._contract import Transform

TRANSFORM: Transform = vllm_add_embedding_capture

_V4 = example_site(vllm_add_embedding_capture.KIND, "DeepseekV4Model", "forward", path="model.py")

_BEFORE_CPU = """\
class DeepseekV4Model(nn.Module, EagleModelMixin):
    def forward(self, input_ids, positions, intermediate_tensors, inputs_embeds=None):
        if get_pp_group().is_first_rank:
            hidden_states = self.embed_input_ids(input_ids)
            hidden_states = hidden_states.unsqueeze(-2).repeat(1, self.hc_mult, 1)
        else:
            hidden_states = intermediate_tensors["hidden_states"]

        residual, post_mix, res_mix = None, None, None
        aux_hidden_states: list[torch.Tensor] = []
        for idx, layer in enumerate(
            islice(self.layers, self.start_layer, self.end_layer),
            start=self.start_layer,
        ):
            hidden_states, residual, post_mix, res_mix = layer(
                hidden_states, positions, input_ids, post_mix, res_mix, residual
            )
            if (idx + 1) in self.aux_hidden_state_layers:
                if layer.use_fused_mhc:
                    aux_recon = layer.hc_post(hidden_states, residual, post_mix, res_mix)
                else:
                    aux_recon = hidden_states
                aux_hidden_states.append(aux_recon.mean(dim=1))
        return self.norm(self.hc_head_op(hidden_states)), aux_hidden_states
"""

_AFTER_CPU = """\
class DeepseekV4Model(nn.Module, EagleModelMixin):
    def forward(self, input_ids, positions, intermediate_tensors, inputs_embeds=None):
        if get_pp_group().is_first_rank:
            hidden_states = self.embed_input_ids(input_ids)
            hidden_states = hidden_states.unsqueeze(-2).repeat(1, self.hc_mult, 1)
        else:
            hidden_states = intermediate_tensors["hidden_states"]

        residual, post_mix, res_mix = None, None, None
        aux_hidden_states: list[torch.Tensor] = []
        # patchcraft: vLLM id 0 is hs[0]: this forward captures after each layer only, so id 0 captured nothing; capture it before the first layer as the loop captures the others (the embedding streams' mean, a new tensor)
        if self.start_layer == 0 and 0 in self.aux_hidden_state_layers:
            aux_hidden_states.append(hidden_states.clone() if hidden_states.dim() == 2 else hidden_states.mean(dim=1))
        for idx, layer in enumerate(
            islice(self.layers, self.start_layer, self.end_layer),
            start=self.start_layer,
        ):
            hidden_states, residual, post_mix, res_mix = layer(
                hidden_states, positions, input_ids, post_mix, res_mix, residual
            )
            if (idx + 1) in self.aux_hidden_state_layers:
                if layer.use_fused_mhc:
                    aux_recon = layer.hc_post(hidden_states, residual, post_mix, res_mix)
                else:
                    aux_recon = hidden_states
                aux_hidden_states.append(aux_recon.mean(dim=1))
        return self.norm(self.hc_head_op(hidden_states)), aux_hidden_states
"""

_BEFORE_NVIDIA = """\
class DeepseekV4Model(nn.Module, EagleModelMixin):
    def forward(self, input_ids, positions, intermediate_tensors, inputs_embeds=None):
        hidden_states = self.embed_input_ids(input_ids)
        full_num_tokens = positions.shape[0]
        if self.use_sequence_parallel:
            hidden_states = sp_shard(hidden_states)
        residual, post_mix, res_mix = None, None, None
        aux_hidden_states: list[torch.Tensor] = []
        final_aux_recon = None
        for idx, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer):
            hidden_states, residual, post_mix, res_mix = layer(
                hidden_states, positions, input_ids, post_mix, res_mix, residual
            )
            if idx + 1 in self.aux_hidden_state_layers:
                aux_recon = mhc_post_tilelang(hidden_states, residual, post_mix, res_mix)
                aux_hidden_state = aux_recon.mean(dim=1)
                if self.use_sequence_parallel:
                    aux_hidden_state = sp_all_gather(aux_hidden_state)[:full_num_tokens]
                aux_hidden_states.append(aux_hidden_state)
                final_aux_recon = aux_recon
        return hidden_states, aux_hidden_states
"""

_AFTER_NVIDIA = """\
class DeepseekV4Model(nn.Module, EagleModelMixin):
    def forward(self, input_ids, positions, intermediate_tensors, inputs_embeds=None):
        hidden_states = self.embed_input_ids(input_ids)
        full_num_tokens = positions.shape[0]
        if self.use_sequence_parallel:
            hidden_states = sp_shard(hidden_states)
        residual, post_mix, res_mix = None, None, None
        aux_hidden_states: list[torch.Tensor] = []
        final_aux_recon = None
        # patchcraft: vLLM id 0 is hs[0]: this forward captures after each layer only, so id 0 captured nothing; capture it before the first layer as the loop captures the others (the embedding streams' mean, a new tensor)
        if self.start_layer == 0 and 0 in self.aux_hidden_state_layers:
            aux_hidden_state = hidden_states.clone() if hidden_states.dim() == 2 else hidden_states.mean(dim=1)
            if self.use_sequence_parallel:
                aux_hidden_state = sp_all_gather(aux_hidden_state)[:full_num_tokens]
            aux_hidden_states.append(aux_hidden_state)
        for idx, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer):
            hidden_states, residual, post_mix, res_mix = layer(
                hidden_states, positions, input_ids, post_mix, res_mix, residual
            )
            if idx + 1 in self.aux_hidden_state_layers:
                aux_recon = mhc_post_tilelang(hidden_states, residual, post_mix, res_mix)
                aux_hidden_state = aux_recon.mean(dim=1)
                if self.use_sequence_parallel:
                    aux_hidden_state = sp_all_gather(aux_hidden_state)[:full_num_tokens]
                aux_hidden_states.append(aux_hidden_state)
                final_aux_recon = aux_recon
        return hidden_states, aux_hidden_states
"""

EXAMPLES = [
    Example(
        title="DeepSeek-V4 on CPU, ROCm and XPU (vllm/models/deepseek_v4/{cpu,amd,xpu}/model.py): the embedding "
        "widened to the streams, id 0 captured as the loop captures the others, their mean",
        site=_V4,
        before=_BEFORE_CPU,
        after=_AFTER_CPU,
    ),
    Example(
        title="DeepSeek-V4 on NVIDIA: the 2-D embedding cloned (the first layer widens it), the sequence-parallel "
        "gather kept, the statement reading what came before the mean (`final_aux_recon = aux_recon`) left out",
        site=_V4,
        before=_BEFORE_NVIDIA,
        after=_AFTER_NVIDIA,
    ),
    Example.unchanged(title="already patched: recognised by its mark, not doubled", site=_V4, text=_AFTER_CPU),
]
