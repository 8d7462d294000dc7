"""Which model class ``explain`` and ``check-draft`` are about: ``--model NAME`` in one tree.

``NAME`` is a model file stem, a class, ``module.Class``, or an
architecture (a class with the setter in its MRO that has no plan row of
its own). A file stem (or ``module.Class``) loads that file and its bases'
files only, and so does a class name (an architecture) that one file
defines; anything else plans the whole tree. More than one match, or
none, is a one-line :class:`~patchcraft.base.errors.PatchcraftError`
naming the candidates or the nearest names (:func:`patchcraft.planning.selection.no_match`).
"""

from __future__ import annotations

import re
from pathlib import Path

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.target import SglangTree
from patchcraft.planning.model_plans import plan_models, scan
from patchcraft.planning.records import ModelPlan
from patchcraft.planning.selection import named, no_match
from patchcraft.reading.class_graph import SETTER, ClassNode, ModelGraph
from patchcraft.reading.prefilter import read_models


def choose_model(tree: SglangTree, name: str | None) -> tuple[ModelGraph, ClassNode]:
    """The class graph read for ``name`` and the model class it names in ``tree`` (None: the only one)."""
    if not tree.models_dir.is_dir():
        raise PatchcraftError(f"{tree.package}: not an SGLang tree (no srt/models)")
    stem = name.lower().removesuffix(".py") if name else ""
    if "." in stem and (tree.models_dir / f"{stem.split('.')[0]}.py").is_file():
        stem = stem.split(".")[0]  # module.Class: that module's classes are enough, as for a file stem
    if stem and (tree.models_dir / f"{stem}.py").is_file():
        # A model file: its classes and what they import are enough (loaded on demand).
        graph = _file_graph(tree.models_dir, stem)
    else:
        found = _by_class_name(tree.models_dir, name) if name else None
        if found is not None:
            return found
        graph = scan(tree.models_dir)
    plans = plan_models(graph, inheriting=True)  # a fork's entry class that only inherits a setter has a row
    return graph, _choose_class(tree, graph, plans, name)


def _file_graph(models_dir: Path, stem: str, data: bytes | None = None) -> ModelGraph:
    """The classes of one model file, with their bases' files loaded (an inherited setter makes a model class)."""
    graph = ModelGraph(models_dir=models_dir)
    graph.load(stem, data)
    for cls in list(graph.classes.values()):
        graph.mro(cls)
    return graph


def _by_class_name(models_dir: Path, name: str) -> tuple[ModelGraph, ClassNode] | None:
    """A class name (an architecture) that exactly one model file defines: that file is enough.

    Planning the whole tree to pick one class costs most of a cold
    ``check-draft`` (its target names an architecture). Selection matches a
    name against a plan's class, module and label, case-insensitively; so
    when no file stem is the name and the bytes of exactly one file hold a
    ``class`` statement of that name (in any case, at any indent), no plan
    of another file can match it, and this file's graph chooses what the
    whole tree's would. Anything else (no such file, several, a match that
    is not exactly one model class, a file that cannot be parsed): None, and
    the whole tree is read.
    """
    if not name.isidentifier() or not name.isascii():
        return None
    wanted = name.lower()
    texts = read_models(models_dir)
    if any(stem.lower() == wanted for stem in texts):
        return None
    pattern = re.compile(rb"^[ \t]*class[ \t]+" + re.escape(name.encode()) + rb"\b", re.MULTILINE | re.IGNORECASE)
    holders = [stem for stem, data in texts.items() if pattern.search(data)]
    if len(holders) != 1:
        return None
    try:
        graph = _file_graph(models_dir, holders[0], texts[holders[0]])
        chosen = named(plan_models(graph, inheriting=True), [name])
    except PatchcraftError:  # a file that cannot be read: the whole tree says what it always said
        return None
    if len(chosen) != 1 or chosen[0].cls.lower() != wanted:
        return None
    return graph, graph.classes[(chosen[0].module, chosen[0].cls)]


def _choose_class(tree: SglangTree, graph: ModelGraph, plans: list[ModelPlan], name: str | None) -> ClassNode:
    chosen = named(plans, [name] if name else [])
    if len(chosen) > 1:
        # One module, several model classes (an MTP head next to the model): take the supported one.
        exact = [p for p in chosen if name and p.cls.lower() == name.lower()]
        supported = [p for p in chosen if not p.unsupported]
        chosen = exact or (supported if len(supported) == 1 else chosen)
    if len(chosen) == 1:
        return graph.classes[(chosen[0].module, chosen[0].cls)]
    if name and not chosen:
        found = class_by_name(graph, name)
        if found is not None:
            return found
        raise PatchcraftError(f"{tree.models_dir}: {no_match(tree.models_dir, [name])}")
    names = ", ".join(p.label for p in chosen[:8]) + (", ..." if len(chosen) > 8 else "")
    raise PatchcraftError(f"{len(chosen)} model classes match; pass --model NAME (one of: {names})")


def class_by_name(graph: ModelGraph, name: str) -> ClassNode | None:
    """A class with a setter in its MRO, found by its name (e.g. an architecture) in any model file.

    The files are scanned as bytes for ``class NAME``; only those that hold
    it are parsed.
    """
    bare = name.split(".")[-1]
    pattern = re.compile(rb"^class\s+" + re.escape(bare.encode()) + rb"\b", re.M)
    for path in sorted(graph.models_dir.glob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if pattern.search(data) and graph.load(path.stem):
            cls = graph.classes.get((path.stem, bare))
            if cls is not None and graph.find_method(cls, SETTER) is not None:
                return cls
    return None
