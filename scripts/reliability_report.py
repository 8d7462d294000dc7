#!/usr/bin/env python
"""Regenerate docs/reliability.md from the reliability tests' own figures.

    python scripts/reliability_report.py            # run tests/reliability, write the page
    python scripts/reliability_report.py --figures DIR   # render figures already collected

The tests under tests/reliability store what they measured (runs, outcomes,
files lost) as JSON when ``PATCHCRAFT_RELIABILITY_FIGURES`` names a
directory; this script sets it, runs them, and renders the tables. The run
fails (and the page is not written) when any test fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reliability.md"
FIGURES_ENV = "PATCHCRAFT_RELIABILITY_FIGURES"


def collect(directory: Path, extra: list[str]) -> float:
    """Run the reliability tests, storing their figures in ``directory``; the wall time."""
    env = {**os.environ, FIGURES_ENV: str(directory)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "", "tests/reliability", *extra],
        cwd=ROOT,
        env=env,
    )
    if done.returncode != 0:
        sys.exit(f"reliability tests failed (exit {done.returncode}); docs/reliability.md not written")
    wall = time.monotonic() - started
    (directory / "_suite.json").write_text(json.dumps({"seconds": round(wall, 1)}) + "\n")
    return wall


def load(directory: Path) -> dict:
    return {path.stem: json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))}


def _counts(mapping: dict) -> str:
    return ", ".join(f"{key}: {value}" for key, value in sorted(mapping.items(), key=lambda kv: -kv[1])) or "-"


def code(text: str) -> str:
    """``text`` as a Markdown code span (longer fences when it holds backticks)."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def table(rows: list[list], header: list[str]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines + [""]


def summary_rows(f: dict) -> list[list]:
    rows = []
    crash = f.get("crash")
    if crash:
        rerun = f"{crash['distinct_post_kill_states_rerun']} distinct post-kill states re-run: {crash['distinct_post_kill_states_rerun'] - crash['rerun_failures']} completed the job"
        rows.append(
            [
                "SIGKILL during `apply` (CLI entry point, forked)",
                crash["runs"],
                _counts(crash["outcomes"]) + "; " + rerun,
                crash["lost"],
            ]
        )
        console = crash.get("console_script")
        if console:
            rows.append(
                [
                    "SIGKILL of `python -m patchcraft apply`",
                    console["runs"],
                    _counts(console["outcomes"]) + "; each re-run completed the job",
                    console["lost"],
                ]
            )
    self_test = f.get("crash_self_test")
    if self_test:
        rows.append(
            [
                "control: the same kills against an in-place (non-atomic) writer",
                self_test["runs"],
                f"torn files detected: {self_test['lost']} (the check works)",
                "n/a (control)",
            ]
        )
    conc = f.get("concurrency", {})
    shared = conc.get("two applies, different models, shared file")
    if shared:
        rows.append(
            [
                "two `apply` at once (`--model qwen2`, `--model qwen3`, shared qwen2.py)",
                shared["rounds"],
                f"both exit 0 every round; waits announced: {shared['waits']}; tree = the two runs one after the other",
                0,
            ]
        )
    both = conc.get("apply and revert at once")
    if both:
        rows.append(
            [
                "`apply` and `revert` at once",
                both["rounds"],
                "final tree: " + _counts(both["final"]) + "; mixed trees: 0",
                0,
            ]
        )
    refusals = f.get("refusals", {})
    if refusals:
        rows.append(
            [
                "refusals (bad input, faults)",
                len(refusals),
                f"exit 2 in all {len(refusals)}; files changed: {sum(r.get('files_changed', 0) for r in refusals.values())}",
                0,
            ]
        )
    hand = f.get("hand_edits", {})
    combos = {
        k: v
        for k, v in hand.items()
        if isinstance(v, dict) and "outcome" in v and " " in k and k.split()[0][0].isdigit()
    }
    if combos:
        rows.append(
            [
                "sed hand fix, every combination of its three edits (0.5.6, 0.5.10)",
                len(combos),
                _counts(_tally(v["outcome"] for v in combos.values())) + "; second insertions: 0",
                0,
            ]
        )
    fuzz = f.get("fuzz")
    if fuzz:
        rows.append(
            [
                "fuzzing: structural mutations of real files",
                fuzz["cases"],
                _counts(fuzz["verdicts"]) + f"; violations: {fuzz['violations']}",
                fuzz["violations"],
            ]
        )
    revert = f.get("revert")
    if revert:
        files = sum(r["files"] for r in revert.values())
        patched = sum(r["patched_by_apply"] for r in revert.values())
        bad = sum(r["not_identical_after_revert"] for r in revert.values())
        rows.append(
            [
                f"`apply` then `revert`, {len(revert)} releases",
                f"{files} files",
                f"{patched} patched and reverted; byte-identical: {files - bad} of {files}",
                bad,
            ]
        )
    return rows


def _tally(values) -> dict:
    counts: dict = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def render(f: dict, wall: float | None) -> str:
    out = [
        "# Reliability: faults, bad input and hand-edited files",
        "",
        "<!-- Generated by scripts/reliability_report.py from the figures tests/reliability measures. Do not edit. -->",
        "",
        "patchcraft edits files inside a serving stack, so every guarantee below is a test in",
        "`tests/reliability/` that measures it; this page shows the figures of one run of those tests",
        "(`python scripts/reliability_report.py` runs them again and rewrites it). **Lost** counts",
        "files that ended neither byte-identical to the original nor to the fully patched version,",
        "files missing, doubled insertions, or broken files left with exit 0. It must be 0 everywhere.",
        "",
    ]
    out += table(summary_rows(f), ["fault or input", "runs / cases", "outcomes", "lost"])
    out += _crash(f) + _concurrency(f) + _refusals(f) + _hand(f) + _properties(f) + _fuzz(f) + _revert(f)
    environment = f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
    wall = wall if wall is not None else f.get("_suite", {}).get("seconds")
    if wall is not None:
        environment += f", {wall:.0f} s for the whole reliability suite, on a machine shared with other work"
    out += ["## Where these figures come from", "", f"One run of `tests/reliability` ({environment}).", ""]
    return "\n".join(out).rstrip() + "\n"


def _crash(f: dict) -> list[str]:
    crash = f.get("crash")
    if not crash:
        return []
    out = [
        "## Crash safety (SIGKILL)",
        "",
        f"A reduced copy of a real release (0.5.10: apertus.py, CRLF; qwen2.py and qwen3.py, whose inner model lives in qwen2.py;",
        f"qwen2_classification.py, with a UTF-8 BOM) is patched by `patchcraft apply` {crash['runs']} times, two trees side by side,",
        f"each run killed with SIGKILL. An uninterrupted apply takes {crash['apply_seconds']} s, its write phase {crash['write_phase_seconds']} s",
        f"(first temporary file to last rename), its rename phase {crash.get('rename_phase_seconds', '?')} s. Kill moments: "
        + _counts(crash["kill_draws"])
        + ";",
        "a write-phase kill comes a random delay after the run's first temporary file appears, a rename-phase kill after its first",
        "file is replaced (the parent watches the directory), so the draws hit the dangerous moments on a loaded machine too.",
        "Runs start from " + _counts(crash["start_states"]) + ".",
        "",
    ]
    rows = [
        ["runs", crash["runs"]],
        ["files checked after a kill (all files of the tree, every run)", crash["file_checks"]],
        *[[f"outcome: {k}", v] for k, v in sorted(crash["outcomes"].items())],
        ["temporary files left by kills (removed by the next run)", crash["temp_files_left_by_kills"]],
        ["lock files left by kills (the kernel had released the lock)", crash["lock_files_left_by_kills"]],
        ["distinct post-kill states re-run to completion", crash["distinct_post_kill_states_rerun"]],
        ["re-runs that did not complete the job", crash["rerun_failures"]],
        ["exit codes differing from an uninterrupted run", crash["exit_code_mismatches"]],
        ["**files lost** (neither original nor fully patched, or missing)", f"**{crash['lost']}**"],
    ]
    out += table(rows, ["figure", "value"])
    return out


def _concurrency(f: dict) -> list[str]:
    conc = f.get("concurrency")
    if not conc:
        return []
    out = [
        "## Concurrency",
        "",
        "Every writing command holds `srt/models/.patchcraft.lock` (flock) from its first read to its last write.",
        "",
    ]
    waiter = conc.get("waiter")
    if waiter:
        out += [
            "The run that waits says so, then re-reads the files and finds the work done (exit 0, nothing rewritten):",
            "",
            "```",
            waiter["message"],
            "```",
            "",
        ]
    rows = [[name, _fields(value)] for name, value in conc.items() if name != "waiter"]
    return out + table(rows, ["scenario", "figures"])


def _fields(value: dict) -> str:
    """``key: value, ...`` with nested counts flattened and underscores as spaces."""
    parts = []
    for key, item in value.items():
        shown = _counts(item) if isinstance(item, dict) else item
        parts.append(f"{key.replace('_', ' ')}: {shown}")
    return ", ".join(parts)


def _refusals(f: dict) -> list[str]:
    refusals = f.get("refusals")
    if not refusals:
        return []
    rows = [
        [name, v["exit"], v.get("files_changed", 0), code(v["message"]) if "message" in v else ""]
        for name, v in sorted(refusals.items())
    ]
    return [
        "## Refusals",
        "",
        "Each case: exit 2, one line giving the reason, and every file of the tree byte-identical afterwards.",
        "See docs/troubleshooting.md for what to do about each.",
        "",
    ] + table(rows, ["input", "exit", "files changed", "message"])


def _hand(f: dict) -> list[str]:
    hand = f.get("hand_edits")
    if not hand:
        return []
    rows = []
    for name, value in sorted(hand.items(), key=lambda kv: _hand_order(kv[0])):
        if "outcome" in value:
            edits = value.get("edits", {})
            statuses = ", ".join(f"{k} {edits[k]}" for k in ("init", "setter", "forward") if k in edits)
            rows.append([name, value["outcome"], value["exit"], statuses or code(value.get("message", ""))])
        else:
            for kind, entry in sorted(value.items()):
                rows.append([f"{name}: {kind}", entry["outcome"], entry["exit"], code(entry["message"])])
    return [
        "## Hand-edited files",
        "",
        "The sed fix of DOMAIN.md, run with GNU sed on the real deepseek_v2.py, in all eight combinations of its three",
        "edits: the edits present are recognised (`hand-applied`), the missing ones completed, and nothing is inserted twice.",
        "A changed patchcraft block, or a half-done setter edit, is refused with the line named.",
        "",
    ] + table(rows, ["file", "outcome", "exit", "edits / message"])


def _hand_order(name: str) -> tuple:
    """Releases in order, combinations by size, the refusals last."""
    version, _, combo = name.partition(" ")
    if not version[:1].isdigit():
        return (1, (), 0, name)
    edits = [] if combo == "none" else combo.split("+")
    return (0, tuple(int(x) for x in version.split(".")), len(edits), combo)


def _properties(f: dict) -> list[str]:
    props = f.get("properties")
    if not props:
        return []
    rows = [[name.replace("_", " "), _fields(value)] for name, value in sorted(props.items())]
    return ["## File properties", "", "Kept by apply and revert (revert is byte-identical in each case).", ""] + table(
        rows, ["property", "checked"]
    )


def _fuzz(f: dict) -> list[str]:
    fuzz = f.get("fuzz")
    if not fuzz:
        return []
    rows = [[k, v] for k, v in fuzz["per_base"].items()]
    return [
        "## Fuzzing",
        "",
        f"{fuzz['cases']} cases, seed {fuzz['seed']}: one to three structural mutations ({_counts(fuzz['mutations'])})",
        f"of the model classes of real files ({', '.join(fuzz['bases'])}). Verdicts: {_counts(fuzz['verdicts'])};",
        f"violations (traceback, exit 0 with a broken or unverified file, not idempotent, revert not exact, a refused file changed): **{fuzz['violations']}**.",
        "",
    ] + table(rows, ["base and verdict", "cases"])


def _revert(f: dict) -> list[str]:
    revert = f.get("revert")
    if not revert:
        return []
    order = sorted(revert, key=lambda v: tuple(int(x) for x in v.split(".")))
    rows = [
        [
            v,
            revert[v]["files"],
            revert[v]["patched_by_apply"],
            revert[v]["reverted"],
            revert[v]["not_identical_after_revert"],
        ]
        for v in order
    ]
    return [
        "## Revert",
        "",
        "Every file of each release copy, after `apply` then `revert`, compared byte for byte with the release.",
        "",
    ] + table(rows, ["release", "files", "patched by apply", "reverted", "not identical"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figures", type=Path, help="render figures already collected in this directory")
    parser.add_argument("--output", type=Path, default=PAGE)
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments")
    args = parser.parse_args()
    wall = None
    if args.figures:
        directory = args.figures
    else:
        directory = Path(tempfile.mkdtemp(prefix="reliability-figures-"))
        wall = collect(directory, args.pytest_args)
    args.output.write_text(render(load(directory), wall), encoding="utf-8")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
