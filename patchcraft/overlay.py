"""An overlay: the patched files of an SGLang install, served at import time, the install untouched.

``build`` runs what ``apply`` would write (the harness proof included when
torch is importable) and writes it, with a stdlib-only bootstrap, into a
content-addressed directory:

- ``sitecustomize.py``: the bootstrap. Python runs it at start-up when the
  directory is on ``PYTHONPATH``, in the server and in every process it
  starts (TP workers, scheduler, ``multiprocessing`` spawn children). It
  installs a meta-path finder for the patched module names only, then runs
  the ``sitecustomize`` that would have run without it, if any.
- ``patchcraft_overlay.json``: the manifest. Per module: the overlay file,
  and the installed file it was built from (path, size, mtime, sha256).
- ``tree/sglang/``: a copy of the parts of the package patchcraft reads,
  patched, so ``patchcraft verify``/``smoke``/``check-draft`` can run on it.

The finder serves a module from the overlay only while the file Python
would otherwise import is the very file the overlay was built from (size
and mtime, else its hash); otherwise it raises ImportError naming the file.
It never serves code derived from another release.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from patchcraft import __version__, cache
from patchcraft.cache_root import ensure_directory
from patchcraft.engine import run
from patchcraft.results import Mode, RunResult
from patchcraft.errors import PatchcraftError
from patchcraft.fetch import copy_parts
from patchcraft.status import ModelStatus
from patchcraft.tree import SglangTree

MANIFEST = "patchcraft_overlay.json"
BOOTSTRAP = "sitecustomize.py"
TREE = "tree"


@dataclass(frozen=True)
class Overlay:
    directory: Path
    modules: tuple[str, ...]
    reused: bool
    result: RunResult | None = None

    @property
    def package(self) -> Path:
        """The patched copy of the package, a TARGET for verify, smoke and check-draft."""
        return self.directory / TREE / "sglang"


def default_directory(tree: SglangTree, names: Sequence[str], runner: bool) -> Path | None:
    """``<cache>/overlays/<key>``: keyed by every file a run reads, the options and patchcraft itself."""
    from patchcraft.fetch import cache_dir

    key = cache.run_key(tree, Mode.APPLY, names, runner)
    return None if key is None else cache_dir() / "overlays" / key


def build(tree: SglangTree, out: Path | None = None, names: Sequence[str] = (), runner: bool = True, prove=None) -> Overlay:
    """Build the overlay of ``tree`` into ``out`` (default: the content-addressed cache directory).

    A directory that already holds a complete overlay for the same inputs is
    reused as it is. ``prove`` is the harness step (commands/_proof.gate):
    what it fails is not in the overlay, and the build refuses.
    """
    directory = out if out is not None else default_directory(tree, names, runner)
    if directory is None:
        raise PatchcraftError(f"{tree.package}: cannot read every file of the install to key the overlay")
    if out is None and (directory / MANIFEST).is_file():
        return Overlay(directory, tuple(json.loads((directory / MANIFEST).read_text())["modules"]), reused=True)
    result = run(tree, Mode.APPLY, names, runner=runner)
    if prove is not None:
        result = prove(result)
    failed = [m for m in result.models if m.status == ModelStatus.ERROR or m.proof == "harness-failed"]
    if failed:
        raise PatchcraftError(f"{failed[0].model}: {failed[0].message}; no overlay was built")
    return _write(tree, result, directory)


def module_name(tree: SglangTree, path: Path) -> str:
    rel = path.resolve().relative_to(tree.package.resolve().parent)
    return ".".join(rel.with_suffix("").parts)


def _write(tree: SglangTree, result: RunResult, directory: Path) -> Overlay:
    ensure_directory(directory.parent)  # an unusable cache or --out parent: one line naming it (cache_root)
    staging = Path(tempfile.mkdtemp(prefix=".overlay-", dir=directory.parent))
    try:
        package = staging / TREE / "sglang"
        copy_parts(tree.package, package)  # what patchcraft reads, so `smoke --overlay` can run on the tree
        modules = {}
        for change in result.changes:
            original = change.source.path
            rel = original.resolve().relative_to(tree.package.resolve())
            target = package / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(change.source.encode(change.after))
            data = original.read_bytes()
            stat = original.stat()
            modules[module_name(tree, original)] = {
                "file": (Path(TREE) / "sglang" / rel).as_posix(),
                "original": str(original.resolve()),
                "size": stat.st_size,
                "mtime_ns": stat.st_mtime_ns,
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        manifest = {"patchcraft": __version__, "sglang_version": tree.version, "package": str(tree.package.resolve()), "modules": modules}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        (staging / BOOTSTRAP).write_text(BOOTSTRAP_SOURCE.replace("__MODULES__", repr(modules)), encoding="utf-8")
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise PatchcraftError(f"{directory}: cannot write the overlay ({exc})") from None
    return Overlay(directory, tuple(modules), reused=False, result=result)


def stale(directory: Path) -> list[str]:
    """Installed files that changed since ``directory``'s overlay was built (by hash), or why it is unreadable."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"{directory / MANIFEST}: not an overlay ({exc})"]
    problems = []
    for name, entry in sorted(manifest["modules"].items()):
        try:
            digest = hashlib.sha256(Path(entry["original"]).read_bytes()).hexdigest()
        except OSError as exc:
            problems.append(f"{entry['original']} ({name}): unreadable ({exc})")
            continue
        if digest != entry["sha256"]:
            problems.append(f"{entry['original']} ({name}) changed since the overlay was built")
    return problems


#: The bootstrap: stdlib only (no patchcraft, libcst, rich or torch at server start), and cheap:
#: the module table is a literal (no json import), hashlib and importlib.util load only when used.
BOOTSTRAP_SOURCE = '''\
"""patchcraft overlay bootstrap: serves SGLang modules patched by patchcraft from this directory.

Written by patchcraft; see its docs/run.md. Stdlib only. Runs the sitecustomize
that would have run without it, if any.
"""

MODULES = __MODULES__


def _install():
    import os
    import sys
    from importlib.machinery import PathFinder

    here = os.path.dirname(os.path.abspath(__file__))

    class PatchcraftOverlayFinder:
        """Claims only the modules patchcraft patched; steps aside for everything else."""

        def find_spec(self, name, path=None, target=None):
            entry = MODULES.get(name)
            if entry is None:
                return None
            original = PathFinder.find_spec(name, path)
            if original is None or not original.origin:
                return None
            origin = os.path.realpath(original.origin)
            if origin != entry["original"]:
                raise ImportError(
                    "patchcraft overlay %s was built from %s, but this process imports %s; "
                    "rebuild it (patchcraft overlay build, or patchcraft run)" % (here, entry["original"], origin),
                    name=name,
                )
            stat = os.stat(origin)
            if (stat.st_size, stat.st_mtime_ns) != (entry["size"], entry["mtime_ns"]):
                import hashlib

                with open(origin, "rb") as handle:
                    if hashlib.sha256(handle.read()).hexdigest() != entry["sha256"]:
                        raise ImportError(
                            "patchcraft overlay: %s changed since the overlay in %s was built from it "
                            "(SGLang upgraded?); rebuild it (patchcraft overlay build, or patchcraft run)" % (origin, here),
                            name=name,
                        )
            import importlib.util

            return importlib.util.spec_from_file_location(name, os.path.join(here, entry["file"]))

    sys.meta_path.insert(0, PatchcraftOverlayFinder())

    # The sitecustomize this one shadows (further down sys.path) still runs.
    real = os.path.realpath(here)
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != real]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        import importlib.util

        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_install()
del _install
'''
