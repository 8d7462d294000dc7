"""Run the torch.compile check (patchcraft.harness.compiled) over releases: one line each, with times.

    python -m tools.sweep_compile                 # every minor release (patchcraft.base.releases.MINOR_RELEASES)
    python -m tools.sweep_compile 0.5.10 0.5.23   # these
    python -m tools.sweep_compile --jobs 2 --backend aot_eager --verbose

Each release is applied in memory (nothing is written) and every patched
model class is compiled fullgraph. Exit 1 when a row fails or errors.
Releases come from the tests' helpers (tests/harness/harness_support.py,
tests/conftest.py): unpacked under ``<cache>/test-releases``, never written.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The checkout (tools/ is not installed), the tests' helpers (conftest, suite_cache) and the harness tests' own.
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "harness")]


def sweep_one(version: str, backend: str) -> tuple[str, float, list[tuple[str, str, str, str]]]:
    from harness_support import patched

    from patchcraft.harness.compiled import compiler
    from patchcraft.harness.runner import SKIPPED, smoke_tree

    start = time.process_time()
    state = patched(version)
    run = smoke_tree(state.tree, models=state.applied.models, texts=state.texts, check=compiler(backend))
    rows = [(r.model, r.status, r.message, r.notes) for r in run.results if r.status != SKIPPED]
    return version, time.process_time() - start, rows


def main(argv: list[str] | None = None) -> int:
    from patchcraft.base.releases import MINOR_RELEASES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", default=list(MINOR_RELEASES))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    bad = 0
    wall = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for version, cpu, rows in pool.map(sweep_one, args.versions, [args.backend] * len(args.versions)):
            counts: dict[str, int] = {}
            for _, status, _, _ in rows:
                counts[status] = counts.get(status, 0) + 1
            summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no patched model classes"
            print(f"{version:12} {cpu:6.1f}s cpu  {summary}", flush=True)
            for model, status, message, notes in rows:
                if status != "pass" or args.verbose or notes:
                    print(f"    {status:5} {model}: {message}" + (f" (note: {notes})" if notes else ""), flush=True)
                bad += status in ("fail", "error")
    print(f"{len(args.versions)} releases in {time.perf_counter() - wall:.0f}s wall, {bad} rows failed or errored")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
