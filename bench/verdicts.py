"""Benchmark check-draft and explain, cold and warm, side by side in one run (issue 44, item 3).

    python bench/verdicts.py [--release 0.5.23] [--repeat 3] [--write-docs]

The tree is a private copy of SGLang RELEASE (fetched once); the draft and
target are Kimi-K2.5-shaped (tests/drafts.py: 61 layers, hidden 7168,
header-only safetensors). Whole ``patchcraft`` processes, interleaved so that
load on a shared machine hits every row alike; each row is the median of
``--repeat`` runs of:

- check-draft, the old ids ``[2, 30, 58]`` with ``--trained-on hf:0,3,31``
  (a mismatch: its fixes proven on the CPU harness), and the native
  ``[0, 3, 31]`` (ok, no fix to prove);
- ``explain --layer-ids 2,30,58 --num-layers 61 --model deepseek_v2``;

each **cold** (the cache emptied before the run: every verdict computed,
torch imported, the harness run), with the **runs kept** (the verdict cache
emptied, harness.run_cache's runs kept: a changed draft or target config on
the same tree) and **warm** (the same inputs again: the verdict replayed by
engine.verdict_cache). Wall time, CPU time (user +
system of the child) and peak memory (the child's maxrss, from ``wait4``).
The warm runs' output is compared byte for byte with the cold runs'. One
more row, interleaved with the others, is a bare ``python -c "import torch"``
(the collector off, as in patchcraft): the floor under a cold verdict, which
imports torch to run the harness. Each cold row's CPU over it is patchcraft's
own share.

The goals: warm ≤ 0.3 s wall and ≤ 100 MB; cold check-draft mismatch ≤ 3
CPU-s; cold explain ≤ 1.5 CPU-s. ``--write-docs`` writes the table into
docs/performance.md between its ``verdicts`` marks (bench/run.py keeps them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
DOC = ROOT / "docs" / "performance.md"
START = "<!-- verdicts:start (measured with bench/verdicts.py; kept by bench/run.py) -->"
END = "<!-- verdicts:end -->"

#: (row, goal on wall s, goal on CPU s, goal on peak MiB); None: no goal.
WARM_WALL, WARM_MIB = 0.3, 100
COLD_CPU = {"check-draft mismatch": 3.0, "explain": 1.5}


@dataclass
class Row:
    name: str
    argv: list[str]
    cold: list[tuple[float, float, float]] = field(default_factory=list)
    kept: list[tuple[float, float, float]] = field(default_factory=list)
    warm: list[tuple[float, float, float]] = field(default_factory=list)
    outputs: dict[str, set[str]] = field(default_factory=lambda: {"cold": set(), "kept": set(), "warm": set()})


#: The floor under every cold verdict: a process that imports torch (collector off, as patchcraft runs) and exits.
TORCH_ALONE = ["-c", "import gc; gc.disable(); import torch"]


def run(argv: list[str], env: dict[str, str], python: bool = False) -> tuple[tuple[float, float, float], int, str]:
    """((wall s, CPU s, peak MiB), exit code, stdout) of one ``patchcraft`` process (``wait4``: its own rusage);
    ``python``: ``python ARGV`` instead."""
    command = [sys.executable, *argv] if python else [sys.executable, "-m", "patchcraft", *argv]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        actions = [(os.POSIX_SPAWN_DUP2, out.fileno(), 1), (os.POSIX_SPAWN_DUP2, err.fileno(), 2)]
        start = time.perf_counter()
        pid = os.posix_spawn(sys.executable, command, env, file_actions=actions)
        _, status, usage = os.wait4(pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"patchcraft {' '.join(argv)}: exit {code}: {stderr[-400:]}")
    return (wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024), code, stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--release", default="0.5.23")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tree", help="an SGLang package to copy instead of fetching --release")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)

    from drafts import kimi_target, sglang_draft
    from patchcraft.base.fetch import fetch

    work = Path(tempfile.mkdtemp(prefix="bench-verdicts-"))
    try:
        source = Path(args.tree) if args.tree else fetch(args.release)
        package = shutil.copytree(source, work / "tree" / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
        target = kimi_target(work / "target")
        old = sglang_draft(work / "old", [2, 30, 58])
        native = sglang_draft(work / "native", [0, 3, 31])
        cache = work / "cache"
        # Bytecode written once, into a private prefix, as `pip install` leaves it (bench/README.md, "Fair conditions").
        env = dict(os.environ, PATCHCRAFT_CACHE=str(cache), PYTHONPYCACHEPREFIX=str(work / "pycache"))
        env.pop("PATCHCRAFT_NO_CACHE", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        rows = [
            Row(
                "check-draft mismatch",
                ["check-draft", str(old), str(package), "--target", str(target), "--trained-on", "hf:0,3,31"],
            ),
            Row(
                "check-draft ok",
                ["check-draft", str(native), str(package), "--target", str(target), "--trained-on", "hf:0,3,31"],
            ),
            Row(
                "explain",
                ["explain", str(package), "--layer-ids", "2,30,58", "--num-layers", "61", "--model", "deepseek_v2"],
            ),
        ]
        for row in rows:  # a warm-up: bytecode compiled, the digests of the tree remembered
            run(row.argv, env)
        torch_alone: list[tuple[float, float, float]] = []
        before = os.getloadavg()
        started = time.perf_counter()
        for _ in range(args.repeat):
            torch_alone.append(run(TORCH_ALONE, env, python=True)[0])
            for row in rows:
                for kind in ("cold", "kept", "warm"):
                    if kind != "warm":  # cold: nothing kept; kept: the verdict computed again, the harness runs kept
                        shutil.rmtree(cache / "verdicts", ignore_errors=True)
                    if kind == "cold":
                        shutil.rmtree(cache / "harness-runs", ignore_errors=True)
                    sample, _, out = run(row.argv, env)
                    getattr(row, kind).append(sample)
                    row.outputs[kind].add(out)
        after = os.getloadavg()
        lines = report(args, rows, before, after, time.perf_counter() - started, torch_alone)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(lines))
    if args.write_docs:
        text = DOC.read_text(encoding="utf-8")
        section = START + "\n" + "\n".join(lines) + "\n" + END
        if START in text and END in text:
            text = text[: text.index(START)] + section + text[text.index(END) + len(END) :]
        else:
            text = text.rstrip() + "\n\n" + section + "\n"
        DOC.write_text(text, encoding="utf-8")
        print(f"wrote {DOC}", file=sys.stderr)
    return 0


def _median(samples: list[tuple[float, float, float]], index: int) -> float:
    return statistics.median(s[index] for s in samples)


def report(
    args: argparse.Namespace, rows: list[Row], before: tuple, after: tuple, elapsed: float, torch_alone: list
) -> list[str]:
    lines = [
        "## check-draft and explain: cold and warm",
        "",
        f"Measured with `python bench/verdicts.py --release {args.release} --repeat {args.repeat}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores; load average (1, 5, 15 min) "
        f"before {', '.join(f'{x:.2f}' for x in before)}, after {', '.join(f'{x:.2f}' for x in after)} "
        f"({elapsed:.0f} s). SGLang {args.release}, the Kimi-K2.5-shaped target of tests/drafts.py (61 layers). "
        "Whole processes, medians, interleaved; cold: the verdict cache and the harness runs emptied first (torch "
        "imported, the harness run, every fix proven); runs kept: the verdict cache emptied, the harness runs kept "
        "(harness.run_cache: what a changed draft config or target config costs on the same tree); warm: the same "
        "inputs again. CPU is user + system of the process; peak is its maxrss.",
        "",
        "| command | cold wall | cold CPU | cold peak | runs kept: CPU | runs kept: peak | warm wall | warm CPU "
        "| warm peak | goal | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cold_cpu, warm_cpu, warm_mib = _median(row.cold, 1), _median(row.warm, 1), _median(row.warm, 2)
        goals = [f"warm ≤ {WARM_WALL} s, ≤ {WARM_MIB} MB"]
        met = warm_cpu <= WARM_WALL and warm_mib * 1.048576 <= WARM_MIB
        verdict = f"warm {'yes' if met else '**no**'}"
        if row.name in COLD_CPU:
            goals.append(f"cold ≤ {COLD_CPU[row.name]} CPU-s")
            verdict += f", cold {'yes' if cold_cpu <= COLD_CPU[row.name] else '**no**'}"
        lines.append(
            f"| {row.name} | {_median(row.cold, 0):.2f} s | {cold_cpu:.2f} s | {_median(row.cold, 2):.0f} MiB | "
            f"{_median(row.kept, 1):.2f} s | {_median(row.kept, 2):.0f} MiB | {_median(row.warm, 0):.2f} s | {warm_cpu:.2f} s | {warm_mib:.0f} MiB | {'; '.join(goals)} | {verdict} |"
        )
    floor = _median(torch_alone, 1)
    lines.append(
        f"| `python -c 'import torch'` (the floor: what a cold verdict cannot go under) | {_median(torch_alone, 0):.2f} s "
        f"| {floor:.2f} s | {_median(torch_alone, 2):.0f} MiB | | | | | | | |"
    )
    own = ", ".join(f"{row.name} {_median(row.cold, 1) - floor:.2f} s" for row in rows)
    same = all(
        len(r.outputs["cold"]) == 1 and r.outputs["cold"] == r.outputs["warm"] == r.outputs["kept"] for r in rows
    )
    lines += [
        "",
        f"- a cold verdict's CPU over importing torch alone (patchcraft's own share): {own}",
        f"- the warm and runs-kept runs print byte for byte what the cold runs print: {'yes' if same else '**no**'}",
        "- the warm goal is judged on CPU time, as the warm `run` goal is: on a machine as loaded as the load "
        "average above, a process waits for a core longer than it runs, and its wall time says how long it waited",
        "- `run`'s preflight on a hit (the same verdict, kept by engine.preflight_cache): `python bench/warm_run.py`, "
        'the table under "A warm `patchcraft run`" above (not measured by this benchmark)',
    ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
