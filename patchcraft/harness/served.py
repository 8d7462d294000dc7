"""The hidden states a draft is really fed: run the model's own setter and forward.

``explain`` and ``check-draft`` read the served states from the code by
static rules (:mod:`patchcraft.analysis.explain`); this module runs that code
instead, on the CPU harness's stand-ins (docs/harness.md), with the
target's layer count and the draft's ids. What it runs is exactly what the
server would import: the files on disk (the install as it is, patched or
not, or an overlay's tree), or the texts ``patchcraft apply`` would write.

Each aux state that reaches the collector is named by its Hugging Face
index (``hs[k]``), with whether it is a copy: an entry that shares storage
with the embedding output is the embedding when captured, and layer 0's
in-place residual add then overwrites it. A crash (in the setter or the
forward) is reported with the exception and the file's line, but only when
it is SGLang's: the failing line is the release's own code acting on values
the release itself produces. A failure raised in a stand-in, or on a line
that acts on a stand-in's answer (a helper the stand-ins do not model,
which answers :class:`~patchcraft.harness.standins.Nothing`), says nothing
about SGLang: the model "cannot be run here" and the static reading answers
(:func:`standin_cause`, decided from the traceback's frames).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import ast
import types

import torch

from patchcraft.base.memo import Memo, stamp
from patchcraft.reading.class_graph import ModelGraph
from patchcraft.planning.records import ModelPlan
from patchcraft.harness.outcomes import CANNOT_RUN, NOT_RUN, Fed, RunOutcome, fed_text
from patchcraft.harness.assemble import Program, Sources
from patchcraft.harness.extract import ORIGINAL, PATCHED
from patchcraft.harness.scenarios import _describe
from patchcraft.harness.shapes import ShapeError
from patchcraft.harness.nothing import HARNESS_DIR, HarnessError, Nothing, StandInWatch, watch_standins
from patchcraft.harness.standins import RecordingEmbedding, World, mix, reference_states
from patchcraft.harness.subject import HIDDEN, VOCAB, Subject, input_ids, subjects


def run_ids(
    package: Path,
    graph: ModelGraph,
    plan: ModelPlan,
    layer_ids: Optional[Sequence[int]],
    num_layers: int,
    texts: Optional[Mapping[Path, str]] = None,
) -> RunOutcome:
    """Set ``layer_ids`` (None: the no-argument call) and run one forward of ``plan``'s model.

    ``texts``: file texts to run instead of the files on disk (what apply
    would write). A model the harness cannot build gives ``not_run``.
    """
    try:
        subject = _subject(package, graph, plan, texts)
    except (HarnessError, ShapeError) as exc:
        return RunOutcome(not_run=f"{NOT_RUN}: {exc}")
    except Exception as exc:  # a class graph the harness cannot assemble: the static reading answers
        return RunOutcome(not_run=f"{NOT_RUN}: the harness cannot build {plan.label} ({type(exc).__name__}: {exc})")
    if subject is None:
        return RunOutcome(not_run=f"{NOT_RUN}: no inner model class")
    subject = replace(subject, layers=num_layers)
    runs = graph.find_method(subject.inner, "forward")
    if runs is not None and runs[0].key != subject.forward_owner.key:
        # A draft's wrapper forward (``super().forward`` on other inputs): the smoke harness skips
        # it to test the parent's capture, but the server runs the wrapper, which the stand-ins
        # cannot feed; the static reading answers instead.
        return RunOutcome(not_run=f"{NOT_RUN}: {runs[0].label}.forward wraps {subject.forward_owner.label}.forward")
    with torch.no_grad():
        return _run(subject, layer_ids, num_layers)


#: Subjects kept between runs (one model tried with several id lists): compiled once, kept while their files are unchanged.
_SUBJECTS: Memo[tuple[Subject | None, ModelGraph]] = Memo(keep=32)


def _subject(package: Path, graph: ModelGraph, plan: ModelPlan, texts: Optional[Mapping[Path, str]]) -> Subject | None:
    """The first subject of ``plan``, reused while the files it was built from are unchanged (:mod:`patchcraft.base.memo`)."""
    key = (str(package), id(graph), plan.label, tuple(sorted((str(p), t) for p, t in (texts or {}).items())))
    kept = _SUBJECTS.recall(key)
    if kept is not None and kept[0][1] is graph:
        return kept[0][0]
    sources = Sources(package, texts)
    programs = {variant: Program(graph, sources, variant) for variant in (PATCHED, ORIGINAL)}
    found = subjects(graph, plan, programs)
    subject = found[0] if found else None
    # Its files are known once it is built: stamped now (a file written meanwhile is read again next time).
    _SUBJECTS.remember(key, (subject, graph), stamp(sorted(subject.files) if subject is not None else ()))
    return subject


def _run(subject: Subject, layer_ids: Optional[Sequence[int]], num_layers: int) -> RunOutcome:
    world = World()
    try:
        instance = subject.build(PATCHED, world)
    except Exception as exc:  # the literal __init__ statements failing: the harness cannot judge
        return RunOutcome(not_run=f"{NOT_RUN}: building the model raised {_describe(exc, subject.files)}")
    with watch_standins() as seen:
        try:
            subject.set_ids(instance, list(layer_ids) if layer_ids is not None else None, world)
        except HarnessError as exc:
            return RunOutcome(not_run=f"{NOT_RUN}: {exc}")
        except Exception as exc:
            return _crash(exc, subject, seen, "setter")
        try:
            aux = subject.run(instance, world)
        except HarnessError as exc:
            return RunOutcome(not_run=f"{NOT_RUN}: {exc}")
        except Exception as exc:
            return _crash(exc, subject, seen, "forward")
    return RunOutcome(fed=_identify(aux, instance.embedding, num_layers))


def _identify(aux: Sequence[Any], embedding: RecordingEmbedding, num_layers: int) -> tuple[Fed, ...]:
    """Name each captured tensor: an alias of the embedding output first, then by value."""
    reference = RecordingEmbedding(VOCAB, HIDDEN, torch.Generator().manual_seed(0))
    states = reference_states(reference(input_ids()), num_layers)
    pointers = {t.untyped_storage().data_ptr() for t in embedding.outputs}
    fed = []
    for tensor in aux:
        if not isinstance(tensor, torch.Tensor):
            fed.append(Fed(None, True, type(tensor).__name__))
        elif tensor.untyped_storage().data_ptr() in pointers:
            fed.append(Fed(0, False))
        else:
            fed.append(_by_value(tensor, states))
    return tuple(fed)


def _by_value(tensor: torch.Tensor, states: list[torch.Tensor]) -> Fed:
    for index, state in enumerate(states):
        if tensor.shape == state.shape and torch.equal(tensor, state):
            return Fed(index, True)
    for index, state in enumerate(states[:-1]):
        if tensor.shape == state.shape and torch.equal(tensor, mix(state, index)):
            return Fed(None, True, f"layer {index}'s output without its residual")
    return Fed(None, True, f"an unknown tensor {tuple(tensor.shape)}")


def _crash(exc: Exception, subject: Subject, seen: StandInWatch, stage: str) -> RunOutcome:
    """SGLang's crash, or "cannot be run here" when what failed was a stand-in (:func:`standin_cause`)."""
    described = _describe(exc, subject.files)
    cause = standin_cause(exc, subject, seen)
    if cause:
        return RunOutcome(not_run=f"{CANNOT_RUN}: the {stage} raised {described}, {cause}")
    return RunOutcome(crash=described, stage=stage)


def standin_cause(exc: BaseException, subject: Subject, seen: StandInWatch) -> str:
    """Why ``exc`` says nothing about SGLang, or "" when it is SGLang's own crash.

    The innermost frame that is either the harness or the code under test
    decides (library frames, torch's, are passed over): the harness's
    (a stand-in raised) is no claim about SGLang; the model's is SGLang's
    crash unless its statement obtained a stand-in's answer while it ran,
    or reads a local that holds one.
    """
    package = str(subject.programs[PATCHED].sources.package)
    tb = exc.__traceback__
    frames: list[tuple[types.FrameType, int]] = []
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    for frame, line in reversed(frames):
        filename = frame.f_code.co_filename
        where = f"{Path(filename).name}:{line}"
        if filename.startswith(HARNESS_DIR):
            return f"inside the CPU harness's stand-in ({where} in {frame.f_code.co_name}): no claim about SGLang"
        if filename in subject.files or filename.startswith(package):
            name = _standin_on_statement(frame, line, subject, seen)
            if not name:
                return ""
            return (
                f"acting on `{name}`, a stand-in the CPU harness does not model (SGLang gives a real value there): "
                "no claim about SGLang"
            )
    return "outside the model's code: no claim about SGLang"


def _standin_on_statement(frame: types.FrameType, line: int, subject: Subject, seen: StandInWatch) -> str:
    """The stand-in that the statement at ``line`` of ``frame`` obtained or reads ("" when none)."""
    statements = _statements(subject, Path(frame.f_code.co_filename))
    first, last = _statement_span(statements, line)
    made = [
        m
        for m in seen.seen
        if m.frame == id(frame) and m.filename == frame.f_code.co_filename and first <= m.line <= last
    ]
    if made:
        return made[-1].name
    for name in (n for at in range(first, last + 1) for n in statements.names.get(at, ())):
        value = frame.f_locals.get(name)
        if isinstance(value, Nothing) or (
            isinstance(value, (tuple, list)) and any(isinstance(v, Nothing) for v in value)
        ):
            return name
    return ""


@dataclass(frozen=True)
class _Statements:
    """A file's statements by line span (a compound statement's header only), and the names each line reads."""

    spans: tuple[tuple[int, int], ...]
    names: Mapping[int, tuple[str, ...]]


_STATEMENTS: dict[int, tuple[ast.Module, _Statements]] = {}


def _statements(subject: Subject, path: Path) -> _Statements:
    try:
        tree = subject.programs[PATCHED].sources.get(path).syntax
    except (OSError, SyntaxError, ValueError):
        return _Statements((), {})
    cached = _STATEMENTS.get(id(tree))
    if cached is not None and cached[0] is tree:
        return cached[1]
    spans, names = [], {}  # type: ignore[var-annotated]
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.setdefault(node.lineno, []).append(node.id)
        elif isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = getattr(node, "body", None)
            end = body[0].lineno - 1 if isinstance(body, list) and body else node.end_lineno or node.lineno
            spans.append((node.lineno, max(end, node.lineno)))
    found = _Statements(tuple(spans), {line: tuple(n) for line, n in names.items()})
    if len(_STATEMENTS) >= 16:
        _STATEMENTS.pop(next(iter(_STATEMENTS)))
    _STATEMENTS[id(tree)] = (tree, found)
    return found


def _statement_span(statements: _Statements, line: int) -> tuple[int, int]:
    """The lines of the innermost statement holding ``line``."""
    holding = [span for span in statements.spans if span[0] <= line <= span[1]]
    return min(holding, key=lambda span: span[1] - span[0]) if holding else (line, line)
