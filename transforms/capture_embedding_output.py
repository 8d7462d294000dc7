"""Edit 3: in the inner model's ``forward``, capture the embedding output before the layer loop."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import libcst.matchers as m

from patchcraft.graph import EditSite
from patchcraft.transforms._base import (
    FLAG,
    AnchorError,
    Example,
    Outcome,
    body_of,
    edit_method,
    find_statements,
    insert_at,
    is_marked,
    line_of,
    marked_statement,
    strip_marker_lines,
)

NAME = "capture_embedding_output"
KIND = "forward"
DESCRIPTION = (
    "Right after the aux collector is created and before the layer loop, append a copy of "
    "the embedding output when the flag is set, on the first pipeline stage only."
)
#: The embedding at the loop top; a copy, because fused add-norm kernels update
#: layer 0's residual (this same tensor) in place.
SEED_EXPRESSION = "hidden_states.clone() if residual is None else hidden_states + residual"
NO_RESIDUAL_EXPRESSION = "hidden_states.clone()"


def block(site: EditSite, collector: str, expression: str) -> str:
    gate = site.param("gate")
    test = f"self.{FLAG} and {gate}" if gate else f"self.{FLAG}"
    return (
        "# patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only\n"
        f"if {test}:\n"
        f"    {collector}.append(\n"
        f"        {expression}\n"
        "    )\n"
    )


def _collector_name(stmt: cst.BaseStatement) -> str | None:
    """``NAME = []`` (optionally annotated) -> NAME."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target, value = small.targets[0].target, small.value
    elif isinstance(small, cst.AnnAssign) and small.value is not None:
        target, value = small.target, small.value
    else:
        return None
    if isinstance(target, cst.Name) and isinstance(value, cst.List) and not value.elements:
        return target.value
    return None


def _is_layer_loop(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.For)


def _assigns_any(stmt: cst.BaseStatement, names: set) -> bool:
    for target in m.findall(stmt, m.AssignTarget() | m.AnnAssign() | m.AugAssign()):
        node = getattr(target, "target", None)
        for name in m.findall(node, m.Name()) if node is not None else ():
            if name.value in names:  # type: ignore[attr-defined]
                return True
    return False


def _has_local(func: cst.FunctionDef, name: str) -> bool:
    params = [p.name.value for p in func.params.params + func.params.kwonly_params]
    if name in params:
        return True
    return any(
        isinstance(getattr(t, "target", None), cst.Name) and t.target.value == name  # type: ignore[attr-defined]
        for t in m.findall(func, m.AssignTarget())
    ) or bool(m.findall(func, m.AssignTarget(target=m.Tuple(elements=[m.ZeroOrMore(), m.Element(m.Name(name)), m.ZeroOrMore()]))))


def _find_collector(func: cst.FunctionDef, site: EditSite):
    """The one collector statement whose name is appended to later in ``func``."""
    code = cst.Module(body=()).code_for_node(func)
    candidates = []
    for stmt in find_statements(func, lambda s: _collector_name(s) is not None):
        name = _collector_name(stmt)
        if f"{name}.append(" in code or f"={name}" in code.replace(" ", ""):
            candidates.append((stmt, name))
    names = {name for _, name in candidates}
    if not candidates:
        raise AnchorError(site, "an aux collector such as `aux_hidden_states = []` before the layer loop")
    if len(names) > 1 or len(candidates) > 1:
        raise AnchorError(site, f"one aux collector, found {len(candidates)} ({', '.join(sorted(names))}); ambiguous")
    return candidates[0]


def _block_containing(func: cst.FunctionDef, stmt: cst.CSTNode):
    for block in m.findall(func, m.IndentedBlock()):
        for index, child in enumerate(block.body):  # type: ignore[attr-defined]
            if child is stmt:
                return block, index
    return None, -1


def edit(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, Outcome]:
    marked = find_statements(func, is_marked)
    hand = find_statements(func, lambda s: isinstance(s, cst.If) and FLAG in cst.Module(body=()).code_for_node(s.test))
    anchor, collector = _find_collector(func, site)
    expression = SEED_EXPRESSION if _has_local(func, "residual") else NO_RESIDUAL_EXPRESSION
    canonical = marked_statement(module, block(site, collector, expression))
    if marked:
        if strip_marker_lines(module, marked[0]) == strip_marker_lines(module, canonical):
            return func, Outcome("present")
        return func, Outcome("modified", f"line {line_of(module, marked[0])}: the inserted capture block was changed by hand")
    if hand:
        return func, Outcome("hand-applied")
    block_node, index = _block_containing(func, anchor)
    assert block_node is not None
    statements = block_node.body  # type: ignore[attr-defined]
    loop_at = next((i for i in range(index + 1, len(statements)) if _is_layer_loop(statements[i])), None)
    if loop_at is None:
        raise AnchorError(site, f"the layer loop (`for ...`) after `{collector} = []` in the same block")
    insert_after = anchor
    for stmt in statements[index + 1 : loop_at]:
        if _assigns_any(stmt, {"hidden_states", "residual"}):
            insert_after = stmt  # the capture must see the final embedding
    return insert_at(func, insert_after, canonical, after=True), Outcome("applied")


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    return edit_method(module, site, edit)


_SITE = EditSite(
    kind=KIND,
    path=Path("example.py"),
    module="example",
    cls="DeepseekV2Model",
    method="forward",
    params=(("gate", "self.pp_group.is_first_rank"),),
)

EXAMPLES = [
    Example(
        title="list collector with `hidden_states + residual` at the loop top",
        site=_SITE,
        before='''\
class DeepseekV2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        if self.pp_group.is_first_rank:
            hidden_states = self.embed_tokens(input_ids)
            residual = None
        aux_hidden_states = []
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
        return hidden_states, aux_hidden_states
''',
        after='''\
class DeepseekV2Model(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        if self.pp_group.is_first_rank:
            hidden_states = self.embed_tokens(input_ids)
            residual = None
        aux_hidden_states = []
        # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
        if self.capture_embedding_for_eagle3 and self.pp_group.is_first_rank:
            aux_hidden_states.append(
                hidden_states.clone() if residual is None else hidden_states + residual
            )
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
        return hidden_states, aux_hidden_states
''',
    ),
    Example(
        title="collector created before the embedding: the capture goes after it",
        site=EditSite(kind=KIND, path=Path("example.py"), module="example", cls="LlamaModel", method="forward"),
        before='''\
class LlamaModel(nn.Module):
    def forward(self, input_ids):
        aux_hidden_states = []
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual if residual is not None else hidden_states)
            hidden_states, residual = self.layers[i](hidden_states, residual)
        return hidden_states, aux_hidden_states
''',
        after='''\
class LlamaModel(nn.Module):
    def forward(self, input_ids):
        aux_hidden_states = []
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        # patchcraft: layer id -1 captures the embedding output (hs[0]), first pipeline stage only
        if self.capture_embedding_for_eagle3:
            aux_hidden_states.append(
                hidden_states.clone() if residual is None else hidden_states + residual
            )
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual if residual is not None else hidden_states)
            hidden_states, residual = self.layers[i](hidden_states, residual)
        return hidden_states, aux_hidden_states
''',
    ),
]
