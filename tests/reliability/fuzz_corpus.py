"""Structural fuzzing of real model files, fast enough for the suite.

Bases: the two model classes of a real release file (the outer
``...ForCausalLM`` and its inner model), verbatim, keeping the methods the
edits touch (``__init__``, ``forward``, the setter) plus one more, so that a
case costs a fraction of a whole file. Each base is parsed once with libcst;
the position of every statement and every anchor name is recorded once, and
a mutation is then a cheap text edit at those positions:

* ``rename``: an anchor name (``layers_to_capture``, the collector, the
  setter, ``forward``, a class name, ...) is renamed at one occurrence;
* ``remove``: a statement is deleted;
* ``duplicate``: a method (or any statement) is repeated right after itself;
* ``swap``: two neighbouring statements of one block change places;
* ``comment`` / ``blank``: a comment line or blank lines go before a statement;
* ``line``: a raw line is deleted or repeated (this may break the syntax).

A case applies one to three mutations, then the real engine: ``run`` in
APPLY mode on a one-file tree, ``verify`` on the result, and ``revert_text``.
The verdict is one of: patched (compiles, verified, idempotent, reverts to
the mutated input byte for byte), unchanged (nothing to do or unsupported),
or refused (``PatchcraftError`` or an error status, the file not among the
changes). Anything else is a violation.
"""

from __future__ import annotations

import codecs
import random
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from patchcraft.engine.tree_run import run, write_changes
from patchcraft.base.errors import PatchcraftError
from patchcraft.engine.file_patch import revert_text
from patchcraft.ui.machine_output import exit_code
from patchcraft.engine.records import Mode
from patchcraft.base.sources import decode, read_source
from patchcraft.base.status import ModelStatus
from patchcraft.base.target import SglangTree

from patchcraft.base.fetch import fetch

from reliability_kit import MODEL_DIR

SETTER = "set_eagle3_layers_to_capture"
#: (release, file, inner class, outer class, extra encoding tweak)
BASES = (
    ("0.5.10", "llama", "LlamaModel", "LlamaForCausalLM", ""),
    ("0.5.10", "apertus", "ApertusModel", "ApertusForCausalLM", ""),  # CRLF
    ("0.5.10", "qwen2", "Qwen2Model", "Qwen2ForCausalLM", "bom"),
    ("0.5.10", "gpt_oss", "GptOssModel", "GptOssForCausalLM", ""),
    ("0.5.6", "deepseek_v2", "DeepseekV2Model", "DeepseekV2ForCausalLM", ""),
    ("0.4.10", "llama", "LlamaModel", "LlamaForCausalLM", "latin-1"),
)
KEEP_METHODS = ("__init__", "forward", SETTER)
ANCHORS = (
    "layers_to_capture",
    "aux_hidden_states",
    SETTER,
    "forward",
    "__init__",
    "residual",
    "hidden_states",
    "model",
    "pp_group",
    "start_layer",
    "layer_ids",
    "capture_aux_hidden_states",
)
#: Revert is checked on every REVERT_EVERY-th case (it is checked on every real file elsewhere).
REVERT_EVERY = 4
KINDS = ("rename", "remove", "duplicate", "swap", "comment", "blank", "line")


@dataclass(frozen=True)
class Span:
    """A statement: lines [start, end] (1-based, inclusive) and its indentation."""

    start: int
    end: int
    indent: str
    method: bool


@dataclass
class Base:
    label: str
    text: str
    prefix: bytes
    encoding: str
    statements: list
    blocks: list  # lists of sibling Spans
    names: list  # (line, col, end_col, value)


def _mini_module(text: str, inner: str, outer: str) -> str:
    """The two classes, verbatim, keeping only the methods the edits read or touch."""
    module = cst.parse_module(text)
    body = []
    for stmt in module.body:
        if isinstance(stmt, cst.ClassDef) and stmt.name.value in (inner, outer):
            keep = KEEP_METHODS if stmt.name.value == inner else ("__init__", SETTER, "_init_model")
            kept = [item for item in stmt.body.body if isinstance(item, cst.FunctionDef) and item.name.value in keep]
            body.append(stmt.with_changes(body=stmt.body.with_changes(body=kept)))
    return module.with_changes(body=body, header=()).code


def load_base(version: str, stem: str, inner: str, outer: str, tweak: str) -> Base:
    package = _cached_release(version)
    raw = (package / MODEL_DIR / f"{stem}.py").read_bytes()
    text = _mini_module(raw.decode("utf-8-sig"), inner, outer)
    prefix, encoding = b"", "utf-8"
    if tweak == "bom":
        prefix = codecs.BOM_UTF8
    elif tweak == "latin-1":
        encoding = "latin-1"
        text = "# -*- coding: latin-1 -*-\n# Caf\u00e9 cr\u00e8me\n" + text
    wrapper = MetadataWrapper(cst.parse_module(text))
    positions = wrapper.resolve(PositionProvider)
    collector = _Collector(positions)
    wrapper.module.visit(collector)
    label = f"{version}/{stem}" + (f"+{tweak}" if tweak else "")
    return Base(label, text, prefix, encoding, collector.statements, collector.blocks, collector.names)


def _cached_release(version: str) -> Path:
    """The pristine cached release (only read here)."""
    return fetch(version)


class _Collector(cst.CSTVisitor):
    def __init__(self, positions) -> None:
        super().__init__()
        self.positions = positions
        self.statements: list[Span] = []
        self.blocks: list[list[Span]] = []
        self.names: list[tuple[int, int, int, str]] = []

    def _span(self, node: cst.CSTNode) -> Span:
        where = self.positions[node]
        return Span(where.start.line, where.end.line, " " * where.start.column, isinstance(node, cst.FunctionDef))

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        spans = [self._span(s) for s in node.body]
        self.statements.extend(spans)
        self.blocks.append(spans)

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in ANCHORS or node.value.endswith(("Model", "ForCausalLM")):
            where = self.positions[node]
            if where.start.line == where.end.line:
                self.names.append((where.start.line, where.start.column, where.end.column, node.value))


# -- mutations -----------------------------------------------------------------


@dataclass
class Edit:
    """Replace lines [start, end] (1-based, inclusive; end = start - 1 inserts) with ``lines``."""

    kind: str
    start: int
    end: int
    lines: list


def _newline(lines: list) -> str:
    return "\r\n" if lines and lines[0].endswith("\r\n") else "\n"


def mutation(base: Base, lines: list, rng: random.Random) -> Optional[Edit]:
    kind = rng.choice(KINDS)
    nl = _newline(lines)
    if kind == "rename" and base.names:
        line, col, end, value = rng.choice(base.names)
        others = [a for a in ANCHORS if a != value]
        new = rng.choice([value + "_renamed", rng.choice(others)])
        text = lines[line - 1]
        return Edit(kind, line, line, [text[:col] + new + text[end:]])
    span = rng.choice(base.statements)
    block = lines[span.start - 1 : span.end]
    if kind == "remove":
        return Edit(kind, span.start, span.end, [])
    if kind == "duplicate":
        methods = [s for s in base.statements if s.method]
        if methods and rng.random() < 0.7:
            span = rng.choice(methods)
            block = lines[span.start - 1 : span.end]
        return Edit(kind, span.start, span.end, block + block)
    if kind == "swap":
        siblings = rng.choice([b for b in base.blocks if len(b) > 1] or [[span]])
        if len(siblings) < 2:
            return None
        index = rng.randrange(len(siblings) - 1)
        first, second = siblings[index], siblings[index + 1]
        if second.start <= first.end:
            return None
        gap = lines[first.end : second.start - 1]
        return Edit(
            kind,
            first.start,
            second.end,
            lines[second.start - 1 : second.end] + gap + lines[first.start - 1 : first.end],
        )
    if kind == "comment":
        return Edit(kind, span.start, span.start - 1, [f"{span.indent}# fuzz: a comment the user added{nl}"])
    if kind == "blank":
        return Edit(kind, span.start, span.start - 1, [nl] * rng.randint(1, 3))
    # raw line edit: may well break the syntax; then a refusal is the right answer
    line = rng.randrange(1, len(lines) + 1)
    if rng.random() < 0.5:
        return Edit("line", line, line, [])
    return Edit("line", line, line, [lines[line - 1]] * 2)


def mutate(base: Base, rng: random.Random) -> tuple[str, list]:
    """One to three non-overlapping mutations of ``base``; the text and their kinds."""
    lines = base.text.splitlines(keepends=True)
    edits: list[Edit] = []
    for _ in range(rng.randint(1, 3)):
        edit = mutation(base, lines, rng)
        if edit and all(edit.end < e.start - 1 or edit.start > e.end + 1 for e in edits):
            edits.append(edit)
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        lines[edit.start - 1 : edit.end] = edit.lines
    return "".join(lines), [e.kind for e in edits]


# -- one case ------------------------------------------------------------------


@dataclass
class Tally:
    cases: int = 0
    verdicts: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    per_base: Counter = field(default_factory=Counter)
    violations: list = field(default_factory=list)

    def merge(self, other: "Tally") -> None:
        self.cases += other.cases
        self.verdicts.update(other.verdicts)
        self.kinds.update(other.kinds)
        self.per_base.update(other.per_base)
        self.violations.extend(other.violations)


class OneFileTree:
    """``<tmp>/sglang/srt/models/<stem>.py``: a whole tree of one model file."""

    def __init__(self, stem: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fuzz-"))
        self.models = self.root / "sglang" / MODEL_DIR
        self.models.mkdir(parents=True)
        self.path = self.models / f"{stem}.py"
        self.tree = SglangTree(package=self.root / "sglang", root=self.root)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def judge(base: Base, data: bytes, where: OneFileTree, check_revert: bool = True) -> tuple[str, str]:
    """(verdict, problem): what ``apply`` does to one mutated file, checked.

    The engine runs in process, and its changes go through the real
    ``write_changes``, whose checks (it compiles, it is writable) are part
    of the answer.
    """
    where.path.write_bytes(data)
    try:
        result = run(where.tree, Mode.APPLY)
        write_changes(result.changes)
    except PatchcraftError:
        if where.path.read_bytes() != data:
            return "violation", "refused, but the file changed"
        return "refused", ""
    except Exception as exc:  # a traceback: the worst outcome
        return "violation", f"traceback: {type(exc).__name__}: {exc}"
    code = exit_code([result])
    statuses = {m.status for m in result.models}
    changed = where.path.read_bytes() != data
    if ModelStatus.ERROR in statuses:
        if changed:
            return "violation", "a model was refused, but its file changed"
        # One model in error is that model's: exit 1 (never 0, never 2: exit 2 means nothing could run).
        return "refused", "" if code == 1 else f"error status but exit {code}"
    if not changed:
        if statuses - {ModelStatus.ALREADY, ModelStatus.UNSUPPORTED, ModelStatus.NOT_APPLICABLE}:
            return "violation", f"nothing written but statuses {sorted(statuses)}"
        return "unchanged", ""
    return _check_patched(where, data, code, check_revert)


def _check_patched(where: OneFileTree, data: bytes, code: int, check_revert: bool) -> tuple[str, str]:
    source = read_source(where.path)
    try:
        compile(source.text, str(where.path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        return "violation", f"exit {code} with a file that does not compile: {exc}"
    try:
        verify = run(where.tree, Mode.VERIFY)
    except PatchcraftError as exc:
        return "violation", f"verify refuses the patched file: {exc}"
    if verify.changes:
        return "violation", "not idempotent: a second apply would change the file again"
    if any(
        m.status not in (ModelStatus.ALREADY, ModelStatus.UNSUPPORTED) or m.compiles is False for m in verify.models
    ):
        return "violation", f"patched but not verified: {[(m.model, m.status) for m in verify.models]}"
    if check_revert and revert_text(source.text, where.path) != decode(where.path, data).text:
        return "violation", "revert is not byte-identical"
    if code != 0:
        return "violation", f"patched and verified but exit {code}"
    return "patched", ""


def run_cases(indices: list, seed: int) -> Tally:
    """Cases ``indices`` (each seeded by ``seed`` and its index), spread over the bases."""
    bases = [load_base(*spec) for spec in BASES]
    trees = {b.label: OneFileTree(spec[1]) for b, spec in zip(bases, BASES)}
    tally = Tally()
    try:
        for index in indices:
            rng = random.Random(f"{seed}:{index}")
            base = bases[index % len(bases)]
            text, kinds = mutate(base, rng)
            data = base.prefix + text.encode(base.encoding, errors="strict")
            verdict, problem = judge(base, data, trees[base.label], check_revert=index % REVERT_EVERY == 0)
            tally.cases += 1
            tally.verdicts[verdict] += 1
            tally.per_base[(base.label, verdict)] += 1
            tally.kinds.update(kinds)
            if problem:
                tally.violations.append((index, base.label, kinds, problem))
    finally:
        for where in trees.values():
            where.close()
    return tally


def check_bases() -> dict:
    """Every unmutated base patches cleanly (else the fuzzing would prove little)."""
    found = {}
    for spec in BASES:
        base = load_base(*spec)
        where = OneFileTree(spec[1])
        try:
            found[base.label] = judge(base, base.prefix + base.text.encode(base.encoding), where)
        finally:
            where.close()
    return found
