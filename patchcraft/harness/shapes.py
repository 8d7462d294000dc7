"""Read how a forward calls its decoder layers, so the stand-in layers answer in kind.

The calling convention is part of the forward shape: ``(hidden_states,
residual)`` in and out (L1, L2, L3, packer), the collector passed in as
a keyword (L3, packer, layer-boundary era), a residual kept on the forward
batch (``residual_batch``, layer-boundary era), or no residual at all
(Gemma 3 before 0.5.20). It is read from the layer call in the forward
itself; nothing here keys on a release or a file name.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Optional

from patchcraft.harness.extract import MethodCode

#: (position, keyword): where an argument sits in the layer call.
Slot = tuple[Optional[int], Optional[str]]


class ShapeError(Exception):
    """The forward has no layer call the harness can stand in for."""


@dataclass(frozen=True)
class LayerCall:
    """Where the layer call puts its arguments and what it unpacks from the result."""

    hidden: Slot
    residual: Optional[Slot]
    batch: Optional[Slot]
    residual_kind: str  # "pair" | "stream" | "none"
    outputs: Optional[tuple[str, ...]]  # None: the result is hidden_states itself
    captures: tuple[str, ...] = ()
    line: int = 0
    #: State the call threads besides the stream and the residual, each (name, slot): passed in and rebound from
    #: the result (DeepSeek-V4's hyper-connection ``post_mix, res_mix``; Kimi's attention-residual ``prefix_delta``).
    threaded: tuple[tuple[str, Slot], ...] = ()

    @staticmethod
    def pick(args: tuple, kwargs: dict, slot: Optional[Slot]) -> Any:
        if slot is None:
            return None
        position, keyword = slot
        if keyword is not None and keyword in kwargs:
            return kwargs[keyword]
        if position is not None and position < len(args):
            return args[position]
        return None


#: The attribute holding the decoder layers (a model may keep a slice of it under another name: ``stacks``).
LAYERS = frozenset(("layers",))


def _mentions_layers(node: ast.AST, stacks: frozenset[str] = LAYERS) -> bool:
    return any(
        isinstance(n, ast.Attribute) and n.attr in stacks and isinstance(n.value, ast.Name) and n.value.id == "self"
        for n in ast.walk(node)
    )


def _layer_names(func: ast.AST, stacks: frozenset[str] = LAYERS) -> set[str]:
    """Local names bound to a decoder layer: loop targets over ``self.layers`` (or over a local holding a slice of
    it: MiniMax-M3's ``layers = self.layers[self.start_layer : self.end_layer]``) or ``x = self.layers[i]``."""
    names: set[str] = set()
    sliced = {
        t.id
        for node in ast.walk(func)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Subscript)
        and isinstance(node.value.slice, ast.Slice)
        and _mentions_layers(node.value, stacks)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    for node in ast.walk(func):
        if isinstance(node, ast.For) and (
            _mentions_layers(node.iter, stacks)
            or any(isinstance(n, ast.Name) and n.id in sliced for n in ast.walk(node.iter))
        ):
            names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        elif (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Subscript)
            and _mentions_layers(node.value, stacks)
        ):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def layer_stacks(init: Optional[ast.AST]) -> frozenset[str]:
    """``layers`` and each ``self.X = self.layers[...]`` in ``init``: GLM-5-Next's ``self._active_layers =
    self.layers[self.start_layer : self.end_layer]``, which its forward loops over."""
    found = set(LAYERS)
    for node in ast.walk(init) if init is not None else ():
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript) and _mentions_layers(node.value):
            found |= {t.attr for t in node.targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)}
    return frozenset(found)


def _slot(call: ast.Call, name: str) -> Optional[Slot]:
    for position, arg in enumerate(call.args):
        if isinstance(arg, ast.Name) and arg.id == name:
            return (position, None)
    for keyword in call.keywords:
        if isinstance(keyword.value, ast.Name) and keyword.value.id == name:
            return (None, keyword.arg)
    return None


def _is_layer_call(node: ast.AST, layer_names: set[str], stacks: frozenset[str] = LAYERS) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in layer_names
    return isinstance(func, ast.Subscript) and _mentions_layers(func, stacks)


def _assigned(func: ast.AST, call: ast.Call) -> Optional[ast.expr]:
    """The one target of the assignment whose value is ``call`` (None if the call is not assigned)."""
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and node.value is call and len(node.targets) == 1:
            return node.targets[0]
    return None


def _names(target: Optional[ast.expr]) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [e.id for e in target.elts if isinstance(e, ast.Name)]
    return []


def stream_name(func: ast.AST, call: ast.Call) -> Optional[str]:
    """The hidden stream the layer call threads: ``hidden_states``, or by structure the first positional
    argument the call is passed and rebinds (GPT-OSS's ``x, residual = layer(x, positions, residual)``)."""
    if _slot(call, "hidden_states") is not None:
        return "hidden_states"
    rebound = set(_names(_assigned(func, call))) - {"residual"}
    return next((a.id for a in call.args if isinstance(a, ast.Name) and a.id in rebound), None)


def _outputs(func: ast.AST, call: ast.Call, residual: bool, hidden: str) -> Optional[tuple[str, ...]]:
    """The names the result is unpacked into, the stream spelled ``hidden_states`` (the stand-in's word)."""
    target = _assigned(func, call)
    if isinstance(target, (ast.Tuple, ast.List)):
        return tuple(
            ("hidden_states" if e.id == hidden else e.id) if isinstance(e, ast.Name) else "_" for e in target.elts
        )
    if isinstance(target, ast.Name) and target.id != hidden:
        # layer_outputs = layer(...); hidden_states = layer_outputs[0]
        return ("hidden_states", "residual") if residual else ("hidden_states",)
    return None


def layer_call(forward: MethodCode, stacks: frozenset[str] = LAYERS) -> LayerCall:
    """The first decoder-layer call in ``forward`` and its convention (``stacks``: the attributes holding the
    layers, :func:`layer_stacks`)."""
    func = forward.tree().body[0]
    names = _layer_names(func, stacks)
    layer_calls = [n for n in ast.walk(func) if isinstance(n, ast.Call) and _is_layer_call(n, names, stacks)]
    # a call passing hidden_states first; else one threading a stream of another name (GPT-OSS's ``x``)
    calls = [n for n in layer_calls if _slot(n, "hidden_states") is not None] or [
        n for n in layer_calls if stream_name(func, n) is not None
    ]
    if not calls:
        raise ShapeError(f"{forward.cls}.forward: no call of a decoder layer with hidden_states found")
    call = min(calls, key=lambda c: (c.lineno, c.col_offset))
    hidden = stream_name(func, call)
    assert hidden is not None
    residual = _slot(call, "residual")
    uses_stream = any(isinstance(n, ast.Name) and n.id == "residual_batch" for n in ast.walk(func))
    kind = "pair" if residual is not None else "stream" if uses_stream else "none"
    captures = tuple(k.arg for k in call.keywords if k.arg and "capture" in k.arg)
    rebound = [n for n in _names(_assigned(func, call)) if n not in (hidden, "residual")]
    threaded = tuple((n, slot) for n in rebound if (slot := _slot(call, n)) is not None)
    return LayerCall(
        hidden=_slot(call, hidden),  # type: ignore[arg-type]
        residual=residual,
        batch=_slot(call, "forward_batch"),
        residual_kind=kind,
        outputs=_outputs(func, call, residual is not None, hidden),
        captures=captures,
        line=call.lineno,
        threaded=threaded,
    )


def _self_calls(forward: MethodCode) -> list[tuple[str, ast.Call]]:
    return [
        (node.func.attr, node)
        for node in ast.walk(forward.tree())
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    ]


def embedding_attributes(forward: MethodCode) -> set[str]:
    """``self.<name>(input_ids)``: the attributes the forward embeds tokens with."""
    return {
        name
        for name, call in _self_calls(forward)
        if call.args and isinstance(call.args[0], ast.Name) and call.args[0].id == "input_ids"
    }


def norm_attributes(forward: MethodCode) -> set[str]:
    """``self.<...norm...>(hidden_states, ...)``: the final norm, whatever its name."""
    return {
        name
        for name, call in _self_calls(forward)
        if "norm" in name and call.args and isinstance(call.args[0], ast.Name) and call.args[0].id == "hidden_states"
    }


def has_pipeline(forward: MethodCode) -> bool:
    """Whether the forward has a later-pipeline-stage path at all."""
    text = forward.text
    return "pp_proxy_tensors" in text or "is_first_rank" in text or "from_pp" in text
