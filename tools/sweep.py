"""The release sweep: the real CLI over one SGLang release, and a record of what happened.

For one release, :func:`sweep_release` copies the pristine package to a
temporary directory and runs, in process through :func:`patchcraft.cli.main`
(the console script's own entry point, exit code from ``SystemExit``), with
``PATCHCRAFT_NO_CACHE=1``:

1. ``patchcraft apply DIR --format json``
2. ``patchcraft verify DIR --format json``
3. ``patchcraft smoke DIR --format json`` (only when torch is importable), then
   ``patchcraft smoke DIR --compile``: each patched forward under torch.compile(fullgraph=True)
4. ``patchcraft apply --check DIR --format json``
5. ``patchcraft revert DIR --format json``

then compares every file of the copy, byte for byte, with the pristine
package. The outcome is one :class:`ReleaseResult`; :meth:`ReleaseResult.problems`
says, one line each, what did not pass. ``scripts/sweep.py``,
tests/test_release_history.py and the new-release workflow all call
:func:`sweep_release`.

Statuses are read from the JSON documents as they come (``summary`` and
each model's ``status``), so a new status is counted without a change here;
only ``error``, ``patched``, ``already-patched`` and ``would-patch`` have a meaning to the
checks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from patchcraft.base.releases import version_key
from patchcraft.base.status import ModelStatus

#: Smoke verdicts (patchcraft.harness.runner); any other status is counted too.
SMOKE_STATUSES = ("pass", "fail", "error", "skipped")
#: Exit codes of a command that did not run to a verdict (patchcraft.base.errors: usage, bug).
BROKEN_CODES = (2, 3)


@dataclass(frozen=True)
class Limitation:
    """A smoke ``error`` that is known, named, and not a failure of the patch (xfail-style).

    It covers only an ``error`` row (never a ``fail``) of ``model``, in the
    releases from ``first`` to ``last``, whose message contains ``message``.
    """

    model: str  #: the model row (``module.Class``)
    first: str  #: the first release it applies to
    last: Optional[str]  #: the last one (None: every later release too)
    message: str  #: a part of the smoke row's message
    reason: str

    def covers(self, version: str, model: str, message: Optional[str] = None) -> bool:
        if model != self.model or version_key(version) < version_key(self.first):
            return False
        if message is not None and self.message not in message:
            return False
        return self.last is None or version_key(version) <= version_key(self.last)


#: Every named smoke limitation, with its reason: the one list the sweep, its test and the workflow use.
LIMITATIONS: tuple[Limitation, ...] = (
    # None today. The last one, qwen4_exp from 0.5.22 (its own forward did not run under the
    # stand-ins), went when the model became unsupported: its forward returns before the aux
    # states reach the draft. An entry looks like:
    # Limitation("module.Class", "0.5.22", None, "a part of the smoke message", "why it is not the patch"),
)


def limitation(version: str, row: Mapping[str, Any]) -> Optional[Limitation]:
    """The named limitation covering smoke ``row`` (a JSON row) of ``version``, if any."""
    if row.get("status") != "error":
        return None
    return next((lim for lim in LIMITATIONS if lim.covers(version, row["model"], row.get("message", ""))), None)


@dataclass
class Command:
    """One CLI run: its arguments, exit code, JSON document (None if stdout was not JSON) and stderr."""

    argv: tuple[str, ...]
    code: int
    document: Optional[dict]
    stderr: str
    seconds: float

    @property
    def name(self) -> str:
        return " ".join(a for a in self.argv if not a.startswith("/") and a not in ("--format", "json"))

    @property
    def models(self) -> list[dict]:
        return list((self.document or {}).get("models") or [])

    def by_status(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for model in self.models:
            counts[model["status"]] = counts.get(model["status"], 0) + 1
        return dict(sorted(counts.items()))

    def error_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""


@dataclass
class ReleaseResult:
    """What the sweep found for one release."""

    version: str
    apply: Command
    verify: Command
    smoke: Optional[Command]  #: None: torch is not importable, smoke not run
    check: Command
    revert: Command
    #: Files whose bytes differ from the pristine package after revert, or that exist on one side only.
    revert_differs: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: ``smoke --compile``: every patched forward under torch.compile(fullgraph=True) (None: not run).
    compiled: Optional[Command] = None

    # -- what the record says -------------------------------------------------

    @property
    def after_apply(self) -> dict[str, int]:
        """Model rows per status after ``apply``."""
        return self.apply.by_status()

    @property
    def error_rows(self) -> list[tuple[str, str]]:
        """(model, message) of every ``error`` row of apply, verify, check or revert."""
        rows = []
        for command in (self.apply, self.verify, self.check, self.revert):
            rows += [
                (f"{command.name}: {m['model']}", m.get("message", ""))
                for m in command.models
                if m["status"] == ModelStatus.ERROR
            ]
        return rows

    @property
    def unverified(self) -> list[str]:
        """Models apply patched that verify does not report verified, or reports patched but not verified."""
        verify = {m["model"]: m for m in self.verify.models}
        found = []
        for model in self.apply.models:
            if model["status"] == ModelStatus.PATCHED:
                row = verify.get(model["model"])
                if row is None or row["status"] != ModelStatus.ALREADY:
                    found.append(f"{model['model']} (verify: {row['status'] if row else 'no row'})")
        for row in self.verify.models:
            if row["status"] == ModelStatus.ALREADY and (
                row.get("compiles") is False or row.get("idempotent") is False
            ):
                found.append(f"{row['model']} (compiles={row.get('compiles')}, idempotent={row.get('idempotent')})")
        return found

    @property
    def check_clean(self) -> bool:
        """``apply --check`` after apply exits 0 and would change no file."""
        summary = (self.check.document or {}).get("summary") or {}
        return self.check.code == 0 and summary.get("files_changed", 1) == 0

    @property
    def revert_identical(self) -> bool:
        return self.revert.code == 0 and not self.revert_differs

    @property
    def smoke_rows(self) -> list[dict]:
        return list(((self.smoke.document or {}).get("smoke") or {}).get("models") or []) if self.smoke else []

    @property
    def smoke_counts(self) -> Optional[dict[str, int]]:
        """Smoke rows per status, named limitations counted apart (``limited``); None when not run."""
        if self.smoke is None:
            return None
        counts = {status: 0 for status in SMOKE_STATUSES}
        counts["limited"] = 0
        for row in self.smoke_rows:
            key = "limited" if limitation(self.version, row) else row["status"]
            counts[key] = counts.get(key, 0) + 1
        return counts

    @property
    def smoke_limited(self) -> list[tuple[str, str]]:
        """(model, reason) of each smoke row a named limitation covers."""
        return [
            (row["model"], lim.reason) for row in self.smoke_rows if (lim := limitation(self.version, row)) is not None
        ]

    @property
    def smoke_problems(self) -> list[tuple[str, str, str]]:
        """(model, status, message) of each smoke ``fail``/``error`` row no named limitation covers."""
        return [
            (row["model"], row["status"], row.get("message", ""))
            for row in self.smoke_rows
            if row["status"] in ("fail", "error") and not limitation(self.version, row)
        ]

    def problems(self) -> list[str]:
        """One line per thing that did not pass (empty: the release passes)."""
        found = []
        for command in (self.apply, self.verify, self.smoke, self.compiled, self.check, self.revert):
            if command is not None and (command.code in BROKEN_CODES or command.document is None):
                found.append(f"{command.name}: exit {command.code}, {command.error_line() or 'no JSON document'}")
        found += [f"{model}: error: {message}" for model, message in self.error_rows]
        found += [f"verify: not verified: {what}" for what in self.unverified]
        if not self.check_clean:
            would = [m["model"] for m in self.check.models if m["status"] == ModelStatus.WOULD]
            found.append(
                f"apply --check after apply: exit {self.check.code}, would change {', '.join(would) or 'files'}"
            )
        if not self.revert_identical:
            shown = ", ".join(self.revert_differs[:5]) + (
                f" and {len(self.revert_differs) - 5} more" if len(self.revert_differs) > 5 else ""
            )
            found.append(f"revert: exit {self.revert.code}, not byte-identical: {shown or 'no file listed'}")
        found += [f"smoke: {model}: {status}: {message}" for model, status, message in self.smoke_problems]
        found += [f"compile: {model}: {status}: {message}" for model, status, message in self.compile_problems]
        return found

    @property
    def compile_problems(self) -> list[tuple[str, str, str]]:
        """(model, status, message) of each ``smoke --compile`` row that failed or errored."""
        if self.compiled is None:
            return []
        rows = list(((self.compiled.document or {}).get("smoke") or {}).get("models") or [])
        return [
            (row["model"], row["status"], row.get("message", "")) for row in rows if row["status"] in ("fail", "error")
        ]

    @property
    def ok(self) -> bool:
        return not self.problems()

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "ok": self.ok,
            "after_apply": self.after_apply,
            "apply_exit": self.apply.code,
            "verify_exit": self.verify.code,
            "verify": self.verify.by_status(),
            "smoke": self.smoke_counts,
            "smoke_limited": [{"model": m, "reason": r} for m, r in self.smoke_limited],
            "check_clean": self.check_clean,
            "revert_identical": self.revert_identical,
            "revert_differs": self.revert_differs,
            "seconds": round(self.seconds, 2),
            "problems": self.problems(),
        }


# -- running the CLI ------------------------------------------------------------


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


@contextlib.contextmanager
def _no_cache() -> Any:
    old = os.environ.get("PATCHCRAFT_NO_CACHE")
    os.environ["PATCHCRAFT_NO_CACHE"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PATCHCRAFT_NO_CACHE", None)
        else:
            os.environ["PATCHCRAFT_NO_CACHE"] = old


def cli(*argv: str) -> Command:
    """``patchcraft ARGV`` in process: what the console script does, output captured."""
    from patchcraft.cli import main

    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with _no_cache(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    try:
        document = json.loads(out.getvalue())
    except ValueError:
        document = None
    return Command(
        tuple(argv), code, document if isinstance(document, dict) else None, err.getvalue(), time.perf_counter() - start
    )


def differing_files(pristine: Path, copy: Path) -> list[str]:
    """Relative paths whose bytes differ, or that exist on one side only (every file, recursively).

    A file is a regular file or a link (a link to a directory counts as one entry, never
    followed); two entries of the same size are compared byte for byte, and one that cannot
    be read as a file (a link to a directory) differs.
    """
    left, right = _entries(pristine), _entries(copy)
    differ = sorted(left.keys() ^ right.keys())
    differ += sorted(rel for rel in left.keys() & right.keys() if not _same_bytes(left[rel], right[rel]))
    return differ


def _entries(root: Path) -> dict[str, str]:
    """``{relative path: path}`` of every file and link under ``root`` (os.walk: a release has thousands)."""
    found: dict[str, str] = {}
    base = str(root)
    for directory, dirs, files in os.walk(base):
        rel = os.path.relpath(directory, base)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(directory, d))]:
            found[os.path.normpath(os.path.join(rel, name))] = os.path.join(directory, name)
    return found


def _same_bytes(one: str, other: str) -> bool:
    try:
        if os.stat(one).st_size != os.stat(other).st_size:
            return False
        with open(one, "rb") as a, open(other, "rb") as b:
            return a.read() == b.read()
    except OSError:
        return False


def sweep_release(
    version: str,
    pristine: Optional[Path] = None,
    smoke: Optional[bool] = None,
    after: Optional[Mapping[str, Callable[[Path], None]]] = None,
    on_step: Optional[Callable[[str], None]] = None,
    prove: Optional[bool] = None,
) -> ReleaseResult:
    """Apply, verify, smoke, check and revert ``version`` on a temporary copy; compare with the pristine package.

    ``pristine``: the release's package root (default: fetched into the
    cache, as the tests do). ``smoke``: run the CPU smoke (default: when
    torch is importable). ``prove``: let ``apply`` run the harness before it
    writes, as a user's apply does (default: when torch is importable);
    ``False`` is ``apply --no-smoke``: the static sweep, or a sweep whose own
    smoke step runs the same harness on the same patched tree right after. ``after``: ``{step: function}``, each called with
    the copied package right after that step (``apply``, ``verify``,
    ``smoke``, ``check``): the tests use it to break a release on purpose.
    ``on_step``: called with each command line as it starts (the progress line).
    """
    from patchcraft.base.fetch import cache_dir, fetch

    if pristine is None:
        said = on_step
        pristine = fetch(
            version,
            cache_dir() / "test-releases" / version,
            on_step=None if said is None else lambda detail: said(f"{version}: {detail}"),
        )
    run_smoke = torch_available() if smoke is None else smoke
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"sweep-{version}-") as tmp:
        package = Path(tmp) / "sglang"
        shutil.copytree(pristine, package, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        target = str(package)
        hooks = dict(after or {})

        def step(name: str, *argv: str) -> Command:
            if on_step is not None:
                on_step(f"{version}: {' '.join(argv)}")
            command = cli(*argv, target, "--format", "json")
            if name in hooks:
                hooks.pop(name)(package)
            return command

        apply = step("apply", "apply", *(() if (torch_available() if prove is None else prove) else ("--no-smoke",)))
        verify = step("verify", "verify")
        smoked = step("smoke", "smoke") if run_smoke else None
        # SGLang compiles the forward (--enable-torch-compile, piecewise CUDA graphs): no graph break may come from the patch.
        compiled = step("compile", "smoke", "--compile") if run_smoke else None
        check = step("check", "apply", "--check")
        if hooks:
            raise ValueError(f"no step named {', '.join(hooks)} (apply, verify, smoke, compile, check)")
        if on_step is not None:
            on_step(f"{version}: revert")
        revert = cli("revert", target, "--format", "json")
        # Every file, the release's and any a command left (a backup, a __pycache__): all must match.
        differs = differing_files(Path(pristine), package)
    return ReleaseResult(version, apply, verify, smoked, check, revert, differs, time.perf_counter() - start, compiled)


def sweep(
    versions: Iterable[str], report: Optional[Callable[[ReleaseResult], None]] = None, **options: Any
) -> list[ReleaseResult]:
    """:func:`sweep_release` on each version in turn, with a progress line on an interactive stderr (releases done of all)."""
    from patchcraft.ui import console

    versions = list(versions)
    results: list[ReleaseResult] = []
    with console.progress("sweep", total=len(versions), unit="releases") as status:
        for version in versions:
            status.update(version, len(results))
            result = sweep_release(version, on_step=lambda detail: status.update(detail, len(results)), **options)
            results.append(result)
            if report is not None:
                report(result)
    return results


# -- one row per release -----------------------------------------------------------


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {status}" for status, n in counts.items() if n) or "none"


def smoke_cell(result: ReleaseResult) -> str:
    counts = result.smoke_counts
    if counts is None:
        return "not run (no torch)"
    cell = "/".join(str(counts.get(s, 0)) for s in SMOKE_STATUSES)
    extra = {k: v for k, v in counts.items() if k not in SMOKE_STATUSES and k != "limited" and v}
    if extra:
        cell += " + " + _counts(extra)
    return cell


def limited_cell(result: ReleaseResult) -> str:
    return ", ".join(f"`{model}`" for model, _ in result.smoke_limited) or "—"


HISTORY_COLUMNS = (
    "release",
    "rows",
    "after apply",
    "verify exit",
    "smoke pass/fail/error/skipped",
    "named limitations",
    "`apply --check` after apply",
    "revert byte-identical",
    "passes",
)


def history_cells(result: ReleaseResult) -> tuple[str, ...]:
    """The docs row of one release (no times: the page must not change between equal runs)."""
    return (
        result.version,
        str(sum(result.after_apply.values())),
        _counts(result.after_apply),
        str(result.verify.code),
        smoke_cell(result),
        limited_cell(result),
        "nothing to change" if result.check_clean else f"exit {result.check.code}",
        "yes" if result.revert_identical else f"no ({len(result.revert_differs)} files)",
        "yes" if result.ok else "**no**",
    )


def history_row(result: ReleaseResult) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in history_cells(result)) + " |"


def text_row(result: ReleaseResult) -> str:
    """The line scripts/sweep.py prints per release."""
    verdict = "ok  " if result.ok else "FAIL"
    return (
        f"{verdict} {result.version:<12} {result.seconds:6.1f}s  apply: {_counts(result.after_apply)}; "
        f"verify exit {result.verify.code}; smoke {smoke_cell(result)}"
        + (f" ({len(result.smoke_limited)} limited)" if result.smoke_limited else "")
        + f"; check {'clean' if result.check_clean else 'NOT clean'}; revert {'identical' if result.revert_identical else 'DIFFERS'}"
    )


# -- the release-history section of docs/coverage.md ----------------------------------

START = (
    "<!-- release-history:start (generated by scripts/sweep.py --write-docs; scripts/coverage_table.py keeps it) -->"
)
END = "<!-- release-history:end -->"

HISTORY_INTRO = """## Every release: the sweep

Generated by `python scripts/sweep.py --all --write-docs` (`--write-docs`
with named releases replaces just their rows); `scripts/coverage_table.py`
keeps this section as it is. For each release, on a copy of its package:
`patchcraft apply`, `verify`, `smoke` (the CPU harness), `apply --check`,
`revert`, each `--format json`, then every file compared byte for byte
with the release. tests/test_release_history.py runs the same sweep on one
release per minor version; the new-release workflow runs it on the newest
release on the package index every day.

- **rows**: model rows, with the `runner` row (the CUDA-graph fix of
  0.4.10 to 0.5.10, `not-needed` elsewhere) where the release has a model
  runner. **after apply**: rows per status. **verify exit**: `verify`'s
  exit code, recorded and not judged here (its meaning: docs/usage.md).
- **smoke**: rows per verdict; a smoke `error` a named limitation covers
  (listed below with its reason, from `tools/sweep.py`) is counted
  under **named limitations**, not as an error.
- **passes**: no `error` row, every model apply patched verified, nothing
  left for `apply --check`, revert byte-identical, and no smoke `fail` or
  `error` that is not a named limitation.
"""


def _table_rows(section: str) -> dict[str, str]:
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| release |"):
            version = line[2:].split(" |", 1)[0].strip()
            try:
                version_key(version)
            except ValueError:
                continue
            rows[version] = line
    return rows


def history_section(rows: dict[str, str]) -> str:
    """The whole marked section for ``{version: docs row}``, oldest release first."""
    lines = [START, "", HISTORY_INTRO, "| " + " | ".join(HISTORY_COLUMNS) + " |", "|" + "---|" * len(HISTORY_COLUMNS)]
    lines += [rows[v] for v in sorted(rows, key=version_key)]
    lines += ["", "Named limitations:", ""]
    lines += [
        f"- `{lim.model}`, {lim.first}{' and later' if lim.last is None else ' to ' + lim.last}"
        f" (smoke error: {lim.message}): {lim.reason}."
        for lim in LIMITATIONS
    ] or ["- none."]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def split_page(text: str) -> tuple[str, Optional[str], str]:
    """(before, the marked section or None, after) of docs/coverage.md."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        return text, None, ""
    end += len(END)
    if text[end : end + 1] == "\n":
        end += 1
    return text[:start], text[start:end], text[end:]


def history_rows(text: str) -> dict[str, str]:
    """``{version: row}`` of the release-history table in a docs/coverage.md text."""
    _, section, _ = split_page(text)
    return _table_rows(section or "")


def write_history(page: Path, results: Sequence[ReleaseResult]) -> None:
    """Put ``results``' rows into the release-history section of ``page`` (other rows kept)."""
    text = page.read_text(encoding="utf-8") if page.is_file() else ""
    before, section, after = split_page(text)
    rows = _table_rows(section or "")
    rows.update({r.version: history_row(r) for r in results})
    if section is None:
        before = before.rstrip("\n") + "\n\n" if before.strip() else ""
    page.write_text(before + history_section(rows) + after, encoding="utf-8")
