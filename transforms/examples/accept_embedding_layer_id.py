"""``accept_embedding_layer_id``'s before/after examples: its unit tests (tests/transforms/test_accept_embedding_layer_id.py)
and its section of docs/transforms.md (scripts/document_transforms.py)."""

from __future__ import annotations

from patchcraft.reading.class_graph import SETTER
from patchcraft.planning.records import EditSite, SetterParams
from .. import accept_embedding_layer_id
from .._base import Example, example_site
from .._contract import Transform

TRANSFORM: Transform = accept_embedding_layer_id


def _site(cls: str, pp: str = "self.pp_group") -> EditSite:
    return example_site(
        accept_embedding_layer_id.KIND, cls, SETTER, SetterParams(target="self.model", param="layer_ids", pp=pp)
    )


_SITE = _site("DeepseekV2ForCausalLM")

EXAMPLES = [
    Example(
        title="plain +1 setter with a pipeline-parallel guard",
        site=_SITE,
        before="""\
class DeepseekV2ForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):
        if not self.pp_group.is_last_rank:
            return

        if layer_ids is None:
            self.capture_aux_hidden_states = True
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.capture_aux_hidden_states = True
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
""",
        after="""\
class DeepseekV2ForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):
        # patchcraft: layer id -1 = embedding output (hs[0]); drop it before the ids are converted
        if layer_ids is not None and -1 in layer_ids:
            if not hasattr(self.model, "capture_embedding_for_eagle3"):
                raise ValueError(
                    f"EAGLE-3 layer id -1 is not supported by {type(self.model).__name__}: "
                    "its forward does not capture the embedding (run `patchcraft apply`)"
                )
            if self.pp_group.world_size > 1:
                raise ValueError(
                    "EAGLE-3 layer id -1 (embedding output) needs a single pipeline stage: "
                    "the embedding exists only on the first stage"
                )
            self.model.capture_embedding_for_eagle3 = True
            layer_ids = [val for val in layer_ids if val >= 0]
        else:
            self.model.capture_embedding_for_eagle3 = False
        if not self.pp_group.is_last_rank:
            return

        if layer_ids is None:
            self.capture_aux_hidden_states = True
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.capture_aux_hidden_states = True
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
""",
    ),
    Example(
        title="first-id heuristic: -1 leaves before `layer_ids[0] == 1` is tested, and with -1 the rest is +1 whatever it chose",
        site=_SITE,
        before="""\
class DeepseekV2ForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):
        if not self.pp_group.is_last_rank:
            return

        if layer_ids is None:
            self.capture_aux_hidden_states = True
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.capture_aux_hidden_states = True
            if layer_ids and layer_ids[0] == 1:
                self.model.layers_to_capture = [val + 1 for val in layer_ids]
            else:
                self.model.layers_to_capture = list(layer_ids)
""",
        after="""\
class DeepseekV2ForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):
        # patchcraft: layer id -1 = embedding output (hs[0]); drop it before the ids are converted
        if layer_ids is not None and -1 in layer_ids:
            if not hasattr(self.model, "capture_embedding_for_eagle3"):
                raise ValueError(
                    f"EAGLE-3 layer id -1 is not supported by {type(self.model).__name__}: "
                    "its forward does not capture the embedding (run `patchcraft apply`)"
                )
            if self.pp_group.world_size > 1:
                raise ValueError(
                    "EAGLE-3 layer id -1 (embedding output) needs a single pipeline stage: "
                    "the embedding exists only on the first stage"
                )
            self.model.capture_embedding_for_eagle3 = True
            layer_ids = [val for val in layer_ids if val >= 0]
        else:
            self.model.capture_embedding_for_eagle3 = False
        if not self.pp_group.is_last_rank:
            return

        if layer_ids is None:
            self.capture_aux_hidden_states = True
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.capture_aux_hidden_states = True
            if layer_ids and layer_ids[0] == 1:
                self.model.layers_to_capture = [val + 1 for val in layer_ids]
            else:
                self.model.layers_to_capture = list(layer_ids)
            # patchcraft: with layer id -1 the other ids are layer outputs (+1), whatever the test above chose
            if self.model.capture_embedding_for_eagle3:
                self.model.layers_to_capture = [val + 1 for val in layer_ids]
""",
    ),
    Example(
        title="max heuristic (gpt-oss): with -1 given, the ids are +1 even when the test keeps them raw",
        site=_site("GptOssForCausalLM"),
        before="""\
class GptOssForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):
        num_layers = self.config.num_hidden_layers
        if layer_ids is None:
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            if layer_ids and max(layer_ids) == num_layers:
                self.model.layers_to_capture = list(layer_ids)
            else:
                self.model.layers_to_capture = [val + 1 for val in layer_ids]
""",
        after="""\
class GptOssForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):
        # patchcraft: layer id -1 = embedding output (hs[0]); drop it before the ids are converted
        if layer_ids is not None and -1 in layer_ids:
            if not hasattr(self.model, "capture_embedding_for_eagle3"):
                raise ValueError(
                    f"EAGLE-3 layer id -1 is not supported by {type(self.model).__name__}: "
                    "its forward does not capture the embedding (run `patchcraft apply`)"
                )
            if self.pp_group.world_size > 1:
                raise ValueError(
                    "EAGLE-3 layer id -1 (embedding output) needs a single pipeline stage: "
                    "the embedding exists only on the first stage"
                )
            self.model.capture_embedding_for_eagle3 = True
            layer_ids = [val for val in layer_ids if val >= 0]
        else:
            self.model.capture_embedding_for_eagle3 = False
        num_layers = self.config.num_hidden_layers
        if layer_ids is None:
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            if layer_ids and max(layer_ids) == num_layers:
                self.model.layers_to_capture = list(layer_ids)
            else:
                self.model.layers_to_capture = [val + 1 for val in layer_ids]
            # patchcraft: with layer id -1 the other ids are layer outputs (+1), whatever the test above chose
            if self.model.capture_embedding_for_eagle3:
                self.model.layers_to_capture = [val + 1 for val in layer_ids]
""",
    ),
    Example(
        title="inner helper, pipeline group from a function: the guard uses the setter's own group",
        site=_site("Qwen3NextForCausalLM", pp="get_pp_group()"),
        before="""\
class Qwen3NextForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids: Optional[list[int]] = None):
        if not get_pp_group().is_last_rank:
            return

        self.capture_aux_hidden_states = True
        if layer_ids is None:
            num_layers = self.config.num_hidden_layers
            self.model.set_eagle3_layers_to_capture([2, num_layers // 2, num_layers - 3])
        else:
            self.model.set_eagle3_layers_to_capture([val + 1 for val in layer_ids])
""",
        after="""\
class Qwen3NextForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids: Optional[list[int]] = None):
        # patchcraft: layer id -1 = embedding output (hs[0]); drop it before the ids are converted
        if layer_ids is not None and -1 in layer_ids:
            if not hasattr(self.model, "capture_embedding_for_eagle3"):
                raise ValueError(
                    f"EAGLE-3 layer id -1 is not supported by {type(self.model).__name__}: "
                    "its forward does not capture the embedding (run `patchcraft apply`)"
                )
            if get_pp_group().world_size > 1:
                raise ValueError(
                    "EAGLE-3 layer id -1 (embedding output) needs a single pipeline stage: "
                    "the embedding exists only on the first stage"
                )
            self.model.capture_embedding_for_eagle3 = True
            layer_ids = [val for val in layer_ids if val >= 0]
        else:
            self.model.capture_embedding_for_eagle3 = False
        if not get_pp_group().is_last_rank:
            return

        self.capture_aux_hidden_states = True
        if layer_ids is None:
            num_layers = self.config.num_hidden_layers
            self.model.set_eagle3_layers_to_capture([2, num_layers // 2, num_layers - 3])
        else:
            self.model.set_eagle3_layers_to_capture([val + 1 for val in layer_ids])
""",
    ),
    Example(
        title="no pipeline parallelism in the model: no stage check",
        site=_site("Gemma3ForCausalLM", pp=""),
        before="""\
class Gemma3ForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):
        if layer_ids is None:
            self.capture_aux_hidden_states = True
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.capture_aux_hidden_states = True
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
""",
        after="""\
class Gemma3ForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):
        # patchcraft: layer id -1 = embedding output (hs[0]); drop it before the ids are converted
        if layer_ids is not None and -1 in layer_ids:
            if not hasattr(self.model, "capture_embedding_for_eagle3"):
                raise ValueError(
                    f"EAGLE-3 layer id -1 is not supported by {type(self.model).__name__}: "
                    "its forward does not capture the embedding (run `patchcraft apply`)"
                )
            self.model.capture_embedding_for_eagle3 = True
            layer_ids = [val for val in layer_ids if val >= 0]
        else:
            self.model.capture_embedding_for_eagle3 = False
        if layer_ids is None:
            self.capture_aux_hidden_states = True
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.capture_aux_hidden_states = True
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
""",
    ),
    Example.unchanged(
        title="the sed fix from the field is recognised as hand-applied",
        site=_SITE,
        text="""\
class DeepseekV2ForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if layer_ids is None:
            self.model.layers_to_capture = [2, 30, 58]
        else:
            self.model.capture_embedding_for_eagle3 = (-1 in layer_ids)
            self.model.layers_to_capture = [val + 1 for val in layer_ids if val >= 0]
""",
    ),
]
