"""The overlay's bootstrap, copied verbatim into every overlay as ``sitecustomize.py``.

Python imports ``sitecustomize`` at start-up from the first directory on
``sys.path`` that has one; an overlay directory first on ``PYTHONPATH`` is
that directory, in the server and in every process it starts. This module
then puts one meta-path finder first on ``sys.meta_path``. The finder claims
only the module names in the overlay's table (:data:`TABLE`, a data file
beside it) and steps aside for everything else.

Stdlib only, and cheap: it runs in every SGLang (or vLLM) process. Importing it as
``patchcraft.overlay.bootstrap`` only defines names; it installs itself only
when Python runs it as ``sitecustomize``.

One bootstrap per process. A second overlay further down ``sys.path`` is
never executed: its table joins the one finder. The same module served by
two overlays with the same file is served once; with different files, its
import raises ``ImportError`` naming both overlays. The ``sitecustomize``
these shadow (the first one that is not an overlay's) runs exactly once.

Before serving a module the finder checks, each time:

- that the file Python would otherwise import is the file the overlay was
  built from (path, then size and mtime, else sha256);
- that the overlay's own file still has the sha256 it was written with.

Either failing raises ``ImportError`` naming the file and saying to rebuild.
A table that cannot be read makes every ``sglang`` (and ``vllm``) import raise the same way:
never a silent fallback to the unpatched install.

While a process runs, it holds a shared ``flock`` on the overlay's
:data:`LOCK` file: patchcraft never deletes an overlay someone holds.
"""

from __future__ import annotations

import os
import sys

#: The module table, beside the bootstrap: a header (:data:`HEADER`, the row count), then one module a line,
#: :data:`FIELDS` tab-separated fields. The count makes an emptied or cut table damaged, not "nothing to serve".
TABLE = "patchcraft_modules.tsv"
HEADER = "#patchcraft-overlay-table"
#: The file every process using the overlay holds a shared lock on.
LOCK = ".lock"
#: The manifest patchcraft writes (the bootstrap only checks that it is there, to recognise an overlay).
MANIFEST = "patchcraft_overlay.json"
#: The overlay's layout, named here once (this module is the one every other overlay module may import):
#: this file is copied in as BOOTSTRAP; the patched files sit under PACKAGE_DIR (an SGLang overlay) or
#: VLLM_PACKAGE_DIR (a vLLM overlay), as the install has them.
BOOTSTRAP = "sitecustomize.py"
PACKAGE_DIR = ("tree", "sglang")
VLLM_PACKAGE_DIR = ("tree", "vllm")
#: The packages an overlay serves modules of: a damaged table makes every import of them raise.
SERVED_PACKAGES = ("sglang", "vllm")
#: Module name, overlay file (relative), its sha256, installed file, its size, mtime_ns and sha256.
FIELDS = 7
#: The finder's marker attribute, and the version of what :meth:`OverlayFinder.add` accepts.
PROTOCOL = 1
_REBUILD = "rebuild it (patchcraft overlay build, or patchcraft run)"


def read_table(directory: str) -> dict[str, tuple[str, ...]]:
    """The table of the overlay in ``directory``: module name -> the other six fields."""
    with open(os.path.join(directory, TABLE), encoding="utf-8") as handle:
        text = handle.read()
    lines = text.splitlines()
    head = lines[0].split("\t") if lines else []
    if len(head) != 2 or head[0] != HEADER or head[1] != str(len(lines) - 1):
        raise ValueError(f"{TABLE} is cut short or not a module table")
    rows: dict[str, tuple[str, ...]] = {}
    for number, line in enumerate(lines[1:], 2):
        fields = line.split("\t")
        if len(fields) != FIELDS:
            raise ValueError(f"{TABLE} line {number} has {len(fields)} fields, not {FIELDS}")
        rows[fields[0]] = tuple(fields[1:])
    return rows


def _sha256(path: str) -> str:
    import hashlib

    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _hold(directory: str) -> int | None:
    """A shared, non-blocking lock on the overlay's lock file, kept for the process's life."""
    try:
        import fcntl
    except ImportError:  # not POSIX: nothing to hold
        return None
    fd = os.open(os.path.join(directory, LOCK), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise OSError(f"{os.path.join(directory, LOCK)} is locked: the overlay is being removed") from None
    return fd


class OverlayFinder:
    """Claims only the modules the overlays on the path patched; steps aside for everything else."""

    patchcraft_overlay = PROTOCOL

    def __init__(self) -> None:
        self.modules: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.conflicts: dict[str, str] = {}
        self.broken: list[str] = []
        self.directories: list[str] = []
        self.locks: list[int] = []

    def add(self, directory: str) -> None:
        """Serve the overlay in ``directory`` (a real path) too; the same directory twice counts once."""
        if directory in self.directories:
            return
        self.directories.append(directory)
        try:
            fd = _hold(directory)
            if fd is not None:
                self.locks.append(fd)
            table = read_table(directory)
        except (OSError, ValueError) as exc:
            self.broken.append(f"patchcraft overlay {directory} is damaged ({exc}); {_REBUILD}")
            return
        for name, row in table.items():
            known = self.modules.get(name)
            if known is None:
                self.modules[name] = (directory, row)
            elif known[1][1:3] != row[1:3]:  # another file, or built from another install
                self.conflicts[name] = (
                    f"patchcraft overlay: {name} is served by two different overlays, {known[0]} and {directory}; "
                    "put only one of them on PYTHONPATH"
                )

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if self.broken and name.partition(".")[0] in SERVED_PACKAGES:
            raise ImportError(self.broken[0], name=name)
        if name in self.conflicts:
            raise ImportError(self.conflicts[name], name=name)
        known = self.modules.get(name)
        if known is None:
            return None
        directory, (file, file_sha, original_path, size, mtime_ns, sha) = known
        from importlib.machinery import PathFinder

        original = PathFinder.find_spec(name, path)  # type: ignore[arg-type]
        if original is None or not original.origin:
            return None
        origin = os.path.realpath(original.origin)
        if origin != original_path:
            raise ImportError(
                f"patchcraft overlay {directory} was built from {original_path}, but this process imports {origin}; {_REBUILD}",
                name=name,
            )
        stat = os.stat(origin)
        if (str(stat.st_size), str(stat.st_mtime_ns)) != (size, mtime_ns) and _sha256(origin) != sha:
            raise ImportError(
                f"patchcraft overlay: {origin} changed since the overlay in {directory} was built from it (the engine upgraded?); {_REBUILD}",
                name=name,
            )
        served = os.path.join(directory, file)
        try:
            intact = _sha256(served) == file_sha
        except OSError:
            intact = False
        if not intact:
            raise ImportError(
                f"patchcraft overlay: {served} is missing or changed since the overlay was built; {_REBUILD}", name=name
            )
        import importlib.util

        return importlib.util.spec_from_file_location(name, served)


def _is_overlay(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, MANIFEST))


def _import_system() -> tuple[object, object]:
    """``PathFinder`` and ``module_from_spec``, from the import system's frozen modules when it can.

    ``importlib.util`` pulls in contextlib, collections and functools: several
    ms in every process. The frozen modules are loaded already.
    """
    try:
        from _frozen_importlib import module_from_spec
        from _frozen_importlib_external import PathFinder
    except ImportError:  # another Python than CPython
        from importlib.machinery import PathFinder
        from importlib.util import module_from_spec
    return PathFinder, module_from_spec


def _run_shadowed(finder: OverlayFinder) -> None:
    """Run the first ``sitecustomize`` further down ``sys.path`` that is not an overlay's; join the overlays met on the way."""
    path_finder, module_from_spec = _import_system()
    while True:
        rest = [p for p in sys.path if os.path.realpath(p or os.curdir) not in finder.directories]
        spec = path_finder.find_spec("sitecustomize", rest)  # type: ignore[attr-defined]
        if spec is None or spec.loader is None or not spec.origin:
            return
        where = os.path.realpath(os.path.dirname(spec.origin))
        if _is_overlay(where):
            if os.path.isfile(os.path.join(where, TABLE)):
                finder.add(where)
            else:  # an overlay of an older patchcraft: never executed (it would chain back to this one)
                finder.directories.append(where)
            continue
        module = module_from_spec(spec)  # type: ignore[operator]
        spec.loader.exec_module(module)
        return


def main(file: str) -> None:
    """Install the overlay whose bootstrap is ``file``: one finder per process, the shadowed sitecustomize once."""
    here = os.path.dirname(os.path.realpath(file))
    for finder in sys.meta_path:
        if getattr(finder, "patchcraft_overlay", None) == PROTOCOL:
            finder.add(here)  # type: ignore[attr-defined]  # a second bootstrap run by someone's chain: join, never chain again
            return
    mine = OverlayFinder()
    mine.add(here)
    sys.meta_path.insert(0, mine)  # type: ignore[arg-type]
    _run_shadowed(mine)


if __name__ == "sitecustomize":
    main(__file__)
