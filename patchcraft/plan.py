"""Turn a model class graph into one :class:`ModelPlan` per model class.

A model class is a class that defines ``set_eagle3_layers_to_capture``,
or inherits it and builds a different inner model (``Llama4ForCausalLM``
inherits Llama's setter but its ``self.model`` is ``Llama4Model``, which
has its own ``forward``). Every such class gets a plan: its edit sites,
or the precise reason it cannot be supported. None is skipped silently.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
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
    words_of,
    read_setter,
    references_self_attr,
)


#: Start of the reason given for an inner model's helper setter that nothing calls.
OWN_HELPER = "inner-model helper only:"


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
    data = read_models(models_dir)
    pending = [stem for stem, text in data.items() if any(token in text for token in RELEVANT)]
    bases = {stem: _base_lists(text) for stem, text in data.items()}
    searched: set[str] = set()
    while pending:
        for stem in pending:
            graph.load(stem, data[stem])
        names = {c.name for c in list(graph.classes.values()) if graph.find_method(c, SETTER)} - searched
        searched |= names
        wanted = [name.encode() for name in names]
        pending = [
            stem
            for stem, text in data.items()
            if stem not in graph.loaded and any(name in text and _subclasses_in(text, bases[stem], name) for name in wanted)
        ]
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
    the files importing them (transitively) can meet ``files``; when the
    plans chosen reach further, the scope grows and planning runs again.
    None when a file lies outside ``models_dir`` (plan the whole tree then).
    """
    models = models_dir.resolve()
    wanted = {path.resolve() for path in files}
    if not wanted or any(path.parent != models for path in wanted):
        return None
    data = read_models(models_dir)
    imports = import_map(data)
    candidates = candidate_files(data)
    graph = ModelGraph(models_dir=models_dir)
    while True:
        load_scope(graph, importers(imports, {path.stem for path in wanted}) & candidates, data)
        chosen = choose(plan_models(graph), wanted)
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


def load_scope(graph: ModelGraph, scope: set[str], data: dict[str, bytes]) -> None:
    """Load the model files of ``scope`` into ``graph``, as :func:`scan` would have.

    ``scope`` holds only files :func:`scan` may load (:func:`candidate_files`).
    Then every class's setter is looked up, which loads the files its bases
    come from: so a class of ``scope`` that inherits a setter from outside
    ``scope`` is a model class here as in the whole graph. Plans of classes
    in ``scope`` are the whole graph's plans (resolution only follows imports).
    """
    for stem in sorted(scope):
        if stem in data:
            graph.load(stem, data[stem])
    for cls in list(graph.classes.values()):
        graph.find_method(cls, SETTER)


def import_map(data: dict[str, bytes]) -> dict[str, set[str]]:
    """Per model file, the words of its import statements that may name a sibling model file.

    Every word of an import statement whose head names the models package
    (or is relative) counts: this over-approximates the imports
    :class:`ModelGraph` follows, so a file found needlessly only costs a
    parse, and none that matters is missed (see :func:`_sibling_imports`).
    """
    return {stem: _imported_words(text) for stem, text in data.items()}


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
    """Whether ``at`` certainly lies in a comment or a string, never in code.

    A ``#`` before ``at`` on its physical line, with no quote before it
    there, starts a comment; or the line began inside a string that is
    still open at ``at`` (closing it would take a quote).
    """
    prefix = text[text.rfind(b"\n", 0, at) + 1 : at]
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


def _imported_words(text: bytes) -> set[str]:
    return {word.decode() for region in _sibling_imports(text) for word in _WORD.findall(region)}


def candidate_files(data: dict[str, bytes]) -> set[str]:
    """The files :func:`scan` may load up front, from text alone (a superset).

    The files that mention the setter, then those whose class bases (or
    ``import ... as`` names) name a class of a file found so far, until
    nothing new turns up.
    """
    found = {stem for stem, text in data.items() if any(token in text for token in RELEVANT)}
    mentions = {stem: _base_words(text) for stem, text in data.items() if stem not in found}
    names: set[bytes] = set()
    frontier = set(found)
    while frontier:
        names |= {name for stem in frontier for name in _class_names(data[stem])}
        frontier = {stem for stem, words in mentions.items() if stem not in found and not words.isdisjoint(names)}
        found |= frontier
    return found


# The patterns below start with a newline, a literal the regex engine searches
# for quickly; ``^`` with re.M tries every position (5x slower). They run on
# the text after a newline put in front, so a match on the first line counts.
_CLASS_NAME = re.compile(rb"\nclass\s+(\w+)")
_ALIASED = re.compile(rb"(\w+)\s+as\s+\w+")


def _class_names(text: bytes) -> list[bytes]:
    """Names of the classes at column 0 (every top-level class; a few in strings too)."""
    return _CLASS_NAME.findall(b"\n" + text) if b"class" in text else []


def _base_words(text: bytes) -> set[bytes]:
    # ``X as Y`` only in sibling imports: the graph resolves no other alias.
    words: set[bytes] = set()
    for region in _sibling_imports(text) if b"as" in text else ():
        if b"as" in region:
            words.update(_ALIASED.findall(region))
    for bases in _base_lists(text):
        words.update(_WORD.findall(bases))
    return words


#: ``class Name(<bases>):`` at the top level; the bases may span lines and hold one level of calls.
_CLASS_BASES = re.compile(rb"\nclass\s+\w+\s*\(((?:[^()]|\([^()]*\))*)\)\s*:")


def _base_lists(text: bytes) -> list[bytes]:
    return _CLASS_BASES.findall(b"\n" + text) if b"class" in text else []


def _subclasses_in(text: bytes, bases: list[bytes], name: bytes) -> bool:
    """Whether a top-level class of ``text`` may derive from ``name`` (also through ``import ... as``)."""
    word = re.compile(rb"\b" + re.escape(name) + rb"\b")
    return any(word.search(b) for b in bases) or re.search(word.pattern + rb"\s+as\s+\w+", text) is not None


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
    return sorted(plans.values(), key=lambda p: (p.module, _line(graph, p)))


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
            return ModelPlan(**base, unsupported=problem, notes=tuple(notes))
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
            return ModelPlan(**base, unsupported=f"delegates to {target.label}: {delegate.unsupported}", delegate=target.label)
        sites.extend(delegate.sites)
        names.append(target.label)
        notes.extend(n for n in delegate.notes if n not in notes)
    return ModelPlan(**base, sites=tuple(_unique(sites)), delegate=", ".join(names), notes=tuple(notes))


def _inner_sites(graph: ModelGraph, inner: ClassNode, sites: list[EditSite], notes: list[str]) -> str | None:
    """Append the init and forward sites of inner model ``inner``; or say why not."""
    init_owner = next(
        (o for o in graph.mro(inner) if "__init__" in o.methods and assigns_self_attr(o.methods["__init__"], "layers_to_capture")),
        None,
    )
    found = _capturing_forward(graph, inner)
    if init_owner is None and found is None:
        return (
            f"{inner.label} has no aux hidden-state capture at all (no `self.layers_to_capture` in __init__, "
            "no capture in forward): the setter has no effect on it, so EAGLE-3 itself, not only layer id -1, "
            "is unavailable for this class"
        )
    if init_owner is None:
        return f"{inner.label} (or its bases) never initialises `self.layers_to_capture` in __init__"
    if found is None:
        return f"{inner.label}: forward never captures aux hidden states (no layers_to_capture in it, nor in the super().forward it calls)"
    forward_owner, forward = found
    gate = group_of(forward, "is_first_rank")
    if gate:
        gate = f"{gate}.is_first_rank"
    elif class_assigns(graph, forward_owner, "pp_group"):
        gate = "self.pp_group.is_first_rank"
    elif class_assigns(graph, forward_owner, "start_layer"):
        gate = "self.start_layer == 0"
    sites.append(EditSite(kind="init", path=init_owner.path, module=init_owner.module, cls=init_owner.name, method="__init__"))
    sites.append(
        EditSite(
            kind="forward",
            path=forward_owner.path,
            module=forward_owner.module,
            cls=forward_owner.name,
            method="forward",
            params=(("gate", gate),),
        )
    )
    for label in read_forward(forward).labels():
        if f"forward: {label}" not in notes:
            notes.append(f"forward: {label}")
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
    for node in ast.walk(func):
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
