"""Edit 2: make layer id -1 in ``set_eagle3_layers_to_capture`` mean the embedding output."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from patchcraft.graph import EditSite
from patchcraft.transforms._base import (
    FLAG,
    AnchorError,
    Example,
    Outcome,
    assign_targets,
    body_of,
    edit_method,
    find_statements,
    insert_at,
    is_marked,
    line_of,
    marked_statement,
    strip_marker_lines,
)

NAME = "accept_embedding_layer_id"
KIND = "setter"
DESCRIPTION = (
    "At the top of set_eagle3_layers_to_capture, turn layer id -1 into "
    "`capture_embedding_for_eagle3 = True` and drop it before the release's own id "
    "conversion runs (+1 rule or heuristics); -1 with several pipeline stages raises."
)


def block(site: EditSite) -> str:
    """The code inserted at ``site`` (parameterised by the setter's names)."""
    target = site.param("target") or "self.model"
    param = site.param("param") or "layer_ids"
    pp = site.param("pp")
    guard = ""
    if pp:
        guard = (
            f"    if {pp}.world_size > 1:\n"
            "        raise ValueError(\n"
            '            "EAGLE-3 layer id -1 (embedding output) needs a single pipeline stage: "\n'
            '            "the embedding exists only on the first stage"\n'
            "        )\n"
        )
    return (
        "# patchcraft: layer id -1 = embedding output (hs[0]); drop it before the ids are converted\n"
        f"if {param} is not None and -1 in {param}:\n"
        f"    if not hasattr({target}, \"{FLAG}\"):\n"
        "        raise ValueError(\n"
        f"            f\"EAGLE-3 layer id -1 is not supported by {{type({target}).__name__}}: \"\n"
        '            "its forward does not capture the embedding (run `patchcraft apply`)"\n'
        "        )\n"
        f"{guard}"
        f"    {target}.{FLAG} = True\n"
        f"    {param} = [val for val in {param} if val >= 0]\n"
        "else:\n"
        f"    {target}.{FLAG} = False\n"
    )


def _sets_flag(stmt: cst.BaseStatement) -> bool:
    return any(isinstance(t, cst.Attribute) and t.attr.value == FLAG for t in assign_targets(stmt))


def _filters_ids(func: cst.FunctionDef) -> bool:
    """A hand edit must also drop -1 from the ids (a comprehension with an ``if``)."""
    finder = _FilteredComprehension()
    func.visit(finder)
    return finder.found


class _FilteredComprehension(cst.CSTVisitor):
    """Finds a ``for`` clause with an ``if`` (plain visitor: ``libcst.matchers`` costs ~0.17 s to import)."""

    found = False

    def visit_CompFor(self, node: cst.CompFor) -> bool:
        self.found = self.found or bool(node.ifs)
        return not self.found


def _insertion_index(func: cst.FunctionDef) -> int:
    body = body_of(func)
    first = body[0] if body else None
    if (
        isinstance(first, cst.SimpleStatementLine)
        and len(first.body) == 1
        and isinstance(first.body[0], cst.Expr)
        and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    ):
        return 1  # keep the docstring first
    return 0


def edit(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, Outcome]:
    canonical = marked_statement(module, block(site))
    marked = [s for s in body_of(func) if is_marked(s)]
    if marked:
        stmt = marked[0]
        if strip_marker_lines(module, stmt) == strip_marker_lines(module, canonical):
            return func, Outcome("present")
        return func, Outcome("modified", f"line {line_of(module, stmt)}: the inserted -1 block was changed by hand")
    flagged = find_statements(func, _sets_flag)
    if flagged:
        if _filters_ids(func):
            return func, Outcome("hand-applied", "no pipeline-parallel guard in the hand-applied form")
        return func, Outcome(
            "modified",
            f"line {line_of(module, flagged[0])}: sets {FLAG} but never drops -1 from the ids",
        )
    body = body_of(func)
    if not body:
        raise AnchorError(site, "an indented setter body")
    index = _insertion_index(func)
    if index < len(body):
        return insert_at(func, body[index], canonical, after=False), Outcome("applied")
    return insert_at(func, body[index - 1], canonical, after=True), Outcome("applied")


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    return edit_method(module, site, edit)


_SITE = EditSite(
    kind=KIND,
    path=Path("example.py"),
    module="example",
    cls="DeepseekV2ForCausalLM",
    method="set_eagle3_layers_to_capture",
    params=(("target", "self.model"), ("param", "layer_ids"), ("pp", "self.pp_group")),
)

EXAMPLES = [
    Example(
        title="plain +1 setter with a pipeline-parallel guard",
        site=_SITE,
        before='''\
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
''',
        after='''\
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
''',
    ),
    Example(
        title="first-id heuristic: -1 leaves before `layer_ids[0] == 1` is tested",
        site=_SITE,
        before='''\
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
''',
        after='''\
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
''',
    ),
    Example(
        title="inner helper, pipeline group from a function: the guard uses the setter's own group",
        site=EditSite(
            kind=KIND,
            path=Path("example.py"),
            module="example",
            cls="Qwen3NextForCausalLM",
            method="set_eagle3_layers_to_capture",
            params=(("target", "self.model"), ("param", "layer_ids"), ("pp", "get_pp_group()")),
        ),
        before='''\
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
''',
        after='''\
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
''',
    ),
    Example(
        title="no pipeline parallelism in the model: no stage check",
        site=EditSite(
            kind=KIND,
            path=Path("example.py"),
            module="example",
            cls="Gemma3ForCausalLM",
            method="set_eagle3_layers_to_capture",
            params=(("target", "self.model"), ("param", "layer_ids"), ("pp", "")),
        ),
        before='''\
class Gemma3ForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):
        if layer_ids is None:
            self.capture_aux_hidden_states = True
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.capture_aux_hidden_states = True
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
''',
        after='''\
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
''',
    ),
    Example.unchanged(
        title="the sed fix from the field is recognised as hand-applied",
        site=_SITE,
        text='''\
class DeepseekV2ForCausalLM(nn.Module):
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if layer_ids is None:
            self.model.layers_to_capture = [2, 30, 58]
        else:
            self.model.capture_embedding_for_eagle3 = (-1 in layer_ids)
            self.model.layers_to_capture = [val + 1 for val in layer_ids if val >= 0]
''',
    ),
]
