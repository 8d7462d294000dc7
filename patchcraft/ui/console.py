"""The only module that styles text (and the only one that imports rich).

Diffs and JSON go to stdout, plain when piped, so `patchcraft diff >
fix.patch` works; status lines and tables go to stderr. ``NO_COLOR`` is
honoured; ``--color always`` forces colour. Long work shows a transient
progress line on stderr, only on an interactive terminal (:func:`progress`).
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from patchcraft.engine.records import Mode, RunResult
from patchcraft.base.status import EditStatus, FileState, ModelStatus, Proof, WITHHELD

if TYPE_CHECKING:
    from patchcraft.harness.gpu_summary import CudaSmokeSummary
    from patchcraft.engine.hand_edits import (
        FileReport,
    )  # types only: a warm `patchcraft run` never loads the class graph

_STYLE = {
    ModelStatus.PATCHED: "green",
    ModelStatus.ALREADY: "green",
    ModelStatus.REVERTED: "cyan",
    ModelStatus.WOULD: "yellow",
    ModelStatus.UNSUPPORTED: "magenta",
    ModelStatus.ERROR: "bold red",
    ModelStatus.NOT_NEEDED: "green",
    # An empty style would leave a bare "[/]" (MarkupError).
    ModelStatus.NOT_PATCHED: "dim",
    ModelStatus.NOT_APPLICABLE: "dim",
}
#: An edit still to make shows as "missing" in the verify table (yellow: the default).
_EDIT_STYLE: dict[str, str] = {
    status: "green" for status in (EditStatus.APPLIED, EditStatus.PRESENT, EditStatus.HAND_APPLIED)
}
_EDIT_STYLE.update({EditStatus.MODIFIED: "bold red", EditStatus.ERROR: "bold red"})


def use_color(choice: str, stream: Any) -> bool:
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def _console(stream: Any, color: bool):
    from rich.console import Console

    return Console(
        file=stream,
        force_terminal=color,
        no_color=not color,
        highlight=False,
        soft_wrap=True,
        width=None if color else 200,
    )


# --- the progress line of long work (docs/usage.md, "Progress") --------------------------


def _progress_console() -> Any:
    """A rich console on stderr where a live line may be drawn, else None.

    stderr itself must be a terminal: ``FORCE_COLOR`` or ``TTY_COMPATIBLE=1``
    make rich treat a pipe as a terminal, and a live line's cursor codes must
    never reach a log. Then rich's own rule decides (``Console.is_interactive``):
    not under ``TERM=dumb`` or ``TERM=unknown``, nor ``TTY_INTERACTIVE=0``.
    ``NO_COLOR`` takes the colour away, as rich applies it, not the line.
    One line at a time: work inside another line's block shows none.
    rich is imported only here, so a piped run never loads it.
    """
    stream = getattr(sys.stderr, "rich_proxied_file", sys.stderr)  # under a live line, the stream beneath
    if _ACTIVE or not _isatty(stream):
        return None
    from rich.console import Console

    # The stream itself, not ``stderr=True``: that would follow ``sys.stderr`` into a
    # ``redirect_stderr`` of in-process work (tools/sweep.py) and draw the line there.
    console = Console(file=stream, highlight=False)
    return console if console.is_interactive else None


class ProgressLine:
    """What long work reports as it goes; it draws nothing unless :func:`progress` gave it a console.

    The line starts on the first report, so work that ends before it reports
    (a release already in the cache) shows nothing at all.
    """

    def __init__(self, label: str, total: int | None, console: Any, unit: str = "") -> None:
        self._label, self._total, self._console, self._unit = label, total, console, unit
        self._done, self._detail = 0, ""
        self._live: Any = None
        self._task: Any = None

    @property
    def shown(self) -> bool:
        return self._console is not None

    def advance(self, n: int = 1, detail: str = "") -> None:
        """``n`` more steps done; ``detail``: what runs now."""
        self.update(detail, self._done + n)

    def update(self, detail: str = "", done: int | None = None, total: int | None = None) -> None:
        """What runs now, and (when given) the steps done and the steps in all."""
        if self._console is None:
            return
        self._done = self._done if done is None else done
        self._total = self._total if total is None else total
        self._detail = detail
        if self._live is None:
            self._start()
        self._live.update(self._task, description=self._description(), completed=self._done, total=self._total)

    def _description(self) -> str:
        from rich.markup import escape

        count = (
            f" {self._done}/{self._total}" + (f" {self._unit}" if self._unit else "") if self._total is not None else ""
        )
        return escape(f"{self._label}{count}" + (f"  {self._detail}" if self._detail else ""))

    def _start(self) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        class CountedBar(BarColumn):
            """A bar only for steps that can be counted: the spinner alone says the rest is going."""

            def render(self, task: Any) -> Any:
                return super().render(task) if task.total is not None else ""

        self._live = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            CountedBar(bar_width=20),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,
            # stdout written meanwhile goes above the line when it is the same terminal; a piped
            # stdout is left alone (rich would send it to the stderr console otherwise).
            redirect_stdout=_isatty(sys.stdout),
            redirect_stderr=True,
        )
        self._task = self._live.add_task(self._description(), total=self._total)
        self._live.start()

    def close(self) -> None:
        """Clear the line (transient: the terminal is left as it would be without it)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self in _ACTIVE:
            _ACTIVE.remove(self)


#: The line being drawn, if any: rich draws one live display per terminal.
_ACTIVE: list[ProgressLine] = []


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextmanager
def progress(label: str, total: int | None = None, shown: bool = True, unit: str = "") -> Iterator[ProgressLine]:
    """A transient progress line on stderr for the work inside the block.

    ``label``: what the work is; ``total``: its steps (``unit``: what one is), or None (a spinner);
    ``shown=False`` (``--format json``) draws nothing, whatever stderr is.
    Nothing is drawn either when stderr is not an interactive terminal
    (:func:`_progress_console`). The line is cleared when the block ends, so
    stdout and every other stderr byte are what they are without it.
    """
    line = ProgressLine(label, total, _progress_console() if shown else None, unit)
    if line.shown:
        _ACTIVE.append(line)
    try:
        yield line
    finally:
        line.close()


def print_diff(text: str, color: str = "auto") -> None:
    if not text:
        return
    if not use_color(color, sys.stdout):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from rich.text import Text

    console = _console(sys.stdout, True)
    for line in text.splitlines():
        style = (
            "green"
            if line.startswith("+")
            else "red"
            if line.startswith("-")
            else "cyan"
            if line.startswith("@@")
            else ""
        )
        if line.startswith(("+++", "---")):
            style = "bold"
        console.print(Text(line, style=style))


def print_json(document: dict) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    sys.stdout.flush()


def print_report(output_format: str, code: int, as_json: Callable[[], dict], as_text: Callable[[], str]) -> int:
    """A report command's output on stdout: its JSON document or its text; returns ``code``."""
    if output_format == "json":
        print_json(as_json())
    else:
        sys.stdout.write(as_text())
        sys.stdout.flush()
    return code


def print_github(lines: Sequence[str]) -> None:
    """GitHub workflow commands (``::error file=...``) on stdout, never styled."""
    for line in lines:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()


def print_line(message: str) -> None:
    sys.stderr.write(message + "\n")


def hand_edit_lines(reports: Sequence[Mapping[str, FileReport]], replaced: Sequence[FileReport] = ()) -> list[str]:
    """What the files a run touches are against their pristine text (nothing when none could be had)."""
    known = [r for rep in reports for r in rep.values() if r.state != FileState.UNKNOWN]
    if not known:
        return []
    counts = {
        state: sum(r.state == state for r in known) for state in (FileState.PRISTINE, FileState.PATCHED, FileState.HAND)
    }
    origins = ", ".join(sorted({r.origin for r in known}))
    lines = [
        f"files against their pristine text ({origins}): "
        + ", ".join(f"{n} {state}" for state, n in counts.items() if n)
    ]
    dropped = {r.path for r in replaced}
    for r in known:
        if r.state != FileState.HAND:
            continue
        verb = (
            "replaced: these hand edits were dropped and the pristine file patched afresh"
            if r.path in dropped
            else "edited by hand"
        )
        lines.append(f"  {r.rel}: {verb}")
        for hunk in r.hunks:
            where = (
                f"at the {hunk.site} edit site"
                if hunk.site
                else "at no patchcraft edit site (apply --replace-hand-edits refuses this file)"
            )
            lines.append(f"    {hunk.label(r.rel)}: {where}")
    return lines


def print_hand_edits(
    reports: Sequence[Mapping[str, FileReport]],
    replaced: Sequence[FileReport] = (),
    show_diff: bool = False,
    color: str = "auto",
) -> None:
    """The files' states on stderr, and (``show_diff``) the hand diffs on stdout, before the run's own output."""
    for line in hand_edit_lines(reports, replaced):
        print_line(line)
    if show_diff:
        print_diff("".join(r.diff for rep in reports for r in rep.values() if r.state == FileState.HAND), color)


def print_results(results: Sequence[RunResult], color: str = "auto") -> None:
    """The human summary on stderr: a table for verify, one line per model otherwise.

    Without colour (a pipe, a hook, a CI log) it is plain text written
    directly: rich is imported only to style a terminal (docs/performance.md).
    """
    stream = sys.stderr
    if not use_color(color, stream):
        stream.write("".join(line + "\n" for line in plain_lines(results)))
        stream.flush()
        return
    from rich.markup import escape

    console = _console(stream, True)
    for result in results:
        console.print(_header(result), markup=False)
        if not result.models:
            console.print(_NO_MODELS, markup=False)
            continue
        if result.mode is Mode.VERIFY:
            _verify_table(console, result)
            continue
        for model in result.models:
            style = _STYLE.get(model.status, "")
            console.print(
                f"  [{style}]{model.status:<16}[/] {escape(model.model)}  {escape(message_of(model))}",
                markup=True,
                highlight=False,
            )
        for line in _change_lines(result):
            console.print(line, markup=False)


_NO_MODELS = "  no model class with set_eagle3_layers_to_capture in this target"
_COLUMNS = ("model", "status", "init", "setter", "forward", "compiles", "idempotent", "message")


def _header(result: RunResult) -> str:
    return f"{result.tree.engine} {result.version} at {result.tree.package}"


def _change_lines(result: RunResult) -> list[str]:
    verb = {Mode.APPLY: "Rewriting", Mode.REVERT: "Reverted"}.get(result.mode, "Would rewrite")
    return [f"{verb} {change.rel}" for change in result.changes]


def _verify_cells(model) -> list[str]:
    """One verify table row, unstyled: model, status, the three edits, compiles, idempotent, message."""
    cells = [_kind_status(model, k) for k in ("init", "setter", "forward")]
    return [
        model.model,
        ("not verified" if model.proof in WITHHELD else "verified")
        if model.status == ModelStatus.ALREADY
        else model.status,
        *[c if c != EditStatus.APPLIED else "missing" for c in cells],
        _yes_plain(model.compiles),
        _yes_plain(model.idempotent),
        message_of(model),
    ]


#: From worst to best: the status a column shows when a model has several edits of one kind
#: (the flag goes into every ``__init__`` that runs a patched forward).
_EDIT_ORDER = (EditStatus.ERROR, EditStatus.MODIFIED, EditStatus.APPLIED, EditStatus.HAND_APPLIED, EditStatus.PRESENT)


def _kind_status(model, kind: str) -> str:
    statuses = [e.status for e in model.edits if e.kind == kind]
    if not statuses:
        return "-"
    return min(statuses, key=lambda s: _EDIT_ORDER.index(s) if s in _EDIT_ORDER else 0)


def message_of(model) -> str:
    """A row's message, with the harness's verdict when it ran (or why not)."""
    if model.proof == Proof.HARNESS_SKIPPED and model.harness is not None and model.harness.message:
        return f"{model.message}; proof: {model.proof} ({model.harness.message})"
    return f"{model.message}; proof: {model.proof}" if model.proof else model.message


def plain_lines(results: Sequence[RunResult]) -> list[str]:
    """The summary as plain lines: the verify table's columns padded to their widest cell, never wrapped."""
    lines: list[str] = []
    for result in results:
        lines.append(_header(result))
        if not result.models:
            lines.append(_NO_MODELS)
            continue
        if result.mode is Mode.VERIFY:
            rows = [list(_COLUMNS)] + [_verify_cells(model) for model in result.models]
            widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
            lines.extend("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)
            continue
        lines.extend(f"  {model.status:<16} {model.model}  {message_of(model)}" for model in result.models)
        lines.extend(_change_lines(result))
    return lines


def _verify_table(console, result: RunResult) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_lines=False, pad_edge=False, box=None)
    for column in _COLUMNS:
        table.add_column(column, overflow="fold")
    for model in result.models:
        cells = _verify_cells(model)
        table.add_row(
            escape(cells[0]),
            f"[{_STYLE.get(model.status, '')}]{cells[1]}[/]",
            *[f"[{_EDIT_STYLE.get(c, 'yellow')}]{c}[/]" for c in cells[2:5]],  # "missing": yellow
            _yes(model.compiles),
            _yes(model.idempotent),
            escape(cells[7]),  # a message may hold "[...]", which is not markup
        )
    console.print(table)


def _yes_plain(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "[red]no[/]")


# --- patchcraft smoke --device cuda (sglang): the summary as text -------------------------


def render_cuda_smoke(summary: CudaSmokeSummary) -> str:
    """A :class:`patchcraft.harness.gpu_summary.CudaSmokeSummary` as the text docs/smoke.md shows (no trailing newline)."""
    lines = [f"patchcraft smoke (cuda, tp={summary.tp}): {'PASS' if summary.ok else 'FAIL'}"]
    result = summary.comparison
    if result is not None:
        lines.append(f"  target     {result.target}")
        lines.append(f"  draft      {result.draft}")
        lines.append(f"  layer ids  {list(result.layer_ids)} -> {result.expected}  (reference: {result.reference})")
        if result.sglang_version or result.sglang_file:
            lines.append(f"  sglang     {result.sglang_version} ({result.sglang_file})")
        if result.engine.get("allreduce_fusion"):
            lines.append(f"  allreduce  FlashInfer allreduce fusion: {result.engine['allreduce_fusion']}")
    for check in summary.checks:
        lines.append(f"  [{'ok' if check.ok else 'FAIL'}]{' ' if check.ok else ''} {check.name}: {check.message}")
    if result is not None:
        lines.extend(f"  info   {line}" for line in result.lossless.info)
        spec, base = result.speed.get("speculative") or {}, result.speed.get("baseline") or {}
        if spec:
            lines.append(
                f"  info   accept length {spec.get('accept_length')}, {spec.get('tokens_per_s')} tok/s "
                f"(baseline {base.get('tokens_per_s')} tok/s, batch 1)"
            )
    if summary.work_dir:
        lines.append(f"  files  {summary.work_dir}")
    if summary.out_dir:
        lines.append(f"  out    {summary.out_dir}")
    return "\n".join(lines)
