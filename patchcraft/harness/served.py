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
forward) is reported with the exception and the file's line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch

from patchcraft.reading.class_graph import ModelGraph
from patchcraft.planning.records import ModelPlan
from patchcraft.harness.assemble import Program, Sources
from patchcraft.harness.extract import ORIGINAL, PATCHED
from patchcraft.harness.scenarios import _describe
from patchcraft.harness.shapes import ShapeError
from patchcraft.harness.standins import HarnessError, RecordingEmbedding, World, mix, reference_states
from patchcraft.harness.subject import HIDDEN, VOCAB, Subject, input_ids, subjects

#: Where the harness cannot follow a model, the answer is this prefix and the reason.
NOT_RUN = "not run"


@dataclass(frozen=True)
class Fed:
    """One aux state as it reached the collector."""

    state: int | None  # hs index; None: a tensor that is no hidden state of the reference
    copy: bool  # False: it shares storage with the embedding output (overwritten in place later)
    what: str = ""  # for an unknown tensor: what it is (e.g. a layer's output without its residual)


@dataclass(frozen=True)
class RunOutcome:
    """What running the setter and the forward with one id list gave."""

    fed: tuple[Fed, ...] = ()
    crash: str = ""  # "TypeError: ... at deepseek_v2.py:2446 in forward"; "" when it ran
    stage: str = ""  # "setter" or "forward": where the crash happened
    not_run: str = ""  # why the harness could not run this model ("" when it ran)

    @property
    def ran(self) -> bool:
        return not self.not_run

    @property
    def states(self) -> tuple[int, ...]:
        """The hs indices fed, in order (an unknown tensor counts as -1)."""
        return tuple(-1 if f.state is None else f.state for f in self.fed)

    @property
    def all_copies(self) -> bool:
        return all(f.copy for f in self.fed)

    @property
    def nothing(self) -> bool:
        """It ran without a crash and nothing reached the collector."""
        return self.ran and not self.crash and not self.fed


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


#: Subjects kept between runs (one model tried with several id lists): compiled once.
_SUBJECTS: dict[tuple, tuple[Subject | None, tuple, ModelGraph]] = {}


def _subject(package: Path, graph: ModelGraph, plan: ModelPlan, texts: Optional[Mapping[Path, str]]) -> Subject | None:
    """The first subject of ``plan``, reused while its files are unchanged (size and mtime)."""
    digest = tuple(sorted((str(p), hash(t)) for p, t in (texts or {}).items()))
    key = (str(package), id(graph), plan.label, digest)
    cached = _SUBJECTS.get(key)
    if cached is not None and cached[2] is graph and cached[1] == _stats(cached[0]):
        return cached[0]
    sources = Sources(package, texts)
    programs = {variant: Program(graph, sources, variant) for variant in (PATCHED, ORIGINAL)}
    found = subjects(graph, plan, programs)
    subject = found[0] if found else None
    if len(_SUBJECTS) >= 32:
        _SUBJECTS.pop(next(iter(_SUBJECTS)))
    _SUBJECTS[key] = (subject, _stats(subject), graph)
    return subject


def _stats(subject: Subject | None) -> tuple:
    if subject is None:
        return ()
    found = []
    for name in sorted(subject.files):
        try:
            info = Path(name).stat()
        except OSError:
            return ("gone", name)
        found.append((name, info.st_mtime_ns, info.st_size))
    return tuple(found)


def _run(subject: Subject, layer_ids: Optional[Sequence[int]], num_layers: int) -> RunOutcome:
    world = World()
    try:
        instance = subject.build(PATCHED, world)
    except Exception as exc:  # the literal __init__ statements failing: the harness cannot judge
        return RunOutcome(not_run=f"{NOT_RUN}: building the model raised {_describe(exc, subject.files)}")
    try:
        subject.set_ids(instance, list(layer_ids) if layer_ids is not None else None, world)
    except HarnessError as exc:
        return RunOutcome(not_run=f"{NOT_RUN}: {exc}")
    except Exception as exc:
        return RunOutcome(crash=_describe(exc, subject.files), stage="setter")
    try:
        aux = subject.run(instance, world)
    except HarnessError as exc:
        return RunOutcome(not_run=f"{NOT_RUN}: {exc}")
    except Exception as exc:
        return RunOutcome(crash=_describe(exc, subject.files), stage="forward")
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


def fed_text(outcome: RunOutcome) -> str:
    """``hs[0] (not a copy), hs[3], hs[31]``, the crash, or ``nothing``."""
    if outcome.not_run:
        return outcome.not_run
    if outcome.crash:
        return f"crash in the {outcome.stage}: {outcome.crash}"
    items = []
    for f in outcome.fed:
        name = f"hs[{f.state}]" if f.state is not None else f.what
        items.append(name if f.copy else f"{name} (not a copy: layer 0 overwrites it in place)")
    return ", ".join(items) if items else "nothing"
