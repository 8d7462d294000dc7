"""The CPU harness on a device: ``patchcraft smoke --device cuda --engine harness``.

Needs only torch (with CUDA), libcst and click: no SGLang, no GPU kernels of
its own. For each patched model class, on ``device``:

``scenarios``  the five scenarios of :mod:`patchcraft.harness.scenarios`, with
               every tensor made on the device (``with torch.device(device)``);
``graph``      the patched forward (ids ``[-1, 1, 4]``) captured once in a
               graph with static input ids, then replayed :data:`REPLAYS` times,
               fresh ids copied into the static buffer before each replay:
               aux[0] must be the embedding of *these* ids every time, and the
               whole capture must equal an eager run on them;
``compile``    (``--compile``) :mod:`patchcraft.harness.compiled` on the device,
               and the graph replay of the compiled forward.

The device and the graph are parameters: on CUDA the graph is a
``torch.cuda.CUDAGraph``; elsewhere :class:`ReplayGraph` re-runs the
captured callable and copies its results into the first outputs, which is
how a CUDA graph's static outputs behave. The tests run every part with
``device="cpu"`` through the same code.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch

from patchcraft.base.errors import PatchcraftError
from patchcraft.reading.class_graph import ModelGraph
from patchcraft.planning.records import ModelPlan
from patchcraft.harness.assemble import Program
from patchcraft.harness.compiled import compile_check
from patchcraft.harness.scenarios import ERROR, FAIL, PASS, Check, Scenarios, _difference
from patchcraft.harness.shapes import ShapeError
from patchcraft.harness.standins import HarnessError
from patchcraft.harness.subject import CAPTURE_IDS, TOKENS, VOCAB, Failure, Limitation, Subject, input_ids, subjects

REPLAYS = 4


def require_device(device: str) -> None:
    """Raise a one-line :class:`PatchcraftError` (exit 2) unless torch can use ``device``."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PatchcraftError(
            f"--device {device} --engine harness needs a CUDA device, and torch {torch.__version__} sees none "
            "(torch.cuda.is_available() is False)"
        )


class ReplayGraph:
    """A graph stand-in for devices without graphs: ``replay`` re-runs and writes into the first outputs."""

    def __init__(self) -> None:
        self.function: Optional[Callable[[], Any]] = None
        self.outputs: list[torch.Tensor] = []

    def capture(self, function: Callable[[], Any]) -> Any:
        self.function = function
        result = function()
        self.outputs = list(result)
        return result

    def replay(self) -> None:
        assert self.function is not None
        fresh = list(self.function())
        if len(fresh) != len(self.outputs):
            raise Failure(f"replay gave {len(fresh)} aux states, the capture {len(self.outputs)}")
        for static, value in zip(self.outputs, fresh):
            static.copy_(value)


class CudaGraph:
    """``torch.cuda.CUDAGraph``: warm up on a side stream, capture once, replay."""

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, function: Callable[[], Any]) -> Any:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                function()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(self.graph):
            result = function()
        return result

    def replay(self) -> None:
        self.graph.replay()
        torch.cuda.synchronize()


def graph_for(device: str) -> Callable[[], Any]:
    return CudaGraph if torch.device(device).type == "cuda" else ReplayGraph


def fresh_ids(generator: torch.Generator, previous: torch.Tensor) -> torch.Tensor:
    """Random token ids (on the CPU) that differ from ``previous`` in every position."""
    ids = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
    before = previous.cpu()
    return torch.where(ids == before, (ids + 1) % VOCAB, ids)


def graph_check(
    subject: Subject,
    device: str,
    graph_factory: Optional[Callable[[], Any]] = None,
    wrap: Optional[Callable[[Any], Any]] = None,
    name: str = "graph",
) -> Check:
    """Capture the patched forward once, replay it with fresh ids in the static buffer, judge each replay."""
    scenarios = Scenarios(subject)
    world = scenarios.FIRST
    instance = scenarios.patched(world)
    scenarios.call(f"ids {CAPTURE_IDS}", subject.set_ids, instance, CAPTURE_IDS, world)
    static_ids = input_ids().clone()
    graph = (graph_factory or graph_for(device))()
    captured = scenarios.call(
        "graph capture of the forward",
        graph.capture,
        lambda: subject.run(instance, world, tokens=static_ids, wrap=wrap),
    )
    if not captured:
        raise Failure(f"graph capture: the forward with ids {CAPTURE_IDS} captured nothing")
    generator = torch.Generator().manual_seed(2)
    previous = static_ids.clone()
    for replay in range(1, REPLAYS + 1):
        ids = fresh_ids(generator, previous).to(static_ids.device)
        static_ids.copy_(ids)
        scenarios.call(f"replay {replay}", graph.replay)
        embedding = torch.nn.functional.embedding(ids, instance.embedding.weight)
        old = torch.nn.functional.embedding(previous, instance.embedding.weight)
        aux = list(captured)
        if not torch.equal(aux[0], embedding):
            stale = (
                " (the previous ids' embedding: the replay did not see the new input)"
                if torch.equal(aux[0], old)
                else ""
            )
            raise Failure(f"replay {replay}: aux[0] is not the embedding of the new input ids{stale}")
        eager_instance = scenarios.patched(world)
        subject.set_ids(eager_instance, CAPTURE_IDS, world)
        eager = subject.run(eager_instance, world, tokens=ids.clone())
        known = {"the new embedding": embedding, "the previous embedding": old}
        known.update({f"eager aux[{i}]": t for i, t in enumerate(eager)})
        problem = _difference(aux, eager, known)
        if problem:
            raise Failure(f"replay {replay}: differs from an eager run on the same ids: {problem}")
        previous = ids.clone()
    where = torch.device(device).type
    kind = "torch.cuda.CUDAGraph" if isinstance(graph, CudaGraph) else f"{type(graph).__name__} ({where})"
    return Check(
        name,
        PASS,
        f"{kind}: {REPLAYS} replays with fresh ids, aux[0] = their embedding each time ({len(captured)} states)",
    )


def device_model(
    graph: ModelGraph,
    plan: ModelPlan,
    programs: dict[str, Program],
    path: str,
    device: str,
    compiled: bool = False,
    backend: Optional[str] = None,
    graph_factory: Optional[Callable[[], Any]] = None,
) -> Any:
    """One row: the scenarios, the graph replay and (``compiled``) the compile checks, on ``device``."""
    from patchcraft.harness.runner import SmokeResult, shape_of, smoke_model

    start = time.perf_counter()
    with torch.device(device):
        base = smoke_model(graph, plan, programs, path)
        if base.status == ERROR and not base.checks:
            return base
        try:
            found = subjects(graph, plan, programs)
        except (HarnessError, ShapeError) as exc:
            return SmokeResult(plan.label, path, ERROR, str(exc), seconds=time.perf_counter() - start)
        checks = list(base.checks)
        backend = backend or ("inductor" if torch.device(device).type == "cuda" else "eager")
        for subject in found:
            prefix = f"{subject.inner.name}: " if len(found) > 1 else ""
            runs: list[tuple[str, Callable[[], Check]]] = [
                ("graph", lambda: graph_check(subject, device, graph_factory))
            ]
            if compiled:
                runs.append(("compile", lambda: compile_check(subject, backend)))
                wrap = lambda function: torch.compile(function, fullgraph=True, backend=backend)  # noqa: E731
                runs.append(
                    ("graph-compiled", lambda: graph_check(subject, device, graph_factory, wrap, "graph-compiled"))
                )
            for name, run in runs:
                try:
                    check = run()
                except Failure as exc:
                    check = Check(name, FAIL, str(exc))
                except (Limitation, HarnessError) as exc:
                    check = Check(name, ERROR, str(exc))
                checks.append(Check(check.name, check.status, prefix + check.detail, check.note))
    status = (
        FAIL if any(c.status == FAIL for c in checks) else ERROR if any(c.status == ERROR for c in checks) else PASS
    )
    first = next((c for c in checks if c.status == status), None) if status != PASS else None
    notes = "; ".join(f"{c.name}: {c.note}" for c in checks if c.note)
    message = f"{first.name}: {first.detail}" if first else f"all checks pass on {device}"
    shape = "; ".join(sorted({shape_of(s) for s in found}))
    return SmokeResult(plan.label, path, status, message, tuple(checks), time.perf_counter() - start, shape, notes)


def device_check(
    device: str,
    compiled: bool = False,
    backend: Optional[str] = None,
    graph_factory: Optional[Callable[[], Any]] = None,
) -> Callable[..., Any]:
    """``check=`` for :func:`patchcraft.harness.runner.smoke_tree` on ``device``."""

    def check(graph: ModelGraph, plan: ModelPlan, programs: dict[str, Program], path: str) -> Any:
        return device_model(graph, plan, programs, path, device, compiled, backend, graph_factory)

    return check
