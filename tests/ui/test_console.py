"""output.py: the only module that styles text, and the only one that imports rich.

Plain output (a hook's or CI log's table) never imports rich; the plain
table's columns line up and long cells never wrap (the release copies of
conftest.py, SMALL_RELEASE 0.5.2); text in brackets is never read as rich markup.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli as cli
from patchcraft.engine import tree_run
from patchcraft.engine.records import Mode, ModelResult, RunResult
from patchcraft.base.target import SglangTree, resolve_target


def test_plain_output_never_imports_rich_and_colour_does(package: Path, tmp_path: Path) -> None:
    """A hook's or CI log's table is written as plain text; rich only styles a terminal."""
    env = {**os.environ, "PATCHCRAFT_NO_CACHE": "1"}
    env.pop("NO_COLOR", None)

    def imported(*options: str) -> set:
        run = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "patchcraft", "verify", *options, str(package)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert run.returncode == 1, run.stderr[-2000:]  # an unpatched release
        return {
            line.split("|")[-1].strip().split(".")[0]
            for line in run.stderr.splitlines()
            if line.startswith("import time:")
        }

    assert "rich" not in imported("--color", "never")
    assert "rich" in imported("--color", "always")


def test_plain_table_columns_line_up_and_long_cells_never_wrap(package: Path, capsys) -> None:
    code, _, err = cli(capsys, "verify", "--color", "never", str(package))
    lines = err.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("model "))
    table = lines[header:]
    assert len(table) == 1 + len(tree_run.run(resolve_target(str(package)), Mode.VERIFY).models)
    for column in ("status", "init", "setter", "forward", "compiles", "idempotent", "message"):
        at = table[0].index(column)
        assert all(row[at - 2 : at] == "  " and row[at] != " " for row in table[1:]), (column, table)
    assert all(line == line.rstrip() for line in table)
    # One line per model however long its message: an unsupported model's reason stays whole.
    assert any(len(row) > 120 for row in table[1:]), "0.5.2 has long unsupported reasons"


@pytest.mark.parametrize("mode", [Mode.VERIFY, Mode.APPLY])
@pytest.mark.parametrize("color", ["always", "never"])
def test_text_in_brackets_is_printed_as_is_in_colour_and_plain(mode: Mode, color: str, capsys) -> None:
    """A model name or message holding ``[...]`` (ids, "[/]") is text, never rich markup."""
    from patchcraft.ui import console

    message = "ids [default] and [/] stay"
    model = ModelResult(model="m.[bold]X", path="p.py", status="would-patch", message=message)
    tree = SglangTree(package=Path("/src/sglang"), root=Path("/src"))
    console.print_results([RunResult(mode=mode, tree=tree, version="0.5.10", models=(model,), changes=())], color)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().err)
    words = " ".join(shown.split())
    assert "m.[bold]X" in words.replace(" ", "") or "m.[bold]X" in words
    assert "[default]" in words and "[/]" in words
