"""Edit 5 (all-reduce fusion): EAGLE-3 captures reduced layer states at TP > 1.

With FlashInfer all-reduce fusion on (``ServerArgs`` turns it on by itself
for DeepseekV3, Kimi-K2.5, GLM-4-MoE, Qwen3-MoE, gpt-oss ... on SM90/SM100
at TP > 1), a decoder layer returns its MLP output *before* the all-reduce
when ``LayerCommunicator.should_fuse_mlp_allreduce_with_next_layer`` says
so, and the next layer's input norm (``prepare_attn``) does the reduction.
A model whose ``forward`` captures ``hidden_states + residual`` at the top
of layer ``i`` then hands the draft a per-rank partial sum. SGLang turns the
fusion off for EAGLE only under DP attention.

The fix, found by structure, never by release: in
``srt/layers/communicator.py``, right after the release's own EAGLE guard
(``if ... <algo> is not None and <algo>.is_eagle(): return False``), a
marked guard with the same receiver returns False for EAGLE-3::

    # patchcraft: EAGLE-3 captures hidden_states + residual at the top of a layer: keep it reduced
    if <algo> is not None and <algo>.is_eagle3():
        return False

Needed only where some model file both defers its all-reduce through this
decision and captures ``hidden_states + residual`` in the function that
reads ``layers_to_capture``; releases whose models capture after the
reduction (``prepare_attn_and_capture_last_layer_outputs``) or that have no
such decision (0.5.21 on: ``layers/layer_boundary``) get ``not-needed``.

Cost: every EAGLE-3 target at TP > 1 runs without the fused
all-reduce + residual + RMSNorm kernel (a separate all-reduce instead), as
SGLang already does for EAGLE under DP attention. Every EAGLE-3 target
captures aux states, so the guard is exact for EAGLE-3; DFLASH (0.5.14 on)
is left as it is.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import libcst as cst

from patchcraft import MARKER
from patchcraft.errors import PatchcraftError
from patchcraft.graph import EditSite, FusionParams
from patchcraft.sources import read_source
from patchcraft.status import EditStatus
from patchcraft.transforms._base import AnchorError, Example, Outcome, edit_method, example_site, insert_at, is_marked, line_of, plain_code

NAME = "keep_captured_states_reduced"
KIND = "fusion"
#: The report row's model name.
ROW = "allreduce-fusion"
DESCRIPTION = (
    "In srt/layers/communicator.py, make LayerCommunicator.should_fuse_mlp_allreduce_with_next_layer "
    "return False for EAGLE-3, so that at TP > 1 a model capturing hidden_states + residual at the top "
    "of a layer captures the all-reduced state, not a per-rank partial sum (FlashInfer all-reduce fusion)."
)
#: Where the decision lives, relative to the package root.
COMMUNICATOR = Path("srt") / "layers" / "communicator.py"
CLASS = "LayerCommunicator"
METHOD = "should_fuse_mlp_allreduce_with_next_layer"
COMMENT = f"{MARKER} EAGLE-3 captures hidden_states + residual at the top of a layer: keep it reduced at TP > 1"
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
    #: Model files that defer their all-reduce and capture ``hidden_states + residual``.
    affected: tuple[Path, ...] = ()


# -- planning (ast) ------------------------------------------------------------

def communicator_path(package: Path) -> Path:
    return package / COMMUNICATOR


def _is_partial_capture(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and isinstance(node.left, ast.Name)
        and isinstance(node.right, ast.Name)
        and {node.left.id, node.right.id} == {"hidden_states", "residual"}
    )


def captures_partial_sums(text: str) -> bool:
    """A model file that defers its all-reduce and captures ``hidden_states + residual``
    in a function reading ``layers_to_capture`` (the state before the next layer's norm)."""
    if METHOD not in text or "layers_to_capture" not in text:
        return False
    try:
        module = ast.parse(text)
    except SyntaxError:
        return False
    defers = any(isinstance(n, ast.Attribute) and n.attr == METHOD for n in ast.walk(module))
    if not defers:
        return False
    for func in ast.walk(module):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = list(ast.walk(func))
        if any(isinstance(n, ast.Attribute) and n.attr == "layers_to_capture" for n in nodes) and any(map(_is_partial_capture, nodes)):
            return True
    return False


def affected_models(models_dir: Path) -> tuple[Path, ...]:
    found = []
    for path in sorted(models_dir.glob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if METHOD.encode() in data and b"layers_to_capture" in data and captures_partial_sums(read_source(path).text):
            found.append(path)
    return tuple(found)


def _decision(module: ast.Module) -> Optional[ast.FunctionDef]:
    for stmt in module.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == CLASS:
            for item in stmt.body:
                if isinstance(item, ast.FunctionDef) and item.name == METHOD:
                    return item
    return None


def _eagle_receiver(test: ast.expr, method: str = "is_eagle") -> Optional[ast.expr]:
    for node in ast.walk(test):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method and not node.args:
            return node.func.value
    return None


def _returns_false(body: list) -> bool:
    return len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Constant) and body[0].value.value is False


def plan(package: Path, models_dir: Optional[Path] = None) -> FusionPlan:
    """Decide, from the structure of the communicator and the model files, what is needed."""
    path = communicator_path(package)
    text = read_source(path).text
    try:
        module = ast.parse(text)
    except SyntaxError as exc:
        raise PatchcraftError(f"{path}: syntax error at line {exc.lineno}: {exc.msg}; nothing was changed") from None
    func = _decision(module)
    if func is None:
        return FusionPlan(not_needed=f"not needed: no {CLASS}.{METHOD} (no deferred all-reduce to turn off)", path=path)
    affected = affected_models(models_dir if models_dir is not None else package / "srt" / "models")
    if not affected:
        return FusionPlan(
            not_needed="not needed: no model that defers its all-reduce captures hidden_states + residual (captures follow the reduction)",
            path=path,
        )
    guards = [s for s in func.body if isinstance(s, ast.If) and _eagle_receiver(s.test) is not None and _returns_false(s.body)]
    if len(guards) != 1:
        return FusionPlan(unsupported=f"{path.name}: {CLASS}.{METHOD}: expected one `if ... .is_eagle(): return False` guard, found {len(guards)}", path=path, affected=affected)
    receiver = ast.unparse(_eagle_receiver(guards[0].test))  # type: ignore[arg-type]
    site = EditSite(kind=KIND, path=path, module=path.stem, cls=CLASS, method=METHOD, params=FusionParams(algo=receiver))
    return FusionPlan(site=site, path=path, affected=affected)


def has_enforce_flag(package: Path) -> bool:
    """Whether this release's ServerArgs has ``--enforce-disable-flashinfer-allreduce-fusion``."""
    for candidate in (package / "srt" / "server_args.py",):
        try:
            if b"enforce_disable_flashinfer_allreduce_fusion" in candidate.read_bytes():
                return True
        except OSError:
            pass
    return False


def defect(package: Path, model_files: tuple[Path, ...]) -> Optional[str]:
    """The partial-sum warning for a model whose files are ``model_files``, or None.

    None when the release has no communicator, the decision is patched (by
    us or by hand), or none of the model's files captures partial sums.
    """
    if not communicator_path(package).is_file():
        return None
    try:
        fusion = plan(package)
    except PatchcraftError:
        return None
    if fusion.site is None:
        return None
    wanted = {p.resolve() for p in model_files}
    hit = [p for p in fusion.affected if p.resolve() in wanted]
    if not hit:
        return None
    text = read_source(fusion.site.path).text
    module = cst.parse_module(text)
    try:
        _, outcome = apply(module, fusion.site)
    except PatchcraftError:
        return None
    if outcome.status in (EditStatus.PRESENT, EditStatus.HAND_APPLIED):
        return None
    fix = "run `patchcraft apply` (its allreduce-fusion edit turns the fusion off for EAGLE-3)"
    if has_enforce_flag(package):
        fix += f", or serve with {ENFORCE_FLAG}"
    else:
        fix += f" ({ENFORCE_FLAG} does not exist in this release)"
    names = ", ".join(p.name for p in hit)
    return (
        f"{PARTIAL_SUMS}: {names} captures hidden_states + residual before the next layer's norm reduces the MLP output, "
        f"and SGLang auto-enables FlashInfer all-reduce fusion at TP > 1 on SM90/SM100; {fix}"
    )


# -- applying (libcst) ---------------------------------------------------------

def canonical(module: cst.Module, site: EditSite) -> cst.BaseStatement:
    algo = site.params_as(FusionParams).algo
    code = f"{COMMENT}\nif {algo} is not None and {algo}.is_eagle3():\n    return False\n"
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
    if ours:
        same = plain_code(ours[0].with_changes(leading_lines=())) == plain_code(new.with_changes(leading_lines=()))  # type: ignore[call-arg]
        if same:
            return func, Outcome(EditStatus.PRESENT)
        return func, Outcome(EditStatus.MODIFIED, f"line {line_of(module, ours[0])}: the EAGLE-3 guard was changed by hand")
    if any(isinstance(s, cst.If) and _calls(s.test, "is_eagle3") and _returns_false_cst(s) for s in body):
        return func, Outcome(EditStatus.HAND_APPLIED)
    guards = [s for s in body if isinstance(s, cst.If) and _calls(s.test, "is_eagle") and _returns_false_cst(s)]
    if len(guards) != 1:
        raise AnchorError(site, f"one `if ... .is_eagle(): return False` guard, found {len(guards)}")
    return insert_at(func, guards[0], new, after=True), Outcome(EditStatus.APPLIED)


def apply(module: cst.Module, site: EditSite) -> tuple[cst.Module, Outcome]:
    """Insert the EAGLE-3 guard into the decision (idempotent; marked, so revert removes it)."""
    return edit_method(module, site, _edit)


# -- examples (unit tests and docs) ------------------------------------------------

_SITE = example_site(KIND, CLASS, METHOD, FusionParams(algo="self._speculative_algo"), path="communicator.py")

EXAMPLES = [
    Example(
        title="EAGLE-3 turns off the deferred all-reduce, so captured states are reduced",
        site=_SITE,
        before='''\
class LayerCommunicator:
    def should_fuse_mlp_allreduce_with_next_layer(
        self, forward_batch: ForwardBatch
    ) -> bool:
        if (
            is_dp_attention_enabled()
            and self._speculative_algo is not None
            and self._speculative_algo.is_eagle()
        ):
            return False

        if get_attn_tp_context().input_scattered:
            return False
        return apply_flashinfer_allreduce_fusion(batch_size) and self._context.tp_size > 1
''',
        after='''\
class LayerCommunicator:
    def should_fuse_mlp_allreduce_with_next_layer(
        self, forward_batch: ForwardBatch
    ) -> bool:
        if (
            is_dp_attention_enabled()
            and self._speculative_algo is not None
            and self._speculative_algo.is_eagle()
        ):
            return False
        # patchcraft: EAGLE-3 captures hidden_states + residual at the top of a layer: keep it reduced at TP > 1
        if self._speculative_algo is not None and self._speculative_algo.is_eagle3():
            return False

        if get_attn_tp_context().input_scattered:
            return False
        return apply_flashinfer_allreduce_fusion(batch_size) and self._context.tp_size > 1
''',
    ),
    Example.unchanged(
        title="a guard for EAGLE-3 written by hand is recognised, not doubled",
        site=_SITE,
        text='''\
class LayerCommunicator:
    def should_fuse_mlp_allreduce_with_next_layer(self, forward_batch):
        if is_dp_attention_enabled() and self._speculative_algo.is_eagle():
            return False
        if self._speculative_algo.is_eagle3():
            return False
        return True
''',
    ),
]
