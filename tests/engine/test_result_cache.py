"""cache.py: a cached result is never stale, and a hit imports no libcst.

Real release 0.5.2 (ten model classes over eight files, plus the runner):
small enough to run a whole tree in well under a second of CPU, big enough
to have models sharing files (qwen2.py serves qwen3 and qwen2_5_vl).
No test here measures time: bench/run.py does. The release copies
(``pristine``, ``package``) and ``flip_one_byte`` are in conftest.py:
test_workers.py, test_output.py and test_lazy.py use them too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import flip_one_byte, run_cli as cli
from patchcraft.engine import result_cache
from patchcraft.engine import tree_run
from patchcraft.pipeline import stages as _pipeline
from patchcraft.engine.records import Mode
from patchcraft.base.target import resolve_target

INIT = b"self.layers_to_capture = []"


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    """A private result cache; the list records every real engine run."""
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PATCHCRAFT_NO_CACHE", raising=False)
    calls: list = []
    real = _pipeline.run

    def counting(tree, mode, names=(), runner=True, jobs=1, **options):
        calls.append((tree, mode))
        return real(tree, mode, names, runner=runner, jobs=jobs, **options)

    monkeypatch.setattr(_pipeline, "run", counting)
    return calls


# -- the result cache ------------------------------------------------------------------


def test_second_verify_is_served_from_the_cache(package: Path, runs: list, capsys) -> None:
    first = cli(capsys, "verify", "--format", "json", str(package))
    second = cli(capsys, "verify", "--format", "json", str(package))
    assert first == second
    assert len(runs) == 1
    assert first[0] == 1  # an unpatched tree is not verified


def test_a_single_byte_changes_the_result(package: Path, runs: list, capsys, monkeypatch) -> None:
    """One byte in llama.py (size and mtime kept) must not be served the old result."""
    before = cli(capsys, "verify", "--format", "json", str(package))
    flip_one_byte(package / "srt" / "models" / "llama.py", INIT, INIT.replace(b"capture ", b"capturf "))
    after = cli(capsys, "verify", "--format", "json", str(package))
    assert len(runs) == 2
    assert after != before
    assert "never initialises `self.layers_to_capture`" in after[1]
    # And it is exactly what a run without any cache says.
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    assert cli(capsys, "verify", "--format", "json", str(package)) == after


def test_a_byte_in_a_file_no_model_uses_or_a_new_file_invalidates(package: Path, runs: list, capsys) -> None:
    """The key covers every file the engine may read, and the listing, not just what matters today."""
    cli(capsys, "verify", str(package))
    other = next(
        p for p in sorted((package / "srt" / "models").glob("*.py")) if b"layers_to_capture" not in p.read_bytes()
    )
    flip_one_byte(other, b"import", b"imporT")
    cli(capsys, "verify", str(package))
    (package / "srt" / "models" / "zz_new_model.py").write_text("x = 1\n")
    cli(capsys, "verify", str(package))
    assert len(runs) == 3


def test_apply_then_verify_is_not_stale(package: Path, runs: list, capsys) -> None:
    """verify (cached, not verified) -> apply -> verify must see the patch; writing commands always run."""
    before = cli(capsys, "verify", str(package))
    assert cli(capsys, "apply", str(package))[0] == 0
    after = cli(capsys, "verify", str(package))
    assert after != before
    assert "would-patch" in before[2] and "would-patch" not in after[2]
    assert cli(capsys, "verify", str(package)) == after
    assert cli(capsys, "revert", str(package))[0] == 0
    assert cli(capsys, "apply", str(package))[0] == 0  # the same bytes as the first apply read
    assert [mode for _, mode in runs] == [Mode.VERIFY, Mode.APPLY, Mode.VERIFY, Mode.REVERT, Mode.APPLY]


def test_each_option_that_shapes_the_result_has_its_own_entry(package: Path, runs: list, capsys) -> None:
    variants = [
        ("verify", str(package)),
        ("verify", "--model", "llama", str(package)),
        ("verify", "--no-runner", str(package)),
        ("diff", str(package)),
        ("apply", "--check", str(package)),
        ("verify", str(package / "srt" / "models" / "qwen2.py")),
    ]
    outputs = [cli(capsys, *argv) for argv in variants]
    assert len(runs) == len(variants)
    assert [cli(capsys, *argv) for argv in variants] == outputs  # all served from the cache now
    assert len(runs) == len(variants)


def test_an_edit_to_patchcraft_itself_invalidates(package: Path, runs: list, capsys, monkeypatch) -> None:
    cli(capsys, "verify", str(package))
    monkeypatch.setattr(result_cache, "_CODE_HASH", "a transform was edited")
    cli(capsys, "verify", str(package))
    assert len(runs) == 2


def test_code_hash_covers_the_transforms() -> None:
    files = {(p.parent.name, p.name) for p in result_cache._code_files()}
    expected = {
        ("engine", "tree_run.py"),
        ("planning", "model_plans.py"),
        ("reading", "class_graph.py"),
        ("transforms", "_base.py"),
        ("transforms", "capture_embedding_output.py"),
        ("examples", "capture_embedding_output.py"),
    }
    assert expected <= files


def test_a_damaged_entry_is_a_miss_and_is_removed(package: Path, runs: list, capsys) -> None:
    first = cli(capsys, "verify", str(package))
    (entry,) = result_cache.directory().glob("*.pickle")
    entry.write_bytes(b"not a cache entry")
    assert cli(capsys, "verify", str(package)) == first
    assert len(runs) == 2
    assert entry.read_bytes() != b"not a cache entry"  # replaced by a good one


def test_an_unusable_cache_directory_just_means_no_cache(
    package: Path, runs: list, capsys, tmp_path, monkeypatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(blocker))  # <file>/runs cannot be created
    first = cli(capsys, "verify", str(package))
    assert cli(capsys, "verify", str(package)) == first
    assert len(runs) == 2


def test_no_cache_variable_turns_it_off(package: Path, runs: list, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    cli(capsys, "verify", str(package))
    cli(capsys, "verify", str(package))
    assert len(runs) == 2
    assert not result_cache.directory().exists()


def test_the_cache_lives_in_the_user_cache_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("PATCHCRAFT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert result_cache.directory() == tmp_path / "xdg" / "patchcraft" / "runs"
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "mine"))
    assert result_cache.directory() == tmp_path / "mine" / "runs"


def test_the_key_covers_every_file_the_engine_reads(package: Path, monkeypatch) -> None:
    """Record every file a real run opens; each one inside the tree must be a cache input."""
    read: set = set()
    real_read_bytes, real_open = Path.read_bytes, Path.open
    import builtins
    import io

    real_builtin_open = builtins.open

    def note(path) -> None:
        try:
            read.add(Path(os.path.realpath(os.fspath(path))))
        except TypeError:
            pass  # a file descriptor

    def read_bytes(self):
        note(self)
        return real_read_bytes(self)

    def path_open(self, *args, **kwargs):
        note(self)
        return real_open(self, *args, **kwargs)

    def builtin_open(file, *args, **kwargs):
        note(file)
        return real_builtin_open(file, *args, **kwargs)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(Path, "open", path_open)
    monkeypatch.setattr(builtins, "open", builtin_open)
    monkeypatch.setattr(io, "open", builtin_open)
    tree = resolve_target(str(package))
    for mode in (Mode.VERIFY, Mode.DIFF, Mode.CHECK):
        tree_run.run(tree, mode)
    monkeypatch.undo()
    inside = {p for p in read if str(p).startswith(str(package.resolve()))}
    assert inside, "the recorder saw no read at all"
    inputs = {Path(os.path.realpath(p)) for p in result_cache.inputs(tree)}
    assert inside <= inputs, f"read but not in the cache key: {sorted(inside - inputs)}"


def test_a_warm_verify_does_not_import_libcst(package: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PATCHCRAFT_CACHE": str(tmp_path / "cache"), "NO_COLOR": "1"}
    env.pop("PATCHCRAFT_NO_CACHE", None)
    command = [sys.executable, "-m", "patchcraft", "verify", str(package)]
    cold = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    warm = subprocess.run(
        [sys.executable, "-X", "importtime", *command[1:]], capture_output=True, text=True, env=env, timeout=300
    )
    imported = {line.split("|")[-1].strip() for line in warm.stderr.splitlines() if line.startswith("import time:")}
    assert "patchcraft.engine.result_cache" in imported  # the trace works
    assert not {name for name in imported if name.split(".")[0] == "libcst"}
    assert "patchcraft.transforms" not in imported
    shown = "\n".join(line for line in warm.stderr.splitlines() if not line.startswith("import time:"))
    assert (warm.returncode, warm.stdout, shown + "\n") == (cold.returncode, cold.stdout, cold.stderr)
