"""Edit 5 (all-reduce fusion): at TP > 1, keep reduced the layer outputs that an EAGLE-3 capture reads.

With FlashInfer all-reduce fusion on (``ServerArgs`` turns it on by itself
for DeepseekV3, Kimi-K2.5, GLM-4-MoE, Qwen3-MoE, gpt-oss ... on SM90/SM100
at TP > 1), a decoder layer returns its MLP output *before* the all-reduce
when ``LayerCommunicator.should_fuse_mlp_allreduce_with_next_layer`` says
so, and the next layer's input norm (``prepare_attn``) does the reduction.
A model whose ``forward`` captures ``hidden_states + residual`` at the top
of layer ``i`` then hands the draft a per-rank partial sum. SGLang turns the
fusion off for EAGLE only under DP attention.

Which models do that is found through the class graph
(:mod:`patchcraft.reading.fusion_reading`): inherited decoder layers, helpers the
forward calls, capture loops in another file. Only those models are
touched: their setter marks the communicator of each layer whose output a
capture reads (``mark_captured_outputs``), and in
``srt/layers/communicator.py``, right after the release's own EAGLE guard
(``if ... <algo> is not None and <algo>.is_eagle(): return False``), a
marked guard with the same receiver keeps exactly those layers unfused::

    # patchcraft: all-reduce fusion: EAGLE-3 captures this layer's output before the next norm reduces it: keep it reduced
    if <algo> is not None and <algo>.is_eagle3() and getattr(self, "patchcraft_output_captured", False):
        return False

Cost: at TP > 1 with EAGLE-3, the marked layers (three by default) of the
affected models run a separate all-reduce instead of the fused
all-reduce + residual + RMSNorm kernel. Every other layer of those models,
every model whose capture reads the reduced state (DeepSeek/Kimi from
0.5.14, Qwen3-MoE from 0.5.6, MiniMax-M2), EAGLE, MTP and DFLASH keep the
release's own decision. ``not-needed`` where no EAGLE-3 capture reads a
deferred sum (0.5.21 on, where no decoder layer defers its all-reduce).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import libcst as cst

from patchcraft.reading.parsed import parse_python
from patchcraft import MARKER
from patchcraft.base.errors import PatchcraftError
from patchcraft.reading import fusion_reading
from patchcraft.reading.fusion_reading import MARK, FusionCapture, Override
from patchcraft.reading.class_graph import ClassNode, ModelGraph, words_of
from patchcraft.planning.records import EditSite, FusionParams
from patchcraft.base.sources import read_source
from patchcraft.base.status import EditKind, EditStatus
from patchcraft.transforms._base import (
    AnchorError,
    Outcome,
    edit_method,
    insert_at,
    is_marked,
    line_of,
    plain_code,
    replace_statement,
)

NAME = "keep_captured_states_reduced"
KIND = EditKind.FUSION
#: The report row's model name.
ROW = "allreduce-fusion"
DESCRIPTION = (
    "In srt/layers/communicator.py, make LayerCommunicator.should_fuse_mlp_allreduce_with_next_layer "
    "return False for EAGLE-3 on the layers the setter marked (mark_captured_outputs), so that at TP > 1 a "
    "capture of hidden_states + residual at the top of a layer reads the all-reduced state, not a per-rank "
    "partial sum (FlashInfer all-reduce fusion); every other layer and model keeps the release's decision."
)
#: Where the decision lives, relative to the package root.
COMMUNICATOR = Path("srt") / "layers" / "communicator.py"
CLASS = "LayerCommunicator"
METHOD = "should_fuse_mlp_allreduce_with_next_layer"
COMMENT = (
    f"{MARKER} all-reduce fusion: EAGLE-3 captures this layer's output before the next norm reduces it: keep it reduced"
)
#: The guard an earlier patchcraft wrote (every layer of every EAGLE-3 target): replaced by the marked-layer guard.
OLD_COMMENT = f"{MARKER} EAGLE-3 captures hidden_states + residual at the top of a layer: keep it reduced at TP > 1"
#: The user-facing line of explain and check-draft.
PARTIAL_SUMS = "layer states are per-rank partial sums at TP > 1 (all-reduce fusion)"
ENFORCE_FLAG = "--enforce-disable-flashinfer-allreduce-fusion"


@dataclass(frozen=True)
class FusionPlan:
    """What the decision needs: one edit site, or why it needs none (or cannot be helped)."""

    site: Optional[EditSite] = None
    not_needed: Optional[str] = None
    unsupported: Optional[str] = None
    path: Optional[Path] = None
    #: The EAGLE-3 models whose capture reads a deferred all-reduce sum.
    affected: tuple[FusionCapture, ...] = ()
    #: Subclasses whose decision returns before the guard runs, each with why that is (or is not) harmless.
    overrides: tuple[str, ...] = ()


# -- planning (ast) ------------------------------------------------------------


def communicator_path(package: Path) -> Path:
    return package / COMMUNICATOR


def affected_models(package: Path, models_dir: Optional[Path] = None) -> tuple[FusionCapture, ...]:
    """The EAGLE-3 models whose capture reads a deferred all-reduce sum (:mod:`patchcraft.reading.fusion_reading`)."""
    from patchcraft.planning.model_plans import scan

    graph = scan(models_dir if models_dir is not None else package / "srt" / "models")
    return tuple(fusion_reading.affected(graph))


def _decision(module: ast.Module) -> Optional[ast.FunctionDef]:
    for stmt in module.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == CLASS:
            for item in stmt.body:
                if isinstance(item, ast.FunctionDef) and item.name == METHOD:
                    return item
    return None


def _eagle_receiver(test: ast.expr, method: str = "is_eagle") -> Optional[ast.expr]:
    for node in ast.walk(test):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == method
            and not node.args
        ):
            return node.func.value
    return None


def _returns_false(body: list) -> bool:
    return (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Constant)
        and body[0].value.value is False
    )


def plan(package: Path, models_dir: Optional[Path] = None) -> FusionPlan:
    """Decide, from the structure of the communicator and the model files, what is needed."""
    path = communicator_path(package)
    text = read_source(path).text
    try:
        module = parse_python(text)
    except SyntaxError as exc:
        raise PatchcraftError(f"{path}: syntax error at line {exc.lineno}: {exc.msg}; nothing was changed") from None
    func = _decision(module)
    if func is None:
        return FusionPlan(not_needed=f"not needed: no {CLASS}.{METHOD} (no deferred all-reduce to turn off)", path=path)
    models = models_dir if models_dir is not None else package / "srt" / "models"
    affected = affected_models(package, models)
    overrides = tuple(
        _judge_override(o, affected, package) for o in fusion_reading.overrides(package / "srt" / "layers", models)
    )
    if not affected:
        return FusionPlan(not_needed=NOT_NEEDED, path=path, overrides=overrides)
    bypassed = [o for o in overrides if o.startswith(BYPASSED)]
    if bypassed:
        return FusionPlan(unsupported=bypassed[0], path=path, affected=affected, overrides=overrides)
    guards = [
        s for s in func.body if isinstance(s, ast.If) and _eagle_receiver(s.test) is not None and _returns_false(s.body)
    ]
    if len(guards) != 1:
        return FusionPlan(
            unsupported=f"{path.name}: {CLASS}.{METHOD}: expected one `if ... .is_eagle(): return False` guard, found {len(guards)}",
            path=path,
            affected=affected,
        )
    receiver = ast.unparse(_eagle_receiver(guards[0].test))  # type: ignore[arg-type]
    site = EditSite(
        kind=KIND, path=path, module=path.stem, cls=CLASS, method=METHOD, params=FusionParams(algo=receiver)
    )
    return FusionPlan(site=site, path=path, affected=affected, overrides=overrides)


NOT_NEEDED = "not needed: no EAGLE-3 capture reads hidden_states + residual before a deferred all-reduce (captures read reduced states)"
#: How an override that skips the guard for an affected model starts.
BYPASSED = "bypasses the guard:"


def _judge_override(found: Override, affected: tuple[FusionCapture, ...], package: Path) -> str:
    """One line on a subclass's decision that returns before the (guarded) base decision runs."""
    where = f"{found.path.relative_to(package)}: {found.cls}.{METHOD} returns at line {found.line}, before the guard in {CLASS}"
    hit = sorted({c.model for c in affected if c.forward_path.stem in found.users or c.path.stem in found.users})
    if hit:
        return (
            f"{BYPASSED} {where}, and {', '.join(hit)} capture(s) a deferred sum through it; serve with {ENFORCE_FLAG}"
        )
    users = ", ".join(found.users) or "no model file"
    return f"{where}; harmless: its users ({users}) capture reduced states"


def has_enforce_flag(package: Path) -> bool:
    """Whether this release's ServerArgs has ``--enforce-disable-flashinfer-allreduce-fusion``."""
    # 0.5.20 moved the server arguments' fields into srt/arg_groups/.
    for candidate in (package / "srt" / "server_args.py", *sorted((package / "srt" / "arg_groups").rglob("*.py"))):
        try:
            if b"enforce_disable_flashinfer_allreduce_fusion" in candidate.read_bytes():
                return True
        except OSError:
            pass
    return False


def defect(package: Path, graph: ModelGraph, cls: ClassNode) -> Optional[str]:
    """The partial-sum warning for model class ``cls`` at TP > 1, or None.

    None when its capture reads the reduced state, the release has no
    decision, or both edits are in place: the guard in the communicator (or
    a hand-written EAGLE-3 guard) and the setter's layer marks.
    """
    capture = fusion_reading.read_capture(graph, cls)
    if capture is None or not capture.affected or not communicator_path(package).is_file():
        return None
    try:
        fusion = plan(package, graph.models_dir)
    except PatchcraftError:
        return None
    if fusion.site is None:
        return None
    text = read_source(fusion.site.path).text
    try:
        _, outcome = apply(cst.parse_module(text), fusion.site)
    except (PatchcraftError, cst.ParserSyntaxError):
        return None
    if outcome.status == EditStatus.HAND_APPLIED:
        return None
    if outcome.status == EditStatus.PRESENT and _setter_marks(graph, cls):
        return None
    fix = "run `patchcraft apply` (its allreduce-fusion edit keeps the captured layers' outputs reduced)"
    if has_enforce_flag(package):
        fix += f", or serve with {ENFORCE_FLAG}"
    else:
        fix += f" ({ENFORCE_FLAG} does not exist in this release)"
    return (
        f"{PARTIAL_SUMS}: {capture.evidence}, and SGLang auto-enables FlashInfer all-reduce fusion "
        f"at TP > 1 on SM90/SM100; {fix}"
    )


def _setter_marks(graph: ModelGraph, cls: ClassNode) -> bool:
    """Whether the setter that runs for ``cls`` (or the one it delegates to) marks its layers."""
    capture = fusion_reading.read_capture(graph, cls)
    if capture is None:
        return False
    owner = next(
        (c for c in graph.classes.values() if c.name == capture.setter_cls and c.path == capture.setter_path), None
    )
    setter = owner.methods.get(fusion_reading.SETTER) if owner is not None else None
    return setter is not None and MARK in words_of(setter)


# -- applying (libcst) ---------------------------------------------------------


def canonical(module: cst.Module, site: EditSite) -> cst.BaseStatement:
    algo = site.params_as(FusionParams).algo
    code = f'{COMMENT}\nif {algo} is not None and {algo}.is_eagle3() and getattr(self, "{MARK}", False):\n    return False\n'
    return cst.parse_statement(code, config=module.config_for_parsing)


def _calls(node: cst.CSTNode, attr: str) -> bool:
    return f".{attr}()" in plain_code(node)


def _returns_false_cst(stmt: cst.If) -> bool:
    body = stmt.body
    if not isinstance(body, cst.IndentedBlock) or len(body.body) != 1:
        return False
    line = body.body[0]
    return (
        isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and isinstance(line.body[0], cst.Return)
        and isinstance(line.body[0].value, cst.Name)
        and line.body[0].value.value == "False"
    )


def _edit(module: cst.Module, func: cst.FunctionDef, site: EditSite) -> tuple[cst.FunctionDef, Outcome]:
    body = list(func.body.body) if isinstance(func.body, cst.IndentedBlock) else []
    new = canonical(module, site)
    ours = [s for s in body if is_marked(s)]
    if ours and _is_old_guard(module, ours[0], site):
        # An earlier patchcraft's guard (every layer of every EAGLE-3 target): narrow it to the marked layers.
        return replace_statement(func, ours[0], new), Outcome(
            EditStatus.APPLIED, "replaced the all-layer EAGLE-3 guard"
        )
    if ours:
        same = plain_code(ours[0].with_changes(leading_lines=())) == plain_code(new.with_changes(leading_lines=()))  # type: ignore[call-arg]
        if same:
            return func, Outcome(EditStatus.PRESENT)
        return func, Outcome(
            EditStatus.MODIFIED, f"line {line_of(module, ours[0])}: the EAGLE-3 guard was changed by hand"
        )
    if any(isinstance(s, cst.If) and _calls(s.test, "is_eagle3") and _returns_false_cst(s) for s in body):
        return func, Outcome(EditStatus.HAND_APPLIED)
    guards = [s for s in body if isinstance(s, cst.If) and _calls(s.test, "is_eagle") and _returns_false_cst(s)]
    if len(guards) != 1:
        raise AnchorError(site, f"one `if ... .is_eagle(): return False` guard, found {len(guards)}")
    return insert_at(func, guards[0], new, after=True), Outcome(EditStatus.APPLIED)


def _is_old_guard(module: cst.Module, stmt: cst.BaseStatement, site: EditSite) -> bool:
    algo = site.params_as(FusionParams).algo
    old = cst.parse_statement(
        f"{OLD_COMMENT}\nif {algo} is not None and {algo}.is_eagle3():\n    return False\n",
        config=module.config_for_parsing,
    )
    return plain_code(stmt.with_changes(leading_lines=())) == plain_code(old.with_changes(leading_lines=())) and any(  # type: ignore[call-arg]
        line.comment is not None and line.comment.value == OLD_COMMENT
        for line in stmt.leading_lines  # type: ignore[attr-defined]
    )


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    """Insert the EAGLE-3 guard into the decision (idempotent; marked, so revert removes it)."""
    return edit_method(module, site, _edit)
