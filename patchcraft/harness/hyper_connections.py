"""Stand-in layers for hyper-connection (mHC) models: DeepSeek-V4's streams, run as the release's forward expects.

DeepSeek-V4 (vLLM's ``vllm/models/deepseek_v4/<platform>/model.py``) widens the
embedding output to ``hc_mult`` streams (``[tokens, hc_mult, hidden]``) and
threads, besides the stream and the residual, each layer's post-mix and
combine weights through its layer call::

    hidden_states, residual, post_mix, res_mix = layer(
        hidden_states, positions, input_ids, post_mix, res_mix, residual)

On the fused path (``use_fused_mhc``: tilelang or aiter, i.e. CUDA and ROCm)
a layer defers its last post-mix: it returns the branch output, the stream
it mixed into and the weights, and the caller completes the stream with
``layer.hc_post(...)`` (or ``mhc_post_tilelang(...)``) wherever it needs it
whole, as every capture does before averaging the streams. On the unfused
path (CPU and XPU: vLLM's ``_has_tilelang_mhc()`` is false off CUDA and
ROCm, ``model_executor/layers/mhc.py`` of 0.32.0) the layer returns the
completed stream and ``None`` for the rest.

The stand-in keeps that contract, with :func:`~patchcraft.harness.standins.mix`
as each layer's work: layer ``k`` completes the stream it was handed (a
2-D embedding output is widened to :data:`STREAMS` equal streams, as the
first layer of the NVIDIA module does itself) and adds ``mix(stream, k)``
to every stream alike, out of place. The streams stay equal, so their mean
after ``k`` layers is exactly ``hs[k]`` of
:func:`~patchcraft.harness.standins.reference_states` (two streams: the
mean of two equal floats is that float). What the harness judges is which
state each id reaches the draft as, and that is the release's own forward.
"""

from __future__ import annotations

import ast
from typing import Any, Optional

import torch

from patchcraft.harness.nothing import HarnessError
from patchcraft.harness.shapes import LayerCall
from patchcraft.harness.standins import StandInConfig, StandInLayer, mix
from patchcraft.harness.switches import HYPER_CONNECTIONS, reads_config
from patchcraft.reading.class_graph import ClassNode, ModelGraph

#: Streams of the stand-in model (``config.hc_mult``).
STREAMS = 2
#: The config field of the stream count: a model reading it has hyper-connections.
FIELD = "hc_mult"
#: Platforms whose mHC layers defer their post-mix (fused kernels: tilelang on CUDA, tilelang or aiter on ROCm).
FUSED_PLATFORMS = ("cuda", "rocm")


def post(x: Any, residual: Any, post_mix: Any = None, res_mix: Any = None) -> Any:
    """The completed stream: ``residual`` mixed with the branch output ``x``; ``x`` itself when nothing was deferred."""
    if residual is None:
        return x
    return residual + x


def head(x: Any, *args: Any, **kwargs: Any) -> Any:
    """``hc_head``: the streams collapsed to ``[tokens, hidden]`` (their mean; the final output is not judged)."""
    return x.mean(dim=1) if isinstance(x, torch.Tensor) and x.dim() == 3 else x


def contract(x: Any, hc_mult: Any = None) -> Any:
    """``hc_contract``: the streams contracted back to ``[tokens, hidden]`` (their mean: ``hs[k]``)."""
    return x.mean(dim=1) if isinstance(x, torch.Tensor) and x.dim() == 3 else x


#: The mHC kernels a forward calls by name (NVIDIA's ``deepseek_v4/nvidia/model.py``; GLM-5-Next's ``hc_contract``,
#: imported from ``model_executor/layers/mhc.py``): their stand-ins.
HELPERS = {
    "mhc_post_tilelang": lambda: post,
    "hc_head_fused_kernel_tilelang": lambda: head,
    "hc_contract": lambda: contract,
}
#: The attribute a forward asks whether a layer deferred its post-mix (DeepSeek-V4's ``layer.use_fused_mhc``).
FUSED_FLAG = "use_fused_mhc"


class StreamsConfig(StandInConfig):
    """The stand-in config of a hyper-connection model: :data:`STREAMS` streams."""

    def __init__(self, layers: int, hidden: int, vocab: int) -> None:
        super().__init__(layers, hidden, vocab)
        self.hc_mult = STREAMS


class StreamsLayer(StandInLayer):
    """Decoder layer ``index`` of a hyper-connection model: the stream completed, ``mix`` added, out of place."""

    def __init__(self, index: int, call: LayerCall, fused: bool) -> None:
        super().__init__(index, call)
        self.use_fused_mhc = fused

    def hc_post(self, x: Any, residual: Any, post_mix: Any = None, res_mix: Any = None) -> Any:
        return post(x, residual, post_mix, res_mix)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        call = self.call
        hidden = call.pick(args, kwargs, call.hidden)
        residual = call.pick(args, kwargs, call.residual)
        if not isinstance(hidden, torch.Tensor):
            raise HarnessError(f"layer {self.index} got {type(hidden).__name__} as hidden_states")
        weights = [call.pick(args, kwargs, slot) for _, slot in call.threaded]
        stream = post(hidden, residual, *weights[:2])
        if stream.dim() == 2:
            stream = stream.unsqueeze(-2).repeat(1, STREAMS, 1)
        branch = mix(stream, self.index)
        extra = [name for name, _ in call.threaded]
        if self.use_fused_mhc:  # deferred: the caller completes residual + branch
            values: dict[str, Any] = {"hidden_states": branch, "residual": stream}
            values.update({name: torch.ones(stream.shape[0], STREAMS) for name in extra})
        else:
            values = {"hidden_states": stream + branch, "residual": None}
        if call.outputs is None:
            return values["hidden_states"]
        return tuple(values.get(name) for name in call.outputs)


def has_streams(graph: ModelGraph, inner: ClassNode, call: LayerCall) -> bool:
    """Whether ``inner`` is a hyper-connection model: its layer call threads more state and its classes read
    ``<config>.hc_mult``."""
    return bool(call.threaded) and _reads_field(graph, inner)


def stream_attributes(graph: ModelGraph, inner: ClassNode) -> set[str]:
    """``self.X = <config>.hc_mult`` in the ``__init__`` of ``inner``'s classes: the attributes holding the count."""
    return _assigned(graph, inner, _is_field)


def _assigned(graph: ModelGraph, inner: ClassNode, value_test: Any) -> set[str]:
    """``X`` of each ``self.X = value`` in the ``__init__`` of ``inner``'s classes where ``value_test(value)``."""
    found: set[str] = set()
    for node in graph.mro(inner):
        init = node.methods.get("__init__")
        for stmt in ast.walk(init) if init is not None else ():
            if isinstance(stmt, ast.Assign) and value_test(stmt.value):
                found |= {t.attr for t in stmt.targets if isinstance(t, ast.Attribute) and _is_self_attribute(t)}
    return found


def _reads_field(graph: ModelGraph, inner: ClassNode) -> bool:
    return any(_is_field(n) for node in graph.mro(inner) for method in node.methods.values() for n in ast.walk(method))


def _is_field(node: Optional[ast.AST]) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == FIELD


def _is_self_attribute(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def defers(forward_text: str, platform: Optional[str]) -> bool:
    """Whether the stand-in layers defer their post-mix: per platform where the forward asks each layer
    (:data:`FUSED_FLAG`, DeepSeek-V4), always where it does not and completes whatever deferred state it is handed
    (GLM-5-Next: ``_aux_hidden_state(hidden_states, residual, post, comb)``, every mHC layer deferring to the next
    one's fused pre-op on every platform)."""
    return fused_on(platform) if FUSED_FLAG in forward_text else True


def post_op_attributes(graph: ModelGraph, inner: ClassNode) -> set[str]:
    """``self.X = <...>PostOp()`` in the ``__init__`` of ``inner``'s classes: the post-mix op the forward completes
    deferred streams with (GLM-5-Next's ``self._aux_post_op = MHCPostOp()``)."""
    return _assigned(
        graph,
        inner,
        lambda value: (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id.endswith("PostOp")
        ),
    )


def mhc_switch(graph: ModelGraph, inner: ClassNode) -> bool:
    """Whether a class of ``inner``'s file reads ``config.mhc``: whether its layers have hyper-connections is the
    checkpoint's (GLM-5-Next: its large model's layers do, its 70B model's do not). The stand-in layers are mHC
    layers, so the run is that side (:data:`~patchcraft.harness.switches.HYPER_CONNECTIONS`)."""
    return reads_config(
        (m for (module, _), node in graph.classes.items() if module == inner.module for m in node.methods.values()),
        HYPER_CONNECTIONS.field,
    )


def fused_on(platform: Optional[str]) -> bool:
    """Whether ``platform``'s mHC layers defer their post-mix (no platform named: the GPU path, fused)."""
    return platform is None or platform in FUSED_PLATFORMS
