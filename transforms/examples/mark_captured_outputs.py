"""``mark_captured_outputs``'s before/after examples: its unit tests (tests/transforms/test_mark_captured_outputs.py)
and its section of docs/transforms.md (scripts/document_transforms.py)."""

from __future__ import annotations

from patchcraft.reading.class_graph import SETTER
from patchcraft.reading.fusion_reading import MarkParams
from .. import mark_captured_outputs
from .._base import Example, example_site
from .._contract import Transform

TRANSFORM: Transform = mark_captured_outputs

_SITE = example_site(
    mark_captured_outputs.KIND,
    "Glm4MoeForCausalLM",
    SETTER,
    MarkParams(target="self.model", communicator="layer_communicator"),
)

EXAMPLES = [
    Example(
        title="the setter marks the layers whose output a capture reads",
        site=_SITE,
        before="""\
class Glm4MoeForCausalLM:
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if layer_ids is None:
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
""",
        after="""\
class Glm4MoeForCausalLM:
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if layer_ids is None:
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
        # patchcraft: all-reduce fusion: a capture at the top of layer i reads layer i-1's output; mark those layers
        for _index, _layer in enumerate(getattr(self.model, "layers", ())):
            if hasattr(_layer, "layer_communicator"):
                _layer.layer_communicator.patchcraft_output_captured = _index + 1 in self.model.layers_to_capture
""",
    ),
]
