"""File properties survive apply and revert: line endings, BOM, whitespace, mode,
owner, coding cookie, symlinks; and stale bytecode never runs afterwards."""

from __future__ import annotations

import codecs
import compileall
import difflib
import os
import py_compile
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from patchcraft import MARKER
from patchcraft.engine.tree_run import run, write_changes
from patchcraft.engine.file_patch import revert_text
from patchcraft.engine.records import Mode
from patchcraft.base.sources import drop_stale_bytecode
from patchcraft.base.status import ModelStatus
from patchcraft.base.target import resolve_target
from reliability_kit import MODEL_DIR, record, reduced_release, snapshot

_FIGURES: dict = {}


def _note(name: str, **values) -> None:
    _FIGURES[name] = values
    record("properties", _FIGURES)


def _apply(package: Path):
    result = run(resolve_target(str(package)), Mode.APPLY)
    write_changes(result.changes)
    return result


def _verified(package: Path) -> bool:
    result = run(resolve_target(str(package)), Mode.VERIFY)
    return not result.changes and all(m.status == ModelStatus.ALREADY and m.compiles for m in result.models)


def _only_insertions(before: str, after: str) -> bool:
    """Every line of ``before`` is in ``after``, in order, unchanged (line endings included)."""
    matcher = difflib.SequenceMatcher(
        None, before.splitlines(keepends=True), after.splitlines(keepends=True), autojunk=False
    )
    return all(op in ("equal", "insert") for op, *_ in matcher.get_opcodes())


def test_crlf_file_stays_crlf(tmp_path: Path) -> None:
    """apertus.py of 0.5.10 is CRLF throughout (real file): so are the inserted lines."""
    package = reduced_release("0.5.10", tmp_path, ["apertus"], executor=False)
    model = package / MODEL_DIR / "apertus.py"
    before = model.read_bytes()
    assert before.count(b"\r\n") == before.count(b"\n") > 600
    _apply(package)
    after = model.read_bytes()
    assert after != before
    assert after.count(b"\n") == after.count(b"\r\n"), "a bare LF was inserted into a CRLF file"
    assert b"\r\r" not in after
    assert _only_insertions(before.decode(), after.decode())
    assert _verified(package)
    assert revert_text(after.decode(), model).encode() == before
    _note("crlf", file="0.5.10/apertus.py", lines_after=after.count(b"\r\n"), bare_lf=0)


def test_bare_cr_file_keeps_its_last_line_ending_on_the_whole_module_path(tmp_path: Path) -> None:
    """Old-Mac line endings (bare CR): libcst prints a module back without its final CR.

    A revert with patchcraft text outside every class goes through the whole
    module (not class slices); the file must still end as it did.
    """
    package = reduced_release("0.5.10", tmp_path, ["llama"], executor=False)
    model = package / MODEL_DIR / "llama.py"
    original = model.read_text().replace("\n", "\r")
    model.write_text(original, newline="")
    _apply(package)
    patched = model.read_bytes().decode()
    assert patched != original and "\n" not in patched
    stray = f"{MARKER} a note outside every class\r"  # kept: patchcraft never inserts at module level
    assert revert_text(patched + stray, model) == original + stray
    assert revert_text(patched, model) == original  # the class-slice path


def test_real_bom_file_in_a_whole_tree_scan(tmp_path: Path) -> None:
    """qwen2_classification.py (0.5.6-0.5.10) starts with a BOM and has no setter."""
    package = reduced_release("0.5.10", tmp_path, ["qwen2", "qwen2_classification"], executor=False)
    bom_file = package / MODEL_DIR / "qwen2_classification.py"
    data = bom_file.read_bytes()
    assert data.startswith(codecs.BOM_UTF8)
    result = _apply(package)
    assert {m.model for m in result.models} == {"qwen2.Qwen2ForCausalLM"}
    assert bom_file.read_bytes() == data
    assert _verified(package)


def test_bom_variant_of_a_patched_file(tmp_path: Path) -> None:
    package = reduced_release("0.5.10", tmp_path, ["llama"], executor=False)
    model = package / MODEL_DIR / "llama.py"
    plain = model.read_bytes()
    reference = tmp_path / "reference"
    ref_package = reduced_release("0.5.10", reference, ["llama"], executor=False)
    _apply(ref_package)
    patched_plain = (ref_package / MODEL_DIR / "llama.py").read_bytes()

    model.write_bytes(codecs.BOM_UTF8 + plain)
    _apply(package)
    after = model.read_bytes()
    assert after == codecs.BOM_UTF8 + patched_plain
    assert _verified(package)
    reverted = revert_text(after.decode("utf-8-sig"), model)
    assert codecs.BOM_UTF8 + reverted.encode() == codecs.BOM_UTF8 + plain
    _note("bom", file="0.5.10/llama.py with a BOM", same_as_plain_patch=True)


def test_tabs_and_trailing_whitespace_elsewhere(tmp_path: Path) -> None:
    package = reduced_release("0.5.10", tmp_path, ["qwen2"], executor=False)
    model = package / MODEL_DIR / "qwen2.py"
    lines = model.read_text(encoding="utf-8").splitlines(keepends=True)
    decorated = []
    for number, line in enumerate(lines):
        if line.strip() and number % 5 == 0:
            line = line.rstrip("\n") + " \t \n"  # trailing whitespace
        if number % 11 == 0 and line.strip():
            indent = line[: len(line) - len(line.lstrip())]
            decorated.append(f"{indent}#\ta comment\twith tabs\t\n")
        decorated.append(line)
    decorated.append("\n\n  \n")  # trailing blank lines with spaces
    text = "".join(decorated)
    model.write_text(text, encoding="utf-8")
    _apply(package)
    after = model.read_text(encoding="utf-8")
    assert after != text and MARKER in after
    assert _only_insertions(text, after)
    assert _verified(package)
    assert revert_text(after, model) == text
    _note(
        "whitespace",
        file="0.5.10/qwen2.py",
        trailing_whitespace_lines=sum(1 for l in decorated if l.endswith(" \t \n")),
    )


def test_tab_indented_file(tmp_path: Path) -> None:
    """A file indented with tabs gets tab-indented insertions (else Python raises TabError)."""
    package = reduced_release("0.5.10", tmp_path, ["llama"], executor=False)
    model = package / MODEL_DIR / "llama.py"
    tabbed = []
    for line in model.read_text(encoding="utf-8").splitlines(keepends=True):
        stripped = line.lstrip(" ")
        depth = (len(line) - len(stripped)) // 4
        tabbed.append("\t" * depth + " " * ((len(line) - len(stripped)) % 4) + stripped)
    text = "".join(tabbed)
    compile(text, "llama.py", "exec")
    model.write_text(text, encoding="utf-8")
    result = _apply(package)
    after = model.read_text(encoding="utf-8")
    if after == text:
        # refused: then it must say so, and never write a file Python cannot load
        assert any(m.status == "error" for m in result.models), result.models
        _note("tabs", file="0.5.10/llama.py re-indented with tabs", outcome="refused")
        return
    compile(after, "llama.py", "exec")
    inserted = [l for l in after.splitlines() if l not in set(text.splitlines())]
    assert inserted and all(not l.startswith(" ") for l in inserted), inserted
    assert _verified(package)
    assert revert_text(after, model) == text
    _note("tabs", file="0.5.10/llama.py re-indented with tabs", outcome="patched, tab-indented insertions")


def test_mode_owner_and_symlink_inside_the_tree(tmp_path: Path) -> None:
    package = reduced_release("0.5.10", tmp_path, ["llama", "qwen2", "qwen3"], executor=False)
    models = package / MODEL_DIR
    (models / "llama.py").chmod(0o750)
    (models / "qwen2.py").chmod(0o604)
    os.chown(models / "qwen2.py", 65534, 65534)
    # qwen3.py is a symlink to a file elsewhere inside the same tree
    vendored = package / "vendored"
    vendored.mkdir()
    (models / "qwen3.py").rename(vendored / "qwen3.py")
    (models / "qwen3.py").symlink_to(Path("..", "..", "vendored", "qwen3.py"))
    target_before = (vendored / "qwen3.py").read_bytes()

    _apply(package)
    assert stat.S_IMODE((models / "llama.py").stat().st_mode) == 0o750
    assert stat.S_IMODE((models / "qwen2.py").stat().st_mode) == 0o604
    assert ((models / "qwen2.py").stat().st_uid, (models / "qwen2.py").stat().st_gid) == (65534, 65534)
    assert (models / "qwen3.py").is_symlink(), "the symlink was replaced by a file"
    assert (vendored / "qwen3.py").read_bytes() != target_before
    assert MARKER.encode() in (models / "llama.py").read_bytes()
    assert _verified(package)
    _note("mode_owner_symlink", modes_kept=["0750", "0604"], owner_kept="65534:65534", symlink_kept=True)


def test_latin1_coding_cookie(tmp_path: Path) -> None:
    package = reduced_release("0.5.10", tmp_path, ["llama"], executor=False)
    model = package / MODEL_DIR / "llama.py"
    text = "# -*- coding: latin-1 -*-\n# Auteur : Ren\u00e9e M\u00fcller, \u00a9 caf\u00e9\n" + model.read_text(
        encoding="utf-8"
    )
    data = text.encode("latin-1")
    model.write_bytes(data)
    _apply(package)
    after = model.read_bytes()
    assert after != data
    assert after.startswith(b"# -*- coding: latin-1 -*-\n# Auteur : Ren\xe9e M\xfcller, \xa9 caf\xe9\n")
    py_compile.compile(str(model), cfile=str(tmp_path / "llama.pyc"), doraise=True)
    assert _only_insertions(data.decode("latin-1"), after.decode("latin-1"))
    assert _verified(package)
    assert revert_text(after.decode("latin-1"), model).encode("latin-1") == data
    _note("coding_cookie", file="0.5.10/llama.py as latin-1", bytes_kept=True)


# -- bytecode ---------------------------------------------------------------------

#: A model file small enough to import without torch or SGLang, shaped like the
#: real ones (plain +1 setter, list collector, residual): the engine plans it as usual.
TOY = """\
class ToyModel:
    def __init__(self, num_layers=4):
        self.start_layer, self.end_layer = 0, num_layers
        self.layers_to_capture = []

    def forward(self, hidden_states):
        residual = None
        aux_hidden_states = []
        for i in range(self.start_layer, self.end_layer):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states)
            hidden_states = hidden_states
        return hidden_states, aux_hidden_states


class ToyForCausalLM:
    def __init__(self):
        self.model = ToyModel()

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if layer_ids is None:
            self.model.layers_to_capture = [2]
        else:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
"""
PROBE = (
    "import sys; sys.path.insert(0, sys.argv[1]); import toy; m = toy.ToyForCausalLM(); "
    "print(getattr(m.model, 'capture_embedding_for_eagle3', 'old code'))"
)


def _import_fresh(models: Path) -> str:
    """Import toy.py in a new interpreter; what its new or old code says."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(models)], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


@pytest.mark.parametrize("invalidation", ["timestamp", "unchecked-hash"])
def test_stale_bytecode_never_runs(tmp_path: Path, invalidation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Import, apply, import again in a fresh process: the new code runs.

    ``unchecked-hash`` bytecode (as distributions compile it) is trusted by
    Python whatever the source says; only removing it makes the new code run.
    """
    package = reduced_release("0.5.10", tmp_path, ["qwen2"], executor=False)
    models = package / MODEL_DIR
    (models / "toy.py").write_text(TOY, encoding="utf-8")
    mode = (
        py_compile.PycInvalidationMode.UNCHECKED_HASH
        if invalidation == "unchecked-hash"
        else py_compile.PycInvalidationMode.TIMESTAMP
    )
    assert compileall.compile_dir(str(models), quiet=1, invalidation_mode=mode)
    assert _import_fresh(models) == "old code"
    cached = sorted(p.name for p in (models / "__pycache__").iterdir())
    assert any(p.startswith("toy.") for p in cached) and any(p.startswith("qwen2.") for p in cached)

    result = _apply(package)
    assert "toy.ToyForCausalLM" in {m.model for m in result.models}
    left = sorted(p.name for p in (models / "__pycache__").iterdir())
    assert not [p for p in left if p.startswith(("toy.", "qwen2."))], left  # rewritten files: no bytecode left
    assert _import_fresh(models) == "False"  # the flag __init__ now sets: new code
    _FIGURES.setdefault("bytecode", {})[invalidation] = "new code runs after apply"
    record("properties", _FIGURES)


def test_stale_bytecode_check_fails_without_the_cleanup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is real: with the cleanup disabled, the old code runs."""
    import patchcraft.base.sources as sources

    monkeypatch.setattr(sources, "drop_stale_bytecode", lambda path: None)
    package = reduced_release("0.5.10", tmp_path, ["qwen2"], executor=False)
    models = package / MODEL_DIR
    (models / "toy.py").write_text(TOY, encoding="utf-8")
    compileall.compile_dir(str(models), quiet=1, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    _apply(package)
    assert _import_fresh(models) == "old code"


def test_drop_stale_bytecode_covers_every_cache_entry(tmp_path: Path) -> None:
    source = tmp_path / "llama.py"
    source.write_text("x = 1\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    names = [
        "llama.cpython-311.pyc",
        "llama.cpython-311.opt-1.pyc",
        "llama.cpython-39.pyc",
        "llama4.cpython-311.pyc",
        "llama_x.cpython-311.pyc",
    ]
    for name in names:
        (cache / name).write_bytes(b"")
    drop_stale_bytecode(source)
    assert sorted(p.name for p in cache.iterdir()) == ["llama4.cpython-311.pyc", "llama_x.cpython-311.pyc"]


@pytest.mark.parametrize("bad", ["break\n", "def helper(a, a):\n    pass\n"])
def test_a_file_that_parses_but_does_not_compile_is_reported(tmp_path: Path, bad: str) -> None:
    """``compiles`` is the compiler's verdict, not the parser's: errors only the compiler sees count."""
    package = reduced_release("0.5.10", tmp_path, ["llama"], executor=False)
    _apply(package)
    assert _verified(package)
    model = package / MODEL_DIR / "llama.py"
    model.write_text(model.read_text() + bad)
    result = run(resolve_target(str(package)), Mode.VERIFY)
    assert [m.compiles for m in result.models] == [False]
    assert result.models[0].status == ModelStatus.ALREADY  # the edits are all there; the file is broken elsewhere
