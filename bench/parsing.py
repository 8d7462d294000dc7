"""Benchmark the parse cache (``reading.parsed``): planning a vLLM tree with every text parsed once per process,
against the same work with the cache bounded to one tree (each reader parsing on its own, as before it).

    python bench/parsing.py [--release 0.34.0] [--repeat 3]

Each run is a fresh ``python`` process that plans the release's pristine
package and then a copy of it (what a sweep, a test, or ``apply``'s proof
and ``explain`` after it do: the same bytes in two trees). "off" bounds the
cache to one tree (``LIMIT = 0``: every other text parsed again by each
reader, about what planning did before the cache). Rows, side by side and
interleaved so that load hits both alike: the median CPU seconds (user +
system of the child, from ``wait4``), peak memory (the child's maxrss)
and the number of ``ast.parse`` calls. Both ways must plan the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import ast, json, sys
from pathlib import Path
from patchcraft.reading import parsed
if sys.argv[3] == "off":
    parsed.LIMIT = 0  # one tree kept at a time: every other parse is made again
calls = [0]
real = ast.parse
def counting(*args, **kwargs):
    calls[0] += 1
    return real(*args, **kwargs)
ast.parse = counting
from patchcraft.base.vllm_tree import VllmTree
from patchcraft.planning.vllm_plans import plan_vllm
labels = []
for package in sys.argv[1:3]:
    tree = VllmTree(package=Path(package), root=Path(package).parent)
    labels.append(sorted((p.label, p.sites.__len__(), bool(p.unsupported)) for p in plan_vllm(tree)))
print(json.dumps({"calls": calls[0], "same": labels[0] == labels[1], "plans": labels[0]}))
"""


def _measure(first: Path, second: Path, mode: str) -> tuple[float, float, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATCHCRAFT_NO_CACHE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(first), str(second), mode], stdout=subprocess.PIPE, env=env, text=True
    )
    assert process.stdout is not None
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"bench/parsing.py: the {mode} run exited {process.returncode}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, json.loads(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", default="0.34.0")
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args(argv)
    from patchcraft.base.fetch import cache_dir
    from patchcraft.base.vllm_fetch import fetch_vllm

    pristine = fetch_vllm(options.release, cache_dir() / "releases" / f"vllm-{options.release}")
    with tempfile.TemporaryDirectory(prefix="bench-parsing-") as scratch:
        copy = Path(scratch) / "vllm"
        shutil.copytree(pristine, copy)
        rows: dict[str, list[tuple[float, float, dict]]] = {"on": [], "off": []}
        for _ in range(options.repeat):
            for mode in ("on", "off"):
                rows[mode].append(_measure(pristine, copy, mode))
    on, off = rows["on"], rows["off"]
    assert all(r[2]["same"] for r in on + off) and on[0][2]["plans"] == off[0][2]["plans"], "the plans differ"
    load = os.getloadavg()[0]
    cpu_on, cpu_off = statistics.median(r[0] for r in on), statistics.median(r[0] for r in off)
    mem_on, mem_off = statistics.median(r[1] for r in on), statistics.median(r[1] for r in off)
    print(f"vLLM {options.release}: plan the package and a copy, median of {options.repeat}, load {load:.1f}")
    print("| parse cache | CPU s | peak MB | ast.parse calls |")
    print("|---|---|---|---|")
    print(f"| off (one tree kept) | {cpu_off:.2f} | {mem_off:.0f} | {off[0][2]['calls']} |")
    print(f"| on (reading.parsed) | {cpu_on:.2f} | {mem_on:.0f} | {on[0][2]['calls']} |")
    print(
        f"| ratio on/off | {cpu_on / cpu_off:.2f} | {mem_on / mem_off:.2f} | {on[0][2]['calls'] / off[0][2]['calls']:.2f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
