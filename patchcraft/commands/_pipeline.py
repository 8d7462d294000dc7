"""The one pipeline behind apply, check, diff, verify and revert."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from patchcraft import lock, output, report
from patchcraft.diffs import unified_diffs
from patchcraft.engine import Mode, RunResult, run, write_changes
from patchcraft.sources import remove_stale_temp_files
from patchcraft.tree import SglangTree, resolve_target


@dataclass(frozen=True)
class Options:
    """Options shared by every pipeline command (one object, set once at the CLI edge)."""

    targets: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    output_format: str = "text"
    color: str = "auto"
    show_diff: bool = False
    #: Also make CUDA-graph capture use the configured ids (``--no-runner`` turns it off).
    runner: bool = True


def _run_and_write(trees: Sequence[SglangTree], mode: Mode, models: Sequence[str], runner: bool = True) -> list[RunResult]:
    """Read, transform and (for apply/revert) write, holding each tree's lock throughout.

    The lock covers the reads too: a second run waits, then reads what the
    first one wrote. Every check that can refuse runs before the first
    write, and all files of all trees are written together or not at all.
    """
    writes = mode in (Mode.APPLY, Mode.REVERT)
    with lock.hold([t.models_dir for t in trees] if writes else [], on_wait=output.print_line):
        if writes:
            remove_stale_temp_files(t.models_dir for t in trees)
        results = [run(tree, mode, models, runner=runner) for tree in trees]
        if writes:
            for result in results:
                for change in result.changes:
                    result.tree.check_inside(change.source.path)
            write_changes([change for result in results for change in result.changes])
    return results


def run_pipeline(options: Options, mode: Mode) -> int:
    """Run ``mode`` on every target, write if asked, print, and return the exit code."""
    trees = [resolve_target(t) for t in options.targets] or [resolve_target(None)]
    results = _run_and_write(trees, mode, options.models, options.runner)
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
