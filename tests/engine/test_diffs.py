"""engine.diffs: unified diffs that ``git apply`` and ``patch -p1`` take back to the patched bytes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from patchcraft.base.sources import Source
from patchcraft.engine.diffs import unified_diff, unified_diffs
from patchcraft.engine.records import FileChange


def change(rel: str, before: str, after: str) -> FileChange:
    return FileChange(source=Source(path=Path("/nowhere") / rel, text=before), rel=rel, after=after)


BEFORE = "".join(f"line {i}\n" for i in range(1, 21))
AFTER = BEFORE.replace("line 10\n", "line ten\n")


def test_header_paths_are_relative_with_a_and_b() -> None:
    diff = unified_diff(change("srt/models/llama.py", BEFORE, AFTER))
    lines = diff.splitlines()
    assert lines[:3] == ["--- a/srt/models/llama.py", "+++ b/srt/models/llama.py", "@@ -7,7 +7,7 @@"]
    assert "-line 10" in lines and "+line ten" in lines


def test_context_lines() -> None:
    assert "@@ -10 +10 @@" in unified_diff(change("m.py", BEFORE, AFTER), context=0)
    three = unified_diff(change("m.py", BEFORE, AFTER))
    assert " line 7\n" in three and " line 13\n" in three and " line 6\n" not in three and " line 14\n" not in three


def test_no_change_is_no_diff() -> None:
    assert unified_diff(change("m.py", BEFORE, BEFORE)) == ""


def test_a_missing_final_newline_is_marked_on_each_side() -> None:
    diff = unified_diff(change("m.py", "a = 1\nb = 2", "a = 1\nb = 3"))
    assert diff.endswith("-b = 2\n\\ No newline at end of file\n+b = 3\n\\ No newline at end of file\n")
    gained = unified_diff(change("m.py", "a = 1", "a = 1\n"))
    assert gained.count("\\ No newline at end of file") == 1 and gained.endswith("+a = 1\n")


def test_unified_diffs_is_each_diff_in_order() -> None:
    changes = [change("b.py", "x = 1\n", "x = 2\n"), change("a.py", "y = 1\n", "y = 2\n")]
    assert unified_diffs(changes) == unified_diff(changes[0]) + unified_diff(changes[1])
    assert unified_diffs([]) == ""


# -- the tools take the diff back to the patched bytes ------------------------------------

CASES = {
    "lf": (BEFORE, AFTER),
    "crlf": (BEFORE.replace("\n", "\r\n"), AFTER.replace("\n", "\r\n")),
    "no final newline": ("a = 1\nb = 2", "a = 1\nb = 3"),
    "newline added": ("a = 1", "a = 1\nb = 2\n"),
    "newline removed": ("a = 1\nb = 2\n", "a = 1\nb = 2"),
    "unicode": ("x = 'é'\n", "x = 'ü'\ny = '→'\n"),
    "several hunks": (BEFORE, AFTER.replace("line 1\n", "line one\n").replace("line 20\n", "line twenty\n")),
}


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    return root


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tool", ["git", "patch"])
def test_the_diff_applies_exactly(tmp_path: Path, case: str, tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed")
    before, after = CASES[case]
    rel = "srt/models/m.py"
    root = tree(tmp_path / "tree", {rel: before})
    patch_file = tmp_path / "change.diff"
    patch_file.write_bytes(unified_diffs([change(rel, before, after)]).encode("utf-8"))
    command = (
        ["git", "apply", "--whitespace=nowarn", str(patch_file)]
        if tool == "git"
        else ["patch", "-p1", "--quiet", "-i", str(patch_file)]
    )
    subprocess.run(command, cwd=root, check=True, capture_output=True)
    assert (root / rel).read_bytes() == after.encode("utf-8")


def test_several_files_apply_in_one_go(tmp_path: Path) -> None:
    changes = [change("a/x.py", "x = 1\n", "x = 2\n"), change("b/y.py", "y = 1", "y = 2\n")]
    root = tree(tmp_path / "tree", {c.rel: c.before for c in changes})
    patch_file = tmp_path / "change.diff"
    patch_file.write_bytes(unified_diffs(changes).encode("utf-8"))
    subprocess.run(["git", "apply", str(patch_file)], cwd=root, check=True, capture_output=True)
    assert [(root / c.rel).read_text() for c in changes] == ["x = 2\n", "y = 2\n"]


@pytest.mark.xfail(
    strict=True,
    reason="a bare CR line ending: difflib splits on it, git reads one line; the diff is refused (known limitation)",
)
def test_a_bare_cr_line_ending(tmp_path: Path) -> None:
    before, after = "a = 1\rb = 2\nc = 3\n", "a = 1\rb = 3\nc = 3\n"
    root = tree(tmp_path / "tree", {"m.py": before})
    patch_file = tmp_path / "change.diff"
    patch_file.write_bytes(unified_diff(change("m.py", before, after)).encode("utf-8"))
    subprocess.run(["git", "apply", str(patch_file)], cwd=root, check=True, capture_output=True)
    assert (root / "m.py").read_bytes() == after.encode("utf-8")
