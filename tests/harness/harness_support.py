"""Shared helpers for the harness tests: patched release texts (in memory) and mutations.

Releases are read from the cache (``patchcraft.base.fetch``) and never written:
apply runs in memory, and the harness takes the patched texts directly.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Callable

from patchcraft.engine.tree_run import run
from patchcraft.engine.records import Mode, RunResult
from patchcraft.base.target import SglangTree, resolve_target


def root_conftest() -> ModuleType:
    """tests/conftest.py, loaded by path (tests/gpu_smoke has a conftest.py too)."""
    path = Path(__file__).resolve().parent.parent / "conftest.py"
    spec = importlib.util.spec_from_file_location("patchcraft_root_conftest_harness", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Patched:
    """A release as apply would leave it: the verdicts and the new texts, nothing written."""

    tree: SglangTree
    applied: RunResult
    texts: dict

    def path(self, stem: str) -> Path:
        found = [p for p in self.texts if p.stem == stem]
        assert len(found) == 1, f"apply does not change {stem}.py in {self.tree.version}"
        return found[0]


@lru_cache(maxsize=None)
def patched(version: str) -> Patched:
    tree = resolve_target(str(root_conftest().release_package(version)))
    applied = run(tree, Mode.APPLY)
    return Patched(tree, applied, {c.source.path: c.after for c in applied.changes})


# -- mutations of a correctly patched file -------------------------------------------
# Each takes the patched text and returns it broken in one way; each asserts that it
# changed something, so a mutation can never pass by silently not applying.

_FLAG = "capture_embedding_for_eagle3"


def _changed(before: str, after: str, what: str) -> str:
    assert after != before, f"mutation did not apply: {what}"
    return after


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _block_end(lines: list[str], start: int) -> int:
    """Index after the compound statement starting at ``lines[start]`` (its deeper-indented body)."""
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > _indent(lines[start])):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    return end


def _capture_block(lines: list[str]) -> tuple[int, int]:
    """The inserted ``# patchcraft:`` comment and ``if getattr(self, "capture_embedding_for_eagle3", False)...:`` block of a forward."""
    for index, line in enumerate(lines):
        if line.lstrip().startswith(f'if getattr(self, "{_FLAG}"') and lines[index - 1].lstrip().startswith(
            "# patchcraft:"
        ):
            return index - 1, _block_end(lines, index)
    raise AssertionError("no inserted capture block found")


def drop_flag_init(text: str) -> str:
    """(a) delete the flag initialisation from __init__."""
    pattern = re.compile(rf"^[ \t]*# patchcraft:[^\n]*\n[ \t]*self\.{_FLAG} = False\n", re.M)
    return _changed(text, pattern.sub("", text), "flag initialisation")


def _edit_capture(text: str, edit: Callable[[str], str], what: str) -> str:
    lines = _lines(text)
    start, end = _capture_block(lines)
    block = "".join(lines[start:end])
    return _changed(text, "".join(lines[:start]) + edit(block) + "".join(lines[end:]), what)


def add_without_none_check(text: str) -> str:
    """(b) the capture expression becomes ``hidden_states + residual`` (residual is None there)."""

    def edit(block: str) -> str:
        return re.sub(
            r"hidden_states(\.clone\(\))? if residual is None else hidden_states \+ residual|hidden_states\.clone\(\)",
            "hidden_states + residual",
            block,
        )

    return _edit_capture(text, edit, "capture expression")


def drop_clone(text: str) -> str:
    """(c) the embedding entry is no copy: ``.clone()`` dropped, or ``append`` for the copying ``capture``."""

    def edit(block: str) -> str:
        return block.replace("hidden_states.clone()", "hidden_states").replace(
            ".capture(hidden_states)", ".append(hidden_states)"
        )

    return _edit_capture(text, edit, ".clone()")


def block_after_loop(text: str) -> str:
    """(d) the capture block moved after the layer loop (or the if/else holding the loops) that follows it."""
    lines = _lines(text)
    start, end = _capture_block(lines)
    block, level = lines[start:end], _indent(lines[start + 1])
    index = end
    while index < len(lines):
        line = lines[index]
        if line.strip() and _indent(line) < level:
            raise AssertionError("no layer loop after the capture block in its method")
        if not line.strip() or _indent(line) > level:
            index += 1
            continue
        stop = _block_end(lines, index)
        while stop < len(lines) and _indent(lines[stop]) == level and lines[stop].lstrip().startswith(("elif", "else")):
            stop = _block_end(lines, stop)
        if any(l.lstrip().startswith("for ") for l in lines[index:stop]):
            moved = lines[:start] + lines[end:stop] + block + lines[stop:]
            return _changed(text, "".join(moved), "block after loop")
        index = stop
    raise AssertionError("no layer loop after the capture block")


def keep_minus_one(text: str) -> str:
    """(d) the setter keeps -1 in the ids it converts (``[val for val in ids]``)."""
    pattern = re.compile(r"\[(\w+) for \1 in (\w+) if \1 >= 0\]")
    return _changed(text, pattern.sub(r"[\1 for \1 in \2]", text), "-1 filter")


def forget_packer_count(text: str) -> str:
    """(e) the AuxHiddenStatePacker is sized without the embedding capture."""
    return _changed(text, text.replace(f' + int(getattr(self, "{_FLAG}", False))', ""), "packer count")


def no_pipeline_guard(text: str) -> str:
    """-1 accepted and captured on every pipeline stage: setter guard and forward gate removed."""
    text2 = text.replace("if self.pp_group.world_size > 1:", "if False:")
    text2 = re.sub(rf'if (getattr\(self, "{_FLAG}", False\)) and [^\n:]*:', r"if \1:", text2)
    return _changed(text, text2, "pipeline guard")


def init_flag_true(text: str) -> str:
    """The flag starts ``True``: every forward captures the embedding whatever the ids."""
    pattern = re.compile(rf"(# patchcraft:[^\n]*\n[ \t]*self\.{_FLAG} = )False")
    return _changed(text, pattern.sub(r"\1True", text), "flag initialisation value")


def ids_without_minus_one_set_the_flag(text: str) -> str:
    """The setter's ``else`` branch (no -1, or None) turns the flag on."""
    pattern = re.compile(rf"(else:\n[ \t]*self(?:\.\w+)*\.{_FLAG} = )False")
    return _changed(text, pattern.sub(r"\1True", text), "setter else branch")


def flag_init_in_a_branch(text: str) -> str:
    """The flag initialisation moved inside an ``if`` (set on one path of __init__ only)."""
    pattern = re.compile(rf"^([ \t]*)(# patchcraft:[^\n]*\n)[ \t]*(self\.{_FLAG} = False\n)", re.M)
    return _changed(
        text, pattern.sub(r"\1if self.layers_to_capture is not None:\n\1    \2\1    \3", text), "flag in a branch"
    )


def gate_on_a_missing_group(text: str) -> str:
    """A first-stage gate on ``self.pp_group`` in a forward whose class has no such attribute."""
    old = f'if getattr(self, "{_FLAG}", False):\n'
    return _changed(text, text.replace(old, old[:-2] + " and self.pp_group.is_first_rank:\n"), "gate")


def drop_plus_one_block(text: str) -> str:
    """With -1 given, the other ids follow the release's convention test (kept raw by a first-id heuristic)."""
    pattern = re.compile(
        r"^[ \t]*# patchcraft: with layer id -1 the other ids[^\n]*\n[ \t]*if [^\n]*\n[ \t]*[^\n]*\n", re.M
    )
    return _changed(text, pattern.sub("", text), "+1 block after the convention test")


def _into_block(text: str, statements: Callable[[str], str], what: str) -> str:
    """Insert ``statements(indent)`` at the top of the inserted capture block's body."""
    lines = _lines(text)
    start, _ = _capture_block(lines)
    body = _indent(lines[start + 2]) * " "
    return _changed(text, "".join(lines[: start + 2]) + statements(body) + "".join(lines[start + 2 :]), what)


def block_print(text: str) -> str:
    """A ``print()`` in the capture block: eager output unchanged, a graph break under torch.compile."""
    return _into_block(
        text, lambda pad: f'{pad}print("patchcraft: capturing the embedding output")\n', "print in block"
    )


def block_item_branch(text: str) -> str:
    """A Python branch on ``.item()`` in the capture block (never taken): a data-dependent graph break."""
    return _into_block(
        text,
        lambda pad: (
            f"{pad}if hidden_states.float().abs().sum().item() > 1e30:\n{pad}    raise RuntimeError('overflow')\n"
        ),
        ".item() branch in block",
    )


MUTATIONS: dict[str, Callable[[str], str]] = {
    "compile-print": block_print,
    "compile-item-branch": block_item_branch,
    "a-no-flag-init": drop_flag_init,
    "b-add-none": add_without_none_check,
    "c-no-clone": drop_clone,
    "d-after-loop": block_after_loop,
    "d-keep-minus-one": keep_minus_one,
    "e-packer-count": forget_packer_count,
    "pp-no-guard": no_pipeline_guard,
    "init-flag-true": init_flag_true,
    "else-flag-true": ids_without_minus_one_set_the_flag,
    "gate-missing-group": gate_on_a_missing_group,
    "flag-in-branch": flag_init_in_a_branch,
    "no-plus-one-block": drop_plus_one_block,
}


def mutate(version: str, stem: str, mutation: str) -> dict:
    """The patched texts of ``version`` with ``stem``.py broken by ``mutation``."""
    state = patched(version)
    path = state.path(stem)
    return {**state.texts, path: MUTATIONS[mutation](state.texts[path])}


def row(run_result, label: str):
    found = [r for r in run_result.results if r.model == label]
    assert len(found) == 1, (label, [r.model for r in run_result.results])
    return found[0]
