"""The one pipeline behind apply, check, diff, verify and revert."""

from __future__ import annotations

from dataclasses import dataclass
from patchcraft import output, report
from patchcraft.diffs import unified_diffs
from patchcraft.engine import Mode, RunResult, run, write_changes
from patchcraft.tree import resolve_target


@dataclass(frozen=True)
class Options:
    """Options shared by every pipeline command (one object, set once at the CLI edge)."""

    targets: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    output_format: str = "text"
    color: str = "auto"
    show_diff: bool = False


def run_pipeline(options: Options, mode: Mode) -> int:
    """Run ``mode`` on every target, write if asked, print, and return the exit code."""
    trees = [resolve_target(t) for t in options.targets] or [resolve_target(None)]
    results: list[RunResult] = [run(tree, mode, options.models) for tree in trees]
    if mode in (Mode.APPLY, Mode.REVERT):
        for result in results:
            write_changes(result.changes)
    explicit = bool(options.models) or any(t.only_files for t in trees)
    code = report.exit_code(results, explicit=explicit)
    diff_text = "".join(unified_diffs(r.changes) for r in results)
    if options.output_format == "json":
        document = report.to_json(results, code)
        if options.show_diff or mode is Mode.DIFF:
            document["diff"] = diff_text
        output.print_json(document)
        return code
    if options.show_diff or mode is Mode.DIFF:
        output.print_diff(diff_text, options.color)
    output.print_results(results, options.color)
    return code
