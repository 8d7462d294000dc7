"""The version of any tree: a version file, ``git describe`` for a checkout, else the closest tested release.

Synthetic trees shaped like the forks of issue 33: a setuptools-scm tree
without ``_version.py`` (a release copy with its version files removed),
one with a model file changed, one with a file patchcraft patched, a git
checkout (``git init`` and a tag in tmp). The shipped digest table is
checked against what tools/release_digests.py computes from the wheels:
two releases in the fast tier, every release in the full tier.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_release, run_cli

from patchcraft import MARKER
from patchcraft.base import tree_version
from patchcraft.base.fetch import cache_dir, find_wheel
from patchcraft.base.releases import ALL_RELEASES
from patchcraft.base.target import resolve_target
from patchcraft.base.tree_version import VersionLabel, VersionSource, identify

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None

ROOT = Path(__file__).resolve().parents[2]
#: A release whose compared files no other release shares (0.5.10 and 0.5.10.post1 ship the same ones).
RELEASE = "0.5.2"


def scm_tree(dest: Path, version: str = RELEASE) -> Path:
    """A copy of ``version`` with no version anywhere, as a setuptools-scm checkout built without ``_version.py``."""
    package = copy_release(version, dest)
    for name in tree_version.VERSION_FILES:
        (package / name).unlink(missing_ok=True)
    (package / "__init__.py").write_text("# no version here\n", encoding="utf-8")
    return package


def compared(package: Path) -> int:
    return len(tree_version.tree_digests(package)[0])


# -- the closest release -----------------------------------------------------------------------


def test_a_tree_without_a_version_is_its_release_all_files_identical(tmp_path: Path) -> None:
    package = scm_tree(tmp_path)
    found = identify(package)
    total = compared(package)
    assert total > 50
    assert (found.source, found.version, found.closest_release, found.tied_releases) == (
        VersionSource.CLOSEST,
        "unknown",
        RELEASE,
        (),
    )
    assert (found.identical_files, found.compared_files) == (total, total)
    assert found.label == f"unknown (closest to {RELEASE}: {total} of {total} model and runner files identical)"
    assert found.noun == "this tree"


def test_one_changed_model_file_is_one_fewer_identical(tmp_path: Path) -> None:
    package = scm_tree(tmp_path)
    llama = package / "srt" / "models" / "llama.py"
    llama.write_bytes(llama.read_bytes() + b"\n# a fork's change\n")
    found = identify(package)
    total = compared(package)
    assert (found.closest_release, found.identical_files, found.compared_files) == (RELEASE, total - 1, total)


def test_a_file_patched_by_patchcraft_is_left_out_not_counted_as_different(tmp_path: Path) -> None:
    package = scm_tree(tmp_path)
    llama = package / "srt" / "models" / "llama.py"
    llama.write_bytes(llama.read_bytes() + f"\n{MARKER} a patched file\n".encode())
    found = identify(package)
    total = compared(package)
    assert (found.identical_files, found.compared_files, found.patched_files) == (total, total, 1)
    assert "1 patched by patchcraft, not compared" in found.label


def test_releases_with_the_same_files_are_all_named(tmp_path: Path) -> None:
    """0.5.10.post1 changed none of the compared files: both releases are named, the older first."""
    found = identify(scm_tree(tmp_path, "0.5.10"))
    assert (found.closest_release, found.tied_releases) == ("0.5.10", ("0.5.10.post1",))
    assert "closest to 0.5.10 or 0.5.10.post1:" in found.label


def test_a_tree_sharing_no_file_with_any_release_is_unknown(tmp_path: Path) -> None:
    models = tmp_path / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    (models / "llama.py").write_text("from sglang.srt import x\n", encoding="utf-8")
    found = identify(tmp_path / "sglang")
    assert (found.source, found.label, found.compared_files) == (VersionSource.UNKNOWN, "unknown", 1)


def test_a_missing_or_damaged_table_matches_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = scm_tree(tmp_path)
    for text in ("", "{not json", json.dumps({"format": 999, "releases": ["0.5.2"], "files": {}})):
        table = tmp_path / "table.json"
        table.write_text(text, encoding="utf-8")
        monkeypatch.setattr(tree_version, "TABLE", table)
        monkeypatch.setattr(tree_version, "_table", None)
        assert identify(package).source is VersionSource.UNKNOWN


def test_a_version_file_wins_and_adds_nothing_to_json(tmp_path: Path) -> None:
    package = copy_release(RELEASE, tmp_path)
    found = identify(package)
    assert (found.source, found.version, found.label, found.noun, found.as_json()) == (
        VersionSource.FILE,
        RELEASE,
        RELEASE,
        "this release",
        {},
    )


# -- a checkout ----------------------------------------------------------------------------------


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    proc = subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, env={**env, "PATH": "/usr/bin:/bin"}
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A fork's checkout root: ``python/sglang`` without a version file, committed and tagged v9.9.9."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "fork"
    scm_tree(root / "python")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "fork")
    _git(root, "tag", "v9.9.9")
    return root


def test_a_checkout_is_described_by_git(checkout: Path) -> None:
    tree = resolve_target(str(checkout))
    assert (tree.version_info.source, tree.version) == (VersionSource.GIT, "v9.9.9 (git describe)")
    assert tree.version_info.as_json() == {"sglang_version_source": "git"}
    assert tree.noun == "this tree"
    llama = tree.models_dir / "llama.py"
    llama.write_bytes(llama.read_bytes() + b"\n")
    assert tree.version_info.version == "v9.9.9-dirty"
    _git(checkout, "commit", "-q", "-am", "one more")
    assert tree.version_info.version.startswith("v9.9.9-1-g")


def test_a_checkout_without_a_reachable_tag_is_its_commit_and_the_closest_release(
    checkout: Path,
) -> None:
    """A fork's branch whose release tags live on other branches: a bare commit says nothing, the closest release does."""
    _git(checkout, "tag", "-d", "v9.9.9")
    found = resolve_target(str(checkout)).version_info
    total = compared(checkout / "python" / "sglang")
    commit = _git(checkout, "rev-parse", "--short", "HEAD")
    assert (found.source, found.version, found.closest_release) == (VersionSource.GIT, commit, RELEASE)
    assert found.label == (
        f"{commit} (git describe; closest to {RELEASE}: {total} of {total} model and runner files identical)"
    )
    assert found.as_json()["sglang_version_source"] == "git" and found.as_json()["closest_release"] == RELEASE


def test_without_git_a_checkout_gets_the_closest_release(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(checkout / "no-git-here"))
    found = resolve_target(str(checkout)).version_info
    assert (found.source, found.closest_release) == (VersionSource.CLOSEST, RELEASE)


def test_a_repository_that_does_not_hold_the_tree_is_no_checkout(tmp_path: Path) -> None:
    """An install under a repository that tracks nothing of it (a home directory under git) is not described by it."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    _git(tmp_path, "init", "-q")
    (tmp_path / "README").write_text("dotfiles\n", encoding="utf-8")
    _git(tmp_path, "add", "README")
    _git(tmp_path, "commit", "-q", "-m", "dotfiles")
    package = scm_tree(tmp_path / "site-packages")
    assert identify(package).source is VersionSource.CLOSEST


# -- what the commands print -------------------------------------------------------------------


def test_text_and_json_name_the_closest_release(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    package = scm_tree(tmp_path)
    total = compared(package)
    code, out, err = run_cli(capsys, "apply", "--check", "--no-smoke", "--model", "llama", str(package))
    assert code == 1, err
    assert f"sglang unknown (closest to {RELEASE}: {total} of {total} model and runner files identical) at" in out + err
    code, out, err = run_cli(
        capsys, "apply", "--check", "--no-smoke", "--model", "llama", "--format", "json", str(package)
    )
    target = json.loads(out)["targets"][0]
    assert {key: target[key] for key in target if key not in ("root", "package")} == {
        "sglang_version": "unknown",
        "sglang_version_source": "closest",
        "closest_release": RELEASE,
        "tied_releases": [],
        "identical_files": total,
        "compared_files": total,
        "patched_files": 0,
    }
    section = (ROOT / "docs" / "json.md").read_text(encoding="utf-8").split("### A target without a version file")[1]
    documented = set(
        re.findall(
            r"`(\w+)`",
            "".join(line.split("|")[1] for line in section.split("### ")[0].splitlines() if line.startswith("| `")),
        )
    )
    assert documented == set(target) - {"root", "package", "sglang_version"}


def test_advice_on_a_tree_without_a_version_says_this_tree(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """0.5.10's runner resets the ids before graph capture: said of 'this tree' on a copy without its version."""
    code, out, err = run_cli(
        capsys,
        "explain",
        "--model",
        "llama",
        "--layer-ids",
        "1,2,3",
        "--num-layers",
        "8",
        str(scm_tree(tmp_path, "0.5.10")),
    )
    assert "this tree resets the ids" in out + err and "this release" not in out + err
    code, out, err = run_cli(
        capsys,
        "explain",
        "--model",
        "llama",
        "--layer-ids",
        "1,2,3",
        "--num-layers",
        "8",
        str(copy_release("0.5.10", tmp_path / "r")),
    )
    assert "this release resets the ids" in out + err


# -- the shipped table -------------------------------------------------------------------------


def _tool():
    sys.path.insert(0, str(ROOT))
    from tools import release_digests

    return release_digests


@pytest.mark.parametrize("version", ["0.4.9", "0.5.15"])
def test_the_shipped_table_holds_what_the_wheel_gives(version: str) -> None:
    tool = _tool()
    wheel = find_wheel(cache_dir() / "wheels", version) or tool.release_wheel(version)
    table = json.loads(tree_version.TABLE.read_text(encoding="utf-8"))
    assert tool.release_digests_from_table(table, version) == tool.wheel_digests(wheel)
    assert table["releases"] == list(ALL_RELEASES) and table["compared"] == list(tree_version.COMPARED)


@pytest.mark.slow
def test_the_shipped_table_is_what_the_tool_writes_for_every_release() -> None:
    tool = _tool()
    assert tree_version.TABLE.read_text(encoding="utf-8") == tool.render(tool.build_table(ALL_RELEASES))


def test_the_table_ships_in_the_wheel_and_holds_no_source() -> None:
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    assert "data/release_digests.json" in data["patchcraft.base"]
    text = tree_version.TABLE.read_text(encoding="utf-8")
    assert len(text) < 200_000 and "import" not in text and "def " not in text
    for values in json.loads(text)["files"].values():
        assert all(len(value) == tree_version.DIGEST_CHARS for value in values)


def test_apply_reports_the_version_it_read_before_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The files apply writes then hold patchcraft's marker: JSON still says what the run read (0 patched)."""
    package = scm_tree(tmp_path)
    total = compared(package)
    code, out, err = run_cli(capsys, "apply", "--no-smoke", "--model", "llama", "--format", "json", str(package))
    document = json.loads(out)
    assert code == 0 and document["summary"]["written"], err
    target = document["targets"][0]
    assert (target["identical_files"], target["patched_files"]) == (total, 0)
    assert identify(package).patched_files == len(document["summary"]["written"])


def test_a_version_label_keeps_its_record_through_pickle(tmp_path: Path) -> None:
    """The result cache pickles records: the label comes back with its record."""
    label = resolve_target(str(scm_tree(tmp_path))).version
    again = pickle.loads(pickle.dumps(label))
    assert (again, again.info) == (label, label.info) and isinstance(again, VersionLabel)


# -- a version file the files disagree with ------------------------------------------------------


def test_a_version_file_the_files_disagree_with_is_said_with_them(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """lsglang 1.6.5 (PyPI): its ``_version.py`` says 0.5.15.dev105+g46b087b58, its files are 0.5.22's.

    Text and JSON say both, and advice reasons from the files: ``this tree``, never ``this release``.
    """
    from fork_wheels import LSGLANG, unpacked_fork

    package = unpacked_fork(LSGLANG, tmp_path / "lsglang")
    found = identify(package)
    assert (found.source, found.version, found.noun) == (VersionSource.FILE, "0.5.15.dev105+g46b087b58", "this tree")
    assert found.label == (
        "0.5.15.dev105+g46b087b58 (version file; its files: closest to 0.5.22: 184 of 265 model and runner files "
        "identical; 17 are 0.5.15's)"
    )
    code, out, err = run_cli(capsys, "apply", "--check", "--no-smoke", "--format", "json", str(package))
    doc = json.loads(out)
    target = doc["targets"][0]
    assert {key: target[key] for key in target if key not in ("root", "package")} == {
        "sglang_version": "0.5.15.dev105+g46b087b58",
        "sglang_version_source": "file",
        "closest_release": "0.5.22",
        "tied_releases": [],
        "identical_files": 184,
        "compared_files": 265,
        "patched_files": 0,
        "named_release": "0.5.15",
        "named_identical_files": 17,
    }
    messages = " ".join(m["message"] for m in doc["models"])
    assert "in this tree" in messages and "this release" not in messages, messages
    section = (ROOT / "docs" / "json.md").read_text(encoding="utf-8").split("### A version file the files disagree")[1]
    documented = set(
        re.findall(
            r"`(\w+)`",
            "".join(line.split("|")[1] for line in section.split("### ")[0].splitlines() if line.startswith("| `")),
        )
    )
    assert documented == {"sglang_version_source", "named_release", "named_identical_files"}


@pytest.mark.parametrize(
    ("version", "closest", "tied", "agreed"),
    [
        ("0.5.10", "0.5.10", ("0.5.10.post1",), True),
        ("0.5.10.post1", "0.5.10", ("0.5.10.post1",), True),
        ("0.5.10.post2", "0.5.10", (), True),  # no tested release: its number's
        ("0.5.15.dev105+g46b087b58", "0.5.14", (), True),  # a build between releases: the last one before
        ("0.5.24", "0.5.23", (), True),  # newer than the table
        ("0.5.15.dev105+g46b087b58", "0.5.22", (), False),  # lsglang 1.6.5
        ("0.5.9", "0.5.10", (), False),  # a tested release whose files are another's
        ("0.0.0.dev0", "0.5.9", (), False),
    ],
)
def test_which_version_files_agree_with_the_files(version: str, closest: str, tied: tuple, agreed: bool) -> None:
    found = tree_version.TreeVersion("unknown", VersionSource.CLOSEST, closest_release=closest, tied_releases=tied)
    assert tree_version.agrees(version, found) is agreed
