"""Hand-edited files: recognised, completed, or refused naming the line; never doubled.

The sed fix is applied with GNU sed itself, exactly as DOMAIN.md describes,
to the real ``deepseek_v2.py`` of 0.5.6 and 0.5.10, in all eight
combinations of its three edits (none, one, two or all three).
"""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import pytest

from patchcraft import MARKER
from patchcraft.engine.tree_run import run, write_changes
from patchcraft.engine.file_patch import revert_text
from patchcraft.engine.records import Mode
from patchcraft.base.status import ModelStatus
from patchcraft.base.target import resolve_target
from reliability_kit import MODEL_DIR, error_lines, patchcraft_cli, record, reduced_release

VERSIONS = ("0.5.6", "0.5.10")
EDITS = ("init", "setter", "forward")
#: The three sed commands of the hand fix (DOMAIN.md), as users ran them.
SED = {
    "init": r"s/^\( *\)self\.layers_to_capture = \[\]$/&\n\1self.capture_embedding_for_eagle3 = False/",
    "setter": (
        r"s/^\( *\)self\.model\.layers_to_capture = \[val + 1 for val in layer_ids\]$/"
        r"\1self.model.capture_embedding_for_eagle3 = (-1 in layer_ids)\n"
        r"\1self.model.layers_to_capture = [val + 1 for val in layer_ids if val >= 0]/"
    ),
    "forward": (
        r"s/^\( *\)aux_hidden_states = \[\]$/&\n"
        r"\1# Capture embedding output for EAGLE3 if requested (layer_id=-1)\n"
        r"\1if self.capture_embedding_for_eagle3:\n"
        r"\1    # At this point hidden_states = embed_output, residual = None\n"
        r"\1    aux_hidden_states.append(hidden_states.clone() if residual is None else hidden_states + residual)/"
    ),
}
COMBINATIONS = [c for n in range(4) for c in itertools.combinations(EDITS, n)]
_FIGURES: dict = {}


def _tree(tmp_path: Path, version: str) -> tuple[Path, Path]:
    package = reduced_release(version, tmp_path / version, ["deepseek_v2"], executor=False)
    return package, package / MODEL_DIR / "deepseek_v2.py"


def _sed(model: Path, edits: tuple) -> None:
    before = model.read_bytes()
    for edit in edits:
        subprocess.run(["sed", "-i", SED[edit], str(model)], check=True)
    # each sed command matched exactly once in the real file
    added = {"init": 1, "setter": 1, "forward": 4}
    assert model.read_bytes().count(b"\n") == before.count(b"\n") + sum(added[e] for e in edits)


def _method(text: str, cls: str, name: str) -> str:
    """The source of ``cls.name`` (top-level class), for counting what is in it."""
    start = re.search(rf"^class {cls}\b.*?^    def {name}\(", text, re.M | re.S)
    assert start, (cls, name)
    body = text.index("\n", start.end()) + 1
    end = re.compile(r"^    (def |@)|^\S", re.M).search(text, body)
    return text[start.end() - len(f"    def {name}(") : end.start() if end else len(text)]


def _counts(text: str) -> dict:
    init = _method(text, "DeepseekV2Model", "__init__")
    forward = _method(text, "DeepseekV2Model", "forward")
    setter = _method(text, "DeepseekV2ForCausalLM", "set_eagle3_layers_to_capture")
    return {
        "flag initialised": init.count("self.capture_embedding_for_eagle3 = False"),
        "embedding captured": len(
            re.findall(
                r"^\s*if (self\.capture_embedding_for_eagle3\b|getattr\(self, \"capture_embedding_for_eagle3\")",
                forward,
                re.M,
            )
        ),
        "-1 handled in setter": setter.count("-1 in layer_ids"),
        "markers": text.count(MARKER),
    }


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("edits", COMBINATIONS, ids=lambda c: "+".join(c) or "none")
def test_sed_fix_in_every_combination(tmp_path: Path, version: str, edits: tuple) -> None:
    package, model = _tree(tmp_path, version)
    _sed(model, edits)
    hand = model.read_text(encoding="utf-8")
    tree = resolve_target(str(package))

    first = run(tree, Mode.APPLY)
    write_changes(first.changes)
    [result] = [m for m in first.models if m.model == "deepseek_v2.DeepseekV2ForCausalLM"]
    statuses = {e.kind: e.status for e in result.edits}
    # DeepseekV2 on 0.5.6 and 0.5.10 captures a deferred all-reduce sum: its setter also gets the fusion mark
    # (docs/fusion.md), so even the full sed fix leaves patchcraft one edit to make.
    assert statuses == {**{e: "hand-applied" if e in edits else "applied" for e in EDITS}, "fusion-mark": "applied"}, (
        result
    )
    assert result.status == ModelStatus.PATCHED

    patched = model.read_text(encoding="utf-8")
    counts = _counts(patched)
    # one flag init, one capture, -1 handled once: never a second insertion
    assert counts["flag initialised"] == 1 and counts["embedding captured"] == 1, counts
    assert counts["-1 handled in setter"] == 1, counts
    assert counts["markers"] == 3 - len(edits) + 1, counts  # + the fusion mark

    verify = run(tree, Mode.VERIFY)
    assert all(m.status == ModelStatus.ALREADY and m.compiles for m in verify.models), [
        (m.model, m.status, m.message) for m in verify.models
    ]
    assert not verify.changes  # idempotent
    # revert takes out patchcraft's blocks only: the user's hand edits stay
    assert revert_text(patched, model) == hand
    outcome = "recognised" if len(edits) == 3 else "patched" if not edits else "completed"
    _FIGURES[f"{version} {'+'.join(edits) or 'none'}"] = {"outcome": outcome, "edits": statuses, "exit": 0}
    record("hand_edits", _FIGURES)


def _names_the_block(text: str, named: int, changed: int) -> bool:
    """Whether line ``named`` starts the statement holding line ``changed``.

    A statement starts at its leading comments (the ``# patchcraft:`` marker
    among them) and ends before the next line indented no deeper than its
    first line (``else:`` and the like continue it).
    """
    lines = text.splitlines()
    header = named
    while header <= len(lines) and lines[header - 1].lstrip().startswith("#"):
        header += 1
    if (
        header > len(lines)
        or header > changed
        or lines[header - 1].lstrip().startswith(("def ", "async def ", "class "))
    ):
        return False  # naming the whole method or class is not naming the line
    indent = len(lines[header - 1]) - len(lines[header - 1].lstrip())
    end = header
    for number in range(header + 1, len(lines) + 1):
        line = lines[number - 1]
        depth = len(line) - len(line.lstrip())
        if (
            line.strip()
            and depth <= indent
            and not line.lstrip().startswith(("else", "elif", "except", "finally", ")"))
        ):
            break
        end = number
    return named <= changed <= end


def _reason(line: str) -> str:
    """A model's error line from ``file.py: `` on (the report column and path dropped)."""
    return line.split("deepseek_v2.py: ", 1)[-1].strip()


def _apply(model: Path, package: Path) -> None:
    tree = resolve_target(str(package))
    write_changes(run(tree, Mode.APPLY).changes)


#: How a user might change each inserted block: (kind, old, new).
CHANGED_BLOCKS = (
    ("init", "self.capture_embedding_for_eagle3 = False", "self.capture_embedding_for_eagle3 = True"),
    (
        "setter",
        "layer_ids = [val for val in layer_ids if val >= 0]",
        "layer_ids = [val for val in layer_ids if val > 0]",
    ),
    ("forward", "hidden_states.clone() if residual is None", "hidden_states if residual is None"),
)


@pytest.mark.parametrize("kind,old,new", CHANGED_BLOCKS, ids=[c[0] for c in CHANGED_BLOCKS])
def test_a_changed_inserted_block_is_refused_naming_its_line(tmp_path: Path, kind: str, old: str, new: str) -> None:
    package, model = _tree(tmp_path, "0.5.10")
    _apply(model, package)
    text = model.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    model.write_text(text.replace(old, new), encoding="utf-8")
    data = model.read_bytes()
    changed_line = next(n for n, line in enumerate(data.decode().splitlines(), 1) if new in line)

    result = patchcraft_cli("apply", str(package))
    assert result.returncode == 1, result.stderr  # an error row: that model's (its file untouched, below)
    assert "Traceback" not in result.stderr
    lines = [l for l in result.stderr.splitlines() if "changed by hand" in l or "line " in l and "error" in l]
    assert lines, result.stderr
    named = [int(n) for n in re.findall(r"line (\d+)", lines[0])]
    assert any(_names_the_block(data.decode(), n, changed_line) for n in named), (changed_line, lines[0])
    assert model.read_bytes() == data
    entry = _FIGURES.setdefault("changed inserted block", {})
    entry[kind] = {"outcome": "refused", "exit": result.returncode, "message": _reason(lines[0])}
    record("hand_edits", _FIGURES)


def test_half_done_setter_is_refused_naming_its_line(tmp_path: Path) -> None:
    """The flag line of the setter edit without the filter line: -1 would reach the +1 rule."""
    package, model = _tree(tmp_path, "0.5.10")
    text = model.read_text(encoding="utf-8")
    old = "            self.model.layers_to_capture = [val + 1 for val in layer_ids]\n"
    assert text.count(old) == 1
    model.write_text(
        text.replace(old, "            self.model.capture_embedding_for_eagle3 = (-1 in layer_ids)\n" + old),
        encoding="utf-8",
    )
    data = model.read_bytes()
    flag_line = (
        data.decode().splitlines().index("            self.model.capture_embedding_for_eagle3 = (-1 in layer_ids)") + 1
    )

    result = patchcraft_cli("apply", str(package))
    assert result.returncode == 1, result.stderr  # an error row: that model's (its file untouched, below)
    [line] = [l for l in result.stderr.splitlines() if "never drops -1" in l]
    named = [int(n) for n in re.findall(r"line (\d+)", line)]
    assert any(_names_the_block(data.decode(), n, flag_line) for n in named), (flag_line, line)
    assert model.read_bytes() == data
    _FIGURES["setter flag without the id filter"] = {"outcome": "refused", "exit": 1, "message": _reason(line)}
    record("hand_edits", _FIGURES)


def test_error_lines_are_single(tmp_path: Path) -> None:
    """A refusal of the whole run is exactly one ``patchcraft: error:`` line."""
    package, model = _tree(tmp_path, "0.5.10")
    model.write_bytes(
        model.read_bytes().replace(b"def set_eagle3_layers_to_capture(", b"def set_eagle3_layers_to_capture((", 1)
    )
    result = patchcraft_cli("apply", str(package))
    assert result.returncode == 2
    assert len(error_lines(result.stderr)) == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def _seed_fixed(tmp_path: Path, version: str, stem: str) -> tuple[Path, Path]:
    package = reduced_release(version, tmp_path / version, [stem], executor=False)
    model = package / MODEL_DIR / f"{stem}.py"
    for edit in EDITS:
        subprocess.run(["sed", "-i", SED[edit], str(model)], check=True)
    return package, model


def _move_capture_before_return(text: str) -> str:
    """The sed fix's forward block, moved to right before the ``return`` that follows it."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if "# Capture embedding output for EAGLE3" in line)
    block = lines[start : start + 4]
    rest = lines[:start] + lines[start + 4 :]
    ret = next(i for i in range(start, len(rest)) if rest[i].strip().startswith("return"))
    indent = rest[ret][: len(rest[ret]) - len(rest[ret].lstrip())]
    moved = [indent + line.lstrip() if i in (0, 1) else indent + "    " + line.lstrip() for i, line in enumerate(block)]
    return "".join(rest[:ret] + moved + rest[ret:])


HAND_FIXES = {
    "misplaced": (_move_capture_before_return, "is misplaced"),
    "uncloned": (
        lambda text: text.replace(
            "append(hidden_states.clone() if residual is None else hidden_states + residual)", "append(hidden_states)"
        ),
        "does not append a copy",
    ),
}


@pytest.mark.parametrize("stem", ["deepseek_v2", "llama"])
@pytest.mark.parametrize("fault", sorted(HAND_FIXES))
def test_a_wrong_hand_fix_fails_verify_naming_its_line(tmp_path: Path, stem: str, fault: str) -> None:
    """A hand-made capture counts by what it does: moved before ``return`` it captures the last
    layer's output, un-cloned it is overwritten; plain ``verify`` (no --smoke) refuses both."""
    package, model = _seed_fixed(tmp_path, "0.5.10", stem)
    # --no-smoke: the static judgement alone (the harness fails the field fix on a later
    # pipeline stage anyway: it has no first-stage gate; tests/pipeline/test_proof.py).
    good = patchcraft_cli("verify", "--no-runner", "--no-smoke", "--model", stem, str(package))
    if stem == "deepseek_v2":  # on 0.5.10 its capture reads a deferred all-reduce sum: the fusion mark is still to add
        table = good.stdout + good.stderr
        assert good.returncode == 1 and "missing: fusion-mark" in table, table
        assert table.count("hand-applied") == 3, table
    else:
        assert good.returncode == 0, good.stdout + good.stderr
    assert "hand-applied" in good.stdout + good.stderr
    mutate, words = HAND_FIXES[fault]
    model.write_text(mutate(model.read_text(encoding="utf-8")), encoding="utf-8")
    data = model.read_bytes()
    block_line = next(
        n for n, line in enumerate(data.decode().splitlines(), 1) if "if self.capture_embedding_for_eagle3:" in line
    )

    result = patchcraft_cli("verify", "--no-runner", "--no-smoke", "--model", stem, str(package))
    assert result.returncode != 0, result.stdout
    output = result.stdout + result.stderr
    [line] = [l for l in output.splitlines() if words in l]
    assert f"line {block_line}:" in line, (block_line, line)
    assert model.read_bytes() == data
    _FIGURES.setdefault("wrong hand fix", {})[f"{stem} {fault}"] = {
        "outcome": "refused",
        "exit": result.returncode,
        "message": line.split(".py: ", 1)[-1].strip(),
    }
    record("hand_edits", _FIGURES)
