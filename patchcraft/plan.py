"""Turn a model class graph into one :class:`ModelPlan` per model class.

A model class is a class that defines ``set_eagle3_layers_to_capture``,
or inherits it and builds a different inner model (``Llama4ForCausalLM``
inherits Llama's setter but its ``self.model`` is ``Llama4Model``, which
has its own ``forward``). Every such class gets a plan: its edit sites,
or the precise reason it cannot be supported. None is skipped silently.
"""

from __future__ import annotations

import ast
import codecs
import functools
import re
from pathlib import Path
from dataclasses import replace
from typing import Any, Callable, Iterable

from patchcraft.graph import (
    RELEVANT,
    SETTER,
    ClassNode,
    EditSite,
    ModelGraph,
    ModelPlan,
    assigns_self_attr,
    class_assigns,
    constructors_of,
    group_of,
    read_forward,
    nodes_of,
    words_of,
    read_setter,
    references_self_attr,
)


#: Start of the reason given for an inner model's helper setter that nothing calls.
OWN_HELPER = "inner-model helper only:"
#: In the reason given for a class whose inner model captures nothing (a draft or NextN head).
NO_CAPTURE = "has no aux hidden-state capture at all"


def scan(models_dir: Path) -> ModelGraph:
    """Parse the model files that can matter (cheap text filters before any parse).

    First the files that mention the setter; then, until nothing new turns
    up, the files that mention a class having the setter (its own or
    inherited): a subclass may live in a file that names neither the
    setter nor ``layers_to_capture`` (qwen4_exp, qwen3_omni_moe, the EAGLE
    drafts), and it is a model class all the same. Inner models in other
    files are loaded when the graph resolves them.
    """
    graph = ModelGraph(models_dir=models_dir)
    texts = ModelTexts(read_models(models_dir))
    # ``m.K``, with ``K`` only imported by ``m``, resolves to a class of a third file,
    # whose name need not be ``K``: such files are loaded up front (a few, if any).
    pending = [stem for stem in texts.data if texts.has_setter(stem) or texts.may_derive_through_imports(stem)]
    searched: set[bytes] = set()
    while pending:
        for stem in pending:
            graph.load(stem, texts.data[stem])
        names = {c.name.encode() for c in list(graph.classes.values()) if graph.find_method(c, SETTER)} - searched
        searched |= names
        pending = [stem for stem in texts.data if stem not in graph.loaded and texts.mentions_any(stem, names)] if names else []
    return graph


def plan_reaching(
    models_dir: Path,
    files: Iterable[Path],
    choose: Callable[[list[ModelPlan], set[Path]], list[ModelPlan]],
) -> list[ModelPlan] | None:
    """``choose(plan_models(scan(models_dir)), files)`` without planning the whole tree.

    ``choose`` picks the plans that meet ``files``, closed over the files
    they share (engine.select). A plan's sites are found by following
    imports from its class's file, so only the classes of ``files`` and of
    the files importing them (transitively) can meet ``files``; of those
    files only the ones that may hold a class with the setter are parsed
    (:class:`Reach`). When the plans chosen reach further, the scope grows
    and planning runs again. None when a file lies outside ``models_dir``
    (plan the whole tree then).
    """
    models = models_dir.resolve()
    wanted = {path.resolve() for path in files}
    if not wanted or any(path.parent != models for path in wanted):
        return None
    texts = ModelTexts(read_models(models_dir))
    imports = import_map(texts)
    reach = Reach(ModelGraph(models_dir=models_dir), texts)
    while True:
        reach.load(importers(imports, {path.stem for path in wanted}))
        chosen = choose(plan_models(reach.graph), wanted)
        touched = wanted | {path.resolve() for plan in chosen for path in (*plan.files, plan.path)}
        if touched <= wanted:
            return chosen
        wanted = touched


def read_models(models_dir: Path) -> dict[str, bytes]:
    """The bytes of every ``<models_dir>/*.py``, by stem, in name order (unreadable files left out)."""
    data: dict[str, bytes] = {}
    for path in sorted(models_dir.glob("*.py")):
        try:
            data[path.stem] = path.read_bytes()
        except OSError:
            continue
    return data


class Reach:
    """Loads, of the files in a scope, those that may hold a class with the setter.

    Why that is enough: a model class has the setter, its own or inherited.
    Its own: the file mentions the setter. Inherited: follow its bases
    until one leaves the file; :class:`ModelGraph` resolves that base
    through an import from a sibling file C (``from C import K``, ``K as
    N``, ``C.K``), and K has the setter. So the file's base lists or
    ``import ... as`` names hold the word K (:meth:`ModelTexts.mentions`),
    C is among the files its imports may name, and K is one of
    :meth:`setter_classes` of C: exactly those of the parsed graph when C
    is loaded (the whole graph resolves the same names to the same
    classes), else every class name of C unless C cannot hold one either,
    decided the same way. ``C.K`` may also be a name C imports from a
    third file (:meth:`exported_setter_classes`). A file left out holds no
    model class, so the plans of the others are the whole graph's
    (resolution only follows imports, and loads what it needs on its own).
    Files are decided in name order, each after the siblings it needs;
    an import cycle back to an undecided file counts it as "maybe".
    """

    def __init__(self, graph: ModelGraph, texts: ModelTexts) -> None:
        self.graph = graph
        self.texts = texts
        self.scope: set[str] = set()
        self.decided: dict[str, bool] = {}
        self.pending: set[str] = set()
        self.names: dict[str, set[bytes] | None] = {}

    def load(self, scope: set[str]) -> None:
        """Load the files of ``scope`` that may hold a class with the setter, and their bases."""
        self.scope |= scope
        for stem in sorted(scope):
            if stem in self.texts.data and stem not in self.graph.loaded:
                self._decide(stem)
        # Looking every setter up loads the files the bases come from, as scan does.
        for cls in list(self.graph.classes.values()):
            self.graph.find_method(cls, SETTER)

    def setter_classes(self, stem: str) -> set[bytes] | None:
        """Names of the classes of ``stem`` that may have the setter (None: any name)."""
        if stem not in self.graph.loaded and stem not in self.pending:
            self._decide(stem)  # loads it when in scope: then the names are exact
        if self.graph.loaded.get(stem):
            if stem not in self.names:
                classes = [c for c in list(self.graph.classes.values()) if c.module == stem]
                self.names[stem] = {c.name.encode() for c in classes if self.graph.find_method(c, SETTER)}
            return self.names[stem]
        if stem in self.pending or self.decided.get(stem, True):
            return self.texts.class_names(stem)  # undecided (an import cycle) or maybe: any of its classes
        return set()

    def exported_setter_classes(self, stem: str) -> set[bytes] | None:
        """What ``m.K`` may name with the setter, ``m`` being ``stem``: the graph also resolves
        ``K`` through the imports of ``m`` (one step: to a class defined where it points)."""
        own = self.setter_classes(stem)
        if own is None:
            return None
        if not self.graph.loaded.get(stem):
            return own | self.texts.imported_names(stem)
        names = set(own)
        for alias, (other, name) in self.graph.imports.get(stem, {}).items():
            found = self.setter_classes(other) if other != stem else own
            if found is None or name.encode() in found:
                names.add(alias.encode())
        return names

    def _decide(self, stem: str) -> bool:
        """Whether ``stem`` may hold a class with the setter; loaded if so and in scope.

        Files out of scope are only judged, never parsed here: their class
        names stand in for the classes with the setter.
        """
        if stem not in self.decided:
            self.pending.add(stem)
            try:
                self.decided[stem] = self._may_hold_setter_class(stem)
            finally:
                self.pending.discard(stem)
        if self.decided[stem] and stem in self.scope and stem not in self.graph.loaded:
            self.graph.load(stem, self.texts.data[stem])
        return self.decided[stem]

    def _may_hold_setter_class(self, stem: str) -> bool:
        texts = self.texts
        if texts.has_setter(stem):
            return True
        words = texts.mentions(stem)
        if words is None:
            return True
        dotted = texts.dotted_bases(stem)
        for sibling in sorted(texts.siblings(stem)) if words else ():
            names = self.setter_classes(sibling)
            if names is None or not words.isdisjoint(names):
                return True
            names = self.exported_setter_classes(sibling) if dotted else set()
            if names is None or not dotted.isdisjoint(names):
                return True
        return False


class ModelTexts:
    """The bytes of the model files, and what their text says: each fact computed once, on first use.

    Every fact over-approximates what :class:`ModelGraph` finds once the
    file is parsed: a fact that says too much costs a parse, one that says
    too little would lose a model, so none may. When the text is not plain
    enough to be sure (a class line the patterns cannot read), the fact
    says "anything" (None). The bytes are searched as ASCII: an encoding
    that is no superset of ASCII (EBCDIC, UTF-16) is not supported.
    """

    def __init__(self, data: dict[str, bytes]) -> None:
        self.data = data
        self._imports: dict[str, list[bytes]] = {}
        self._headers: dict[str, tuple[set[bytes], list[bytes]] | None] = {}
        self._mentions: dict[str, set[bytes] | None] = {}
        self._imported_names: dict[str, set[bytes]] = {}

    def has_setter(self, stem: str) -> bool:
        return any(token in self.data[stem] for token in RELEVANT)

    def imported_words(self, stem: str) -> set[str]:
        """The words of the imports of ``stem`` that may name a sibling model file (:func:`_sibling_imports`)."""
        return {word.decode() for region in self._regions(stem) for word in _WORD.findall(region)}

    def imported_names(self, stem: str) -> set[bytes]:
        """Every word of the sibling imports of ``stem``: the names they bind among them."""
        if stem not in self._imported_names:
            self._imported_names[stem] = {word for region in self._regions(stem) for word in _WORD.findall(region)}
        return self._imported_names[stem]

    def siblings(self, stem: str) -> set[str]:
        """The other model files the imports of ``stem`` may name."""
        return {word for word in self.imported_words(stem) if word in self.data and word != stem}

    def class_names(self, stem: str) -> set[bytes] | None:
        """Names of the top-level classes of ``stem`` (a few in strings too); None: unreadable."""
        headers = self._header(stem)
        return None if headers is None else headers[0]

    def mentions(self, stem: str) -> set[bytes] | None:
        """Every name a top-level class of ``stem`` may derive from; None: any name.

        The words of its base lists (``mod.K`` gives ``K``), and the names
        its sibling imports rename (``K`` of ``from .m import K as N``).
        """
        if stem not in self._mentions:
            headers = self._header(stem)
            words = None if headers is None else _aliased(self._regions(stem)) if b"as" in self.data[stem] else set()
            if headers is not None and words is not None:
                for bases in headers[1]:
                    words.update(_WORD.findall(bases))
            self._mentions[stem] = words
        return self._mentions[stem]

    def dotted_bases(self, stem: str) -> set[bytes]:
        """``K`` of every base ``m.K`` (also ``m.K[T]``) of ``stem``'s classes, ``m`` bound by a sibling import."""
        headers = self._header(stem)
        if not headers:
            return set()
        modules = self.imported_names(stem)
        return {name for bases in headers[1] for module, name in _DOTTED.findall(bases) if module in modules}

    def may_derive_through_imports(self, stem: str) -> bool:
        """Whether a base ``m.K`` of ``stem`` may name what a sibling ``m`` only imports (``K`` of another file)."""
        dotted = self.dotted_bases(stem)
        return bool(dotted) and any(not dotted.isdisjoint(self.imported_names(s)) for s in self.siblings(stem))

    def mentions_any(self, stem: str, names: set[bytes]) -> bool:
        words = self.mentions(stem)
        return words is None or not words.isdisjoint(names)

    def _regions(self, stem: str) -> list[bytes]:
        if stem not in self._imports:
            self._imports[stem] = _sibling_imports(self.data[stem])
        return self._imports[stem]

    def _header(self, stem: str) -> tuple[set[bytes], list[bytes]] | None:
        if stem not in self._headers:
            self._headers[stem] = _class_headers(self.data[stem])
        return self._headers[stem]


def import_map(texts: ModelTexts) -> dict[str, set[str]]:
    """Per model file, the words of its import statements that may name a sibling model file.

    Every word of an import statement whose head names the models package
    (or is relative) counts: this over-approximates the imports
    :class:`ModelGraph` follows, so a file found needlessly only costs a
    parse, and none that matters is missed (see :func:`_sibling_imports`).
    """
    return {stem: texts.imported_words(stem) for stem in texts.data}


def importers(imports: dict[str, set[str]], stems: set[str]) -> set[str]:
    """``stems`` and the model files that import any of them, transitively (see :func:`import_map`)."""
    found = set(stems)
    frontier = set(stems)
    while frontier:
        frontier = {stem for stem, words in imports.items() if stem not in found and not words.isdisjoint(frontier)}
        found |= frontier
    return found


#: Where an import the graph follows may start: ``from .x``/``from . import x`` (also split by a backslash).
_RELATIVE = re.compile(rb"from(?:[ \t]|\\\r?\n)+\.")
#: A parenthesised list of imported names; comments in it may hold parentheses of their own.
_NAME_LIST = re.compile(rb"\((?:[^()#]|#[^\n]*)*\)")
_WORD = re.compile(rb"\w+")


def _sibling_imports(text: bytes) -> list[bytes]:
    """The logical lines of ``text`` that may import a sibling model file (a superset).

    :class:`ModelGraph` follows ``from sglang.srt.models[.x] import ...``,
    ``import sglang.srt.models.x as y`` and level-1 relative imports. The
    head of each (up to ``import``) holds the token ``models`` or
    ``from .``, and can only span physical lines joined by backslashes;
    the names may continue in one parenthesised group. So the logical line
    around every ``models`` and ``from .`` in the text, wherever it stands
    (a one-line ``if ...: from .x import y`` too), holds each such
    statement whole. Hits in comments or strings only add words.
    """
    hits: list[int] = []
    at = text.find(b"models")
    while at >= 0:
        hits.append(at)
        at = text.find(b"models", at + 6)
    if b"from" in text:
        hits.extend(m.start() for m in _RELATIVE.finditer(text))
    regions: dict[int, bytes] = {}
    for hit in hits:
        if _in_comment(text, hit):
            continue  # "Adapted from .../models/llama.py" would make every such file an importer of llama
        start = _logical_line_start(text, hit)
        if start not in regions:
            regions[start] = text[start:_logical_line_end(text, start)]
    return list(regions.values())


def _in_comment(text: bytes, at: int) -> bool:
    """Whether ``at`` certainly lies in a comment, never in code.

    Only the plain case is recognised: a ``#`` before ``at`` on its
    physical line, with no quote anywhere before ``at`` there. Anything
    else (a ``#`` inside a string, a hit inside a multi-line string) counts
    as code, which only adds words (a needless parse, never a lost import).
    """
    # A lone carriage return ends a line too (old Mac files; Python accepts them).
    prefix = text[max(text.rfind(b"\n", 0, at), text.rfind(b"\r", 0, at)) + 1 : at]
    return b"#" in prefix and b'"' not in prefix and b"'" not in prefix


def _logical_line_start(text: bytes, at: int) -> int:
    start = text.rfind(b"\n", 0, at) + 1
    while start >= 2 and _continued(text, start):
        start = text.rfind(b"\n", 0, start - 1) + 1
    return start


def _continued(text: bytes, line_start: int) -> bool:
    """Whether the physical line ending just before ``line_start`` ends in a backslash."""
    end = line_start - 1  # the newline
    if end >= 1 and text[end - 1 : end] == b"\r":
        end -= 1
    return end >= 1 and text[end - 1 : end] == b"\\"


def _logical_line_end(text: bytes, start: int) -> int:
    end = text.find(b"\n", start)
    while end >= 0 and _continued(text, end + 1):
        end = text.find(b"\n", end + 1)
    end = len(text) if end < 0 else end
    # Any parenthesis may open the list of names (``if f(x): from .y import (a,`` too).
    paren = text.find(b"(", start, end)
    while paren >= 0:
        group = _NAME_LIST.match(text, paren)
        if group is None:
            return len(text)  # unclosed: the rest of the file (more words, never fewer)
        end = max(end, group.end())
        paren = text.find(b"(", group.end(), end)
    return end


def _aliased(regions: list[bytes]) -> set[bytes]:
    """``K`` of every ``K as N`` in ``regions``; all their words where a comment or a backslash may split one."""
    words: set[bytes] = set()
    for region in regions:
        if b"as" not in region:
            continue
        if b"#" in region or b"\\" in region:
            words.update(_WORD.findall(region))
        else:
            words.update(_ALIASED.findall(region))
    return words


# The class patterns start with a newline, a literal the regex engine searches
# for quickly (``^`` with re.M tries every position: 5x slower). They run on
# the text after a newline put in front, so a class on the first line counts.
_CLASS_LINE = re.compile(rb"\nclass\b")
_CLASS_NAME = re.compile(rb"\nclass\s+(\w+)")
#: ``class Name(<bases>):``; the bases may span lines and hold one level of calls.
_CLASS_BASES = re.compile(rb"\nclass\s+\w+\s*\(((?:[^()]|\([^()]*\))*)\)\s*:")
_CLASS_PLAIN = re.compile(rb"\nclass\s+\w+\s*:")
#: In a base list read by _CLASS_BASES, what may hide a parenthesis or a class line from it.
_UNREADABLE_BASES = re.compile(rb"[#'\"\\]|\nclass\b")
_ALIASED = re.compile(rb"(\w+)\s+as\s+\w+")
_DOTTED = re.compile(rb"(\w+)\s*\.\s*(\w+)")


def _class_headers(text: bytes) -> tuple[set[bytes], list[bytes]] | None:
    """Names and base lists of the classes at column 0 (every top-level class; a few in strings too).

    None unless every line starting with ``class`` reads as ``class Name:``
    or ``class Name(<bases>):`` with bases free of comments, strings and
    backslashes: then each real header is read whole (no base is missed).
    """
    if b"class" not in text:
        return set(), []
    if b"\x0c" in text or (b"\r" in text and text.count(b"\r") != text.count(b"\r\n")):
        return None  # a form feed may indent a class line, a lone carriage return end the line before it
    text = b"\n" + text.removeprefix(codecs.BOM_UTF8)
    lines = len(_CLASS_LINE.findall(text))
    names = _CLASS_NAME.findall(text)
    bases = _CLASS_BASES.findall(text)
    if len(names) != lines or len(bases) + len(_CLASS_PLAIN.findall(text)) != lines:
        return None
    if any(_UNREADABLE_BASES.search(b) for b in bases):
        return None
    return set(names), bases


def plan_models(graph: ModelGraph) -> list[ModelPlan]:
    """One plan per model class, in file then line order."""
    plans: dict[tuple[str, str], ModelPlan] = {}
    # An inner model's own setter (the "inner helper" variant) is called by the
    # outer model's setter; the inner model is not a model class of its own.
    owners = [
        c
        for c in list(graph.classes.values())
        if SETTER in c.methods and not class_assigns(graph, c, "layers_to_capture")
    ]
    candidates = list(owners)
    for owner in owners:
        for sub in graph.subclasses(owner):
            if sub not in candidates:
                candidates.append(sub)
    for cls in candidates:
        plan = plan_model(graph, cls)
        if cls not in owners and not _differs_from_parent(graph, cls, plan, plans):
            continue
        plans[cls.key] = plan
    # A helper whose inner model another plan edits is that plan's business.
    edited = {(s.module, s.cls) for plan in plans.values() for s in plan.sites}
    for key, plan in list(plans.items()):
        if plan.unsupported and plan.unsupported.startswith(OWN_HELPER) and key in edited:
            del plans[key]
    plans = _with_inheriting_inits(graph, plans)
    return sorted(plans.values(), key=lambda p: (p.module, _line(graph, p)))


def _with_inheriting_inits(graph: ModelGraph, plans: dict[tuple[str, str], ModelPlan]) -> dict[tuple[str, str], ModelPlan]:
    """Give every class that runs a patched ``forward`` the flag in its own ``__init__``.

    A class may inherit an inner model's capturing forward with an
    ``__init__`` of its own and be no model's inner model (0.5.8's
    ``MistralLarge3Model``, built through ``self.model_cls`` for the EAGLE
    draft): the patched forward then reads a flag that class never sets.
    Its ``__init__`` site joins every plan that patches that forward.
    """
    forwards: dict[tuple[str, str, str], list[EditSite]] = {}
    for cls in list(graph.classes.values()):
        found = _capturing_forward(graph, cls)
        init = _init_owner(graph, cls)
        if found is None or init is None:
            continue
        forward_key = (str(found[0].path), found[0].name, "forward")
        site = EditSite(kind="init", path=init.path, module=init.module, cls=init.name, method="__init__")
        if site not in forwards.setdefault(forward_key, []):
            forwards[forward_key].append(site)
    result: dict[tuple[str, str], ModelPlan] = {}
    for key, plan in plans.items():
        # In file and class order: a single-file run loads classes in another order than the whole tree.
        extra = sorted((i for s in plan.sites if s.kind == "forward" for i in forwards.get(s.key, ())), key=lambda i: (str(i.path), i.cls))
        result[key] = replace(plan, sites=tuple(_unique([*plan.sites, *extra]))) if extra else plan
    return result


def _init_owner(graph: ModelGraph, cls: ClassNode) -> ClassNode | None:
    """The class whose ``__init__`` sets ``self.layers_to_capture`` for ``cls`` (where the flag goes)."""
    return next(
        (o for o in graph.mro(cls) if "__init__" in o.methods and assigns_self_attr(o.methods["__init__"], "layers_to_capture")),
        None,
    )


def _line(graph: ModelGraph, plan: ModelPlan) -> int:
    cls = graph.classes.get((plan.module, plan.cls))
    return cls.node.lineno if cls else 0


def _differs_from_parent(graph: ModelGraph, cls: ClassNode, plan: ModelPlan, plans: dict) -> bool:
    """An inheriting class is its own model only when it needs other sites."""
    found = graph.find_method(cls, SETTER)
    if found is None:
        return False
    parent = plan_model(graph, found[0])
    return {s.key for s in plan.sites} != {s.key for s in parent.sites} or plan.unsupported != parent.unsupported


def plan_model(graph: ModelGraph, cls: ClassNode, _depth: int = 0) -> ModelPlan:
    """Find the three edit sites for model class ``cls``, or why there are none."""
    memo = graph.plans
    if (cls.key, _depth) not in memo:
        memo[(cls.key, _depth)] = _plan_model(graph, cls, _depth)
    return memo[(cls.key, _depth)]


def _plan_model(graph: ModelGraph, cls: ClassNode, _depth: int) -> ModelPlan:
    base: dict[str, Any] = dict(module=cls.module, cls=cls.name, path=cls.path)
    key = (cls.module, cls.name)
    if key in graph.duplicates:
        return ModelPlan(**base, unsupported=f"class {cls.name} is defined {graph.duplicates[key]} times in {cls.path.name}; ambiguous anchor")
    found = graph.find_method(cls, SETTER)
    assert found is not None
    setter_owner, setter = found
    shape = read_setter(setter)
    where = f"{setter_owner.path.name}: {setter_owner.name}.{SETTER}"
    if shape.variant == "legacy":
        return ModelPlan(**base, unsupported=f"{where} takes no layer_ids parameter (legacy setter); ids cannot be passed, so -1 cannot be requested")
    if shape.delegate_attr is not None:
        return _plan_delegation(graph, cls, shape.delegate_attr, base, where, _depth)
    if shape.variant == "own-helper":
        return ModelPlan(
            **base,
            not_applicable=True,
            unsupported=(
                f"{OWN_HELPER} {where} sets its own layers_to_capture, and no model class in "
                "sglang/srt/models calls it (no outer setter): EAGLE-3 is not wired for this model at all"
            ),
        )
    if shape.inner_attr is None:
        return ModelPlan(**base, unsupported=f"{where} sets no `self.<model>.layers_to_capture` and calls no inner setter; nothing to extend")
    inner_classes, unresolved = constructors_of(graph, cls, shape.inner_attr)
    if not inner_classes:
        return ModelPlan(**base, unsupported=_unresolved(cls, shape.inner_attr, unresolved, where))
    pp = _pipeline_group(graph, cls, setter, shape.inner_attr, inner_classes)
    sites: list[EditSite] = [
        EditSite(
            kind="setter",
            path=setter_owner.path,
            module=setter_owner.module,
            cls=setter_owner.name,
            method=SETTER,
            params=(("target", f"self.{shape.inner_attr}"), ("param", shape.param or "layer_ids"), ("pp", pp)),
        )
    ]
    notes = [f"setter: {shape.variant}"]
    for inner in inner_classes:
        problem = _inner_sites(graph, inner, sites, notes) or _unmarked(graph, inner, setter, shape.inner_attr, where)
        if problem:
            return ModelPlan(**base, unsupported=problem, notes=tuple(notes), not_applicable=NO_CAPTURE in problem)
    return ModelPlan(**base, sites=tuple(_unique(sites)), notes=tuple(notes))


def _unmarked(graph: ModelGraph, inner: ClassNode, setter, attr: str, where: str) -> str | None:
    """Why nothing is captured when the forward only captures layers flagged ``_is_layer_to_capture``
    and neither the setter nor the inner helper it calls ever sets that flag (0.5.13-0.5.20
    Qwen3.5 under the Qwen3-VL setter): an embedding capture alone would feed the draft one
    state instead of k."""
    found = _capturing_forward(graph, inner)
    if found is None or not read_forward(found[1]).flag_gated_only:
        return None
    marks = "_is_layer_to_capture" in words_of(setter)
    helper = graph.find_method(inner, SETTER)
    if helper is not None and SETTER in words_of(setter):
        marks = marks or "_is_layer_to_capture" in words_of(helper[1])
    if marks:
        return None
    return (
        f"{where} assigns `self.{attr}.layers_to_capture`, but {found[0].label}.forward captures only "
        "layers flagged `_is_layer_to_capture`, which nothing sets in this release: no layer is captured "
        "at all (EAGLE-3 itself is broken here), and the embedding alone would feed the draft one state"
    )


def _pipeline_group(graph: ModelGraph, cls: ClassNode, setter, inner_attr: str, inners: list[ClassNode]) -> str:
    """The pipeline group whose ``world_size`` the setter block checks ("" when none exists).

    The setter's own guard names it (``get_pp_group()``, ``self.pp_group``);
    else the outer class's ``self.pp_group``; else the inner model's, when
    only the inner model knows its pipeline rank (Qwen2.5-VL in 0.5.2).
    """
    named = group_of(setter, "is_last_rank")
    if named:
        return named
    if class_assigns(graph, cls, "pp_group"):
        return "self.pp_group"
    if any(class_assigns(graph, inner, "pp_group") for inner in inners):
        return f"self.{inner_attr}.pp_group"
    return ""


def _unresolved(cls: ClassNode, attr: str, calls: list[str], where: str) -> str:
    if calls:
        return (
            f"{where} works on `self.{attr}`, built by {calls[0]}: a class chosen at run time, "
            "not one defined in sglang/srt/models, so its forward cannot be patched here"
        )
    return f"{cls.path.name}: {cls.name}.__init__ never builds `self.{attr}` (the inner model the setter configures)"


def _plan_delegation(graph: ModelGraph, cls: ClassNode, attr: str, base: dict[str, Any], where: str, depth: int) -> ModelPlan:
    targets, unresolved = constructors_of(graph, cls, attr)
    if not targets:
        return ModelPlan(**base, unsupported=_unresolved(cls, attr, unresolved, where))
    sites: list[EditSite] = []
    names = []
    notes = ["setter: delegation"]
    for target in targets:
        if graph.find_method(target, SETTER) is None or depth > 4:
            return ModelPlan(**base, unsupported=f"{where} delegates to {target.label}, which has no {SETTER}")
        delegate = plan_model(graph, target, depth + 1)
        if delegate.unsupported:
            return ModelPlan(
                **base,
                unsupported=f"delegates to {target.label}: {delegate.unsupported}",
                delegate=target.label,
                not_applicable=delegate.not_applicable,
            )
        sites.extend(delegate.sites)
        names.append(target.label)
        notes.extend(n for n in delegate.notes if n not in notes)
    return ModelPlan(**base, sites=tuple(_unique(sites)), delegate=", ".join(names), notes=tuple(notes))


def _inner_sites(graph: ModelGraph, inner: ClassNode, sites: list[EditSite], notes: list[str]) -> str | None:
    """Append the init and forward sites of inner model ``inner``; or say why not."""
    init_owner = _init_owner(graph, inner)
    found = _capturing_forward(graph, inner)
    if init_owner is None and found is None:
        return (
            f"{inner.label} {NO_CAPTURE} (no `self.layers_to_capture` in __init__, "
            "no capture in forward): the setter has no effect on it, so EAGLE-3 itself, not only layer id -1, "
            "is unavailable for this class"
        )
    if init_owner is None:
        return f"{inner.label} (or its bases) never initialises `self.layers_to_capture` in __init__"
    if found is None:
        return f"{inner.label}: forward never captures aux hidden states (no layers_to_capture in it, nor in the super().forward it calls)"
    forward_owner, forward = found
    early = _returns_before_aux(forward)
    if early is not None:
        return (
            f"{forward_owner.label}.forward returns `{ast.unparse(early.value) if early.value else 'None'}` on every non-idle batch "
            f"(line {early.lineno}), before its aux states: none ever reaches the draft, so EAGLE-3 itself does not work "
            "with this model in this release"
        )
    gate = group_of(forward, "is_first_rank")
    if gate:
        gate = f"{gate}.is_first_rank"
    elif class_assigns(graph, forward_owner, "pp_group"):
        gate = "self.pp_group.is_first_rank"
    elif class_assigns(graph, forward_owner, "start_layer"):
        gate = "self.start_layer == 0"
    sites.append(EditSite(kind="init", path=init_owner.path, module=init_owner.module, cls=init_owner.name, method="__init__"))
    params: tuple[tuple[str, str], ...] = (("gate", gate),)
    if collector_copies(graph.models_dir, read_forward(forward).collector):
        params += (("copies", "append"),)
    sites.append(
        EditSite(
            kind="forward",
            path=forward_owner.path,
            module=forward_owner.module,
            cls=forward_owner.name,
            method="forward",
            params=params,
        )
    )
    for label in read_forward(forward).labels():
        if f"forward: {label}" not in notes:
            notes.append(f"forward: {label}")
    return None


@functools.lru_cache(maxsize=32)
def collector_copies(models_dir: Path, collector: str) -> bool:
    """Whether the release's collector class ``collector`` copies what its ``append`` gets.

    ``AuxHiddenStatePacker.append`` (0.5.18 on) copies into its preallocated
    buffer (``....copy_(hidden)``), so the embedding capture need not clone
    first: that would copy twice. Read from ``srt/layers/aux_hidden_states.py``;
    anything unclear (no such file or class, another body) means "no", and
    the capture clones as usual.
    """
    path = models_dir.parent / "layers" / "aux_hidden_states.py"
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == collector:
            append = next((f for f in stmt.body if isinstance(f, ast.FunctionDef) and f.name == "append"), None)
            return append is not None and _copies_argument(append)
    return False


def _copies_argument(func: ast.FunctionDef) -> bool:
    """``something.copy_(<first argument>)`` in ``func``'s body."""
    if len(func.args.args) < 2:
        return False
    argument = func.args.args[1].arg
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "copy_"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == argument
        for node in ast.walk(func)
    )


def _returns_before_aux(func: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.Return | None:
    """``if not <batch>.forward_mode.is_idle(): return <no aux>`` in the forward's own body.

    Qwen4-Exp (0.5.20+) returns ``(hidden_states, hc_hidden_states)`` there:
    its aux collector is returned on idle batches only, so capturing more
    (the embedding) changes nothing the draft sees.
    """
    for stmt in func.body:
        if not (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.UnaryOp) and isinstance(stmt.test.op, ast.Not)):
            continue
        call = stmt.test.operand
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "is_idle"):
            continue
        last = stmt.body[-1] if stmt.body else None
        if isinstance(last, ast.Return) and not any("aux" in word for word in words_of(last)):
            return last
    return None


def _captures(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(references_self_attr(func, a) for a in ("layers_to_capture", "capture_aux_hidden_states")) or (
        "_is_layer_to_capture" in words_of(func)
    )


def _capturing_forward(graph: ModelGraph, inner: ClassNode):
    """The ``forward`` that runs the capture loop, following ``super().forward(...)``.

    A subclass may wrap its parent's forward (an EAGLE draft feeding fused
    inputs to ``super().forward``); the capture, and so the edit, is then in
    the parent's forward.
    """
    for owner in graph.mro(inner):
        forward = owner.methods.get("forward")
        if forward is None:
            continue
        if _captures(forward):
            return owner, forward
        if not _calls_super_forward(forward):
            return None
    return None


def _calls_super_forward(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for node in nodes_of(func):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "forward"
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super"
        ):
            return True
    return False


def _unique(sites: Iterable[EditSite]) -> list[EditSite]:
    seen: dict[tuple, EditSite] = {}
    for site in sites:
        seen.setdefault(site.key, site)
    return list(seen.values())
