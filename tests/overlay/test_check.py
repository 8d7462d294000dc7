"""overlay.check: owned, intact, current, readable; each problem names the path.

Pure tests on an overlay laid out by hand (a manifest, a bootstrap, one
served module under ``tree/sglang``), no build and no SGLang. Ownership
cases chown to uid 65534 and are skipped unless the session runs as root.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from patchcraft.base.errors import PatchcraftError
from patchcraft.overlay.bootstrap import MANIFEST
from patchcraft.overlay.check import (
    damage,
    problems,
    read_manifest,
    require_usable,
    stale,
    unreadable,
    untrusted,
    untrusted_directory,
    walk,
)

SERVED = "tree/sglang/srt/models/llama.py"
BOOTSTRAP = "sitecustomize.py"
NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")


@pytest.fixture(autouse=True)
def no_digest_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sha256 memo is never read or written: each test hashes what is on disk."""
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_overlay(root: Path) -> dict[str, Path]:
    """An intact overlay at ``root/overlay`` built from ``root/site/.../llama.py``; its paths by role."""
    root.mkdir(exist_ok=True)
    original = root / "site" / "sglang" / "srt" / "models" / "llama.py"
    original.parent.mkdir(parents=True)
    original.write_bytes(b"class LlamaForCausalLM: pass\n")
    overlay = root / "overlay"
    files = {BOOTSTRAP: b"# bootstrap\n", SERVED: b"class LlamaForCausalLM: patched = True\n"}
    for rel, data in files.items():
        (overlay / rel).parent.mkdir(parents=True, exist_ok=True)
        (overlay / rel).write_bytes(data)
    manifest = {
        "modules": {"sglang.srt.models.llama": {"original": str(original), "sha256": digest(original.read_bytes())}},
        "files": {rel: digest(data) for rel, data in files.items()},
    }
    (overlay / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    for path in [root, overlay, *overlay.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return {"overlay": overlay, "original": original, "served": overlay / SERVED, "bootstrap": overlay / BOOTSTRAP}


@pytest.fixture
def ov(tmp_path: Path) -> dict[str, Path]:
    return make_overlay(tmp_path / "root")


# -- the manifest and the walk ------------------------------------------------------------


def test_read_manifest(ov: dict[str, Path]) -> None:
    manifest = read_manifest(ov["overlay"])
    assert set(manifest["files"]) == {BOOTSTRAP, SERVED} and list(manifest["modules"]) == ["sglang.srt.models.llama"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "not an overlay ("),
        ("{not json", "not an overlay ("),
        ("[]", "not an overlay manifest"),
        ('{"modules": []}', "not an overlay manifest"),
    ],
)
def test_a_directory_that_is_no_overlay_is_one_line_naming_the_manifest(
    tmp_path: Path, text: str | None, message: str
) -> None:
    if text is not None:
        (tmp_path / MANIFEST).write_text(text, encoding="utf-8")
    with pytest.raises(PatchcraftError) as caught:
        read_manifest(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / MANIFEST}: {message}") and "\n" not in str(caught.value)


def test_walk_lists_itself_then_folders_before_files_and_never_follows_links(
    ov: dict[str, Path], tmp_path: Path
) -> None:
    overlay = ov["overlay"]
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (overlay / "link").symlink_to(outside)
    listing = walk(overlay)
    rels = [str(path.relative_to(overlay)) for path, _ in listing]
    assert rels == [
        ".",
        "tree",
        "tree/sglang",
        "tree/sglang/srt",
        "tree/sglang/srt/models",
        SERVED,
        "link",
        MANIFEST,
        BOOTSTRAP,
    ]
    assert stat.S_ISLNK(dict(listing)[overlay / "link"].st_mode)


# -- owned ------------------------------------------------------------------------------


def test_an_overlay_of_ours_is_trusted(ov: dict[str, Path]) -> None:
    assert untrusted(ov["overlay"]) is None


@pytest.mark.parametrize(("role", "mode"), [("served", 0o664), ("served", 0o646), ("bootstrap", 0o666)])
def test_a_file_group_or_others_can_write_is_named(ov: dict[str, Path], role: str, mode: int) -> None:
    ov[role].chmod(mode)
    assert untrusted(ov["overlay"]) == f"{ov[role]}: writable by group or others (mode {mode:o})"


def test_a_directory_group_can_write_is_named(ov: dict[str, Path]) -> None:
    models = ov["served"].parent
    models.chmod(0o775)
    assert untrusted(ov["overlay"]) == f"{models}: writable by group or others (mode 775)"


def test_a_sticky_directory_inside_the_overlay_is_still_named(ov: dict[str, Path]) -> None:
    models = ov["served"].parent
    models.chmod(0o1777)  # sticky protects only the parent: inside, anyone could add a module
    assert untrusted(ov["overlay"]) == f"{models}: writable by group or others (mode 1777)"


def test_the_parent_directory_counts_unless_sticky(ov: dict[str, Path]) -> None:
    parent = ov["overlay"].parent
    parent.chmod(0o777)
    assert untrusted(ov["overlay"]) == f"{parent}: writable by group or others (mode 777)"
    parent.chmod(0o1777)  # /tmp: others cannot replace what is ours
    assert untrusted(ov["overlay"]) is None


@as_root
def test_a_file_owned_by_another_user_is_named(ov: dict[str, Path]) -> None:
    os.chown(ov["served"], NOBODY, NOBODY)
    assert (
        untrusted(ov["overlay"])
        == f"{ov['served']}: owned by uid {NOBODY}, not by this user (uid {os.getuid()}) or root"
    )
    assert untrusted(ov["overlay"], owners=[os.getuid(), NOBODY]) is None


@as_root
def test_a_directory_owned_by_another_user_is_named(ov: dict[str, Path]) -> None:
    os.chown(ov["overlay"] / "tree", NOBODY, NOBODY)
    assert untrusted(ov["overlay"]).startswith(f"{ov['overlay'] / 'tree'}: owned by uid {NOBODY}")


def test_a_linked_overlay_checks_the_link_and_the_version_it_points_to(ov: dict[str, Path], tmp_path: Path) -> None:
    link = tmp_path / "root" / "current"
    link.symlink_to(ov["overlay"])
    assert untrusted(link) is None
    ov["served"].chmod(0o666)
    assert untrusted(link) == f"{ov['served']}: writable by group or others (mode 666)"


@as_root
def test_a_link_owned_by_another_user_is_named(ov: dict[str, Path], tmp_path: Path) -> None:
    link = tmp_path / "root" / "current"
    link.symlink_to(ov["overlay"])
    os.lchown(link, NOBODY, NOBODY)
    assert untrusted(link).startswith(f"{link}: owned by uid {NOBODY}")


def test_untrusted_directory(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert untrusted_directory(private) is None
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    assert untrusted_directory(shared) == f"{shared}: writable by group or others (mode 1777)"
    assert untrusted_directory(shared, sticky_ok=True) is None
    assert (
        untrusted_directory(tmp_path / "absent") == f"{tmp_path / 'absent'}: cannot be read (No such file or directory)"
    )


# -- intact -----------------------------------------------------------------------------


def test_an_intact_overlay_has_no_damage(ov: dict[str, Path]) -> None:
    assert damage(ov["overlay"]) == []


def test_a_same_size_edit_is_named(ov: dict[str, Path]) -> None:
    data = ov["served"].read_bytes()
    ov["served"].write_bytes(data.replace(b"True", b"Fals"))
    assert damage(ov["overlay"]) == [
        f"{ov['served']}: changed since the overlay was built (its sha256 is not the manifest's)"
    ]


def test_a_missing_file_is_named(ov: dict[str, Path]) -> None:
    ov["bootstrap"].unlink()
    assert damage(ov["overlay"]) == [f"{ov['bootstrap']}: missing from the overlay"]


def test_an_extra_file_is_named(ov: dict[str, Path]) -> None:
    extra = ov["served"].parent / "planted.py"
    extra.write_bytes(b"import os\n")
    assert damage(ov["overlay"]) == [f"{extra}: not part of the overlay (the manifest does not list it)"]


def test_a_symlinked_entry_is_not_the_file_it_replaces(ov: dict[str, Path], tmp_path: Path) -> None:
    """A link to identical bytes: the listed file is missing (not a regular file), the link not listed."""
    copy = tmp_path / "elsewhere.py"
    copy.write_bytes(ov["served"].read_bytes())
    ov["served"].unlink()
    ov["served"].symlink_to(copy)
    assert damage(ov["overlay"]) == [f"{ov['served']}: missing from the overlay"]
    planted = ov["overlay"] / "extra.pth"
    planted.symlink_to(copy)
    assert f"{planted}: not part of the overlay (the manifest does not list it)" in damage(ov["overlay"])


def test_bytecode_python_writes_under_the_tree_is_allowed_elsewhere_not(ov: dict[str, Path]) -> None:
    cache = ov["served"].parent / "__pycache__"
    cache.mkdir()
    (cache / "llama.cpython-312.pyc").write_bytes(b"pyc")
    assert damage(ov["overlay"]) == []
    top = ov["overlay"] / "__pycache__"
    top.mkdir()
    (top / "sitecustomize.cpython-312.pyc").write_bytes(b"pyc")
    (cache / "notes.txt").write_bytes(b"x")
    assert damage(ov["overlay"]) == [  # in walk order: __pycache__ sorts before tree
        f"{top / 'sitecustomize.cpython-312.pyc'}: not part of the overlay (the manifest does not list it)",
        f"{cache / 'notes.txt'}: not part of the overlay (the manifest does not list it)",
    ]


def test_a_manifest_without_files_is_an_older_overlay(ov: dict[str, Path]) -> None:
    manifest = json.loads((ov["overlay"] / MANIFEST).read_text())
    del manifest["files"]
    (ov["overlay"] / MANIFEST).write_text(json.dumps(manifest))
    assert damage(ov["overlay"]) == [f"{ov['overlay'] / MANIFEST}: lists no files (built by an older patchcraft)"]


# -- current ----------------------------------------------------------------------------


def test_an_unchanged_install_is_current(ov: dict[str, Path]) -> None:
    assert stale(ov["overlay"]) == []


def test_a_changed_installed_file_is_named(ov: dict[str, Path]) -> None:
    ov["original"].write_bytes(b"class LlamaForCausalLM: upgraded = 1\n")
    assert stale(ov["overlay"]) == [f"{ov['original']} (sglang.srt.models.llama) changed since the overlay was built"]


def test_a_removed_installed_file_is_named(ov: dict[str, Path]) -> None:
    ov["original"].unlink()
    assert stale(ov["overlay"]) == [
        f"{ov['original']} (sglang.srt.models.llama): unreadable (No such file or directory)"
    ]


# -- all of it, in order ----------------------------------------------------------------


def test_problems_of_an_intact_overlay(ov: dict[str, Path]) -> None:
    assert problems(ov["overlay"]) == []
    require_usable(ov["overlay"])


def test_problems_owner_first_then_damage_then_staleness(ov: dict[str, Path]) -> None:
    ov["original"].write_bytes(b"changed = 1\n")
    assert problems(ov["overlay"]) == stale(ov["overlay"]) != []
    ov["bootstrap"].write_bytes(b"# planted\n")
    assert problems(ov["overlay"]) == [
        f"{ov['bootstrap']}: changed since the overlay was built (its sha256 is not the manifest's)"
    ]
    ov["bootstrap"].chmod(0o666)
    assert problems(ov["overlay"]) == [f"{ov['bootstrap']}: writable by group or others (mode 666)"]


def test_problems_of_a_missing_directory(tmp_path: Path) -> None:
    assert problems(tmp_path / "absent") == [f"{tmp_path / 'absent'}: cannot be read (No such file or directory)"]


def test_require_usable_is_one_line_with_how_to_rebuild(ov: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(PatchcraftError, match="no such overlay"):
        require_usable(tmp_path / "absent")
    ov["served"].unlink()
    with pytest.raises(PatchcraftError) as caught:
        require_usable(ov["overlay"])
    overlay = ov["overlay"]
    assert (
        str(caught.value)
        == f"{overlay}: {ov['served']}: missing from the overlay: rebuild it with `patchcraft overlay build --out {overlay}`"
    )


# -- readable ---------------------------------------------------------------------------


def test_a_world_readable_overlay_is_readable(ov: dict[str, Path]) -> None:
    assert unreadable(ov["overlay"]) == []


def test_what_others_cannot_read_is_named(ov: dict[str, Path]) -> None:
    ov["served"].chmod(0o640)
    ov["overlay"].joinpath("tree").chmod(0o750)
    assert unreadable(ov["overlay"]) == [
        f"{ov['overlay'] / 'tree'}: not readable by others (mode 750)",
        f"{ov['served']}: not readable by others (mode 640)",
    ]


def test_a_directory_others_can_read_but_not_enter_is_named(ov: dict[str, Path]) -> None:
    ov["served"].parent.chmod(0o744)
    assert unreadable(ov["overlay"]) == [f"{ov['served'].parent}: not readable by others (mode 744)"]


def test_a_named_user_who_cannot_enter_a_parent_is_told_so(ov: dict[str, Path]) -> None:
    private = ov["overlay"].parent
    private.chmod(0o700)
    if os.stat(private).st_uid == NOBODY:
        pytest.skip("this session runs as nobody")
    problems_for_nobody = unreadable(ov["overlay"], user="nobody")
    assert len(problems_for_nobody) == 1
    first_closed = next(p for p in reversed(list(ov["overlay"].resolve().parents)) if not os.stat(p).st_mode & 0o001)
    assert problems_for_nobody == [f"{first_closed}: nobody cannot enter it"]
    assert unreadable(ov["overlay"], user="root") == []


@pytest.fixture
def open_ov() -> Iterator[dict[str, Path]]:
    """An overlay in a world-enterable directory of /tmp (pytest's tmp_path is closed to others)."""
    root = Path(tempfile.mkdtemp(prefix="patchcraft-check-test-"))
    try:
        root.chmod(0o755)
        for parent in root.resolve().parents:
            if not os.stat(parent).st_mode & 0o001:
                pytest.skip(f"{parent} is closed to others")
        yield make_overlay(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_named_user_reads_what_others_may_read(open_ov: dict[str, Path]) -> None:
    assert unreadable(open_ov["overlay"], user="nobody") == []
    open_ov["served"].chmod(0o640)
    assert unreadable(open_ov["overlay"], user="nobody") == [f"{open_ov['served']}: not readable by nobody (mode 640)"]


@as_root
def test_a_named_user_reads_by_owner_bits_when_the_file_is_theirs(open_ov: dict[str, Path]) -> None:
    ov = open_ov
    ov["served"].chmod(0o600)
    assert unreadable(ov["overlay"], user="nobody") == [f"{ov['served']}: not readable by nobody (mode 600)"]
    os.chown(ov["served"], NOBODY, NOBODY)
    assert unreadable(ov["overlay"], user="nobody") == []
    assert unreadable(ov["overlay"], user=str(NOBODY)) == []


def test_an_unknown_user_is_one_line(ov: dict[str, Path]) -> None:
    with pytest.raises(PatchcraftError, match="--user no-such-user-here: no such user"):
        unreadable(ov["overlay"], user="no-such-user-here")
