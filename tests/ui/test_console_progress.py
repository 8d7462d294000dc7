"""The progress line of long work (docs/usage.md, "Progress"): on an interactive stderr only, and transient.

Real commands run with stderr on a pseudo-terminal: the line is drawn there,
and once its frames are taken out, stdout and stderr are byte for byte what
the same command writes piped. Piped, with ``--format json`` and under
``TERM=dumb`` nothing is drawn at all. torch is imported once for the
commands run in process; two run as processes of their own.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import re
import subprocess
import sys
import threading
import tty
import zipfile
from pathlib import Path
from typing import Iterator
from unittest import mock

import pytest

from conftest import SMALL_RELEASE, copy_release
from patchcraft.ui import console

#: rich's live display: the cursor hidden, frames, then the cursor shown and the line erased.
FRAMES = re.compile(rb"\x1b\[\?25l.*?\x1b\[\?25h\r\x1b\[1A\x1b\[2K", re.S)
HIDE_CURSOR = b"\x1b[?25l"
#: What rich takes from the environment about a terminal, unset for every test here.
TERMINAL_VARIABLES = ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")
MODEL = "llama.LlamaForCausalLM"


class Terminal:
    """A pseudo-terminal (raw: no newline translation), read as it is written: a full one would block the writer."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        tty.setraw(self.slave)
        self.stream = open(self.slave, "w", encoding="utf-8", closefd=False)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every writer closed its end
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    @contextlib.contextmanager
    def as_stderr(self) -> Iterator[None]:
        """sys.stderr on this terminal (in the test itself: pytest's capture resets sys.stderr after setup)."""
        with mock.patch.object(sys, "stderr", self.stream):
            yield

    def drawn(self) -> bytes:
        """Everything written on the terminal; it is closed."""
        self.stream.close()
        os.close(self.slave)
        self._reader.join(timeout=60)
        os.close(self.master)
        return b"".join(self._chunks)


def plain_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TERMINAL_VARIABLES}
    return {**env, "TERM": "xterm-256color", "COLUMNS": "120", **extra}


def on_terminal(*argv: str, env: dict[str, str] | None = None) -> tuple[int, bytes, bytes]:
    """``patchcraft ARGV`` as a process, stderr on a pseudo-terminal, stdout piped."""
    terminal = Terminal()
    proc = subprocess.run(
        [sys.executable, "-m", "patchcraft", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=terminal.slave,
        env=env or plain_env(),
        timeout=300,
    )
    return proc.returncode, proc.stdout, terminal.drawn()


def piped(*argv: str, env: dict[str, str] | None = None) -> tuple[int, bytes, bytes]:
    proc = subprocess.run(
        [sys.executable, "-m", "patchcraft", *argv], capture_output=True, env=env or plain_env(), timeout=300
    )
    return proc.returncode, proc.stdout, proc.stderr


def in_process(*argv: str, terminal: Terminal | None = None) -> tuple[int, bytes, bytes]:
    """``patchcraft ARGV`` through cli.main, stdout in memory, stderr in memory or on ``terminal``."""
    from patchcraft.cli import main

    out, err = io.StringIO(), io.StringIO()
    with mock.patch.object(sys, "stdout", out), mock.patch.object(sys, "stderr", terminal.stream if terminal else err):
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue().encode(), terminal.drawn() if terminal else err.getvalue().encode()


def without_timings(output: tuple[int, bytes, bytes]) -> tuple[int, bytes, bytes]:
    """A smoke row's seconds (``0.13s``) differ from run to run."""
    code, out, err = output
    return code, out, re.sub(rb"\b\d+\.\d\ds\b", b"T", err)


@pytest.fixture(autouse=True)
def terminal_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TERMINAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two copies of SMALL_RELEASE, not yet patched."""
    root = tmp_path_factory.mktemp("progress")
    return {name: copy_release(SMALL_RELEASE, root / name) for name in ("piped", "terminal")}


@pytest.fixture(scope="module")
def applied(trees: dict[str, Path]) -> dict[str, tuple[int, bytes, bytes]]:
    """apply on each copy, in process: one with stderr in memory, one on a terminal (the copy's path as PKG).

    One model (and what shares its files: three model classes to prove) keeps it quick.
    """
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TERM", "xterm-256color")
        for name in TERMINAL_VARIABLES:
            env.delenv(name, raising=False)
        # each apply runs the harness: the second copy's rows are not answered from the first's (harness.run_cache)
        env.setenv("PATCHCRAFT_NO_CACHE", "1")
        argv = ("apply", "--color", "never", "--model", MODEL)
        runs = {
            "piped": in_process(*argv, str(trees["piped"])),
            "terminal": in_process(*argv, str(trees["terminal"]), terminal=Terminal()),
        }
    return {
        name: (code, out.replace(str(trees[name]).encode(), b"PKG"), err.replace(str(trees[name]).encode(), b"PKG"))
        for name, (code, out, err) in runs.items()
    }


def test_apply_on_a_terminal_shows_the_harness_line_and_nothing_else(
    applied: dict[str, tuple[int, bytes, bytes]],
) -> None:
    code, out, err = applied["terminal"]
    assert re.search(rb"apply: harness \d+/3 models  \w+\.\w+", err), err[:400]
    assert err.count(HIDE_CURSOR) == 1
    assert (code, out, FRAMES.sub(b"", err)) == applied["piped"]


def test_apply_piped_draws_nothing(applied: dict[str, tuple[int, bytes, bytes]]) -> None:
    code, out, err = applied["piped"]
    assert (code, out) == (0, b"") and b"Rewriting" in err
    assert b"\x1b" not in err and b"apply: harness" not in err


@pytest.fixture(scope="module")
def smoke_piped(trees: dict[str, Path], applied: dict) -> tuple[int, bytes, bytes]:
    return without_timings(piped("smoke", "--model", MODEL, str(trees["piped"])))


def test_smoke_on_a_terminal_counts_models_and_clears_the_line(
    trees: dict[str, Path], smoke_piped: tuple[int, bytes, bytes]
) -> None:
    code, out, err = without_timings(on_terminal("smoke", "--model", MODEL, str(trees["piped"])))
    assert re.search(rb"smoke \d+/3 models  \w+\.\w+", err) and b"smoke  importing torch" in err, err[:400]
    assert err.count(HIDE_CURSOR) == 1 and err.endswith(smoke_piped[2])
    assert (code, out, FRAMES.sub(b"", err)) == smoke_piped


def test_smoke_piped_draws_nothing(smoke_piped: tuple[int, bytes, bytes]) -> None:
    code, out, err = smoke_piped
    assert code == 0 and out == b""
    assert b"\x1b" not in err and b"importing torch" not in err
    assert err.startswith(b"smoke (cpu) sglang 0.5.2 at ")


def test_smoke_format_json_draws_nothing_on_a_terminal(trees: dict[str, Path], applied: dict) -> None:
    code, out, err = in_process(
        "smoke", "--format", "json", "--model", MODEL, str(trees["terminal"]), terminal=Terminal()
    )
    assert code == 0 and err == b""
    assert json.loads(out)["command"] == "smoke"


def test_smoke_draws_nothing_under_term_dumb(
    trees: dict[str, Path], applied: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TERM", "dumb")
    code, out, err = in_process("smoke", "--model", MODEL, str(trees["terminal"]), terminal=Terminal())
    assert code == 0 and err.startswith(b"smoke (cpu) sglang 0.5.2 at ") and b"\x1b" not in err
    assert without_timings((code, out, err)) == without_timings(
        in_process("smoke", "--model", MODEL, str(trees["terminal"]))
    )


# -- fetch: a spinner while there is work, nothing when the release is there ------------------


def test_fetch_spins_while_unpacking_and_is_silent_once_fetched(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    with zipfile.ZipFile(cache / "wheels" / "sglang-9.9.9-py3-none-any.whl", "w") as wheel:
        wheel.writestr("sglang/srt/models/llama.py", "class LlamaForCausalLM: ...\n")
    env = plain_env(PATCHCRAFT_CACHE=str(cache))
    dest = tmp_path / "release"
    code, out, err = on_terminal("fetch", "9.9.9", "--dest", str(dest), env=env)
    assert (code, out) == (0, f"{dest / 'sglang'}\n".encode())
    assert b"fetching sglang 9.9.9  unpacking" in err and FRAMES.sub(b"", err) == b""
    assert on_terminal("fetch", "9.9.9", "--dest", str(dest), env=env) == (0, out, b"")
    assert piped("fetch", "9.9.9", "--dest", str(tmp_path / "again"), env=env) == (
        0,
        f"{tmp_path / 'again' / 'sglang'}\n".encode(),
        b"",
    )


# -- the rules, in process: console.progress on a pseudo-terminal -----------------------------


def work(label: str = "work", shown: bool = True) -> None:
    with console.progress(label, total=3, shown=shown, unit="steps") as line:
        for step in range(3):
            line.update(f"step {step}", step)


def drawn_by(*args: object, **options: object) -> bytes:
    terminal = Terminal()
    with terminal.as_stderr():
        work(*args, **options)  # type: ignore[arg-type]
    return terminal.drawn()


def test_a_terminal_gets_a_transient_line() -> None:
    drawn = drawn_by()
    assert b"work 2/3 steps  step 2" in drawn and FRAMES.sub(b"", drawn) == b""


@pytest.mark.parametrize(
    "env", [{"TERM": "dumb"}, {"TERM": "unknown"}, {"TTY_INTERACTIVE": "0"}, {"TTY_COMPATIBLE": "0"}]
)
def test_rich_rules_turn_the_line_off(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert drawn_by() == b""


def test_no_color_keeps_the_line_without_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    drawn = drawn_by()
    assert b"work 2/3 steps" in drawn
    assert not re.search(rb"\x1b\[[0-9;]*3[0-9]m|\x1b\[9[0-7]m", drawn)  # no foreground colour


def test_shown_false_draws_nothing() -> None:
    assert drawn_by(shown=False) == b""


def test_a_line_inside_a_line_draws_nothing_of_its_own() -> None:
    terminal = Terminal()
    with terminal.as_stderr(), console.progress("outer") as outer:
        outer.update("going")
        work("inner")
    drawn = terminal.drawn()
    assert b"outer" in drawn and b"inner" not in drawn


def test_work_that_never_reports_draws_nothing() -> None:
    terminal = Terminal()
    with terminal.as_stderr(), console.progress("quiet"):
        pass
    assert terminal.drawn() == b""


@pytest.mark.parametrize("env", [{}, {"FORCE_COLOR": "1"}, {"TTY_COMPATIBLE": "1"}, {"TTY_INTERACTIVE": "1"}])
def test_a_pipe_never_gets_the_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str]) -> None:
    """rich would take FORCE_COLOR or TTY_COMPATIBLE=1 for a terminal; a log must never get cursor codes."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with open(tmp_path / "log", "w", encoding="utf-8") as log:
        monkeypatch.setattr(sys, "stderr", log)
        work()
    assert (tmp_path / "log").read_bytes() == b""


def test_the_sweep_counts_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    from tools import sweep

    def fake_release(version: str, on_step=None, **_: object) -> str:
        on_step(f"{version}: apply")
        return version

    monkeypatch.setattr(sweep, "sweep_release", fake_release)
    terminal = Terminal()
    with terminal.as_stderr():
        assert sweep.sweep(["0.5.2", "0.5.10"]) == ["0.5.2", "0.5.10"]
    drawn = terminal.drawn()
    assert b"sweep 1/2 releases  0.5.10: apply" in drawn and FRAMES.sub(b"", drawn) == b""
