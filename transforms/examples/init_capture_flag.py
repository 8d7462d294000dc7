"""``init_capture_flag``'s before/after examples: its unit tests (tests/transforms/test_init_capture_flag.py)
and its section of docs/transforms.md (scripts/document_transforms.py)."""

from __future__ import annotations

from .. import init_capture_flag
from .._base import Example, example_site
from .._contract import Transform

TRANSFORM: Transform = init_capture_flag

_SITE = example_site(init_capture_flag.KIND, "DeepseekV2Model", "__init__")

EXAMPLES = [
    Example(
        title="flag goes right after the capture list",
        site=_SITE,
        before="""\
class DeepseekV2Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers_to_capture = []
        if get_moe_a2a_backend().is_deepep():
            self.enable_a2a_moe = True
""",
        after="""\
class DeepseekV2Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers_to_capture = []
        # patchcraft: EAGLE-3 layer id -1 captures the embedding output
        self.capture_embedding_for_eagle3 = False
        if get_moe_a2a_backend().is_deepep():
            self.enable_a2a_moe = True
""",
    ),
    Example.unchanged(
        title="a hand-applied flag (sed) is recognised, not doubled",
        site=_SITE,
        text="""\
class DeepseekV2Model(nn.Module):
    def __init__(self, config):
        self.layers_to_capture = []
        self.capture_embedding_for_eagle3 = False
""",
    ),
]
