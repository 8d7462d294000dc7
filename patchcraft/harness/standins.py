"""Small stand-ins for what a model file's methods touch besides their own code.

Real: ``torch``, ``torch.nn.Embedding``, the standard library, and the
release's own ``sglang/srt/layers/aux_hidden_states.py``. Stand-ins: the
decoder layers (deterministic math with SGLang's calling convention and
its in-place residual add), the final norm, the parallel groups (one rank,
or a second pipeline stage), the forward batch, the layer-boundary
residual stream (``layer_boundary.residual.batch`` and ``.access``, by
module name: :data:`MODULES`), and every other SGLang helper, which becomes
:class:`Nothing`: falsy, callable, a no-op context manager.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from patchcraft.harness.shapes import LayerCall


class Nothing:
    """A falsy stand-in for an SGLang helper or setting.

    Calling it, reading an attribute or an item gives another Nothing; it
    is an empty container, a no-op context manager, never equal to
    anything, and an ``isinstance`` class that matches nothing. So
    ``get_global_server_args().enable_x`` is off, ``with recorder.with_current_layer(i):``
    does nothing, and a kernel-only branch is never taken.
    """

    __slots__ = ("_name",)

    def __init__(self, name: str = "?") -> None:
        object.__setattr__(self, "_name", name)
        if _WATCH:
            _WATCH[-1].made(name)

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"

    def __bool__(self) -> bool:
        return False

    def __call__(self, *args: Any, **kwargs: Any) -> "Nothing":
        return Nothing(f"{self._name}()")

    def __getattr__(self, name: str) -> "Nothing":
        if name.startswith("__"):
            raise AttributeError(name)
        return Nothing(f"{self._name}.{name}")

    def __setattr__(self, name: str, value: Any) -> None:
        pass

    def __getitem__(self, key: Any) -> "Nothing":
        return Nothing(f"{self._name}[...]")

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __contains__(self, item: Any) -> bool:
        return False

    def __enter__(self) -> "Nothing":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __eq__(self, other: Any) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def __lt__(self, other: Any) -> bool:
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __or__(self, other: Any) -> "Nothing":
        return self

    __ror__ = __or__

    def __instancecheck__(self, obj: Any) -> bool:
        return False

    def __subclasscheck__(self, cls: Any) -> bool:
        return False


class HarnessError(Exception):
    """The code under test took a path the harness cannot model."""


#: This package's files: a frame in one of them is the harness, not the code under test.
HARNESS_DIR = str(Path(__file__).resolve().parent)


@dataclass(frozen=True)
class Made:
    """Where the code under test obtained a :class:`Nothing`: its frame, file and line."""

    frame: int  # id() of the frame
    filename: str
    line: int
    name: str


class StandInWatch:
    """Each :class:`Nothing` the code under test obtains, by the frame and line that asked for it.

    A crash on a line that obtained a Nothing (or reads one) acts on a
    stand-in's answer, not on a value SGLang produces (``with watch_standins() as seen:``).
    """

    def __init__(self) -> None:
        self.seen: list[Made] = []

    def made(self, name: str) -> None:
        frame = sys._getframe(2)  # past Nothing.__init__'s caller, which may be a stand-in itself
        while frame is not None and frame.f_code.co_filename.startswith(HARNESS_DIR):
            frame = frame.f_back  # type: ignore[assignment]
        if frame is not None and len(self.seen) < 100_000:
            self.seen.append(Made(id(frame), frame.f_code.co_filename, frame.f_lineno, name))


_WATCH: list[StandInWatch] = []


class watch_standins:
    """``with watch_standins() as seen:`` records every Nothing the code obtains while it runs."""

    def __enter__(self) -> StandInWatch:
        _WATCH.append(StandInWatch())
        return _WATCH[-1]

    def __exit__(self, *exc: Any) -> None:
        _WATCH.pop()


class _UnknownIsNothing:
    """A stand-in whose other attributes are :class:`Nothing`, named ``<_prefix>.<name>``."""

    _prefix = "object"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Nothing(f"{self._prefix}.{name}")


# -- parallel groups -------------------------------------------------------------


@dataclass
class ParallelGroup(_UnknownIsNothing):
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


# -- the forward batch and the layer-boundary residual stream ---------------------


class ForwardBatch(_UnknownIsNothing):
    """A forward batch with every optional feature off."""

    _prefix = "forward_batch"

    def __init__(self) -> None:
        self.can_run_tbo = False
        self.residual_stream: Optional[ResidualStream] = None


@dataclass
class ResidualStream:
    """The residual a layer-boundary stack keeps between layers (0.5.23 and later)."""

    residual: Optional[torch.Tensor] = None


def _stream(forward_batch: Any) -> ResidualStream:
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
        _stream(forward_batch)
        return hidden_states

    @staticmethod
    def written_residual(forward_batch: Any) -> Optional[torch.Tensor]:
        return _stream(forward_batch).residual

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
        residual = _stream(forward_batch).residual
        return hidden_states.clone() if residual is None else hidden_states + residual

    @staticmethod
    def stream_of(forward_batch: Any) -> ResidualStream:
        return _stream(forward_batch)

    @staticmethod
    def take_output(hidden_states: torch.Tensor, forward_batch: Any) -> torch.Tensor:
        _stream(forward_batch)
        forward_batch.residual_stream = None
        return hidden_states

    @staticmethod
    def clear(forward_batch: Any) -> None:
        forward_batch.residual_stream = None

    @staticmethod
    def to_pp(hidden_states: torch.Tensor, forward_batch: Any, **kwargs: Any) -> "PPProxyTensors":
        residual = _stream(forward_batch).residual
        forward_batch.residual_stream = None
        return PPProxyTensors({"hidden_states": hidden_states, "residual": residual})

    def __getattr__(self, name: str) -> Any:
        raise HarnessError(f"residual_batch.{name} has no stand-in")


def _final_norm(hidden_states: torch.Tensor, forward_batch: Any, layernorm: Any, capture: Any, kwargs: dict) -> Any:
    if kwargs.get("finalize_norm") is not None or kwargs.get("handoff_norm") is not None:
        raise HarnessError("the final norm took a producer handoff (finalize_norm/handoff_norm), which has no stand-in")
    residual = _stream(forward_batch).residual
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


class _AttnBoundary:
    """``layer.attn_boundary``: ``from_pp`` (a later stage takes the received pair), and
    ``snapshot``, which copies the stream like ``residual_batch.snapshot`` (0.5.21's longcat_flash)."""

    snapshot = staticmethod(ResidualBatch.snapshot)

    @staticmethod
    def from_pp(proxy: Any, forward_batch: Any, *, allow_missing_residual: bool = False) -> torch.Tensor:
        residual = proxy.get("residual") if allow_missing_residual else proxy["residual"]
        forward_batch.residual_stream = ResidualStream(residual=residual)
        return proxy["hidden_states"]


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
        self.attn_boundary = _AttnBoundary()

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
            keeper = _stream(call.pick(args, kwargs, call.batch))
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
