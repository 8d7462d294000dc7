"""Stand-ins for the forward batch and SGLang's layer-boundary residual stream.

The forward batch with every optional feature off; the residual a
layer-boundary stack keeps on it (``sglang.srt.layers.layer_boundary.residual.batch``,
0.5.21 and later) and the explicit pair of ``.access``; a layer's
``attn_boundary``; and the tensors a pipeline stage receives. The layers
and the final norm that use them are in :mod:`patchcraft.harness.standins`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from patchcraft.harness.nothing import HarnessError, UnknownIsNothing


class ForwardBatch(UnknownIsNothing):
    """A forward batch with every optional feature off."""

    _prefix = "forward_batch"

    def __init__(self) -> None:
        self.can_run_tbo = False
        self.residual_stream: Optional[ResidualStream] = None


@dataclass
class ResidualStream:
    """The residual a layer-boundary stack keeps between layers (0.5.23 and later)."""

    residual: Optional[torch.Tensor] = None


def batch_stream(forward_batch: Any) -> ResidualStream:
    """The residual stream kept on ``forward_batch`` (a layer before ``residual_batch.start`` is an error)."""
    stream = getattr(forward_batch, "residual_stream", None)
    if not isinstance(stream, ResidualStream):
        raise HarnessError("a layer ran before residual_batch.start(forward_batch)")
    return stream


class ResidualBatch:
    """``sglang.srt.layers.layer_boundary.residual.batch``: the residual kept on the batch.

    The stand-in keeps one representation of the stream: ``residual`` is
    the sum before the last layer's contribution, and the ``hidden_states``
    a layer returns is that contribution (SGLang's *pending* state); a
    stream whose residual is ``None`` holds its full value in
    ``hidden_states`` (SGLang's initial and *written* states, which read
    alike: the next layer takes it as its residual). So ``snapshot`` is
    ``hidden + residual``, as in the release's own ``batch.py``. 0.5.21
    names the final norm ``norm`` (its callback ``capture_output``), 0.5.22
    on ``final_norm`` (``capture``); both are here. Any other function
    raises :class:`HarnessError` (``fold``, ``set_written``,
    ``read_output``: no patched forward the harness runs calls them).
    """

    @staticmethod
    def start(forward_batch: Any) -> None:
        forward_batch.residual_stream = ResidualStream()

    @staticmethod
    def complete_output(hidden_states: torch.Tensor, forward_batch: Any) -> torch.Tensor:
        batch_stream(forward_batch)
        return hidden_states

    @staticmethod
    def written_residual(forward_batch: Any) -> Optional[torch.Tensor]:
        return batch_stream(forward_batch).residual

    @staticmethod
    def final_norm(
        hidden_states: torch.Tensor, forward_batch: Any, layernorm: Any, capture: Any = None, **kwargs: Any
    ) -> Any:
        """0.5.22+: the final norm of the stream, ``capture`` getting the same updated residual."""
        return _final_norm(hidden_states, forward_batch, layernorm, capture, kwargs)

    @staticmethod
    def norm(
        hidden_states: torch.Tensor, forward_batch: Any, layernorm: Any, capture_output: Any = None, **kwargs: Any
    ) -> Any:
        """0.5.21's name for :meth:`final_norm` (its callback is ``capture_output``)."""
        return _final_norm(hidden_states, forward_batch, layernorm, capture_output, kwargs)

    @staticmethod
    def snapshot(hidden_states: torch.Tensor, forward_batch: Any) -> torch.Tensor:
        residual = batch_stream(forward_batch).residual
        return hidden_states.clone() if residual is None else hidden_states + residual

    @staticmethod
    def stream_of(forward_batch: Any) -> ResidualStream:
        return batch_stream(forward_batch)

    @staticmethod
    def take_output(hidden_states: torch.Tensor, forward_batch: Any) -> torch.Tensor:
        batch_stream(forward_batch)
        forward_batch.residual_stream = None
        return hidden_states

    @staticmethod
    def clear(forward_batch: Any) -> None:
        forward_batch.residual_stream = None

    @staticmethod
    def to_pp(hidden_states: torch.Tensor, forward_batch: Any, **kwargs: Any) -> "PPProxyTensors":
        residual = batch_stream(forward_batch).residual
        forward_batch.residual_stream = None
        return PPProxyTensors({"hidden_states": hidden_states, "residual": residual})

    def __getattr__(self, name: str) -> Any:
        raise HarnessError(f"residual_batch.{name} has no stand-in")


def _final_norm(hidden_states: torch.Tensor, forward_batch: Any, layernorm: Any, capture: Any, kwargs: dict) -> Any:
    if kwargs.get("finalize_norm") is not None or kwargs.get("handoff_norm") is not None:
        raise HarnessError("the final norm took a producer handoff (finalize_norm/handoff_norm), which has no stand-in")
    residual = batch_stream(forward_batch).residual
    forward_batch.residual_stream = None
    if residual is None:
        if capture is not None:
            capture(hidden_states)
        return layernorm(hidden_states)
    hidden_states, residual = layernorm(hidden_states, residual)
    if capture is not None:
        capture(residual)
    return hidden_states


class ResidualAccess:
    """``sglang.srt.layers.layer_boundary.residual.access`` (0.5.21+): a layer output and an explicit residual.

    For forwards that carry ``residual`` as a local tensor (``hidden_states,
    residual = layer(...)``); on plain tensors these are what the release's
    functions compute: the pair passes through ``finish_layer_stack``,
    ``snapshot`` copies ``hidden + residual``.
    """

    @staticmethod
    def finish_layer_stack(hidden_states: Any, residual: Any, forward_batch: Any = None, **kwargs: Any) -> tuple:
        if isinstance(residual, ResidualStream):
            raise HarnessError("finish_layer_stack got a residual stream, which has no stand-in")
        return hidden_states, residual

    @staticmethod
    def from_pp(tensors: Any, *, residual_in_hidden: bool = False, allow_missing_residual: bool = False) -> tuple:
        if residual_in_hidden:
            residual = None
        elif allow_missing_residual:
            residual = tensors.get("residual")
        else:
            residual = tensors["residual"]
        return tensors["hidden_states"], residual

    @staticmethod
    def snapshot(hidden_states: torch.Tensor, residual: Optional[torch.Tensor], *, group: Any = None) -> torch.Tensor:
        if isinstance(residual, ResidualStream):
            raise HarnessError("residual_access.snapshot got a residual stream, which has no stand-in")
        if group is not None:
            hidden_states = group.all_reduce(hidden_states.clone())
        return hidden_states.clone() if residual is None else hidden_states + residual

    def __getattr__(self, name: str) -> Any:
        raise HarnessError(f"residual_access.{name} has no stand-in")


class PPProxyTensors:
    """The tensors a pipeline stage receives from the previous one."""

    def __init__(self, tensors: dict) -> None:
        self.tensors = dict(tensors)

    def __getitem__(self, key: str) -> Any:
        return self.tensors[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def get(self, key: str, default: Any = None) -> Any:
        return self.tensors.get(key, default)


class AttnBoundary:
    """``layer.attn_boundary``: ``from_pp`` (a later stage takes the received pair), and
    ``snapshot``, which copies the stream like ``residual_batch.snapshot`` (0.5.21's longcat_flash)."""

    snapshot = staticmethod(ResidualBatch.snapshot)

    @staticmethod
    def from_pp(proxy: Any, forward_batch: Any, *, allow_missing_residual: bool = False) -> torch.Tensor:
        residual = proxy.get("residual") if allow_missing_residual else proxy["residual"]
        forward_batch.residual_stream = ResidualStream(residual=residual)
        return proxy["hidden_states"]
