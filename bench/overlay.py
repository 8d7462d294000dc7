"""Benchmark ``patchcraft run``'s costs: the overlay build (cold and warm) and the bootstrap per process.

    python bench/overlay.py [VERSION] [--repeat N]

Whole processes, medians of N runs, on a copy of the release from the cache:

- ``verify`` today (cold, no result cache): the reference the overlay build is held to;
- ``overlay build --no-smoke`` cold (a fresh cache each run) and warm (reused);
- ``overlay build`` cold with the harness proof (torch imported);
- ``python -c pass`` with and without the overlay on ``PYTHONPATH``: the bootstrap's import-time cost.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def timed(command: list[str], env: dict, repeat: int, before=None, codes: tuple[int, ...] = (0,)) -> float:
    """Median wall time of ``command`` (exit codes other than ``codes`` are an error)."""
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        start = time.perf_counter()
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
        if proc.returncode not in codes:
            raise SystemExit(f"{' '.join(command)}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bootstrap_import_ms(overlay: str, repeat: int) -> float:
    """Median cumulative import time of the overlay's sitecustomize, as ``python -X importtime`` reports it."""
    samples = []
    for _ in range(repeat):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=dict(os.environ, PYTHONPATH=overlay), capture_output=True, text=True, check=True)
        line = next(l for l in proc.stderr.splitlines() if l.split("|")[-1].strip() == "sitecustomize")
        samples.append(int(line.split("|")[1]) / 1000)
    return statistics.median(samples)


def main(argv: list[str]) -> int:
    version = next((a for a in argv if not a.startswith("--") and not a.isdigit()), "0.5.23")
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 5
    from conftest import copy_release

    work = Path(tempfile.mkdtemp(prefix="bench-overlay-"))
    try:
        package = copy_release(version, work / "install")
        cache = work / "cache"
        env = dict(os.environ, PATCHCRAFT_CACHE=str(cache), PATCHCRAFT_NO_CACHE="1")
        patchcraft = [sys.executable, "-m", "patchcraft"]

        def fresh() -> None:
            shutil.rmtree(cache, ignore_errors=True)

        rows = [
            ("verify, cold (the reference)", timed(patchcraft + ["verify", str(package), "--no-smoke"], env, repeat, codes=(0, 1))),
            ("overlay build --no-smoke, cold", timed(patchcraft + ["overlay", "build", str(package), "--no-smoke"], env, repeat, fresh)),
            ("overlay build, warm (reused)", timed(patchcraft + ["overlay", "build", str(package), "--no-smoke"], env, repeat)),
            ("overlay build with the harness proof, cold", timed(patchcraft + ["overlay", "build", str(package)], env, max(1, repeat // 2), fresh)),
        ]
        overlay = subprocess.run(patchcraft + ["overlay", "build", str(package), "--no-smoke"], env=env, check=True, capture_output=True, text=True).stdout.strip().split("=", 1)[1]
        bare = timed([sys.executable, "-S", "-c", "pass"], dict(os.environ), repeat * 4)
        plain = timed([sys.executable, "-c", "pass"], dict(os.environ, PYTHONPATH=str(work)), repeat * 4)
        with_overlay = timed([sys.executable, "-c", "pass"], dict(os.environ, PYTHONPATH=overlay), repeat * 4)
        print(f"SGLang {version}, medians of {repeat} (interpreter start: {repeat * 4}), {os.cpu_count()} cores\n")
        print("| measurement | seconds |\n|---|---|")
        for name, seconds in rows:
            print(f"| {name} | {seconds:.3f} |")
        print(f"| python -c pass | {plain:.4f} |")
        print(f"| python -c pass, overlay on PYTHONPATH | {with_overlay:.4f} |")
        print(f"| bootstrap cost per process (wall difference; noisy on a busy machine) | {(with_overlay - plain) * 1000:.1f} ms |")
        print(f"| bootstrap import time (`-X importtime`, sitecustomize cumulative) | {bootstrap_import_ms(overlay, repeat * 4):.2f} ms |")
        print(f"| (python -S -c pass, no site at all) | {bare:.4f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
