"""The five scenarios for one model class, and how their verdicts are worded.

``init``      right after ``__init__`` the flag exists and is ``False``, and
              ``forward`` runs before any setter call;
``capture``   ids ``[-1, 1, 4]`` give exactly ``[hs[0], hs[2], hs[5]]``, in
              order, with ``hs[0]`` a copy (not the embedding tensor);
``same``      ids without -1 capture exactly what the original captures;
``default``   ``None`` runs the default path, the flag stays ``False``, and
              the capture equals the original's;
``pipeline``  on a later pipeline stage, -1 is refused or nothing is
              captured from the received tensors.

``hs`` is the Hugging Face numbering computed independently by
:func:`reference_states` from the same stand-in layer math. The original
failing is a :class:`Limitation` of the harness; the patched code failing
where the original runs is a :class:`Failure`.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from patchcraft.base.status import HarnessStatus
from patchcraft.harness.rows import Check
from patchcraft.reading.class_graph import FLAG, SETTER
from patchcraft.harness.extract import ORIGINAL, PATCHED
from patchcraft.harness.standins import (
    HarnessError,
    ParallelGroup,
    PPProxyTensors,
    RecordingEmbedding,
    World,
    mix,
    reference_states,
)
from patchcraft.harness.subject import (
    CAPTURE_IDS,
    CAPTURE_IDS_RAW_FIRST,
    HIDDEN,
    LAYERS,
    PIPELINE_IDS,
    SAME_IDS,
    TOKENS,
    VOCAB,
    _MISSING,
    Failure,
    Instance,
    Limitation,
    Subject,
    input_ids,
)

PASS, FAIL, ERROR, SKIPPED, NOT_APPLICABLE = (
    HarnessStatus.PASS,
    HarnessStatus.FAIL,
    HarnessStatus.ERROR,
    HarnessStatus.SKIPPED,
    HarnessStatus.NOT_APPLICABLE,
)


#: What a setter raises on purpose to refuse ids (a deliberate raise, in the model file).
REFUSALS = (ValueError, RuntimeError, NotImplementedError, AssertionError)


# -- judging ------------------------------------------------------------------------


def _name(tensor: Any, known: dict[str, torch.Tensor]) -> str:
    if not isinstance(tensor, torch.Tensor):
        return type(tensor).__name__
    for name, value in known.items():
        if tensor.shape == value.shape and torch.equal(tensor, value):
            return name
    return f"an unknown tensor {tuple(tensor.shape)}"


def _difference(
    actual: Sequence[Any], expected: Sequence[torch.Tensor], known: dict[str, torch.Tensor]
) -> Optional[str]:
    """The first way ``actual`` differs from ``expected`` (exact values, order), or None."""
    got = [_name(t, known) for t in actual]
    want = [_name(t, known) for t in expected]
    if len(actual) != len(expected):
        return f"expected {len(expected)} aux states [{', '.join(want)}], got {len(actual)} [{', '.join(got)}]"
    for index, (a, e) in enumerate(zip(actual, expected)):
        if not (isinstance(a, torch.Tensor) and a.shape == e.shape and torch.equal(a, e)):
            return f"aux[{index}] is {got[index]}, expected {want[index]} (got [{', '.join(got)}])"
    return None


def _aliasing(aux: Sequence[Any], embedding: RecordingEmbedding) -> Optional[str]:
    pointers = {t.untyped_storage().data_ptr() for t in embedding.outputs}
    for index, tensor in enumerate(aux):
        if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() in pointers:
            return (
                f"aux[{index}] shares storage with the embedding output (not a copy): "
                "the next layer's in-place residual add overwrites it (missing .clone()?)"
            )
    return None


def located_in(exc: BaseException, files: set[str]) -> str:
    """``Type: message at file.py:LINE in method``: the innermost frame in the release's files."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f for f in reversed(frames) if f.filename in files), None)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    located = f" at {Path(where.filename).name}:{where.lineno} in {where.name}" if where else ""
    return f"{type(exc).__name__}: {text}{located}"


def _describe(exc: BaseException, files: set[str]) -> str:
    """:func:`located_in`, plus a hint naming the problem where the release's aux collector refused a capture."""
    return located_in(exc, files) + _hint(traceback.extract_tb(exc.__traceback__))


def _hint(frames: list) -> str:
    """Name the problem when the release's aux collector refused a capture."""
    inside = [f.name for f in frames if Path(f.filename).name == "aux_hidden_states.py"]
    if any(name in ("append", "slot", "capture", "extend") for name in inside):
        return (
            " (more captures than the AuxHiddenStatePacker was sized for: its count must include the embedding capture)"
        )
    if "finalize" in inside:
        return " (AuxHiddenStatePacker.finalize: the number of captures differs from the packer's count)"
    return ""


def _raised_in(exc: BaseException, files: set[str]) -> bool:
    """Whether the innermost frame of ``exc`` is in one of the model files (a deliberate raise)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].filename in files


def _hs(states: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"hs[{k}]": t for k, t in enumerate(states)}


class Scenarios:
    """The five scenarios for one subject; each returns a :class:`Check` or raises."""

    FIRST = World()
    LATER = World(pp=ParallelGroup(world_size=2, rank_in_group=1))

    def __init__(self, subject: Subject) -> None:
        self.s = subject
        with torch.no_grad():
            embedding = RecordingEmbedding(VOCAB, HIDDEN, torch.Generator().manual_seed(0))
            self.states = reference_states(embedding(input_ids()), LAYERS)
        self.known = _hs(self.states)
        for index in range(LAYERS):  # what a capture of hidden_states alone (no residual) holds
            self.known[f"layer {index}'s output without its residual"] = mix(self.states[index], index)

    # Helpers that sort exceptions: the original failing is a limitation, the patch failing a failure.
    def original(
        self, ids: Any, world: World, proxy: Optional[PPProxyTensors] = None, what: str = ""
    ) -> list[torch.Tensor]:
        try:
            instance = self.s.build(ORIGINAL, world)
            if ids is not _MISSING:
                self.s.set_ids(instance, ids, world)
            return self.s.run(instance, world, proxy)
        except (Failure, Limitation):
            raise
        except Exception as exc:
            by_file = _raised_in(exc, self.s.files) and not isinstance(exc, (HarnessError, TypeError, AttributeError))
            message = f"the original file does not run under the stand-ins ({what}): {_describe(exc, self.s.files)}"
            raise Limitation(message, by_file) from exc

    def patched(self, world: World) -> Instance:
        try:
            return self.s.build(PATCHED, world)
        except Exception as exc:
            raise Failure(f"building the patched model raised {_describe(exc, self.s.files)}") from exc

    def call(self, what: str, func: Any, *args: Any) -> Any:
        try:
            return func(*args)
        except (Failure, Limitation, HarnessError):
            raise
        except Exception as exc:
            raise Failure(f"{what} raised {_describe(exc, self.s.files)}") from exc

    def flag(self, instance: Instance, expected: bool, after: str) -> None:
        value = instance.inner.__dict__.get(FLAG, _MISSING)
        if value is _MISSING:
            raise Failure(f"{after}: {type(instance.inner).__name__}.{FLAG} is not set")
        if value is not expected:
            raise Failure(f"{after}: {FLAG} is {value!r}, expected {expected}")

    # The scenarios.
    def init(self) -> Check:
        baseline = self.original(_MISSING, self.FIRST, what="forward right after __init__")
        instance = self.patched(self.FIRST)
        aux = self.call("forward right after __init__ (no setter call)", self.s.run, instance, self.FIRST)
        if instance.flag_after_init is _MISSING:
            raise Failure(f"__init__ does not set {FLAG} (the setter then refuses -1 for this model)")
        if not type(instance.inner).sets_unconditionally(FLAG):
            raise Failure(f"__init__ sets {FLAG} only inside a branch: it can be missing until the setter runs")
        if instance.flag_after_init is not False:
            raise Failure(f"__init__ sets {FLAG} = {instance.flag_after_init!r}, expected False")
        problem = _difference(aux, baseline, self.known)
        if problem:
            raise Failure(f"forward right after __init__: {problem}")
        return Check("init", PASS, f"{FLAG} is False after __init__")

    def capture(self) -> Check:
        shifted = [i for i in CAPTURE_IDS if i >= 0]
        baseline = self.original(shifted, self.FIRST, what=f"ids {shifted}")
        hf = [self.states[i + 1] for i in shifted]
        calibrated = _difference(baseline, hf, self.known) is None
        names = self.captured(CAPTURE_IDS, [self.states[0]] + (hf if calibrated else baseline))
        if calibrated:
            # -1 implies the +1 convention for every other id, whatever heuristic the release applies.
            rest = [i for i in CAPTURE_IDS_RAW_FIRST if i >= 0]
            self.captured(CAPTURE_IDS_RAW_FIRST, [self.states[0]] + [self.states[i + 1] for i in rest])
        if not calibrated:
            own = ", ".join(_name(t, self.known) for t in baseline)
            want = ", ".join(f"hs[{i + 1}]" for i in shifted)
            note = (
                f"the unpatched release itself captures [{own}] for ids {shifted}, not [{want}]; the patch keeps that"
            )
            return Check("capture", PASS, f"[{names}]", note)
        return Check("capture", PASS, f"[{names}]")

    def captured(self, ids: list[int], expected: list[torch.Tensor]) -> str:
        """Set ``ids`` on a fresh patched instance, run forward, and compare with ``expected``."""
        instance = self.patched(self.FIRST)
        self.call(f"{SETTER}({ids})", self.s.set_ids, instance, ids, self.FIRST)
        self.flag(instance, True, f"after {SETTER}({ids})")
        aux = self.call(f"forward with ids {ids}", self.s.run, instance, self.FIRST)
        aliased = _aliasing(aux[:1], instance.embedding)
        if aliased:
            raise Failure(f"ids {ids}: {aliased}")
        problem = _difference(aux, expected, self.known)
        if problem:
            raise Failure(f"ids {ids}: {problem}")
        return ", ".join(_name(t, self.known) for t in aux)

    def same(self) -> Check:
        for ids in SAME_IDS:
            baseline = self.original(ids, self.FIRST, what=f"ids {ids}")
            instance = self.patched(self.FIRST)
            self.call(f"{SETTER}({ids})", self.s.set_ids, instance, ids, self.FIRST)
            self.flag(instance, False, f"after {SETTER}({ids})")
            aux = self.call(f"forward with ids {ids}", self.s.run, instance, self.FIRST)
            problem = _difference(aux, baseline, self.known)
            if problem:
                raise Failure(f"ids {ids} differ from the unpatched file: {problem}")
        return Check("same", PASS, f"ids {' and '.join(map(str, SAME_IDS))} capture as unpatched")

    def default(self) -> Check:
        baseline = self.original(None, self.FIRST, what="ids None")
        instance = self.patched(self.FIRST)
        self.call(f"{SETTER}(None)", self.s.set_ids, instance, None, self.FIRST)
        self.flag(instance, False, f"after {SETTER}(None)")
        aux = self.call("forward with ids None", self.s.run, instance, self.FIRST)
        problem = _difference(aux, baseline, self.known)
        if problem:
            raise Failure(f"ids None (default layers) differ from the unpatched file: {problem}")
        return Check("default", PASS, f"{len(aux)} default states as unpatched; {FLAG} False")

    def pipeline(self) -> Check:
        if not self.s.pipeline:
            return Check("pipeline", NOT_APPLICABLE, "this forward has no later-stage path")
        generator = torch.Generator().manual_seed(1)
        here = torch.empty(0).device  # the default device (patchcraft.harness.cuda runs under ``torch.device``)
        received = tuple(torch.randn(TOKENS, HIDDEN, generator=generator, device="cpu").to(here) for _ in range(2))
        known = {"the received hidden_states": received[0].clone()}
        stream = received[0] + received[1]
        for index in range(LAYERS // 2, LAYERS + 1):  # this stage's own states, from the received pair
            known[f"received hs[{index}]"] = stream
            stream = stream + mix(stream, index) if index < LAYERS else stream

        def proxy() -> PPProxyTensors:
            return PPProxyTensors({"hidden_states": received[0].clone(), "residual": received[1].clone()})

        rest = [i for i in PIPELINE_IDS if i >= 0]
        try:
            baseline = self.original(rest, self.LATER, proxy(), what=f"later pipeline stage, ids {rest}")
        except Limitation as exc:
            if not exc.by_file:
                raise
            return Check(
                "pipeline", NOT_APPLICABLE, f"the release refuses a later pipeline stage itself: {exc.__cause__}"
            )
        instance = self.patched(self.LATER)
        try:
            self.s.set_ids(instance, PIPELINE_IDS, self.LATER)
        except REFUSALS as exc:
            if _raised_in(exc, self.s.files):
                return Check("pipeline", PASS, f"-1 refused on a later stage: {_describe(exc, self.s.files)}")
            raise Failure(f"{SETTER}({PIPELINE_IDS}) on a later stage raised {_describe(exc, self.s.files)}") from exc
        except Exception as exc:
            raise Failure(f"{SETTER}({PIPELINE_IDS}) on a later stage raised {_describe(exc, self.s.files)}") from exc
        aux = self.call(f"later-stage forward with ids {PIPELINE_IDS}", self.s.run, instance, self.LATER, proxy())
        problem = _difference(aux, baseline, {**known, **self.known})
        if problem:
            raise Failure(f"later pipeline stage, ids {PIPELINE_IDS}: -1 was accepted and {problem}")
        return Check("pipeline", PASS, "-1 accepted on a later stage but nothing captured from the received tensors")

    def all(self) -> list[Check]:
        checks = []
        for scenario in (self.init, self.capture, self.same, self.default, self.pipeline):
            try:
                checks.append(scenario())
            except Failure as exc:
                checks.append(Check(scenario.__name__, FAIL, str(exc)))
            except (Limitation, HarnessError) as exc:
                checks.append(Check(scenario.__name__, ERROR, str(exc)))
        return checks
