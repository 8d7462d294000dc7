"""base.sources: lossless reading and writing, all files or none.

Pure tests on files written here. The session may run as root, for whom
permission bits do not stop a write: the failure cases make the operation
itself fail (``os.replace``, ``tempfile.mkstemp``, ``os.access``,
``Path.read_bytes`` monkeypatched) rather than rely on a chmod.
"""

from __future__ import annotations

import codecs
import os
import stat
import tempfile
from pathlib import Path

import pytest

from patchcraft.base import sources
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.sources import (
    Source,
    check_compiles,
    check_writable,
    declared_encoding,
    decode,
    drop_stale_bytecode,
    is_temp_name,
    prepare,
    read_source,
    remove_stale_temp_files,
    stale_temp_files,
    write_all,
)


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def temp_files(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.endswith(sources.TEMP_SUFFIX)]


# -- the declared encoding --------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"x = 1\n", "utf-8"),
        (b"# -*- coding: latin-1 -*-\nx = 1\n", "iso8859-1"),
        (b"#!/usr/bin/env python\n# vim: set fileencoding=cp1252 :\n", "cp1252"),
        (b"\n\n# coding: latin-1\n", "utf-8"),  # only the first two lines count
        (b"x = 1  # coding: latin-1\n", "utf-8"),  # a cookie is a comment line of its own
        (b"# coding: no-such-codec\n", "no-such-codec"),  # unknown: the name as written (decode refuses it)
    ],
)
def test_declared_encoding(data: bytes, expected: str) -> None:
    assert declared_encoding(data) == expected


# -- decoding, losslessly -----------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"x = 1\n",
        b"x = 1\r\ny = 2\r\n",  # CRLF
        b"x = 1\r\ny = 2\nz = 3\r",  # mixed endings, a bare CR last
        b"x = 1",  # no final newline
        codecs.BOM_UTF8 + b"x = '\xc3\xa9'\n",  # BOM
        b"# -*- coding: latin-1 -*-\nx = '\xe9'\n",
        "x = 'ü'\n".encode("utf-8"),
    ],
)
def test_decode_keeps_every_byte(tmp_path: Path, data: bytes) -> None:
    source = decode(tmp_path / "m.py", data)
    assert source.raw == data
    assert source.encode() == data
    assert source.encode(source.text) == data


def test_decode_keeps_line_endings_in_the_text(tmp_path: Path) -> None:
    assert decode(tmp_path / "m.py", b"a = 1\r\nb = 2\nc = 3\r").text == "a = 1\r\nb = 2\nc = 3\r"


def test_a_bom_is_remembered_not_kept_in_the_text(tmp_path: Path) -> None:
    source = decode(tmp_path / "m.py", codecs.BOM_UTF8 + b"x = 1\n")
    assert source.bom and source.text == "x = 1\n" and source.encoding == "utf-8"
    assert source.encode("y = 2\n") == codecs.BOM_UTF8 + b"y = 2\n"


def test_a_declared_encoding_is_used_both_ways(tmp_path: Path) -> None:
    source = decode(tmp_path / "m.py", b"# coding: latin-1\nx = '\xe9'\n")
    assert source.encoding == "iso8859-1" and "é" in source.text and not source.bom
    assert source.encode("# coding: latin-1\ny = '\xe9'\n") == b"# coding: latin-1\ny = '\xe9'\n"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "file is empty"),
        (b"  \n\t\n", "file is empty"),
        (b"x = 1\x00\n", "binary file (contains NUL bytes)"),
        (b"x = '\xff'\n", "not valid utf-8 text (byte 5)"),
        (b"# coding: no-such-codec\nx = 1\n", "unknown encoding 'no-such-codec' in coding cookie"),
        (codecs.BOM_UTF8 + b"# coding: latin-1\nx = 1\n", "UTF-8 byte-order mark but coding cookie says iso8859-1"),
    ],
)
def test_what_cannot_be_read_losslessly_is_refused_in_one_line(tmp_path: Path, data: bytes, message: str) -> None:
    with pytest.raises(PatchcraftError) as caught:
        decode(tmp_path / "m.py", data)
    text = str(caught.value)
    assert message in text and text.startswith(str(tmp_path / "m.py")) and "\n" not in text


# -- reading from disk --------------------------------------------------------------------


def test_read_source(tmp_path: Path) -> None:
    path = write(tmp_path / "m.py", b"x = 1\r\n")
    source = read_source(path)
    assert (source.path, source.text, source.raw) == (path, "x = 1\r\n", b"x = 1\r\n")


def test_a_missing_file_or_a_directory_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PatchcraftError, match="no such file"):
        read_source(tmp_path / "absent.py")
    with pytest.raises(PatchcraftError, match="is a directory, expected a Python file"):
        read_source(tmp_path)


def test_an_unreadable_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "m.py", b"x = 1\n")

    def denied(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(PatchcraftError) as caught:
        read_source(path)
    assert str(caught.value) == f"{path}: cannot read (Permission denied)"


# -- compiling before writing -----------------------------------------------------------


def test_check_compiles(tmp_path: Path) -> None:
    source = decode(tmp_path / "m.py", b"x = 1\n")
    check_compiles(source, "y = 2\n")
    with pytest.raises(PatchcraftError, match=r"patched result does not compile \(line 1: .*\); file left untouched"):
        check_compiles(source, "def f(:\n")
    # parses, does not compile: a repeated argument name
    with pytest.raises(PatchcraftError, match="patched result does not compile"):
        check_compiles(source, "def f(a, a):\n    pass\n")


def test_a_file_broken_before_patching_says_so(tmp_path: Path) -> None:
    source = decode(tmp_path / "m.py", b"def f(a, a):\n    pass\n")
    with pytest.raises(PatchcraftError, match="does not compile even before patching .*; nothing was changed"):
        check_compiles(source, "def f(a, a):\n    return 1\n")


# -- check_writable ---------------------------------------------------------------------


def test_check_writable_passes_a_writable_file(tmp_path: Path) -> None:
    check_writable(write(tmp_path / "m.py", b"x = 1\n"))


@pytest.mark.parametrize("denied", ["file", "directory"])
def test_check_writable_refuses_a_read_only_file_or_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, denied: str
) -> None:
    path = write(tmp_path / "pkg" / "m.py", b"x = 1\n")
    refused = path if denied == "file" else path.parent
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if Path(p) == refused and mode == os.W_OK else real_access(p, mode)
    )
    with pytest.raises(PatchcraftError) as caught:
        check_writable(path)
    assert str(caught.value) == f"{path}: read-only (file or directory); nothing was changed"


def test_check_writable_follows_a_symlink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = write(tmp_path / "store" / "m.py", b"x = 1\n")
    link = tmp_path / "tree" / "m.py"
    link.parent.mkdir()
    link.symlink_to(real)
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != real.parent)
    with pytest.raises(PatchcraftError, match="read-only"):
        check_writable(link)


# -- writing: every file or none --------------------------------------------------------


def test_write_all_writes_every_file_in_its_own_bytes(tmp_path: Path) -> None:
    crlf = write(tmp_path / "crlf.py", b"x = 1\r\n")
    bom = write(tmp_path / "bom.py", codecs.BOM_UTF8 + b"x = 1\n")
    latin = write(tmp_path / "latin.py", b"# coding: latin-1\nx = '\xe9'\n")
    write_all(
        [
            (read_source(crlf), "x = 2\r\n"),
            (read_source(bom), "x = 2\n"),
            (read_source(latin), "# coding: latin-1\nx = '\xe8'\n"),
        ]
    )
    assert crlf.read_bytes() == b"x = 2\r\n"
    assert bom.read_bytes() == codecs.BOM_UTF8 + b"x = 2\n"
    assert latin.read_bytes() == b"# coding: latin-1\nx = '\xe8'\n"
    assert temp_files(tmp_path) == []


def test_write_all_keeps_the_mode(tmp_path: Path) -> None:
    path = write(tmp_path / "m.py", b"x = 1\n")
    path.chmod(0o640)
    write_all([(read_source(path), "x = 2\n")])
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_write_all_keeps_the_owner_when_root(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("only root can give a file to another user")
    path = write(tmp_path / "m.py", b"x = 1\n")
    os.chown(path, 65534, 65534)
    write_all([(read_source(path), "x = 2\n")])
    assert (path.stat().st_uid, path.stat().st_gid) == (65534, 65534)


def test_a_symlink_stays_a_link_and_its_target_gets_the_text(tmp_path: Path) -> None:
    real = write(tmp_path / "store" / "m.py", b"x = 1\n")
    link = tmp_path / "tree" / "m.py"
    link.parent.mkdir()
    link.symlink_to(real)
    write_all([(read_source(link), "x = 2\n")])
    assert link.is_symlink() and real.read_bytes() == b"x = 2\n"
    assert temp_files(tmp_path / "tree") == [] and temp_files(tmp_path / "store") == []


def test_a_hard_link_is_broken_never_written_in_place(tmp_path: Path) -> None:
    shared = write(tmp_path / "cache" / "m.py", b"x = 1\n")
    path = tmp_path / "tree" / "m.py"
    path.parent.mkdir()
    os.link(shared, path)
    write_all([(read_source(path), "x = 2\n")])
    assert path.read_bytes() == b"x = 2\n" and shared.read_bytes() == b"x = 1\n"


def test_a_text_that_does_not_compile_writes_nothing(tmp_path: Path) -> None:
    first = write(tmp_path / "a.py", b"a = 1\n")
    second = write(tmp_path / "b.py", b"b = 1\n")
    with pytest.raises(PatchcraftError, match="b.py: patched result does not compile"):
        write_all([(read_source(first), "a = 2\n"), (read_source(second), "b = (\n")])
    assert first.read_bytes() == b"a = 1\n" and second.read_bytes() == b"b = 1\n"
    assert temp_files(tmp_path) == []


def test_a_failed_move_puts_back_the_files_already_moved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [write(tmp_path / f"{name}.py", f"{name} = 1\n".encode()) for name in "abc"]
    items = [(read_source(p), f"{p.stem} = 2\n") for p in paths]
    real_replace, calls = os.replace, []

    def replace(src: str, dst: str) -> None:
        calls.append(dst)
        if len(calls) == 2:  # the second file's move into place
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(sources.os, "replace", replace)
    with pytest.raises(PatchcraftError) as caught:
        write_all(items)
    assert (
        str(caught.value)
        == f"{paths[1]}: cannot write (No space left on device); the 1 file(s) already written were restored; nothing was changed"
    )
    assert [p.read_bytes() for p in paths] == [b"a = 1\n", b"b = 1\n", b"c = 1\n"]
    assert temp_files(tmp_path) == []


def test_a_file_changed_on_disk_meanwhile_is_not_overwritten(tmp_path: Path) -> None:
    first = write(tmp_path / "a.py", b"a = 1\n")
    second = write(tmp_path / "b.py", b"b = 1\n")
    items = [(read_source(first), "a = 2\n"), (read_source(second), "b = 2\n")]
    second.write_bytes(b"b = 'edited by the user'\n")
    with pytest.raises(PatchcraftError) as caught:
        write_all(items)
    assert "b.py: changed on disk while patchcraft ran; re-run to pick up the change" in str(caught.value)
    assert "already written were restored" in str(caught.value)
    assert first.read_bytes() == b"a = 1\n" and second.read_bytes() == b"b = 'edited by the user'\n"
    assert temp_files(tmp_path) == []


def test_a_temp_file_that_cannot_be_made_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = write(tmp_path / "a.py", b"a = 1\n")
    second = write(tmp_path / "sub" / "b.py", b"b = 1\n")
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        if kwargs.get("dir") == second.parent:
            raise PermissionError(13, "Permission denied")
        return real_mkstemp(*args, **kwargs)

    monkeypatch.setattr(sources.tempfile, "mkstemp", mkstemp)
    with pytest.raises(PatchcraftError) as caught:
        write_all([(read_source(first), "a = 2\n"), (read_source(second), "b = 2\n")])
    assert str(caught.value) == f"{second}: cannot write (Permission denied); nothing was changed"
    assert first.read_bytes() == b"a = 1\n" and second.read_bytes() == b"b = 1\n"
    assert temp_files(tmp_path) == [] and temp_files(second.parent) == []


def test_bytes_that_would_not_round_trip_are_refused(tmp_path: Path) -> None:
    # a utf-8-sig cookie without a BOM: decoding drops nothing, encoding would add a BOM
    path = write(tmp_path / "m.py", b"# coding: utf-8-sig\nx = 1\n")
    with pytest.raises(PatchcraftError, match="its utf-8-sig bytes would not survive a rewrite unchanged"):
        prepare(read_source(path), "# coding: utf-8-sig\nx = 2\n")
    assert temp_files(tmp_path) == []


def test_a_source_not_read_from_disk_is_written_without_the_changed_check(tmp_path: Path) -> None:
    path = write(tmp_path / "m.py", b"whatever = 0\n")
    write_all([(Source(path=path, text="x = 1\n"), "x = 2\n")])
    assert path.read_bytes() == b"x = 2\n"


def test_a_write_drops_the_stale_bytecode(tmp_path: Path) -> None:
    path = write(tmp_path / "m.py", b"x = 1\n")
    cache = tmp_path / "__pycache__"
    stale = [write(cache / name, b"old") for name in ("m.cpython-312.pyc", "m.cpython-313.opt-1.pyc", "m.pypy310.pyc")]
    other = write(cache / "mm.cpython-312.pyc", b"keep")
    write_all([(read_source(path), "x = 2\n")])
    assert not any(p.exists() for p in stale) and other.exists()


# -- bytecode and temporary files -------------------------------------------------------


def test_drop_stale_bytecode_escapes_glob_characters(tmp_path: Path) -> None:
    path = write(tmp_path / "m[1].py", b"x = 1\n")
    mine = write(tmp_path / "__pycache__" / "m[1].cpython-312.pyc", b"old")
    lookalike = write(tmp_path / "__pycache__" / "m1.cpython-312.pyc", b"keep")
    drop_stale_bytecode(path)
    assert not mine.exists() and lookalike.exists()


def test_drop_stale_bytecode_next_to_a_symlink_target(tmp_path: Path) -> None:
    real = write(tmp_path / "store" / "real.py", b"x = 1\n")
    link = tmp_path / "tree" / "m.py"
    link.parent.mkdir()
    link.symlink_to(real)
    at_link = write(tmp_path / "tree" / "__pycache__" / "m.cpython-312.pyc", b"old")
    at_target = write(tmp_path / "store" / "__pycache__" / "real.cpython-312.pyc", b"old")
    drop_stale_bytecode(link)
    assert not at_link.exists() and not at_target.exists()


def test_temp_names() -> None:
    assert is_temp_name(".llama.py.ab12_XYZ.patchcraft")
    for name in (
        "llama.py",
        ".llama.py.ab12.patchcraft",
        ".llama.py.ab12_XYZ.patchcraft.py",
        "llama.py.ab12_XYZ.patchcraft",
        ".llama.txt.ab12_XYZ.patchcraft",
    ):
        assert not is_temp_name(name), name


def test_a_real_temp_file_name_is_recognised(tmp_path: Path) -> None:
    fd, name = tempfile.mkstemp(prefix=".llama.py.", suffix=sources.TEMP_SUFFIX, dir=tmp_path)
    os.close(fd)
    assert is_temp_name(os.path.basename(name))


def test_stale_temp_files_are_found_and_removed(tmp_path: Path) -> None:
    leftovers = [write(tmp_path / f".m.py.{tag}.patchcraft", b"") for tag in ("aaaaaaaa", "bbbbbbbb")]
    keep = write(tmp_path / "m.py", b"x = 1\n")
    assert stale_temp_files(tmp_path) == leftovers
    assert stale_temp_files(tmp_path / "absent") == []
    assert remove_stale_temp_files([tmp_path, tmp_path / "absent"]) == 2
    assert not any(p.exists() for p in leftovers) and keep.exists()
