"""Small stand-ins for what a model file's methods touch besides their own code.

Real: ``torch``, ``torch.nn.Embedding``, the standard library, and the
release's own ``sglang/srt/layers/aux_hidden_states.py``. Stand-ins: the
decoder layers (deterministic math with SGLang's calling convention and
its in-place residual add), the final norm, the parallel groups (one rank,
or a second pipeline stage), the forward batch and the layer-boundary
residual stream (:mod:`patchcraft.harness.layer_boundary`; by module name:
:data:`MODULES`), and every other SGLang helper, which becomes
:class:`~patchcraft.harness.nothing.Nothing`: falsy, callable, a no-op
context manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn

from patchcraft.harness.layer_boundary import (
    AttnBoundary,
    ForwardBatch,
    PPProxyTensors,
    ResidualAccess,
    ResidualBatch,
    batch_stream,
)
from patchcraft.harness.nothing import HarnessError, Nothing, UnknownIsNothing
from patchcraft.harness.shapes import LayerCall


# -- parallel groups -------------------------------------------------------------


@dataclass
class ParallelGroup(UnknownIsNothing):
    """A process group of ``world_size`` ranks seen from rank ``rank_in_group``.

    Collectives are those of one rank (the identity): tensor parallelism
    is out of reach on a CPU, and a second pipeline stage only matters to
    the forward through ``is_first_rank`` and the tensors it receives.
    """

    _prefix = "group"
    world_size: int = 1
    rank_in_group: int = 0

    @property
    def rank(self) -> int:
        return self.rank_in_group

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank_in_group == self.world_size - 1

    def all_gather(self, tensor: Any, dim: int = -1, **kwargs: Any) -> Any:
        return tensor

    def all_reduce(self, tensor: Any, **kwargs: Any) -> Any:
        return tensor


@dataclass
class World:
    """The parallel set-up one scenario runs under (helpers read it while it is active)."""

    pp: ParallelGroup = field(default_factory=ParallelGroup)
    tp: ParallelGroup = field(default_factory=ParallelGroup)


_ACTIVE: list[World] = [World()]


def active_world() -> World:
    return _ACTIVE[-1]


class activate:
    """``with activate(world):`` makes the group helpers answer for ``world``."""

    def __init__(self, world: World) -> None:
        self.world = world

    def __enter__(self) -> World:
        _ACTIVE.append(self.world)
        return self.world

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.pop()


class _Parallel:
    """``get_parallel()``: ``*_group`` attributes are one-rank groups, pp is the world's."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name.startswith("pp"):
            return active_world().pp
        if name.endswith("group"):
            return active_world().tp
        if name.endswith(("size", "world_size")):
            return 1
        if name.endswith("rank"):
            return 0
        return Nothing(f"get_parallel().{name}")


def _identity(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor


def _tbo(*args: Any, **kwargs: Any) -> Any:
    raise HarnessError("the two-batch-overlap path ran (forward_batch.can_run_tbo is False here)")


# -- the model parts ---------------------------------------------------------------


class RecordingEmbedding(nn.Embedding):
    """A real ``nn.Embedding`` that remembers each output (for the aliasing check)."""

    def __init__(self, vocab: int, hidden: int, generator: torch.Generator) -> None:
        super().__init__(vocab, hidden)
        with torch.no_grad():
            self.weight.copy_(torch.randn(vocab, hidden, generator=generator, device=generator.device))
        self.outputs: list[torch.Tensor] = []

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = super().forward(input_ids)
        self.outputs.append(out)
        return out


class StandInNorm(nn.Module):
    """The final norm: ``norm(h)`` or the fused ``norm(h, residual)`` that adds in place."""

    def forward(
        self, hidden_states: torch.Tensor, residual: Optional[torch.Tensor] = None, *args: Any, **kwargs: Any
    ) -> Any:
        if residual is None:
            return hidden_states * 1.0
        residual.add_(hidden_states)
        return residual * 1.0, residual


def mix(x: torch.Tensor, index: int) -> torch.Tensor:
    """Layer ``index``'s contribution: deterministic and different for every layer."""
    return torch.tanh(x * (0.5 + 0.125 * index) + 0.0625 * (index + 1))


class StandInLayer(nn.Module):
    """Decoder layer ``index``: SGLang's calling convention, a residual stream of ``x + mix(x)``.

    Like SGLang's fused add-norm kernels it adds into the residual *in
    place*, and at layer 0 it takes the incoming ``hidden_states`` itself
    as its residual, so a capture of the embedding that is not a copy is
    overwritten by the next layer. Capture objects passed as keywords
    (``captured_last_layer_outputs=``, ``capture_output=``) receive the
    layer's input stream, as SGLang's layer communicator gives them.
    """

    def __init__(self, index: int, call: LayerCall) -> None:
        super().__init__()
        self.index = index
        self.call = call
        self.attn_boundary = AttnBoundary()

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_"):
                raise
            return Nothing(f"layers[{self.__dict__.get('index')}].{name}")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        call = self.call
        hidden = call.pick(args, kwargs, call.hidden)
        if not isinstance(hidden, torch.Tensor):
            raise HarnessError(f"layer {self.index} got {type(hidden).__name__} as hidden_states")
        if call.residual_kind == "pair":
            stream = _add(hidden, call.pick(args, kwargs, call.residual))
        elif call.residual_kind == "stream":
            keeper = batch_stream(call.pick(args, kwargs, call.batch))
            stream = keeper.residual = _add(hidden, keeper.residual)
        else:
            stream = hidden
        for keyword in call.captures:
            _capture(kwargs.get(keyword), stream)
        out = mix(stream, self.index)
        values = {"residual": stream}
        values["hidden_states"] = stream + out if call.residual_kind == "none" else out
        if call.outputs is None:
            return values["hidden_states"]
        return tuple(values.get(name) for name in call.outputs)


def _add(hidden: torch.Tensor, residual: Optional[torch.Tensor]) -> torch.Tensor:
    if residual is None:
        return hidden  # the embedding becomes layer 0's residual: same tensor
    residual.add_(hidden)
    return residual


def _capture(target: Any, stream: torch.Tensor) -> None:
    if target is None:
        return
    if callable(target) and not hasattr(target, "append"):
        target(stream)  # e.g. AuxHiddenStateList.capture, which copies
    else:
        target.append(stream.clone())


def reference_states(embedding: torch.Tensor, layers: int) -> list[torch.Tensor]:
    """hs[0..layers] in Hugging Face numbering, straight from :func:`mix`."""
    states = [embedding.clone()]
    x = embedding.clone()
    for index in range(layers):
        x = x + mix(x, index)
        states.append(x)
    return states


# -- free names ------------------------------------------------------------------------

#: SGLang helpers whose answer matters to the code under test.
HELPERS: dict[str, Callable[[], Any]] = {
    "get_pp_group": lambda: lambda *a, **k: active_world().pp,
    "get_tp_group": lambda: lambda *a, **k: active_world().tp,
    "get_world_group": lambda: lambda *a, **k: active_world().tp,
    "get_attention_tp_group": lambda: lambda *a, **k: active_world().tp,
    "get_attn_tp_group": lambda: lambda *a, **k: active_world().tp,
    "get_moe_ep_group": lambda: lambda *a, **k: active_world().tp,
    "get_parallel": lambda: lambda *a, **k: _Parallel(),
    "get_tensor_model_parallel_world_size": lambda: lambda *a, **k: 1,
    "get_tensor_model_parallel_rank": lambda: lambda *a, **k: 0,
    "get_attention_tp_size": lambda: lambda *a, **k: 1,
    "get_attention_tp_rank": lambda: lambda *a, **k: 0,
    "get_pipeline_model_parallel_world_size": lambda: lambda *a, **k: active_world().pp.world_size,
    "tensor_model_parallel_all_reduce": lambda: _identity,
    "tensor_model_parallel_all_gather": lambda: _identity,
    "attn_tp_all_gather": lambda: _identity,
    "model_forward_maybe_tbo": lambda: _tbo,
    "model_forward_stages": lambda: _tbo,
    "PPProxyTensors": lambda: PPProxyTensors,
    "ForwardBatch": lambda: ForwardBatch,
}


#: SGLang modules with a stand-in, by their dotted name: ``from M import f`` and
#: ``from P import M as alias`` both find it, whatever local name the file gives it.
MODULES: dict[str, Callable[[], Any]] = {
    "sglang.srt.layers.layer_boundary.residual.batch": ResidualBatch,
    "sglang.srt.layers.layer_boundary.residual.access": ResidualAccess,
}


def _no_standin(what: str) -> Callable[..., Any]:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise HarnessError(f"{what} has no stand-in")

    return missing


def standin_import(module: str, attr: Optional[str]) -> Any:
    """The stand-in for ``from module import attr`` (or ``import module``), or None when there is none."""
    dotted = f"{module}.{attr}" if attr else module
    if dotted in MODULES:
        return MODULES[dotted]()
    if attr and module in MODULES:
        try:
            return getattr(MODULES[module](), attr)
        except HarnessError:
            return _no_standin(f"{module.rsplit('.', 1)[-1]}.{attr}")
    return None


class StandInConfig:
    """The model config: the sizes the harness uses, Nothing for the rest."""

    def __init__(self, layers: int, hidden: int, vocab: int) -> None:
        self.num_hidden_layers = layers
        self.hidden_size = hidden
        self.vocab_size = vocab

    def get_text_config(self) -> "StandInConfig":
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in ("text_config", "language_config", "llm_config", "text"):
            return self
        return Nothing(f"config.{name}")
