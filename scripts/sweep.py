#!/usr/bin/env python3
"""Sweep SGLang releases through the real CLI: apply, verify, smoke, apply --check, revert, byte compare.

    python scripts/sweep.py 0.5.10 0.5.23      # these releases
    python scripts/sweep.py --all              # every release from 0.4.6 to 0.5.23, posts included
    python scripts/sweep.py --newest           # the newest release on the package index
    python scripts/sweep.py --all --write-docs # and write the release-history table of docs/coverage.md

One row per release; exit 0 when every release passes, 1 when one does not
(each problem named: the error row with its moved anchor, the file revert
left different, the smoke row that failed), 2 when the sweep could not run
(no network for --newest, a release that cannot be fetched). The logic is
tools/sweep.py, shared with tests/test_release_history.py and
.github/workflows/new-sglang-release.yml.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tools/ is not installed (not in the wheel)

from patchcraft.base.errors import PatchcraftError  # noqa: E402
from patchcraft.base.releases import ALL_RELEASES, newest_release  # noqa: E402
from tools.sweep import sweep, text_row, write_history  # noqa: E402

PAGE = ROOT / "docs" / "coverage.md"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every release from 0.4.6 to 0.5.23, posts included")
    which.add_argument(
        "--newest", action="store_true", help="the newest release on the package index (pip index versions sglang)"
    )
    parser.add_argument("versions", nargs="*", metavar="VERSION")
    parser.add_argument(
        "--write-docs", action="store_true", help="write the swept releases' rows into docs/coverage.md"
    )
    parser.add_argument("--json", metavar="FILE", help="also write every release's record as JSON to FILE")
    args = parser.parse_args(argv)
    if sum(bool(x) for x in (args.all, args.newest, args.versions)) != 1:
        parser.error("give VERSIONS, --all or --newest")
    try:
        versions = list(ALL_RELEASES) if args.all else [newest_release()] if args.newest else args.versions
        if args.newest:
            print(f"newest sglang release on the package index: {versions[0]}", flush=True)

        annotate = os.environ.get("GITHUB_ACTIONS") == "true"

        def report(result) -> None:
            print(text_row(result), flush=True)
            for problem in result.problems():
                print(f"     {problem}", flush=True)
                if annotate:  # on the workflow run's page too
                    text = problem.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
                    print(f"::error title=sglang {result.version} does not pass the sweep::{text}", flush=True)

        start = time.perf_counter()
        results = sweep(versions, report=report)
    except PatchcraftError as exc:
        print(f"sweep: error: {exc}", file=sys.stderr)
        return 2
    failed = [r.version for r in results if not r.ok]
    print(
        f"{len(results)} release(s) in {time.perf_counter() - start:.0f} s: "
        + (f"FAILED: {', '.join(failed)}" if failed else "all pass")
    )
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_json() for r in results], indent=2) + "\n", encoding="utf-8")
    if args.write_docs:
        write_history(PAGE, results)
        print(f"wrote {len(results)} row(s) into {PAGE.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
