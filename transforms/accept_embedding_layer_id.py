"""Edit 2: make layer id -1 in ``set_eagle3_layers_to_capture`` mean the embedding output."""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from patchcraft.reading.class_graph import SETTER
from patchcraft.planning.records import EditSite, SetterParams
from patchcraft.base.status import EditKind, EditStatus
from patchcraft.transforms._base import (
    FLAG,
    AnchorError,
    Outcome,
    assign_targets,
    body_of,
    code_of,
    edit_method,
    find_statements,
    insert_at,
    is_marked,
    iter_nodes,
    line_of,
    marked_statement,
    strip_marker_lines,
    walk_statements,
)

NAME = "accept_embedding_layer_id"
KIND = EditKind.SETTER
DESCRIPTION = (
    "At the top of set_eagle3_layers_to_capture, turn layer id -1 into "
    "`capture_embedding_for_eagle3 = True` and drop it before the release's own id "
    "conversion runs (+1 rule or heuristics); -1 with several pipeline stages raises."
)


def block(site: EditSite) -> str:
    """The code inserted at ``site`` (parameterised by the setter's names)."""
    params = site.params_as(SetterParams)
    target, param, pp = params.target, params.param, params.pp
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
        f'    if not hasattr({target}, "{FLAG}"):\n'
        "        raise ValueError(\n"
        f'            f"EAGLE-3 layer id -1 is not supported by {{type({target}).__name__}}: "\n'
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


def _plus_one(node: cst.CSTNode) -> bool:
    """A ``[val + 1 for val in ids]``-style comprehension somewhere under ``node``."""
    return any(
        isinstance(n, (cst.ListComp, cst.GeneratorExp))
        and isinstance(n.elt, cst.BinaryOperation)
        and isinstance(n.elt.operator, cst.Add)
        and any(isinstance(side, cst.Integer) and side.value == "1" for side in (n.elt.left, n.elt.right))
        for n in iter_nodes(node)
    )


def _sets_ids(stmt: cst.CSTNode) -> bool:
    """``<x>.layers_to_capture = ...`` (a simple statement line of assignments only)."""
    targets = assign_targets(stmt)  # type: ignore[arg-type]
    return bool(targets) and all(isinstance(t, cst.Attribute) and t.attr.value == "layers_to_capture" for t in targets)


def _branches(stmt: cst.If) -> Optional[tuple[Sequence[cst.BaseStatement], Sequence[cst.BaseStatement]]]:
    if not isinstance(stmt.body, cst.IndentedBlock) or not isinstance(stmt.orelse, cst.Else):
        return None
    if not isinstance(stmt.orelse.body, cst.IndentedBlock):
        return None
    return stmt.body.body, stmt.orelse.body.body


def heuristics(func: cst.FunctionDef, param: str) -> list[tuple[cst.If, Sequence[cst.BaseStatement]]]:
    """The release's convention tests: an ``if``/``else`` whose one branch converts the ids with +1
    and whose other keeps them raw (0.5.13+ DeepseekV2: ``layer_ids[0] == 1``; 0.5.20+ gpt-oss:
    ``max(layer_ids) == num_layers``). Each with its +1 branch."""
    found = []
    for stmt in find_statements(func, lambda s: isinstance(s, cst.If) and not is_marked(s)):
        branches = _branches(stmt)
        if branches is None:
            continue
        converting = [any(_converts(s, param) for s in branch) for branch in branches]
        plus = [any(_plus_one(s) for s in branch) for branch in branches]
        if all(converting) and plus.count(True) == 1:
            found.append((stmt, branches[plus.index(True)]))
    return found


def plus_one_block(
    module: cst.Module, site: EditSite, test: cst.If, branch: Sequence[cst.BaseStatement]
) -> cst.BaseStatement:
    """After a convention test: with -1 given, the ids are layer outputs (+1), whatever it chose.

    Id -1 exists only in the +1 convention (-1 + 1 = 0, the embedding), so a
    config holding it means +1 for every other id too: ``[-1, 2, 30]`` must
    serve hs[0], hs[3], hs[31] on every release. Without -1 the flag is
    False and the release's own choice stands, byte for byte.
    """
    if not all(_plain_assignment(s) for s in branch):
        raise AnchorError(
            site,
            f"a +1 branch of the id-convention test at line {line_of(module, test)} that only assigns (it is run again for -1)",
        )
    target = site.params_as(SetterParams).target
    body = "".join("    " + code_of(module, s.with_changes(leading_lines=())).strip() + "\n" for s in branch)  # type: ignore[attr-defined]
    return marked_statement(
        module,
        "# patchcraft: with layer id -1 the other ids are layer outputs (+1), whatever the test above chose\n"
        f"if {target}.{FLAG}:\n{body}",
    )


#: Calls a re-run +1 branch may make: they have no side effects.
_PURE_CALLS = frozenset({"list", "len", "max", "min", "sorted", "range", "int", "tuple"})


def _plain_assignment(stmt: cst.BaseStatement) -> bool:
    """Assignments only, calling nothing but pure builtins: running it twice equals running it once."""
    if not isinstance(stmt, cst.SimpleStatementLine) or not all(
        isinstance(s, (cst.Assign, cst.AnnAssign)) for s in stmt.body
    ):
        return False
    return all(
        isinstance(n.func, cst.Name) and n.func.value in _PURE_CALLS
        for n in iter_nodes(stmt)
        if isinstance(n, cst.Call)
    )


def _filters_ids(node: cst.CSTNode) -> bool:
    """A comprehension with an ``if`` (drops -1 from the ids)."""
    return any(isinstance(n, cst.CompFor) and bool(n.ifs) for n in iter_nodes(node))


def _converts(stmt: cst.BaseStatement, param: str) -> bool:
    """A statement that turns the ids into layers to capture (assignment or inner setter call)."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    names = {n.value for n in iter_nodes(stmt) if isinstance(n, cst.Name)}
    calls = any(isinstance(n, cst.Attribute) and n.attr.value == SETTER for n in iter_nodes(stmt))
    return param in names and (_sets_ids(stmt) or calls)


def judge_hand_fix(
    module: cst.Module, func: cst.FunctionDef, site: EditSite, flagged: Sequence[cst.BaseStatement]
) -> Optional[str]:
    """Why a hand-made -1 in the setter does not do what patchcraft's block does, or None.

    -1 must set the flag before the ids are converted, every conversion must
    drop -1 (in its own comprehension or from the ids before it), and a
    release that picks the id convention by a test must not keep the other
    ids raw when -1 is given.
    """
    param = site.params_as(SetterParams).param
    order = [s for s, _ in walk_statements(func)]
    first_flag = min(order.index(s) for s in flagged)
    cleaned_before = [i for i, s in enumerate(order) if _reassigns_filtered(s, param)]
    for index, stmt in enumerate(order):
        if not _converts(stmt, param):
            continue
        if index < first_flag:
            return f"line {line_of(module, stmt)}: the ids are converted before -1 sets {FLAG} (line {line_of(module, flagged[0])})"
        if not _filters_ids(stmt) and not any(i < index for i in cleaned_before):
            return (
                f"line {line_of(module, flagged[0])}: sets {FLAG} but never drops -1 from the ids converted "
                f"at line {line_of(module, stmt)} (-1 would become layer 0, not the embedding)"
            )
    for test, _ in heuristics(func, param):
        if FLAG not in {n.value for n in iter_nodes(test.test) if isinstance(n, cst.Name)}:
            return (
                f"line {line_of(module, test)}: with -1 given, this test still keeps the other ids raw "
                "(serves hs[a], not hs[a+1]); let `patchcraft apply` write the setter block instead"
            )
    return None


def _reassigns_filtered(stmt: cst.BaseStatement, param: str) -> bool:
    targets = assign_targets(stmt)
    return any(isinstance(t, cst.Name) and t.value == param for t in targets) and _filters_ids(stmt)


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
    # The fusion edit's layer-marking loop (mark_captured_outputs) also sits in the setter: not this block.
    marked = [s for s in body_of(func) if is_marked(s) and not _is_fusion_mark(s)]
    if marked:
        stmt = marked[0]
        if strip_marker_lines(module, stmt) != strip_marker_lines(module, canonical):
            return func, Outcome(
                EditStatus.MODIFIED, f"line {line_of(module, stmt)}: the inserted -1 block was changed by hand"
            )
        func, added = _follow_heuristics(module, func, site)
        return func, Outcome(EditStatus.APPLIED if added else EditStatus.PRESENT)
    flagged = find_statements(func, _sets_flag)
    if flagged:
        problem = judge_hand_fix(module, func, site, flagged)
        if problem:
            return func, Outcome(EditStatus.MODIFIED, problem)
        return func, Outcome(EditStatus.HAND_APPLIED, "no pipeline-parallel guard in the hand-applied form")
    body = body_of(func)
    if not body:
        raise AnchorError(site, "an indented setter body")
    index = _insertion_index(func)
    if index < len(body):
        func = insert_at(func, body[index], canonical, after=False)
    else:
        func = insert_at(func, body[index - 1], canonical, after=True)
    func, _ = _follow_heuristics(module, func, site)
    return func, Outcome(EditStatus.APPLIED)


def _follow_heuristics(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, bool]:
    """Put :func:`plus_one_block` after each convention test that lacks one (True if any was added)."""
    added = False
    for test, branch in heuristics(func, site.params_as(SetterParams).param):
        wanted = plus_one_block(module, site, test, branch)
        following = _next_statement(func, test)
        if following is not None and is_marked(following):
            if strip_marker_lines(module, following) != strip_marker_lines(module, wanted):
                raise AnchorError(
                    site,
                    f"patchcraft's +1 block after line {line_of(module, test)} as patchcraft wrote it (it was changed by hand)",
                )
            continue
        func = insert_at(func, test, wanted, after=True)
        added = True
    return func, added


def _next_statement(func: cst.FunctionDef, stmt: cst.BaseStatement) -> Optional[cst.BaseStatement]:
    for node, chain in walk_statements(func):
        if node is stmt:
            block_node, index = chain[-1]
            body = block_node.body
            return body[index + 1] if index + 1 < len(body) else None
    return None


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    return edit_method(module, site, edit)


def _is_fusion_mark(stmt: cst.CSTNode) -> bool:
    from patchcraft.transforms.mark_captured_outputs import is_mark

    return is_mark(stmt)
