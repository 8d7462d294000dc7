"""Two writers on one tree: the lock serialises them; nothing doubled, nothing lost."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from patchcraft import MARKER
from patchcraft.engine.tree_run import run, write_changes
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.tree_lock import LOCK_NAME, TreeLock
from patchcraft.engine.records import Mode
from patchcraft.base.status import ModelStatus
from patchcraft.base.target import resolve_target
from reliability_kit import MODEL_DIR, record, reduced_release, restore, snapshot

KEEP = ("qwen2", "qwen3", "llama")
ROUNDS = 3
_FIGURES: dict = {}


def _start(*args: str, env: dict | None = None) -> subprocess.Popen:
    environment = {**os.environ, "NO_COLOR": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "patchcraft", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )


def _finish(process: subprocess.Popen) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=300)
    return process.returncode, stderr


def _wait_for_message(log: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``process`` says (on stderr, into ``log``) that it waits for the lock."""
    deadline = time.monotonic() + timeout
    while "waiting for it to finish" not in log.read_text():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the second run never waited"
        time.sleep(0.01)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return reduced_release("0.5.10", tmp_path / "t", KEEP, executor=False)


def test_second_apply_waits_says_so_and_rereads(tree: Path, tmp_path: Path) -> None:
    """While we hold the lock and patch, a second ``apply`` waits; then finds the work done."""
    models = tree / MODEL_DIR
    held = TreeLock(models, timeout=5, on_wait=lambda message: None)
    assert held.acquire()
    log = tmp_path / "stderr"
    try:
        with log.open("w") as sink:
            waiter = subprocess.Popen(
                [sys.executable, "-m", "patchcraft", "apply", str(tree)],
                stdout=subprocess.DEVNULL,
                stderr=sink,
                env={**os.environ, "NO_COLOR": "1"},
            )
        _wait_for_message(log, waiter)
        write_changes(run(resolve_target(str(tree)), Mode.APPLY).changes)  # the first run's work
        patched = {rel: data for rel, data in snapshot(tree).items() if not rel.endswith(LOCK_NAME)}
    finally:
        held.release()
    code = waiter.wait(timeout=300)
    stderr = log.read_text()
    assert code == 0, stderr
    lines = stderr.splitlines()
    assert (
        f"patchcraft: another patchcraft run (pid {os.getpid()}) is writing {models}; waiting for it to finish, then re-reading the files"
        in lines
    )
    assert "patchcraft: the other run finished; continuing with fresh reads" in lines
    assert "Rewriting" not in stderr and "already-patched" in stderr
    assert snapshot(tree) == patched  # nothing rewritten, nothing doubled
    assert not (models / LOCK_NAME).exists()
    _FIGURES["waiter"] = {"exit": code, "message": lines[0].replace(str(models), "<models>")}
    record("concurrency", _FIGURES)


def test_lock_timeout_is_a_clean_refusal(tree: Path) -> None:
    models = tree / MODEL_DIR
    before = snapshot(tree)
    held = TreeLock(models, timeout=5, on_wait=lambda message: None)
    assert held.acquire()
    try:
        code, stderr = _finish(_start("apply", str(tree), env={"PATCHCRAFT_LOCK_TIMEOUT": "0.3"}))
    finally:
        held.release()
    assert code == 2, stderr
    assert (
        f"patchcraft: error: {models / LOCK_NAME}: another patchcraft run (pid {os.getpid()}) has held this tree for over 0.3 s; nothing was changed"
        in stderr
    )
    assert snapshot(tree) == before
    _FIGURES["timeout"] = {"exit": code}
    record("concurrency", _FIGURES)


def _reference(tmp_path: Path, *selections: tuple) -> dict:
    """The tree after the given applies, one after the other (no concurrency)."""
    package = reduced_release("0.5.10", tmp_path / f"ref{len(selections)}", KEEP, executor=False)
    for names in selections:
        write_changes(run(resolve_target(str(package)), Mode.APPLY, names).changes)
    return snapshot(package)


def test_two_applies_at_once_on_a_shared_file(tree: Path, tmp_path: Path) -> None:
    """``--model qwen2`` and ``--model qwen3`` both edit qwen2.py (Qwen2Model lives there).

    Unserialised, the later writer would drop the other's edits (or, with the
    changed-on-disk check, fail); with the lock, both succeed and the tree is
    exactly what the two runs give one after the other.
    """
    original = snapshot(tree)
    expected = _reference(tmp_path, ("qwen2",), ("qwen3",))
    waited = 0
    for _ in range(ROUNDS):
        restore(tree, original)
        first, second = _start("apply", "--model", "qwen2", str(tree)), _start("apply", "--model", "qwen3", str(tree))
        (code1, err1), (code2, err2) = _finish(first), _finish(second)
        assert (code1, code2) == (0, 0), (err1, err2)
        waited += ("waiting for it to finish" in err1) + ("waiting for it to finish" in err2)
        assert snapshot(tree) == expected
        shared = (tree / MODEL_DIR / "qwen2.py").read_text(encoding="utf-8")
        assert shared.count(MARKER) == 3  # setter, init, forward: each once
        verify = run(resolve_target(str(tree)), Mode.VERIFY, ("qwen2", "qwen3"))
        assert all(m.status == ModelStatus.ALREADY for m in verify.models), [(m.model, m.status) for m in verify.models]
    _FIGURES["two applies, different models, shared file"] = {
        "rounds": ROUNDS,
        "both_exit_0": ROUNDS,
        "waits": waited,
        "tree_as_sequential": ROUNDS,
    }
    record("concurrency", _FIGURES)


def test_apply_and_revert_at_once(tree: Path, tmp_path: Path) -> None:
    """Whichever runs second wins, whole: every file original, or every file patched."""
    original = snapshot(tree)
    patched = _reference(tmp_path, ())
    outcomes = []
    for _ in range(ROUNDS):
        restore(tree, original)
        first, second = _start("apply", str(tree)), _start("revert", str(tree))
        (code1, err1), (code2, err2) = _finish(first), _finish(second)
        assert (code1, code2) == (0, 0), (err1, err2)
        state = snapshot(tree)
        assert state in (original, patched)
        outcomes.append("original" if state == original else "patched")
    _FIGURES["apply and revert at once"] = {
        "rounds": ROUNDS,
        "final": {o: outcomes.count(o) for o in set(outcomes)},
        "mixed_trees": 0,
    }
    record("concurrency", _FIGURES)


def test_file_changed_between_read_and_write_is_refused(tree: Path) -> None:
    """Even without the lock (another tool, an editor), a file changed under us is not overwritten."""
    target = resolve_target(str(tree))
    result = run(target, Mode.APPLY)
    victim = result.changes[-1].source.path
    edited = victim.read_bytes() + b"# saved by an editor meanwhile\n"
    victim.write_bytes(edited)
    others = {c.source.path: c.source.path.read_bytes() for c in result.changes if c.source.path != victim}
    with pytest.raises(PatchcraftError, match="changed on disk while patchcraft ran"):
        write_changes(result.changes)
    assert victim.read_bytes() == edited
    assert all(path.read_bytes() == data for path, data in others.items())  # all or nothing


def test_a_killed_holders_lock_file_does_not_block(tree: Path) -> None:
    """A lock file left by a killed run (no process holds it) is simply reused."""
    (tree / MODEL_DIR / LOCK_NAME).write_text("999999\n")
    result = subprocess.run(
        [sys.executable, "-m", "patchcraft", "apply", str(tree)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "waiting" not in result.stderr, result.stderr
    assert not (tree / MODEL_DIR / LOCK_NAME).exists()
