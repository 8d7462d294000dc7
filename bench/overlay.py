"""Benchmark ``patchcraft run``'s costs: the overlay build (cold and warm) and the bootstrap per process.

    python bench/overlay.py [VERSION] [--repeat N] [--bootstrap-only]

Whole processes, medians of N runs, on a copy of the release from the cache:

- ``verify`` today (cold, no result cache): the reference the overlay build is held to;
- ``overlay build --no-smoke`` cold (a fresh cache each run) and warm (reused);
- ``overlay build`` cold with the harness proof (torch imported);
- ``python -c pass`` with and without the overlay on ``PYTHONPATH``: the bootstrap's cost per process,
  with and without ``PYTHONDONTWRITEBYTECODE`` (the overlay ships the bootstrap's ``.pyc``; the last
  row removes it, to show what it saves). Goal: under 5 ms over ``python -c pass`` either way.
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


def bootstrap_import_ms(overlay: str, repeat: int, env: dict | None = None) -> float:
    """Median cumulative import time of the overlay's sitecustomize, as ``python -X importtime`` reports it."""
    samples = []
    for _ in range(repeat):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "pass"],
            env=dict(env or os.environ, PYTHONPATH=overlay),
            capture_output=True,
            text=True,
            check=True,
        )
        line = next(l for l in proc.stderr.splitlines() if l.split("|")[-1].strip() == "sitecustomize")
        samples.append(int(line.split("|")[1]) / 1000)
    return statistics.median(samples)


def bootstrap_rows(overlay: str, work: Path, repeat: int) -> list[tuple[str, str, str]]:
    """The bootstrap's cost per process, by default and with ``PYTHONDONTWRITEBYTECODE=1``, side by side."""
    no_pyc = work / "overlay-without-pyc"
    shutil.copytree(Path(overlay).resolve(), no_pyc)
    shutil.rmtree(no_pyc / "__pycache__")
    columns = []
    for extra in ({}, {"PYTHONDONTWRITEBYTECODE": "1"}):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | extra
        plain = timed([sys.executable, "-c", "pass"], dict(env, PYTHONPATH=str(work)), repeat * 4)
        with_overlay = timed([sys.executable, "-c", "pass"], dict(env, PYTHONPATH=overlay), repeat * 4)
        columns.append(
            (
                plain,
                with_overlay,
                bootstrap_import_ms(overlay, repeat * 4, env),
                bootstrap_import_ms(str(no_pyc), repeat * 4, env),
            )
        )
        if not extra:
            shutil.rmtree(no_pyc / "__pycache__", ignore_errors=True)  # the default run wrote one: take it away again
    names = (
        ("python -c pass", lambda c: f"{c[0] * 1000:.1f} ms"),
        ("python -c pass, overlay on PYTHONPATH", lambda c: f"{c[1] * 1000:.1f} ms"),
        (
            "bootstrap cost per process (wall difference; noisy on a busy machine)",
            lambda c: f"{(c[1] - c[0]) * 1000:.1f} ms",
        ),
        ("ratio, overlay / plain", lambda c: f"{c[1] / c[0]:.2f}x"),
        ("bootstrap import time (`-X importtime`, sitecustomize cumulative)", lambda c: f"{c[2]:.2f} ms"),
        ("the same, the overlay's .pyc removed", lambda c: f"{c[3]:.2f} ms"),
    )
    return [(name, show(columns[0]), show(columns[1])) for name, show in names]


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

        rows = (
            []
            if "--bootstrap-only" in argv
            else [
                (
                    "verify, cold (the reference)",
                    timed(patchcraft + ["verify", str(package), "--no-smoke"], env, repeat, codes=(0, 1)),
                ),
                (
                    "overlay build --no-smoke, cold",
                    timed(patchcraft + ["overlay", "build", str(package), "--no-smoke"], env, repeat, fresh),
                ),
                (
                    "overlay build, warm (reused)",
                    timed(patchcraft + ["overlay", "build", str(package), "--no-smoke"], env, repeat),
                ),
                (
                    "overlay build with the harness proof, cold",
                    timed(patchcraft + ["overlay", "build", str(package)], env, max(1, repeat // 2), fresh),
                ),
            ]
        )
        overlay = (
            subprocess.run(
                patchcraft + ["overlay", "build", str(package), "--no-smoke"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .split("=", 1)[1]
        )
        bare = timed([sys.executable, "-S", "-c", "pass"], dict(os.environ), repeat * 4)
        print(f"SGLang {version}, medians of {repeat} (interpreter start: {repeat * 4}), {os.cpu_count()} cores\n")
        print("| measurement | seconds |\n|---|---|")
        for name, seconds in rows:
            print(f"| {name} | {seconds:.3f} |")
        print(f"| (python -S -c pass, no site at all) | {bare:.4f} |")
        print("\n| per process | default | PYTHONDONTWRITEBYTECODE=1 |\n|---|---|---|")
        for name, default, no_bytecode in bootstrap_rows(overlay, work, repeat):
            print(f"| {name} | {default} | {no_bytecode} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
