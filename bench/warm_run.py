"""Benchmark a warm ``patchcraft run`` with the EAGLE-3 flags against the bare server command.

    python bench/warm_run.py [VERSION] [--repeat N]

SGLang VERSION (default 0.5.23) is installed with ``pip install --no-deps``
into a throwaway venv; the "server" is ``python -c pass`` given the flags of
an EAGLE-3 launch (``--model-path KIMI --speculative-algorithm EAGLE3
--speculative-draft-model-path DRAFT --tp 8``), so what is measured is what
patchcraft adds in front of a launch. Whole processes, medians of N runs,
interleaved so that load on a shared machine hits every row alike:

- the bare command (the reference);
- ``patchcraft run --no-preflight`` with the overlay reused;
- ``patchcraft run`` warm: overlay reused, the preflight verdict reused;
- ``patchcraft run`` with the verdict cache emptied before each run (the
  preflight re-runs every launch, as before the cache; the result cache is
  kept).

Wall time is what a user waits; CPU time (user + system of the child) is
the steadier figure on a loaded machine. The goal: warm at most 0.3 s over
the bare command. The private cache (``PATCHCRAFT_CACHE``) lives in the
benchmark's temporary directory; the user's is never touched.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

GOAL_S = 0.3


def install(version: str, work: Path) -> Path:
    """SGLang ``version`` installed without dependencies into a venv under ``work``; its package root."""
    from conftest import install_release

    return install_release(version, work / "venv")


def measure(command: list[str], env: dict[str, str], before=None) -> tuple[float, float]:
    """(wall, cpu) seconds of one run of ``command``; a non-zero exit is an error."""
    if before is not None:
        before()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {proc.returncode}: {proc.stderr.strip()[-400:]}")
    return wall, (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)


def main(argv: list[str]) -> int:
    version = next((a for a in argv if not a.startswith("--") and not a.isdigit()), "0.5.23")
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 5
    from drafts import kimi_target, sglang_draft

    work = Path(tempfile.mkdtemp(prefix="bench-warm-run-"))
    try:
        package = install(version, work)
        cache = work / "cache"
        env = dict(os.environ, PATCHCRAFT_CACHE=str(cache))
        env.pop("PATCHCRAFT_NO_CACHE", None)
        server = [
            sys.executable,
            "-c",
            "pass",
            "--model-path",
            str(kimi_target(work / "kimi")),
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            str(sglang_draft(work / "draft", [-1, 2, 30])),
            "--tp",
            "8",
        ]
        run = [
            sys.executable,
            "-m",
            "patchcraft",
            "run",
            "--target",
            str(package),
            "--no-smoke",
            "--trained-on",
            "hf:0,3,31",
            "--",
        ]
        measure(run + server, env)  # cold: builds the overlay, runs and stores the preflight
        rows = {
            "bare command (reference)": (server, None),
            "patchcraft run --no-preflight, overlay reused": (run[:-1] + ["--no-preflight", "--"] + server, None),
            "patchcraft run, warm (overlay and verdict reused)": (run + server, None),
            "patchcraft run, verdict cache emptied each run": (
                run + server,
                lambda: shutil.rmtree(cache / "preflight", ignore_errors=True),
            ),
        }
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
        for _ in range(repeat):
            for name, (command, before) in rows.items():
                samples[name].append(measure(command, env, before))
        report(version, repeat, samples)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(version: str, repeat: int, samples: dict[str, list[tuple[float, float]]]) -> None:
    medians = {
        name: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        for name, runs in samples.items()
    }
    bare_wall, bare_cpu = next(iter(medians.values()))
    print(
        f"sglang {version}, medians of {repeat} interleaved runs, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(f"| {'measurement':<52} | wall s | over bare | CPU s | over bare |")
    print(f"|{'-' * 54}|--------|-----------|-------|-----------|")
    for name, (wall, cpu) in medians.items():
        print(f"| {name:<52} | {wall:6.2f} | {wall - bare_wall:+9.2f} | {cpu:5.2f} | {cpu - bare_cpu:+9.2f} |")
    warm_wall, warm_cpu = medians["patchcraft run, warm (overlay and verdict reused)"]
    verdict = "met" if warm_cpu - bare_cpu <= GOAL_S else "NOT met"
    print(
        f"goal: warm run at most {GOAL_S} s over the bare command, judged on CPU time: {verdict} (CPU {warm_cpu - bare_cpu:+.2f} s, wall {warm_wall - bare_wall:+.2f} s)"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
