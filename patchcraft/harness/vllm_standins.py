"""vLLM's stand-ins: what a vLLM model's setter and forward touch besides their own code.

The shared stand-ins (:mod:`patchcraft.harness.standins`: the embedding, the
decoder layers with their in-place residual add, the final norm that adds
in place, the parallel groups, :class:`~patchcraft.harness.standins.Nothing`)
serve vLLM as they serve SGLang: vLLM's layer call is SGLang's
``hidden_states, residual = layer(positions, hidden_states, residual)``,
and its ``fused_add_rms_norm`` adds into ``residual`` in place as SGLang's
kernels do (on 0.18 with custom ops on, and on every path from 0.33's
``ir.ops.fused_add_rms_norm.maybe_inplace``), so layer 0 taking the
embedding as its residual overwrites an embedding capture that is no copy.

What differs is here: vLLM's helper names (``get_pp_group``,
``model_parallel_is_initialized``, ``tensor_model_parallel_all_gather``,
``IntermediateTensors``), and the imports vLLM makes *inside* methods
(0.34's ``EagleModelMixin._cache_aux_pp_layout`` imports
``vllm.distributed.parallel_state`` when the setter runs): a method's
``__import__`` hands any ``vllm.*`` module back as :class:`VllmModule`,
whose names are these helpers or ``Nothing``. Nothing of vLLM is ever
imported.
"""

from __future__ import annotations

import builtins
from typing import Any, Callable

from patchcraft.harness import hyper_connections
from patchcraft.harness.standins import Nothing, active_world

PACKAGE = "vllm"


def _identity(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor


class IntermediateTensors(dict):  # type: ignore[type-arg]
    """What a pipeline stage hands the next: a dict of tensors (vLLM's is a dataclass over one)."""

    def __init__(self, tensors: Any = None, **kwargs: Any) -> None:
        super().__init__(tensors or {})


#: vLLM helpers whose answer matters to the code under test (one rank, or the world's pipeline stage).
HELPERS: dict[str, Callable[[], Any]] = {
    "get_pp_group": lambda: lambda *a, **k: active_world().pp,
    "get_tp_group": lambda: lambda *a, **k: active_world().tp,
    "get_tensor_model_parallel_world_size": lambda: lambda *a, **k: 1,
    "get_tensor_model_parallel_rank": lambda: lambda *a, **k: 0,
    "model_parallel_is_initialized": lambda: lambda *a, **k: True,
    "tensor_model_parallel_all_gather": lambda: _identity,
    "tensor_model_parallel_all_reduce": lambda: _identity,
    "IntermediateTensors": lambda: IntermediateTensors,
    # vllm/models/common/ops (0.27+): at TP 1 the release's own first branch, ``return norm(hidden_states,
    # residual)`` (0.33.0 fused_allreduce_rms_norm.py:37-38); the harness runs one rank.
    "fused_allreduce_rms_norm": lambda: lambda hidden_states, residual, norm: norm(hidden_states, residual),
    # DeepSeek-V4's mHC kernels called by name (nvidia/model.py): the stand-in streams' own post-mix and head.
    **hyper_connections.HELPERS,
}


class VllmModule:
    """A ``vllm.*`` module imported inside a method: its helpers from :data:`HELPERS`, the rest ``Nothing``."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in HELPERS:
            return HELPERS[name]()
        return Nothing(f"{self.__name__}.{name}")


def _import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
    if level == 0 and (name == PACKAGE or name.startswith(f"{PACKAGE}.")):
        return VllmModule(name if fromlist else PACKAGE)
    if level > 0:  # a relative import inside a vLLM method: a vLLM module too
        return VllmModule(f"{PACKAGE}.<relative>.{name}")
    return builtins.__import__(name, globals, locals, fromlist, level)


def method_builtins() -> dict[str, Any]:
    """The builtins a vLLM method runs with: the real ones, and an ``__import__`` that never loads vLLM."""
    found = dict(vars(builtins))
    found["__import__"] = _import
    return found
