"""A run's exit code, its JSON document and its GitHub annotations, decided from its records.

0: clean, or done. 1: would change, not patched, or not verified.
2: usage or environment error (target not found, anchor missing or
ambiguous, syntax error, unwritable file). The codes themselves are
:mod:`patchcraft.base.errors`'s, which also has those of an interrupt (130) and
a bug (3), set by the CLI's error handler.

Every exit code a command returns is decided here, from its records:
:func:`exit_code` for a run's rows (the pipeline commands, ``smoke`` and
``verify --smoke``), :func:`verdict_code` for a report with one verdict
(``check-draft``, ``explain``, the GPU smoke). A command with nothing to
judge (``list``, ``cache prune``, ``overlay build``) exits :data:`OK`. The
other documents are built in :mod:`patchcraft.ui.documents`, all under
:data:`SCHEMA_VERSION`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from patchcraft import __version__
from patchcraft.base.errors import CHANGED, OK, USAGE
from patchcraft.planning.selection import is_named
from patchcraft.engine.records import EditResult, Mode, ModelResult, RunResult
from patchcraft.base.tree_version import TreeVersion
from patchcraft.base.status import (
    EDIT_IN_PLACE,
    MODEL_DONE,
    MODEL_SKIPPED,
    EditStatus,
    FileState,
    HarnessStatus,
    ModelStatus,
    Proof,
    WITHHELD,
)

if TYPE_CHECKING:
    from patchcraft.engine.hand_edits import (
        FileReport,
    )  # types only: a warm `patchcraft run` never loads the class graph
    from patchcraft.harness.runner import SmokeRun

#: The version of every JSON document patchcraft prints (docs/json.md).
SCHEMA_VERSION = 1


def exit_code(
    results: Sequence[RunResult],
    names: Sequence[str] = (),
    strict: bool = False,
    *,
    fail_on_change: bool = False,
    smoke: Sequence[SmokeRun] = (),
) -> int:
    """The exit code for one command over all its targets.

    A model patchcraft cannot patch (``unsupported``) fails the run only when
    the user says they serve it: named with ``--model``, or ``--strict``.
    ``not-applicable`` rows (no EAGLE-3 target at all) never do.
    ``fail_on_change`` (``apply --exit-non-zero-on-fix``): an otherwise clean
    apply that rewrote a file exits 1, as formatters do under pre-commit.
    ``smoke``: the CPU harness's runs (``smoke``, ``verify --smoke``): an
    otherwise clean run exits 1 when a model class failed, or could not be run.
    """
    code = _rows_code(results, names, strict)
    if code != OK:
        return code
    if fail_on_change and any(r.changes for r in results if r.mode is Mode.APPLY):
        return CHANGED
    if smoke_failed(smoke):
        return CHANGED
    return OK


def _rows_code(results: Sequence[RunResult], names: Sequence[str], strict: bool) -> int:
    """The code the model rows alone decide."""
    models = [m for r in results for m in r.models]
    if any(m.status == ModelStatus.ERROR and not _only_brought_along(m, names) for m in models):
        # That model's, not the run's: the others were judged and (apply) written; ``written`` lists what was.
        # Exit 2 stays "nothing written": a usage or environment error stops the run before any write.
        return CHANGED
    if any(m.proof in WITHHELD for m in models):
        return CHANGED  # not written (apply) or not verified (verify): the harness failed it
    mode = results[0].mode if results else Mode.VERIFY
    served = [m for m in models if m.status == ModelStatus.UNSUPPORTED and (strict or is_named(m.model, names))]
    if mode is Mode.CHECK and any(m.status == ModelStatus.WOULD for m in models):
        return CHANGED
    if mode is Mode.VERIFY and any(not verified(m) and m.status not in MODEL_SKIPPED for m in models):
        return CHANGED
    if mode in (Mode.APPLY, Mode.CHECK, Mode.VERIFY) and served:
        return CHANGED
    return OK


def smoke_failed(runs: Sequence[SmokeRun]) -> bool:
    """Whether any model class of the harness's runs failed, or could not be run by the harness."""
    return any(row.status in (HarnessStatus.FAIL, HarnessStatus.ERROR) for run in runs for row in run.results)


def verdict_code(ok: bool) -> int:
    """The exit code of a report with one verdict: 0 when its checks pass, 1 when not.

    ``check-draft`` (the draft is fed what it was trained on), ``explain``
    (no id warns: ``verdict_code(not result.warnings)``) and the GPU smoke
    (every check passed).
    """
    return OK if ok else CHANGED


def _only_brought_along(model: ModelResult, names: Sequence[str]) -> bool:
    """A model ``--model`` did not name, in the run only because it shares a file with one it did (``included_by``).

    Its ``error`` row is shown, and fails nothing: naming the models you serve
    is how a model that cannot be patched is left out.
    """
    return bool(names) and model.included_by is not None and not is_named(model.model, names)


def unserved(results: Sequence[RunResult], names: Sequence[str] = (), strict: bool = False) -> list[ModelResult]:
    """Unsupported models that do not fail the run (they get one warning line)."""
    if strict:
        return []
    return [
        m for r in results for m in r.models if m.status == ModelStatus.UNSUPPORTED and not is_named(m.model, names)
    ]


def verified(model: ModelResult) -> bool:
    return model.status in MODEL_DONE and model.compiles is not False and model.proof not in WITHHELD


class Locator:
    """Line numbers of classes and methods, read from the files as they are now.

    A plain text scan, not a parse: it runs after ``apply`` wrote (so lines
    are those of the new text) and must cost next to nothing. ``None`` means
    not found, never a guess.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lines: dict[str, list[str]] = {}

    def line(self, rel: str, cls: str, method: str | None = None) -> int | None:
        lines = self._read(rel)
        start = next((i for i, text in enumerate(lines) if re.match(rf"class\s+{re.escape(cls)}\b", text)), None)
        if start is None or method is None:
            return None if start is None else start + 1
        found: list[tuple[int, int]] = []
        pattern = re.compile(rf"(\s+)(?:async\s+)?def\s+{re.escape(method)}\s*\(")
        for i in range(start + 1, len(lines)):
            if re.match(r"(?:class|def|async\s+def|@)\b|[A-Za-z_]", lines[i]):
                break  # the next top-level statement ends the class body
            match = pattern.match(lines[i])
            if match:
                found.append((len(match.group(1)), i + 1))
        return min(found)[1] if found else None

    def _read(self, rel: str) -> list[str]:
        if rel not in self._lines:
            try:
                text = (self.root / rel).read_text(encoding="utf-8-sig", errors="replace")
            except OSError:
                text = ""
            self._lines[rel] = text.splitlines()
        return self._lines[rel]


#: The note a ``harness-skipped`` row carries in JSON: why the harness did not run this class itself.
HARNESS_SKIPPED_NOTE = "harness-skipped: "


def _proof_notes(model: ModelResult) -> list[str]:
    """Why a written row is ``harness-skipped`` (the harness's words, as the text's ``proof:`` says them)."""
    if model.proof == Proof.HARNESS_SKIPPED and model.harness is not None and model.harness.message:
        return [f"{HARNESS_SKIPPED_NOTE}{model.harness.message}"]
    return []


def model_json(model: ModelResult) -> dict[str, Any]:
    return {
        "path": model.path,
        "model": model.model,
        "status": model.status,
        "edits": [
            {
                "kind": e.kind,
                "transform": e.transform,
                "file": e.file,
                "class": e.cls,
                "method": e.method,
                "status": e.status,
                "detail": e.detail,
            }
            for e in model.edits
        ],
        "files": list(model.files),
        "compiles": model.compiles,
        "idempotent": model.idempotent,
        "notes": list(model.notes) + _proof_notes(model),
        "message": model.message,
        "included_by": model.included_by,
        "proof": model.proof,
    }


def summary(results: Sequence[RunResult], code: int) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for result in results:
        for model in result.models:
            counts[model.status] = counts.get(model.status, 0) + 1
    return {
        "models": sum(counts.values()),
        "by_status": dict(sorted(counts.items())),
        "files_changed": sum(len(r.changes) for r in results),
        "written": written(results),
        "exit_code": code,
    }


def version_json(version: str) -> dict[str, Any]:
    """A target's ``sglang_version`` (docs/json.md) from a record's version.

    A version read by :attr:`SglangTree.version` carries its record
    (``VersionLabel.info``): a tree without a version file adds where the
    version came from (``sglang_version_source``, the closest release and
    its counts), and ``sglang_version`` holds the bare version (``unknown``,
    the ``git describe`` line). A version file's version is the string
    alone, as it always was.
    """
    info = getattr(version, "info", None)
    if not isinstance(info, TreeVersion) or not info.as_json():
        return {"sglang_version": str(version)}
    return {"sglang_version": info.version, **info.as_json()}


def written(results: Sequence[RunResult]) -> list[str]:
    """The files a run wrote (apply and revert write their changes; the other modes write nothing)."""
    return [str(c.rel) for r in results if r.mode in (Mode.APPLY, Mode.REVERT) for c in r.changes]


def to_json(
    results: Sequence[RunResult],
    code: int,
    files: Optional[list[dict[str, Any]]] = None,
    diff: Optional[str] = None,
) -> dict[str, Any]:
    """The document printed by ``--format json`` (documented in docs/json.md); ``files`` (:func:`files_json`) for
    verify and apply, ``diff`` when the diff is shown."""
    document: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "patchcraft": __version__,
        "command": results[0].mode.value if results else None,
        "targets": [
            {"root": str(r.tree.root), "package": str(r.tree.package), **version_json(r.version)} for r in results
        ],
        "models": [model_json(m) for r in results for m in r.models],
        "summary": summary(results, code),
    }
    if files is not None:
        document["files"] = files
    if diff is not None:
        document["diff"] = diff
    return document


def files_json(
    reports: Sequence[Mapping[str, FileReport]], replaced: Sequence[FileReport] = ()
) -> list[dict[str, Any]]:
    """The ``files`` of a verify or apply document: each model file against its pristine text (docs/json.md)."""
    dropped = {r.path for r in replaced}
    return [
        {
            "path": r.rel,
            "state": r.state,
            "pristine_from": r.origin if r.state != FileState.UNKNOWN else None,
            "reason": r.origin if r.state == FileState.UNKNOWN else None,
            "hunks": [
                {
                    "first": h.first,
                    "last": h.last,
                    "where": h.where,
                    "site": h.site,
                    "label": h.label(r.rel),
                    "lines": list(h.lines),
                }
                for h in r.hunks
            ],
            "hand_diff": r.diff,
            "replaced": r.path in dropped,
        }
        for rep in reports
        for r in rep.values()
    ]


# -- GitHub workflow commands (``--format github``, documented in docs/json.md) --


def github_lines(results: Sequence[RunResult], code: int = OK, base: Path | None = None) -> list[str]:
    """``::error file=...,line=...::message`` lines: one per model that needs attention.

    Paths are relative to ``base`` (the job's working directory, normally the
    repository root) when the file lies under it, so GitHub can place the
    annotation in the file view; otherwise they are absolute. ``code`` (the
    run's exit code) is taken for symmetry with :func:`to_json`; each
    model's level follows from its own status.
    """
    lines: list[str] = []
    for result in results:
        locator = Locator(result.tree.root)
        for model in result.models:
            level = _level(result.mode, model)
            if level is None:
                continue
            rel, line = _location(model, locator)
            path = _display_path(result.tree.root / rel, base)
            lines.append(_command(level, path, line, f"patchcraft {result.mode.value}", _problem(model)))
    return lines


def _level(mode: Mode, model: ModelResult) -> str | None:
    """error for what fails verify, --check or any run; warning for what only needs a look."""
    if model.status == ModelStatus.ERROR:
        return "error"
    if model.status == ModelStatus.NOT_APPLICABLE:
        return None
    if mode is Mode.VERIFY and model.status != ModelStatus.UNSUPPORTED:
        return None if verified(model) else "error"
    if model.status == ModelStatus.UNSUPPORTED:
        return "warning"
    if model.status == ModelStatus.WOULD:
        return "error" if mode is Mode.CHECK else "warning"
    if model.status in (ModelStatus.PATCHED, ModelStatus.REVERTED):
        return "notice"
    return None


def _missing(edit: EditResult) -> bool:
    """Whether this edit is what the annotation is about (absent, or just added)."""
    return edit.status not in EDIT_IN_PLACE


def _location(model: ModelResult, locator: Locator) -> tuple[str, int | None]:
    edit = next((e for e in model.edits if _missing(e)), None)
    if edit is not None:
        line = locator.line(edit.file, edit.cls, edit.method) or locator.line(edit.file, edit.cls)
        return edit.file, line
    return model.path, locator.line(model.path, _class_of(model))


def _problem(model: ModelResult) -> str:
    if model.status in (ModelStatus.ERROR, ModelStatus.UNSUPPORTED, ModelStatus.REVERTED):
        return f"{model.model}: {model.status}: {model.message}"
    if model.proof in WITHHELD or any(e.status == EditStatus.HAND_APPLIED for e in model.edits):
        return f"{model.model}: {model.status}: {model.message}"  # the harness's words and, for a hand fix, what to do
    edits = [_describe(e, model) for e in model.edits if _missing(e)]
    if model.status == ModelStatus.PATCHED:
        return f"{model.model}: patched: added {', '.join(edits)}"
    if edits:
        return f"{model.model}: missing {', '.join(edits)}"
    if model.compiles is False:
        return f"{model.model}: patched, but {', '.join(model.files)} does not compile"
    return f"{model.model}: {model.status}: {model.message}"


def _describe(edit: EditResult, model: ModelResult) -> str:
    where = f"{edit.cls}.{edit.method}" + ("" if edit.file == model.path else f" in {Path(edit.file).name}")
    if edit.status == EditStatus.APPLIED:
        return f"{edit.kind} ({where})"
    return f"{edit.kind} ({where}: {edit.status}{': ' + edit.detail if edit.detail else ''})"


def _class_of(model: ModelResult) -> str:
    return model.model.rsplit(".", 1)[-1]


def _display_path(path: Path, base: Path | None) -> str:
    if base is not None:
        try:
            return path.resolve().relative_to(base.resolve()).as_posix()
        except ValueError:
            pass
    return path.as_posix()


def _command(level: str, path: str | None, line: int | None, title: str, message: str) -> str:
    props = [f"file={_escape(path, True)}"] if path else []
    if path and line:
        props.append(f"line={line}")
    props.append(f"title={_escape(title, True)}")
    return f"::{level} {','.join(props)}::{_escape(message, False)}"


def _escape(value: str, prop: bool) -> str:
    """GitHub's workflow-command escaping (properties also escape ':' and ',')."""
    value = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return value.replace(":", "%3A").replace(",", "%2C") if prop else value
