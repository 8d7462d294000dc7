"""Refusals: one clear line, exit 2, and no file changed (the whole tree is compared).

Every case runs the real command line on a reduced copy of 0.5.10 (real
model files: llama, llama4 (inherits from llama), qwen2, qwen3), breaking
one thing. Root ignores file modes, so the read-only cases run without the
capabilities that let root override them (see reliability_kit.NO_DAC).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from patchcraft.commands._pipeline import run_pipeline
from patchcraft.pipeline.stages import Options
from patchcraft.base.errors import PatchcraftError
from patchcraft.engine.records import Mode
from reliability_kit import MODEL_DIR, error_lines, patchcraft_cli, record, reduced_release, scrub, snapshot, temp_files

KEEP = ("llama", "llama4", "qwen2", "qwen3")
_FIGURES: dict = {}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return reduced_release("0.5.10", tmp_path / "t", KEEP, executor=False)


def _refused(
    name: str,
    root: Path,
    *args: str,
    needles: tuple = (),
    obey_modes: bool = False,
    whole: Path | None = None,
    code: int = 2,
) -> str:
    """Run ``apply ARGS``; assert exit ``code``, the first error line with ``needles``, nothing changed.

    2: the run stopped, one error line. 1: models in ``error`` rows (the first one the cause, the
    others blocked by it), and here no other model to write.
    """
    watched = whole or root
    before = snapshot(watched)
    result = patchcraft_cli("apply", *args, obey_modes=obey_modes)
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    errors = _causes(result.stderr)
    assert len(errors) == 1 if code == 2 else errors, result.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    assert snapshot(watched) == before, "a file changed"
    assert not temp_files(root / MODEL_DIR) if (root / MODEL_DIR).is_dir() else True
    _FIGURES[name] = {
        "exit": result.returncode,
        "message": scrub(errors[0].replace(str(root), "<tree>")),
        "files_changed": 0,
    }
    record("refusals", _FIGURES)
    return errors[0]


def _causes(stderr: str) -> list[str]:
    """The lines that state why: ``patchcraft: error: ...`` for a refused run, or a
    model's ``error`` line (models refused only because they share its file say so)."""
    fatal = error_lines(stderr)
    models = [l.strip() for l in stderr.splitlines() if l.strip().startswith("error ")]
    return fatal + [l for l in models if "not written because" not in l]


def _model(tree: Path, stem: str = "llama") -> Path:
    return tree / MODEL_DIR / f"{stem}.py"


@pytest.mark.parametrize("what", ["file", "directory"])
def test_read_only(tree: Path, what: str) -> None:
    target = _model(tree) if what == "file" else tree / MODEL_DIR
    target.chmod(0o444 if what == "file" else 0o555)
    try:
        _refused(f"read-only {what}", tree, str(tree), needles=("read-only", "nothing was changed"), obey_modes=True)
    finally:
        target.chmod(0o644 if what == "file" else 0o755)


def test_write_failing_half_way_is_rolled_back(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second rename fails (a full disk, a vanished directory): the first is undone."""
    before = snapshot(tree)
    calls = []
    real_replace = os.replace

    def failing_replace(src, dst):
        if not str(dst).startswith(str(tree)):  # a cache entry outside the tree (the harness-run cache)
            return real_replace(src, dst)
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(PatchcraftError, match="No space left on device.*restored; nothing was changed") as raised:
        run_pipeline(Options(targets=(str(tree),)), Mode.APPLY)
    assert len(calls) >= 3  # two forward renames, then the restore of the first
    assert snapshot(tree) == before
    assert not temp_files(tree / MODEL_DIR)
    message = "patchcraft: error: " + scrub(str(raised.value).replace(str(tree), "<tree>"))
    _FIGURES["write fails on the 2nd of several files (in process)"] = {
        "exit": 2,
        "files_changed": 0,
        "message": message,
    }
    record("refusals", _FIGURES)


def test_write_failing_before_any_rename(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing a temporary file fails: no target touched, no temporary file left."""
    import patchcraft.base.sources as sources

    before = snapshot(tree)
    real_fsync = os.fsync
    count = []

    def failing_fsync(fd):
        count.append(fd)
        if len(count) == 2:
            raise OSError(5, "Input/output error")
        return real_fsync(fd)

    monkeypatch.setattr(sources.os, "fsync", failing_fsync)
    with pytest.raises(PatchcraftError, match="Input/output error") as raised:
        run_pipeline(Options(targets=(str(tree),)), Mode.APPLY)
    assert snapshot(tree) == before
    assert not temp_files(tree / MODEL_DIR)
    message = "patchcraft: error: " + scrub(str(raised.value).replace(str(tree), "<tree>"))
    _FIGURES["write fails before any rename (in process)"] = {"exit": 2, "files_changed": 0, "message": message}
    record("refusals", _FIGURES)


def test_symlink_outside_the_target(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    model = _model(tree)
    shutil.move(str(model), outside / "llama.py")
    model.symlink_to(outside / "llama.py")
    _refused("symlink outside the target", tree, str(tree), needles=("symlink", "outside"), whole=tmp_path)


def test_not_utf8(tree: Path) -> None:
    model = _model(tree)
    model.write_bytes(model.read_bytes().replace(b"# Adapted from", b"# Adapt\xe9 from", 1))
    _refused("not UTF-8", tree, str(tree), needles=("llama.py", "not valid utf-8"))


def test_binary(tree: Path) -> None:
    model = _model(tree)
    data = model.read_bytes()
    model.write_bytes(data[:500] + b"\x00\x01\x02" + data[500:])
    _refused("binary (NUL bytes)", tree, str(tree), needles=("llama.py", "binary"))


def test_empty_file_named_as_target(tree: Path) -> None:
    _model(tree).write_bytes(b"")
    _refused("empty file (named)", tree, str(_model(tree)), needles=("llama.py", "empty"))


def test_empty_file_another_model_inherits_from(tree: Path) -> None:
    """qwen3's inner model builds on qwen2's: an emptied qwen2.py leaves it without a base; refuse."""
    _model(tree, "qwen2").write_bytes(b"\n")
    _refused("empty file (inherited from)", tree, str(tree), needles=("qwen2.py", "empty"))


def test_syntax_error(tree: Path) -> None:
    model = _model(tree)
    model.write_bytes(
        model.read_bytes().replace(b"def set_eagle3_layers_to_capture(", b"def set_eagle3_layers_to_capture((", 1)
    )
    _refused("syntax error", tree, str(tree), needles=("llama.py", "syntax error at line"))


def test_compiles_not(tree: Path) -> None:
    """Parses, but does not compile (a repeated argument): refused at the write, with the reason."""
    model = _model(tree)
    text = model.read_text(encoding="utf-8")
    old = "    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):"
    assert old in text
    model.write_text(text.replace(old, old.replace("(self,", "(self, self,"), 1), encoding="utf-8")
    _refused("does not compile", tree, str(tree), needles=("llama.py", "does not compile even before patching"))


def test_ambiguous_anchor_two_inner_models(tree: Path) -> None:
    """A second copy of the inner model class pasted into the file: which one runs?"""
    model = _model(tree)
    text = model.read_text(encoding="utf-8")
    start = text.index("class LlamaModel(")
    end = text.index("\nclass ", start + 1)
    model.write_text(text[:end] + "\n\n" + text[start:end] + text[end:], encoding="utf-8")
    message = _refused(
        "ambiguous anchor (inner model defined twice)", tree, str(model), needles=("LlamaModel", "found 2"), code=1
    )
    assert "llama.py" in message


@pytest.mark.parametrize(
    "layout",
    ["empty directory", "python project", "srt/models without sglang", "loose models directory", "file outside sglang"],
)
def test_not_an_sglang_tree(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "proj"
    target = root
    if layout == "empty directory":
        root.mkdir()
    elif layout == "python project":
        (root / "pkg").mkdir(parents=True)
        (root / "pkg" / "model.py").write_text("class Model:\n    pass\n")
    elif layout == "srt/models without sglang":
        (root / "srt" / "models").mkdir(parents=True)
        (root / "srt" / "models" / "llama.py").write_text("import torch\n\nclass LlamaModel:\n    pass\n")
    elif layout == "loose models directory":
        (root / "models").mkdir(parents=True)
        target = root / "models" / "llama.py"
        target.write_text("import torch\n\nclass LlamaModel:\n    pass\n")
    else:
        root.mkdir()
        target = root / "llama.py"
        target.write_text("class LlamaModel:\n    pass\n")
    _refused(f"not SGLang: {layout}", root, str(target), needles=("not",))
