"""Sweep the CPU harness over every cached SGLang release (a tool, not a test).

    python -m tools.sweep_harness [VERSION ...] [--verbose]

For each release (default: every one unpacked under
``~/.cache/patchcraft/test-releases``, oldest first) it copies the parts
patchcraft reads into a temporary directory (``tests/conftest.py``'s
``copy_release``; the cached release is never written), runs
``patchcraft apply DIR --color never`` and ``patchcraft smoke DIR --format
json`` with ``PATCHCRAFT_NO_CACHE=1``, and prints one line per release with
the counts of pass, fail, error and skipped, then the first message of
every row that is not a pass. A row skipped because the engine calls the
model class unsupported (or not applicable) is listed only with
``--verbose``; one skipped for any other reason (apply left it unpatched)
is always listed, and so is a non-zero exit of apply.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The checkout (tools/ is not installed), the tests' helpers (conftest, suite_cache) and the harness tests' own.
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "harness")]

from harness_support import root_conftest  # noqa: E402

from patchcraft.base.fetch import cache_dir  # noqa: E402

STATUSES = ("pass", "fail", "error", "skipped")
#: Skipped rows listed only with --verbose: the engine says the model class cannot or need not be patched.
QUIET_SKIPS = ("unsupported:", "not-applicable:")


def _key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.]|post", version) if p != "")


def cached_versions() -> list[str]:
    root = cache_dir() / "test-releases"
    return sorted((p.name for p in root.iterdir() if (p / "sglang").is_dir()), key=_key)


def _patchcraft(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATCHCRAFT_NO_CACHE="1", NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "patchcraft", *argv], capture_output=True, text=True, env=env)


def sweep(version: str) -> tuple[dict[str, int], list[tuple[str, str, str]], str, int]:
    """(counts per status, [(model, status, message)] of the rows not passing, a problem line or '', apply's exit code)."""
    conftest = root_conftest()
    with tempfile.TemporaryDirectory(prefix=f"sweep-{version}-") as tmp:
        package = conftest.copy_release(version, Path(tmp))
        applied = _patchcraft("apply", str(package), "--color", "never")
        if applied.returncode not in (0, 1):
            return (
                {},
                [],
                f"apply exited {applied.returncode}: {(applied.stderr or applied.stdout).strip()[-300:]}",
                applied.returncode,
            )
        smoked = _patchcraft("smoke", str(package), "--format", "json")
        try:
            document = json.loads(smoked.stdout)
        except json.JSONDecodeError:
            return (
                {},
                [],
                f"smoke exited {smoked.returncode}: {(smoked.stderr or smoked.stdout).strip()[-300:]}",
                applied.returncode,
            )
    models = document["smoke"]["models"]
    counts = {status: sum(m["status"] == status for m in models) for status in STATUSES}
    rows = [
        (m["model"], m["status"], (m["message"] or "").splitlines()[0] if m["message"] else "")
        for m in models
        if m["status"] != "pass"
    ]
    return counts, rows, "", applied.returncode


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", metavar="VERSION", help="default: every release cached for the tests")
    parser.add_argument("--verbose", action="store_true", help="list the rows skipped as unsupported too")
    args = parser.parse_args(argv)
    verbose = args.verbose
    versions = args.versions or cached_versions()
    totals = dict.fromkeys(STATUSES, 0)
    bad = 0
    print(f"{'version':<14} {'pass':>4} {'fail':>4} {'error':>5} {'skip':>4}", flush=True)
    for version in versions:
        counts, rows, problem, applied = sweep(version)
        if problem:
            bad += 1
            print(f"{version:<14} {problem}", flush=True)
            continue
        for status in STATUSES:
            totals[status] += counts[status]
        bad += bool(counts["fail"] or counts["error"])
        note = f"  (apply exited {applied})" if applied else ""
        print(
            f"{version:<14} {counts['pass']:>4} {counts['fail']:>4} {counts['error']:>5} {counts['skipped']:>4}{note}",
            flush=True,
        )
        for model, status, message in rows:
            if status != "skipped" or verbose or not message.startswith(QUIET_SKIPS):
                print(f"    {status:<7} {model}: {message}", flush=True)
    print(
        f"{'total':<14} {totals['pass']:>4} {totals['fail']:>4} {totals['error']:>5} {totals['skipped']:>4}", flush=True
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
