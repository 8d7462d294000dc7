"""``configure_ids_before_graphs``'s before/after examples: its unit tests (tests/transforms/test_configure_ids_before_graphs.py)
and its section of docs/transforms.md (scripts/document_transforms.py)."""

from __future__ import annotations

from pathlib import Path

from patchcraft.planning.runner_edits import ATTR, BEFORE_CAPTURE, PassIds, RememberIds, runner_site
from .. import configure_ids_before_graphs
from .._base import Example
from .._contract import Transform

TRANSFORM: Transform = configure_ids_before_graphs

_GRAPH_SITE = runner_site(
    Path("cuda_graph_runner.py"),
    "CudaGraphRunner",
    "__init__",
    PassIds(runner="self.model_runner", attr=ATTR, model="model"),
)
_RUNNER_SITE = runner_site(
    Path("model_runner.py"),
    "ModelRunner",
    "initialize",
    RememberIds(
        name="eagle_aux_hidden_state_layer_ids",
        attr=ATTR,
        model="model",
        anchors=frozenset({"init_cuda_graphs"}),
        where=BEFORE_CAPTURE,
    ),
)

EXAMPLES = [
    Example(
        title="the graph runner passes the configured ids, not none",
        site=_GRAPH_SITE,
        before="""\
class CudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        # Speculative_inference
        if model_runner.spec_algorithm.is_eagle3():
            self.model_runner.model.set_eagle3_layers_to_capture()

        self.capture()
""",
        after="""\
class CudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        # Speculative_inference
        if model_runner.spec_algorithm.is_eagle3():
            self.model_runner.model.set_eagle3_layers_to_capture(
                # patchcraft: graphs freeze the layers to capture: pass the configured ids, not the defaults
                getattr(self.model_runner, "eagle_aux_hidden_state_layer_ids", None)
            )

        self.capture()
""",
    ),
    Example(
        title="the draft's ids are read before the graphs are captured",
        site=_RUNNER_SITE,
        before="""\
class ModelRunner:
    def initialize(self, min_per_gpu_memory):
        server_args = self.server_args
        if self.device == "cuda":
            self.init_attention_backend()
            self.init_cuda_graphs()

        # auxiliary hidden capture mode
        if self.spec_algorithm.is_eagle3() and not self.is_draft_worker:
            draft_model_config = ModelConfig.from_server_args(server_args, is_draft_model=True)
            try:
                eagle_config = getattr(draft_model_config.hf_config, "eagle_config", None)
                eagle_aux_hidden_state_layer_ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
            except:
                eagle_aux_hidden_state_layer_ids = None

            self.model.set_eagle3_layers_to_capture(eagle_aux_hidden_state_layer_ids)
""",
        after="""\
class ModelRunner:
    def initialize(self, min_per_gpu_memory):
        server_args = self.server_args
        # patchcraft: read the draft's EAGLE-3 aux layer ids before any graph is captured
        if self.spec_algorithm.is_eagle3() and not self.is_draft_worker:
            draft_model_config = ModelConfig.from_server_args(server_args, is_draft_model=True)
            try:
                eagle_config = getattr(draft_model_config.hf_config, "eagle_config", None)
                eagle_aux_hidden_state_layer_ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
            except:
                eagle_aux_hidden_state_layer_ids = None

            self.eagle_aux_hidden_state_layer_ids = eagle_aux_hidden_state_layer_ids
        if self.device == "cuda":
            self.init_attention_backend()
            self.init_cuda_graphs()

        # auxiliary hidden capture mode
        if self.spec_algorithm.is_eagle3() and not self.is_draft_worker:
            draft_model_config = ModelConfig.from_server_args(server_args, is_draft_model=True)
            try:
                eagle_config = getattr(draft_model_config.hf_config, "eagle_config", None)
                eagle_aux_hidden_state_layer_ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
            except:
                eagle_aux_hidden_state_layer_ids = None

            self.model.set_eagle3_layers_to_capture(eagle_aux_hidden_state_layer_ids)
""",
    ),
    Example.unchanged(
        title="a call already passing the runner's ids by hand is recognised, not doubled",
        site=_GRAPH_SITE,
        text="""\
class CudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.model_runner.model.set_eagle3_layers_to_capture(
            self.model_runner.eagle_aux_hidden_state_layer_ids
        )
""",
    ),
]
