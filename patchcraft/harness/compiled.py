"""``torch.compile(fullgraph=True)`` over each patched forward's capture path.

SGLang compiles the model forward for ``--enable-torch-compile`` and for
piecewise CUDA graphs, so the block patchcraft inserts (``if getattr(self,
"capture_embedding_for_eagle3", False) and <gate>: aux.append(hidden_states.clone())``)
must trace without a graph break. For each model class this compiles the
patched forward, on the harness stand-ins, with the ids ``[-1, 1, 4]`` set
(the flag on, so the block is traced), runs it and compares its aux states
with the eager run of the same patched code.

A graph break is blamed on the patch only when the release's original
forward does not have it: when the patched forward breaks, the original
(ids ``[1, 4]``) is compiled too. If the original compiles, every break is
the patch's (``fail``). If the original breaks as well (under the
stand-ins), both are traced again without ``fullgraph`` and their break
reasons compared: a reason the original does not have is the patch's
(``fail``); otherwise the row passes with a note. See docs/harness.md.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from patchcraft.reading.class_graph import FLAG, ModelGraph
from patchcraft.planning.records import ModelPlan
from patchcraft.harness.assemble import Program
from patchcraft.harness.extract import ORIGINAL, PATCHED
from patchcraft.harness.scenarios import ERROR, FAIL, PASS, Check, Scenarios, _describe, _difference
from patchcraft.harness.standins import HarnessError
from patchcraft.harness.subject import CAPTURE_IDS, Subject

#: Dynamo's own backend (trace, then run the captured graph eagerly): graph breaks are a tracing
#: matter, so this is the cheap check; ``aot_eager`` adds functionalization, ``inductor`` codegen.
DEFAULT_BACKEND = "eager"


class GraphBreak(Exception):
    """A compiled forward broke the graph or failed to compile; the message says where and why."""


def _dynamo() -> Any:
    import torch._dynamo

    return torch._dynamo


def _location(exc: BaseException, files: set[str]) -> str:
    """``file.py:LINE`` of the user code Dynamo stopped at (from its message), or ''."""
    found = re.findall(r'File "([^"]+)", line (\d+)', str(exc))
    inside = [(f, n) for f, n in found if f in files] or found
    return f"{Path(inside[-1][0]).name}:{inside[-1][1]}" if inside else ""


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = next((line.strip() for line in text if line.strip()), "")
    return f"{type(exc).__name__}: {first[:300]}"


def block_lines(subject: Subject) -> set[int]:
    """File line numbers of patchcraft's inserted capture block(s) in the patched forward."""
    lines = subject.forward.text.splitlines()
    found: set[int] = set()
    for index, line in enumerate(lines):
        if line.lstrip().startswith(f'if getattr(self, "{FLAG}"'):
            depth = len(line) - len(line.lstrip())
            end = index + 1
            while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > depth):
                end += 1
            found.update(range(subject.forward.line + index, subject.forward.line + end))
    return found


def _in_block(location: str, subject: Subject) -> bool:
    if not location:
        return False
    name, _, number = location.rpartition(":")
    return name == Path(subject.forward.path).name and number.isdigit() and int(number) in block_lines(subject)


def warm_up(subject: Subject, variant: str, ids: list[int], scenarios: Scenarios) -> None:
    """Run ``variant`` eagerly once, so that the harness's lazily compiled methods exist before tracing.

    Otherwise Dynamo would trace the harness itself compiling them (libcst, ``exec``): a
    graph break of the harness, not of the model file. Errors are left to the compiled run.
    """
    try:
        instance = subject.build(variant, scenarios.FIRST)
        subject.set_ids(instance, ids, scenarios.FIRST)
        subject.run(instance, scenarios.FIRST)
    except Exception:
        pass


def compile_forward(
    subject: Subject,
    variant: str,
    ids: list[int],
    scenarios: Scenarios,
    backend: str = DEFAULT_BACKEND,
    fullgraph: bool = True,
) -> list[torch.Tensor]:
    """Build ``variant`` fresh, set ``ids``, and run its forward under ``torch.compile``."""
    dynamo = _dynamo()
    dynamo.reset()
    warm_up(subject, variant, ids, scenarios)
    instance = subject.build(variant, scenarios.FIRST)
    subject.set_ids(instance, ids, scenarios.FIRST)
    compiler = lambda function: torch.compile(function, fullgraph=fullgraph, backend=backend)  # noqa: E731
    try:
        return subject.run(instance, scenarios.FIRST, wrap=compiler)
    except (HarnessError,):
        raise
    except Exception as exc:
        location = _location(exc, subject.files)
        raise GraphBreak(f"{_reason(exc)}" + (f" at {location}" if location else "")) from exc


def break_reasons(subject: Subject, variant: str, ids: list[int], scenarios: Scenarios) -> Counter:
    """Every graph break Dynamo reports for ``variant`` (without fullgraph), by reason text."""
    dynamo = _dynamo()
    dynamo.reset()
    warm_up(subject, variant, ids, scenarios)
    instance = subject.build(variant, scenarios.FIRST)
    subject.set_ids(instance, ids, scenarios.FIRST)
    reasons: Counter = Counter()
    explanation: list[Any] = []

    def wrap(function: Any) -> Any:
        def explained(*args: Any, **kwargs: Any) -> Any:
            explanation.append(dynamo.explain(function)(*args, **kwargs))
            return function(*args, **kwargs)

        return explained

    subject.run(instance, scenarios.FIRST, wrap=wrap)
    for result in explanation:
        for reason in result.break_reasons:
            text = str(getattr(reason, "reason", reason)).strip().splitlines()
            reasons[text[0][:200] if text else "?"] += 1
    return reasons


def compile_check(subject: Subject, backend: str = DEFAULT_BACKEND) -> Check:
    """The ``compile`` check for one subject (see the module docstring)."""
    scenarios = Scenarios(subject)
    instance = scenarios.patched(scenarios.FIRST)
    scenarios.call(f"ids {CAPTURE_IDS}", subject.set_ids, instance, CAPTURE_IDS, scenarios.FIRST)
    eager = scenarios.call(f"eager forward with ids {CAPTURE_IDS}", subject.run, instance, scenarios.FIRST)
    shifted = [i for i in CAPTURE_IDS if i >= 0]
    try:
        compiled = compile_forward(subject, PATCHED, CAPTURE_IDS, scenarios, backend)
    except GraphBreak as patched_break:
        return _judge_break(subject, scenarios, shifted, patched_break, backend)
    exact = backend == "eager"
    problem = _difference(compiled, eager, scenarios.known) if exact else _close(compiled, eager)
    if problem:
        return Check(
            "compile", FAIL, f"compiled forward (ids {CAPTURE_IDS}, backend {backend}) differs from eager: {problem}"
        )
    if not compiled or not torch.equal(compiled[0], scenarios.states[0].to(compiled[0].device)):
        return Check("compile", FAIL, f"compiled forward (ids {CAPTURE_IDS}): aux[0] is not the embedding output")
    return Check("compile", PASS, f"fullgraph, backend {backend}: {len(compiled)} aux states as eager, aux[0] = hs[0]")


def _close(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> Optional[str]:
    if len(actual) != len(expected):
        return f"{len(actual)} aux states, eager gives {len(expected)}"
    for index, (a, e) in enumerate(zip(actual, expected)):
        if a.shape != e.shape or not torch.allclose(a, e, rtol=1e-4, atol=1e-5):
            return f"aux[{index}] differs from eager"
    return None


def _judge_break(
    subject: Subject, scenarios: Scenarios, shifted: list[int], patched_break: GraphBreak, backend: str
) -> Check:
    where = (
        " (inside patchcraft's capture block)" if _in_block(str(patched_break).rpartition(" at ")[2], subject) else ""
    )
    original_break: Optional[GraphBreak] = None
    try:
        compile_forward(subject, ORIGINAL, shifted, scenarios, backend)
    except GraphBreak as exc:
        original_break = exc  # the name of an except clause is deleted when the clause ends
    except Exception as exc:
        return Check(
            "compile",
            ERROR,
            f"the original forward does not run compiled under the stand-ins: {_describe(exc, subject.files)}",
        )
    if original_break is None:
        return Check(
            "compile", FAIL, f"the patched forward breaks the graph and the original does not: {patched_break}{where}"
        )
    if where:
        return Check("compile", FAIL, f"graph break in patchcraft's capture block: {patched_break}")
    try:
        ours = break_reasons(subject, PATCHED, CAPTURE_IDS, scenarios)
        theirs = break_reasons(subject, ORIGINAL, shifted, scenarios)
    except Exception as exc:
        note = f"the original forward already breaks the graph under the stand-ins ({original_break}); breaks not compared: {type(exc).__name__}"
        return Check("compile", PASS, "not fullgraph (the release's own break)", note)
    new = ours - theirs
    if new:
        first = next(iter(new))
        return Check(
            "compile",
            FAIL,
            f"the patched forward adds a graph break the original does not have: {first} (first: {patched_break})",
        )
    note = (
        f"the original forward already breaks the graph under the stand-ins: {original_break}; the patch adds no break"
    )
    return Check("compile", PASS, f"no graph break beyond the original's ({sum(ours.values())})", note)


def compile_model(
    graph: ModelGraph, plan: ModelPlan, programs: dict[str, Program], path: str, backend: str = DEFAULT_BACKEND
) -> Any:
    """One row for :func:`patchcraft.harness.runner.smoke_tree`: the ``compile`` check of every subject."""
    from patchcraft.harness.runner import subject_row

    return subject_row(
        graph, plan, programs, path, lambda subject: [_compile_or_error(subject, backend)], "compiles fullgraph"
    )


def _compile_or_error(subject: Subject, backend: str) -> Check:
    try:
        return compile_check(subject, backend)
    except Exception as exc:  # the eager capture itself fails: the scenarios report that
        return Check("compile", ERROR, f"cannot run the capture path: {exc}")


def compiler(backend: str = DEFAULT_BACKEND) -> Callable[..., Any]:
    """``check=`` for :func:`patchcraft.harness.runner.smoke_tree` with ``backend``."""

    def check(graph: ModelGraph, plan: ModelPlan, programs: dict[str, Program], path: str) -> Any:
        return compile_model(graph, plan, programs, path, backend)

    return check
