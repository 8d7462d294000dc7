"""Every minor SGLang release through the real CLI: apply, verify, smoke, apply --check, revert.

One release per minor version (patchcraft.base.releases.MINOR_RELEASES, 0.4.6 to
0.5.23), each swept once by tools.sweep.sweep_release, the function
scripts/sweep.py and the new-release workflow run:

- no model row ends in ``error`` (apply, verify, check, revert);
- every model apply patched is verified by verify (and compiles, idempotent);
- ``apply --check`` after apply finds nothing to change;
- revert leaves every file byte-identical to the release;
- smoke: no ``fail``, and no ``error`` but the named limitations
  (tools.sweep.LIMITATIONS, each with its reason);
- docs/coverage.md's release-history row is what the sweep finds.

verify's exit code is recorded, not asserted: it is 1 while any model is
unsupported, and how unsupported models count is being changed.

Then the checks themselves, on a small release broken on purpose: each
fails when it should. And the release lists and the index query.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.releases import (
    ALL_RELEASES,
    MATRIX,
    MINOR_RELEASES,
    BETWEEN,
    newest_release,
    parse_index_versions,
    version_key,
)
from tools.sweep import (
    HISTORY_COLUMNS,
    LIMITATIONS,
    ReleaseResult,
    history_cells,
    history_row,
    history_rows,
    sweep_release,
)

from conftest import release_package

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "coverage.md"

#: Smoke failures other engineers are fixing right now. Strict: once the smoke passes, the
#: xfail turns red; then delete the entry (and rewrite the release's docs row).
SMOKE_IN_FLIGHT: dict[str, str] = {}  # none today (0.5.12 gemma4 and 0.5.21 stand-ins: fixed)

#: Releases whose sweep runs the CPU harness (smoke) in the fast tier: the oldest release with
#: patched models, a middle one, and the newest; with 0.5.15 they hold every capture shape
#: (L1, L2, Gemma, L3, the packer, the layer-boundary era). Every other release: the full tier.
FAST_SMOKE = ("0.4.9", "0.5.10", "0.5.15", "0.5.23")

#: At least this many model classes pass the harness (a guard against a run that ran nothing).
PATCHED_CLASSES_RAN = {"0.4.9": 5, "0.5.10": 20, "0.5.15": 28, "0.5.23": 35}

_SWEPT: dict[tuple[str, bool], ReleaseResult] = {}


def swept(version: str, smoke: bool) -> ReleaseResult:
    """One sweep per release and kind per process, shared by the tests below (xdist keeps a release's on one worker).

    ``smoke=False``: the static sweep (``apply --no-smoke``, verify, ``apply
    --check``, revert). ``smoke=True`` adds smoke and ``smoke --compile`` on
    the patched tree, and apply leaves the harness to them (it would run the
    same scenarios on the same code a second time).
    """
    key = (version, smoke)
    if key not in _SWEPT:
        full = _SWEPT.get((version, True))
        _SWEPT[key] = full or sweep_release(version, pristine=release_package(version), smoke=smoke, prove=False)
    return _SWEPT[key]


def _tier(version: str, fast: bool, smoke: bool = True):
    """``version`` as a parameter of its tier (``slow`` unless ``fast``), its tests kept on one xdist worker."""
    marks = [pytest.mark.xdist_group(f"release-{version}")]
    if not fast:
        marks.append(pytest.mark.slow)
    if smoke and version in SMOKE_IN_FLIGHT:
        marks.append(pytest.mark.xfail(strict=True, reason=SMOKE_IN_FLIGHT[version]))
    return pytest.param(version, marks=marks, id=version)


@pytest.mark.parametrize("version", [_tier(v, fast=True, smoke=False) for v in MINOR_RELEASES])
def test_release(version: str) -> None:
    """Statically, every release: apply, verify, apply --check and a byte-identical revert."""
    result = swept(version, smoke=False)
    assert not [line for line in result.problems() if not line.startswith("smoke: ")], "\n".join(result.problems())
    assert not result.error_rows
    assert not result.unverified
    assert result.check_clean
    assert result.revert_identical, result.revert_differs
    assert sum(result.after_apply.values()) >= 1
    # A bare verify after apply exits 0 (unsupported models warn unless served, not-applicable never fails).
    assert result.verify.code == 0, "\n".join(result.problems())
    # What apply found is what docs/coverage.md records: a model class the engine silently stops
    # finding (no error row, nothing to verify) changes the rows and the counts after apply.
    documented = history_rows(PAGE.read_text(encoding="utf-8")).get(version)
    assert documented is not None, f"docs/coverage.md has no row for {version}"
    cells = [c.strip() for c in documented.strip("|").split(" | ")]
    static = dict(zip(HISTORY_COLUMNS, history_cells(result)))
    for column in ("rows", "after apply", "verify exit", "`apply --check` after apply", "revert byte-identical"):
        assert static[column] == cells[HISTORY_COLUMNS.index(column)], (
            f"{version}: {column} is {static[column]!r}, docs/coverage.md says {cells[HISTORY_COLUMNS.index(column)]!r} "
            f"(rewrite: python scripts/sweep.py {version} --write-docs, after checking why)"
        )


@pytest.mark.parametrize("version", [_tier(v, fast=v in FAST_SMOKE) for v in MINOR_RELEASES])
def test_release_smoke(version: str) -> None:
    """The CPU harness on every patched model class, and each patched forward under torch.compile(fullgraph=True)."""
    pytest.importorskip("torch")
    result = swept(version, smoke=True)
    counts = result.smoke_counts
    assert counts is not None
    assert counts["fail"] == 0 and counts["error"] == 0, "\n".join(
        f"{m}: {s}: {msg}" for m, s, msg in result.smoke_problems
    )
    assert not result.smoke_problems
    # Guard against a vacuous pass: the harness really ran model classes where the release has many.
    assert counts["pass"] >= PATCHED_CLASSES_RAN.get(version, 0), counts
    # SGLang compiles the forward: no graph break may come from the patch.
    assert result.compiled is not None and result.compiled.code == 0, "\n".join(
        f"{m}: {s}: {msg}" for m, s, msg in result.compile_problems
    )


@pytest.mark.parametrize("version", [_tier(v, fast=v in FAST_SMOKE) for v in MINOR_RELEASES])
def test_history_row_is_current(version: str) -> None:
    """docs/coverage.md says what the sweep finds (rewrite: python scripts/sweep.py VERSION --write-docs)."""
    pytest.importorskip("torch")  # the docs rows carry smoke counts
    result = swept(version, smoke=True)
    rows = history_rows(PAGE.read_text(encoding="utf-8"))
    assert rows.get(version) == history_row(result), (
        f"docs/coverage.md row of {version} is stale: run python scripts/sweep.py {version} --write-docs"
    )


def test_history_lists_every_release() -> None:
    """One row per release from 0.4.6 to the newest listed, posts included, oldest first."""
    versions = list(history_rows(PAGE.read_text(encoding="utf-8")))
    assert versions == sorted(versions, key=version_key)
    assert set(ALL_RELEASES) <= set(versions)
    assert versions[0] == ALL_RELEASES[0]


def stale_limitations(limitations) -> list[str]:
    """The named limitations that no longer cover a smoke error of a minor release they name."""
    stale = []
    for limitation in limitations:
        covered = [v for v in MINOR_RELEASES if limitation.covers(v, limitation.model)]
        if not covered or not limitation.reason:
            stale.append(f"{limitation.model}: names no minor release, or no reason")
        elif not any(limitation.model in (m for m, _ in swept(v, smoke=True).smoke_limited) for v in covered):
            stale.append(
                f"{limitation.model} is no longer a smoke error in {', '.join(covered)}: remove the limitation"
            )
    return stale


def test_each_limitation_still_limits() -> None:
    """A named limitation covers a smoke error of some minor release it names; else delete it (none is named today)."""
    assert stale_limitations(LIMITATIONS) == []


@pytest.mark.xdist_group("release-0.5.10")  # it reads 0.5.10's harness sweep: the one test_release_smoke[0.5.10] runs
def test_a_limitation_that_limits_nothing_is_named() -> None:
    from tools.sweep import Limitation

    planted = Limitation("llama.LlamaForCausalLM", "0.5.10", "0.5.10", "does not run under the stand-ins", "why")
    assert stale_limitations([planted]) == [
        "llama.LlamaForCausalLM is no longer a smoke error in 0.5.10: remove the limitation"
    ]
    assert stale_limitations([Limitation("m.M", "0.3.0", "0.3.0", "x", "why")]) == [
        "m.M: names no minor release, or no reason"
    ]


# -- each check fails on a broken release ---------------------------------------------------

SMALL = "0.4.9"  # six patched models, a few seconds a sweep


def _broken_copy(tmp_path: Path, edit) -> Path:
    import shutil

    package = tmp_path / "pristine" / "sglang"
    shutil.copytree(release_package(SMALL), package)
    edit(package / "srt" / "models" / "llama.py")
    return package


def test_an_error_row_fails_the_release(tmp_path: Path) -> None:
    """LlamaModel defined twice (an ambiguous anchor): an error row, named with the class."""

    def twice(path: Path) -> None:
        text = path.read_text(encoding="utf-8")
        start = text.index("class LlamaModel(")
        end = text.index("\nclass ", start + 1)
        path.write_text(text[:end] + "\n\n" + text[start:end] + text[end:], encoding="utf-8")

    result = sweep_release(SMALL, pristine=_broken_copy(tmp_path, twice), smoke=False)
    assert result.error_rows and not result.ok
    assert any("LlamaModel" in line and "error" in line for line in result.problems()), result.problems()


def test_revert_not_byte_identical_fails_the_release() -> None:
    def touch(package: Path) -> None:
        path = package / "srt" / "models" / "llama.py"
        path.write_bytes(path.read_bytes() + b"\n")

    result = sweep_release(SMALL, pristine=release_package(SMALL), smoke=False, after={"check": touch})
    assert not result.revert_identical and result.revert_differs == ["srt/models/llama.py"]
    assert any(line.startswith("revert:") and "llama.py" in line for line in result.problems())


def test_a_stray_file_fails_the_release() -> None:
    def stray(package: Path) -> None:
        (package / "srt" / "models" / "llama.py.orig").write_text("", encoding="utf-8")

    result = sweep_release(SMALL, pristine=release_package(SMALL), smoke=False, after={"apply": stray})
    assert result.revert_differs == ["srt/models/llama.py.orig"] and not result.ok


def test_the_comparison_sees_every_kind_of_difference(tmp_path: Path) -> None:
    """One byte flipped in a file of the same size, a file on one side only, and a link the other side lacks."""
    from tools.sweep import differing_files

    one, other = tmp_path / "one", tmp_path / "other"
    for root in (one, other):
        (root / "srt" / "models").mkdir(parents=True)
        (root / "srt" / "models" / "a.py").write_bytes(b"x = 1\n")
        (root / "srt" / "same.py").write_bytes(b"same\n")
    assert differing_files(one, other) == []
    (other / "srt" / "models" / "a.py").write_bytes(b"x = 2\n")
    (other / "srt" / "models" / "__pycache__").mkdir()
    (other / "srt" / "models" / "__pycache__" / "a.pyc").write_bytes(b"")
    (other / "linked").symlink_to(one / "srt")
    assert differing_files(one, other) == ["linked", "srt/models/__pycache__/a.pyc", "srt/models/a.py"]
    (one / "linked").symlink_to(one / "srt")  # a link to a directory is never followed, and never the same file
    assert differing_files(one, other) == ["srt/models/__pycache__/a.pyc", "linked", "srt/models/a.py"]


def test_an_unpatched_file_after_apply_fails_verify_and_check() -> None:
    """llama.py put back to the release's bytes after apply: verify and apply --check both say so."""
    pristine = release_package(SMALL)

    def undo(package: Path) -> None:
        rel = Path("srt") / "models" / "llama.py"
        (package / rel).write_bytes((pristine / rel).read_bytes())

    result = sweep_release(SMALL, pristine=pristine, smoke=False, after={"apply": undo})
    assert any("llama.LlamaForCausalLM" in what for what in result.unverified), result.unverified
    assert not result.check_clean and not result.ok
    assert any(line.startswith("apply --check") and "llama.LlamaForCausalLM" in line for line in result.problems())


def test_a_smoke_error_fails_the_release() -> None:
    """LlamaModel.forward made to raise after verify: the smoke row of llama is an error, and named."""
    pytest.importorskip("torch")

    def breaks(package: Path) -> None:
        path = package / "srt" / "models" / "llama.py"
        text = path.read_text(encoding="utf-8")
        anchor = "        aux_hidden_states = []\n"
        assert text.count(anchor) == 1
        path.write_text(
            text.replace(anchor, anchor + '        raise RuntimeError("broken on purpose")\n'), encoding="utf-8"
        )

    result = sweep_release(SMALL, pristine=release_package(SMALL), after={"verify": breaks})
    assert any(
        model == "llama.LlamaForCausalLM" and "broken on purpose" in message
        for model, _, message in result.smoke_problems
    ), result.smoke_problems
    assert not result.ok and any(line.startswith("smoke: llama.LlamaForCausalLM: error") for line in result.problems())
    # the same row under a named limitation is counted as limited, not as a problem
    from tools import sweep

    named = sweep.Limitation("llama.LlamaForCausalLM", SMALL, SMALL, "broken on purpose", "on purpose")
    original = sweep.LIMITATIONS
    sweep.LIMITATIONS = (named,)
    try:
        assert ("llama.LlamaForCausalLM", "on purpose") in result.smoke_limited
        assert not any(model == "llama.LlamaForCausalLM" for model, _, _ in result.smoke_problems)
        assert result.smoke_counts["limited"] >= 1
    finally:
        sweep.LIMITATIONS = original


def test_a_limitation_covers_only_its_error() -> None:
    """Never a ``fail``, never another message, never another model or release."""
    from tools.sweep import Limitation, limitation
    from tools import sweep

    original = sweep.LIMITATIONS
    sweep.LIMITATIONS = (Limitation("m.M", "0.5.22", None, "does not run under the stand-ins", "why"),)
    try:
        row = {"model": "m.M", "status": "error", "message": "init: the original file does not run under the stand-ins"}
        assert limitation("0.5.22", row) and limitation("0.5.30", row)
        assert limitation("0.5.21", row) is None
        assert limitation("0.5.22", {**row, "status": "fail"}) is None
        assert limitation("0.5.22", {**row, "message": "capture: aux[0] is not the embedding"}) is None
        assert limitation("0.5.22", {**row, "model": "m.N"}) is None
    finally:
        sweep.LIMITATIONS = original


# -- the release lists and the index -------------------------------------------------------


def test_release_lists() -> None:
    assert len(ALL_RELEASES) == 62 and len(set(ALL_RELEASES)) == 62
    assert list(ALL_RELEASES) == sorted(ALL_RELEASES, key=version_key)
    assert ALL_RELEASES[0] == "0.4.6" and ALL_RELEASES[-1] == "0.5.23"
    assert MINOR_RELEASES[:3] == ("0.4.6", "0.4.7", "0.4.8") and MINOR_RELEASES[-1] == "0.5.23"
    assert all(".post" not in v for v in MINOR_RELEASES) and len(MINOR_RELEASES) == 28
    assert {v.rsplit(".post", 1)[0] for v in ALL_RELEASES} == set(MINOR_RELEASES)
    assert set(MATRIX) | set(BETWEEN) <= set(MINOR_RELEASES)


def test_version_key() -> None:
    assert sorted(["0.5.10", "0.5.9", "0.5.10.post1", "0.4.10", "0.5.1.post3", "0.5.1"], key=version_key) == [
        "0.4.10", "0.5.1", "0.5.1.post3", "0.5.9", "0.5.10", "0.5.10.post1",
    ]  # fmt: skip
    with pytest.raises(ValueError):
        version_key("0.5.10rc1")


def test_parse_index_versions() -> None:
    text = "sglang (0.5.24)\nAvailable versions: 0.5.24, 0.5.24rc0, 0.5.23, 0.5.9, 0.5.10.post1\n"
    assert parse_index_versions(text) == ["0.5.24", "0.5.23", "0.5.10.post1", "0.5.9"]
    assert parse_index_versions("ERROR: nothing") == []


def _fake_pip(tmp_path: Path, stdout: str, code: int = 0) -> tuple[str, ...]:
    script = tmp_path / "pip.py"
    script.write_text(
        f"import sys\nsys.stdout.write({stdout!r})\nsys.stderr.write('ERROR: no index\\n')\nsys.exit({code})\n"
    )
    return (sys.executable, str(script))


def test_newest_release_parses_pip(tmp_path: Path) -> None:
    assert (
        newest_release(pip=_fake_pip(tmp_path, "sglang (0.5.30)\nAvailable versions: 0.5.29, 0.5.30, 0.5.30.post1\n"))
        == "0.5.30.post1"
    )


@pytest.mark.parametrize(
    ("stdout", "code", "needle"),
    [("", 1, r"\(exit 1\): ERROR: no index"), ("no versions here\n", 0, "no release version")],
)
def test_newest_release_fails_cleanly(tmp_path: Path, stdout: str, code: int, needle: str) -> None:
    with pytest.raises(PatchcraftError, match=needle):
        newest_release(pip=_fake_pip(tmp_path, stdout, code))
    with pytest.raises(PatchcraftError, match="cannot run pip"):
        newest_release(pip=(str(tmp_path / "no-such-pip"),))
