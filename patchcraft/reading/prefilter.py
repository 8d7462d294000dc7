"""The byte-level pre-filter: which model files can matter, decided before any parse.

Parsing is most of the cost of planning (docs/performance.md). A model
class has the setter, its own or inherited through imports, so plain text
tells which files may hold one (:class:`ModelTexts`), which files import
which (:func:`import_map`, :func:`importers`), and, for a scope of files,
which of them to parse at all (:class:`Reach`). Every fact here
over-approximates what :class:`~patchcraft.reading.class_graph.ModelGraph` finds once a
file is parsed: too much costs a parse, too little would lose a model.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path

from patchcraft.reading.class_graph import RELEVANT, SETTER, ModelGraph


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
            regions[start] = text[start : _logical_line_end(text, start)]
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
