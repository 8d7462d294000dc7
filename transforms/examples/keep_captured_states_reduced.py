"""``keep_captured_states_reduced``'s before/after examples: its unit tests (tests/transforms/test_keep_captured_states_reduced.py)
and its section of docs/transforms.md (scripts/document_transforms.py)."""

from __future__ import annotations

from patchcraft.planning.records import FusionParams
from .. import keep_captured_states_reduced
from ..keep_captured_states_reduced import CLASS, KIND, METHOD
from .._base import Example, example_site
from .._contract import Transform

TRANSFORM: Transform = keep_captured_states_reduced

_SITE = example_site(KIND, CLASS, METHOD, FusionParams(algo="self._speculative_algo"), path="communicator.py")

EXAMPLES = [
    Example(
        title="EAGLE-3 turns off the deferred all-reduce on the layers the setter marked",
        site=_SITE,
        before="""\
class LayerCommunicator:
    def should_fuse_mlp_allreduce_with_next_layer(
        self, forward_batch: ForwardBatch
    ) -> bool:
        if (
            is_dp_attention_enabled()
            and self._speculative_algo is not None
            and self._speculative_algo.is_eagle()
        ):
            return False

        if get_attn_tp_context().input_scattered:
            return False
        return apply_flashinfer_allreduce_fusion(batch_size) and self._context.tp_size > 1
""",
        after="""\
class LayerCommunicator:
    def should_fuse_mlp_allreduce_with_next_layer(
        self, forward_batch: ForwardBatch
    ) -> bool:
        if (
            is_dp_attention_enabled()
            and self._speculative_algo is not None
            and self._speculative_algo.is_eagle()
        ):
            return False
        # patchcraft: all-reduce fusion: EAGLE-3 captures this layer's output before the next norm reduces it: keep it reduced
        if self._speculative_algo is not None and self._speculative_algo.is_eagle3() and getattr(self, "patchcraft_output_captured", False):
            return False

        if get_attn_tp_context().input_scattered:
            return False
        return apply_flashinfer_allreduce_fusion(batch_size) and self._context.tp_size > 1
""",
    ),
    Example.unchanged(
        title="a guard for EAGLE-3 written by hand is recognised, not doubled",
        site=_SITE,
        text="""\
class LayerCommunicator:
    def should_fuse_mlp_allreduce_with_next_layer(self, forward_batch):
        if is_dp_attention_enabled() and self._speculative_algo.is_eagle():
            return False
        if self._speculative_algo.is_eagle3():
            return False
        return True
""",
    ),
]
