"""``vllm_copy_mixin_embedding``'s before/after examples: its unit tests
(tests/transforms/test_vllm_copy_mixin_embedding.py) and its section of docs/transforms.md
(scripts/document_transforms.py)."""

from __future__ import annotations

from .. import vllm_copy_mixin_embedding
from .._base import Example, example_site
from .._contract import Transform

TRANSFORM: Transform = vllm_copy_mixin_embedding

_SITE = example_site(vllm_copy_mixin_embedding.KIND, "EagleModelMixin", "_maybe_add_hidden_state", path="interfaces.py")

_BEFORE_0_18 = """\
class EagleModelMixin:
    aux_hidden_state_layers: tuple[int, ...] = ()

    def _set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        self.aux_hidden_state_layers = layers

    def _maybe_add_hidden_state(
        self,
        aux_hidden_states: list[torch.Tensor],
        layer_idx: int,
        hidden_states: torch.Tensor,
        residual: torch.Tensor,
    ) -> list[torch.Tensor]:
        if layer_idx in self.aux_hidden_state_layers:
            value = hidden_states + residual if residual is not None else hidden_states
            aux_hidden_states.append(value)
        return aux_hidden_states
"""

_AFTER_0_18 = """\
class EagleModelMixin:
    aux_hidden_state_layers: tuple[int, ...] = ()

    def _set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        self.aux_hidden_state_layers = layers

    def _maybe_add_hidden_state(
        self,
        aux_hidden_states: list[torch.Tensor],
        layer_idx: int,
        hidden_states: torch.Tensor,
        residual: torch.Tensor,
    ) -> list[torch.Tensor]:
        if layer_idx in self.aux_hidden_state_layers:
            # patchcraft: vLLM id 0 is hs[0]: capture a copy, not the embedding tensor itself (layer 0 takes it as its residual and its fused add-norm adds into it in place)
            if layer_idx == 0 and residual is None:
                hidden_states = hidden_states.clone()
            value = hidden_states + residual if residual is not None else hidden_states
            aux_hidden_states.append(value)
        return aux_hidden_states
"""

EXAMPLES = [
    Example(
        title="0.18's EagleModelMixin._maybe_add_hidden_state: id 0 captures a copy of the embedding output",
        site=_SITE,
        before=_BEFORE_0_18,
        after=_AFTER_0_18,
    ),
    Example(
        title="another spelling of the same capture: the layer index named by the test, the append inline",
        site=_SITE,
        before="""\
class EagleModelMixin:
    def _maybe_add_hidden_state(self, aux, idx, hidden_states, residual=None):
        if idx in self.aux_hidden_state_layers:
            aux.append(hidden_states if residual is None else hidden_states + residual)
        return aux
""",
        after="""\
class EagleModelMixin:
    def _maybe_add_hidden_state(self, aux, idx, hidden_states, residual=None):
        if idx in self.aux_hidden_state_layers:
            # patchcraft: vLLM id 0 is hs[0]: capture a copy, not the embedding tensor itself (layer 0 takes it as its residual and its fused add-norm adds into it in place)
            if idx == 0 and residual is None:
                hidden_states = hidden_states.clone()
            aux.append(hidden_states if residual is None else hidden_states + residual)
        return aux
""",
    ),
    Example.unchanged(title="already patched: recognised by its mark, not doubled", site=_SITE, text=_AFTER_0_18),
]
