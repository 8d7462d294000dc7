"""Generate patchcraft/base/data/release_digests.json: each release's model-file digests, for the closest-release match.

A tree without a version (a fork built with setuptools-scm, a copied
package) is matched against every tested release by the digests of its
model files (:mod:`patchcraft.base.tree_version`). This tool reads those
digests out of the release wheels in patchcraft's cache (downloaded with
``pip download --no-deps`` on first use) and writes the table that ships
with patchcraft. Only digests go into it, never a byte of SGLang's source.

    python -m tools.release_digests            # rewrite the table from every release in ALL_RELEASES
    python -m tools.release_digests --check    # exit 1 if the shipped table differs from what the wheels give

The table: ``releases`` (oldest first), ``files`` (path inside the package ->
{digest: [indexes into releases]}), digests being the first
:data:`~patchcraft.base.tree_version.DIGEST_CHARS` hex characters of the
file's sha256. Most files are the same in many releases, so each distinct
digest is stored once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # python tools/release_digests.py from anywhere: the checkout's patchcraft
    sys.path.insert(0, str(ROOT))

from patchcraft.base import tree_version
from patchcraft.base.fetch import cache_dir, download_wheel, find_wheel
from patchcraft.base.releases import ALL_RELEASES

PREFIX = "sglang/"


def wheel_digests(wheel: Path) -> dict[str, str]:
    """``path inside the package -> digest`` of every compared file in ``wheel`` (members read, nothing unpacked)."""
    found: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if not member.startswith(PREFIX):
                continue
            path = member[len(PREFIX) :]
            if tree_version.is_compared(path):
                found[path] = tree_version.digest(archive.read(member))
    return found


def release_wheel(version: str) -> Path:
    """The cached wheel of ``version`` (downloaded when missing)."""
    wheels = cache_dir() / "wheels"
    return find_wheel(wheels, version) or download_wheel(version, wheels)


def build_table(releases: Sequence[str], digests_of=lambda version: wheel_digests(release_wheel(version))) -> dict:
    """The table for ``releases``, in the order given (``digests_of(version)``: that release's digests)."""
    files: dict[str, dict[str, list[int]]] = {}
    for index, version in enumerate(releases):
        for path, value in sorted(digests_of(version).items()):
            files.setdefault(path, {}).setdefault(value, []).append(index)
    return {
        "format": tree_version.TABLE_FORMAT,
        "digest": f"sha256, first {tree_version.DIGEST_CHARS} hex characters",
        "compared": list(tree_version.COMPARED),
        "releases": list(releases),
        "files": {path: files[path] for path in sorted(files)},
    }


def render(table: dict) -> str:
    """The table as the shipped file holds it: one line per file, so a new release reads as a small diff."""
    head = {key: value for key, value in table.items() if key != "files"}
    lines = [json.dumps(head, sort_keys=True)[:-1] + ', "files": {']
    items = list(table["files"].items())
    for number, (path, values) in enumerate(items):
        comma = "," if number < len(items) - 1 else ""
        lines.append(f"  {json.dumps(path)}: {json.dumps(values, sort_keys=True, separators=(',', ':'))}{comma}")
    lines.append("}}")
    return "\n".join(lines) + "\n"


def release_digests_from_table(table: dict, version: str) -> dict[str, str]:
    """``path -> digest`` of one release, read back out of ``table``."""
    index = table["releases"].index(version)
    return {
        path: value for path, values in table["files"].items() for value, indexes in values.items() if index in indexes
    }


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.release_digests", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the shipped table is out of date")
    args = parser.parse_args(list(argv) if argv is not None else None)
    text = render(build_table(ALL_RELEASES))
    path = tree_version.TABLE
    if args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path}: out of date; run python -m tools.release_digests", file=sys.stderr)
            return 1
        print(f"{path}: up to date ({len(ALL_RELEASES)} releases)")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path} ({len(ALL_RELEASES)} releases, {hashlib.sha256(text.encode()).hexdigest()[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
