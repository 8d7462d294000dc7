"""Revert's parse: only the marked methods (patchcraft) against whole marked classes (the anchor), side by side.

``python bench/revert.py [RELEASE ...] [--repeat N]``: each release (SGLang,
default 0.5.23 and 0.5.9, whose runner row is patched: ``ModelRunner`` has
thousands of lines) is fetched into the cache, copied, and applied with
``apply --no-smoke``; then every patched file is reverted in process, first
as ``revert`` does (``ClassSlices.of_methods`` over ``marked_parts``), then
parsing each marked class whole (what ``revert`` did before), interleaved,
``--repeat`` times. It prints the CPU seconds of each (medians), their ratio,
and whether both gave every file back byte for byte. Nothing is judged here:
the figures go to docs/performance.md by hand, with the load.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _whole_classes(text: str, path: Path) -> str:
    """The anchor: every marked class parsed whole (a mark outside every class: the whole module)."""
    from patchcraft.engine.file_patch import _revert_module, _slices, parse
    from patchcraft.transforms._base import marked_parts
    from patchcraft.transforms._slices import ClassSlices, code_with_ending

    parts = marked_parts(text)
    if parts == []:
        return text
    slices = _slices(text, path, ClassSlices.of, sorted({cls for cls, _ in parts})) if parts else None
    if slices is None:
        return code_with_ending(_revert_module(parse(text, path), text), text)
    for key, module in slices.modules.items():
        slices.modules[key] = _revert_module(module, slices.segment(key))
    return slices.text()


def measure(release: str, repeat: int) -> dict:
    from patchcraft import MARKER
    from patchcraft.base.fetch import cache_dir, fetch
    from patchcraft.cli import main
    from patchcraft.engine.file_patch import revert_text

    pristine = fetch(release, cache_dir() / "releases" / release)
    with tempfile.TemporaryDirectory(prefix="bench-revert-") as tmp:
        package = Path(tmp) / "sglang"
        shutil.copytree(pristine, package, ignore=shutil.ignore_patterns("__pycache__"))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main(["apply", str(package), "--no-smoke", "--format", "json"])
        files = {}
        for path in sorted(package.rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if MARKER in text:
                files[path] = (text, (pristine / path.relative_to(package)).read_text(encoding="utf-8"))
    sides = {"methods": revert_text, "whole classes": _whole_classes}
    times: dict = {name: [] for name in sides}
    identical = {name: True for name in sides}
    for name, revert in sides.items():  # a warm-up of each: imports, libcst's grammar
        for path, (text, _) in list(files.items())[:2]:
            revert(text, path)
    for _ in range(repeat):
        for name, revert in sides.items():
            start = time.process_time()
            out = {path: revert(text, path) for path, (text, _) in files.items()}
            times[name].append(time.process_time() - start)
            identical[name] &= all(out[path] == original for path, (_, original) in files.items())
    median = {name: statistics.median(values) for name, values in times.items()}
    return {"release": release, "files": len(files), "median": median, "identical": identical}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("releases", nargs="*", default=["0.5.23", "0.5.9"])
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args(argv)
    os.environ.setdefault("PATCHCRAFT_NO_CACHE", "1")
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        "| release | patched files | revert: marked methods (CPU s) | anchor: whole classes (CPU s) | ratio | byte-identical |"
    )
    print("|---|---|---|---|---|---|")
    for release in options.releases:
        row = measure(release, options.repeat)
        ours, anchor = row["median"]["methods"], row["median"]["whole classes"]
        same = "yes" if all(row["identical"].values()) else f"no: {row['identical']}"
        print(f"| {release} | {row['files']} | {ours:.3f} | {anchor:.3f} | {ours / anchor:.2f} | {same} |")
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
