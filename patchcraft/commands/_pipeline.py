"""A pipeline command's output: what :func:`patchcraft.pipeline.stages.run_trees` returned, rendered."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from patchcraft.engine.diffs import unified_diffs
from patchcraft.engine.records import Mode, RunResult
from patchcraft.pipeline.hand_review import JUDGED
from patchcraft.pipeline.stages import Options, run_trees
from patchcraft.ui import console, machine_output


def warn_unserved(results: Sequence[RunResult], options: Options, mode: Mode) -> None:
    """One line for the unsupported models that do not fail this run (docs/usage.md, exit codes)."""
    if mode in (Mode.REVERT, Mode.DIFF):
        return
    skipped = machine_output.unserved(results, options.models, options.strict)
    if skipped:
        names = ", ".join(m.model for m in skipped[:4]) + (", ..." if len(skipped) > 4 else "")
        console.print_line(
            f"patchcraft: warning: {len(skipped)} unsupported model(s) not patched ({names}); "
            "name one with --model, or pass --strict, to make that fail the run"
        )


def run_pipeline(options: Options, mode: Mode) -> int:
    """Run ``mode`` on every target, write if asked, print, and return the exit code."""
    done = run_trees(options, mode)
    results, hand, code = list(done.results), done.hand, done.code

    def diff_text() -> str:  # only when shown: difflib over a whole unpatched tree takes a while
        return "".join(unified_diffs(r.changes) for r in results)

    if options.output_format == "json":
        files = machine_output.files_json(hand.reports, hand.replaced) if mode in JUDGED else None
        diff = diff_text() if options.show_diff or mode is Mode.DIFF else None
        console.print_json(machine_output.to_json(results, code, files, diff))
        return code
    console.print_hand_edits(
        hand.reports, hand.replaced, show_diff=options.show_diff or mode is Mode.VERIFY, color=options.color
    )
    if options.show_diff or mode is Mode.DIFF:
        console.print_diff(diff_text(), options.color)
    console.print_results(results, options.color)
    warn_unserved(results, options, mode)
    if options.output_format == "github":
        # Annotations on stdout, after the human summary (stderr) the log also shows.
        console.print_github(machine_output.github_lines(results, code, base=Path.cwd()))
    return code
