"""From sed to patchcraft in one command: a hand-patched 0.5.10 becomes a proven, revertible install.

Every case starts from a pristine copy of the real release, checked as such
(the RECORD hashes of an install, the wheel's bytes for the release cache,
``git status`` for a checkout), then makes the field's sed edits
(tests/hand_fix.py) to the real ``deepseek_v2.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import copy_release, release_package, run_cli
from fork_wheels import SGLANG_KT, fork_wheel, install_fork
from hand_fix import FULL, PARTIAL, sed_fix
from patchcraft.base.fetch import cache_dir, download_wheel
from patchcraft.base.pristine import _read_record, record_digest

VERSION = "0.5.10"
MODEL = "srt/models/deepseek_v2.py"
#: Only the deepseek_v2 closure, and no tree rows: the cases are about one hand-fixed file.
SCOPE = ("--model", "deepseek_v2", "--no-runner", "--no-fusion-fix")
PP = "at PP > 1 later stages capture the wrong tensor (no first-stage gate)"
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the harness needs torch")
#: A hand edit in the forward the sed fix edits, but at no patchcraft edit site.
UNRELATED_IN_FORWARD = ("        if len(aux_hidden_states) == 0:\n", "        if not aux_hidden_states:\n")
#: One in another class of the same file.
UNRELATED_ELSEWHERE = ("        # for quark model load\n", "        # for quark model load (checked by hand)\n")


@pytest.fixture(autouse=True)
def _no_result_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")


def _wheel() -> Path:
    release_package(VERSION)  # the wheel lands in the cache on first use
    return download_wheel(VERSION, cache_dir() / "wheels")


def _mismatches(site: Path) -> list[str]:
    """The installed ``.py`` files whose bytes differ from their RECORD hash."""
    record = next(site.glob("sglang-*.dist-info/RECORD"))
    hashes = _read_record(record)
    return sorted(m for m, d in hashes.items() if m.endswith(".py") and record_digest((site / m).read_bytes()) != d)


@pytest.fixture(scope="module")
def venv_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """site-packages of a venv holding ``pip install --no-deps`` of the cached 0.5.10 wheel (RECORD present)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(_wheel())],
        check=True,
        env=env,
    )
    return next((venv / "lib").glob("python*/site-packages"))


@pytest.fixture
def installed(venv_site: Path):
    """The install, checked pristine against its RECORD; every file a test changed is put back after it."""
    assert _mismatches(venv_site) == []
    wheel = _wheel()  # now: a test may point the cache elsewhere
    yield venv_site
    with zipfile.ZipFile(wheel) as archive:
        for member in _mismatches(venv_site):
            (venv_site / member).write_bytes(archive.read(member))


@pytest.fixture
def cached_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of patchcraft's own holding the 0.5.10 wheel; ``--release 0.5.10`` unpacks it there."""
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    wheel = _wheel()
    (cache / "wheels" / wheel.name).symlink_to(wheel)
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(cache))
    from patchcraft.base.fetch import fetch

    package = fetch(VERSION)
    assert _differs_from_wheel(package) == []
    return package


def _differs_from_wheel(package: Path) -> list[str]:
    with zipfile.ZipFile(_wheel()) as archive:
        members = [n for n in archive.namelist() if n.startswith("sglang/") and n.endswith(".py")]
        return [n for n in members if (package.parent / n).read_bytes() != archive.read(n)]


def _git(cwd: Path, *args: str) -> str:
    identity = (
        "-c",
        "user.name=patchcraft tests",
        "-c",
        "user.email=tests@patchcraft.invalid",
        "-c",
        "commit.gpgsign=false",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    result = subprocess.run(["git", *identity, *args], cwd=cwd, capture_output=True, text=True, env=env)
    assert result.returncode == 0, f"git {' '.join(args)}: {result.stderr}"
    return result.stdout


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git checkout (``python/sglang`` layout) over the release's files, committed at HEAD."""
    root = tmp_path / "fork"
    copy_release(VERSION, root / "python")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "sglang 0.5.10")
    assert _git(root, "status", "--porcelain") == ""
    return root


# -- the three places a pristine text comes from, each with the full and the partial fix --


def _replace_then_revert(capsys, target: tuple[str, ...], model: Path, edits) -> None:
    """The user's path: sed, ``apply --replace-hand-edits`` (proven), verify, revert."""
    sed_fix(model, edits)
    hand = model.read_text(encoding="utf-8")
    code, out, err = run_cli(capsys, "apply", "--replace-hand-edits", "--diff", *SCOPE, *target)
    assert code == 0, err
    # The hand diff being dropped is shown: each hand hunk named at its site, its lines in the diff.
    assert "deepseek_v2.py: replaced" in err and "at the init edit site" in err, err
    assert "+        self.capture_embedding_for_eagle3 = False\n" in out, out
    code, out, _ = run_cli(capsys, "verify", "--format", "json", *SCOPE, *target)
    document = json.loads(out)
    assert code == 0 and {m["status"] for m in document["models"]} == {"already-patched"}, document["models"]
    states = {f["path"].rsplit("/", 1)[-1]: f["state"] for f in document["files"]}
    assert states["deepseek_v2.py"] == "patchcraft-patched", document["files"]
    assert model.read_text(encoding="utf-8") != hand
    code, _, err = run_cli(capsys, "revert", *SCOPE, *target)
    assert code == 0, err


@needs_torch
@pytest.mark.parametrize("edits", [FULL, PARTIAL], ids=["full", "partial"])
def test_an_install_gets_its_record_hashes_back(installed: Path, capsys, edits) -> None:
    code, out, _ = _apply_json(capsys, str(installed), edits, installed / "sglang" / MODEL)
    assert code == 0
    files = {f["path"]: f for f in out["files"]}
    assert (
        files["sglang/" + MODEL]["replaced"]
        and files["sglang/" + MODEL]["pristine_from"] == "RECORD + wheel sglang-0.5.10-py3-none-any.whl"
    )
    assert {m["proof"] for m in out["models"]} == {"harness-passed"}, out["models"]
    code, _, err = run_cli(capsys, "revert", *SCOPE, str(installed))
    assert code == 0 and _mismatches(installed) == [], err
    _replace_then_revert(capsys, (str(installed),), installed / "sglang" / MODEL, edits)
    assert _mismatches(installed) == []


def _apply_json(capsys, target: str, edits, model: Path) -> tuple[int, dict, str]:
    """sed, then ``apply --replace-hand-edits --format json --diff``: the proof, the files, the hand diff."""
    sed_fix(model, edits)
    code, out, err = run_cli(capsys, "apply", "--replace-hand-edits", "--format", "json", "--diff", *SCOPE, target)
    document = json.loads(out)
    entry = next(f for f in document["files"] if f["path"].endswith(MODEL))
    assert entry["state"] == "edited-by-hand" and entry["hunks"] and all(h["site"] for h in entry["hunks"]), entry
    kinds = {"init"} if edits == PARTIAL else {"init", "setter", "forward"}
    assert {h["site"] for h in entry["hunks"]} == kinds, entry["hunks"]
    assert "+        self.capture_embedding_for_eagle3 = False\n" in entry["hand_diff"]
    return code, document, err


@needs_torch
@pytest.mark.parametrize("edits", [FULL, PARTIAL], ids=["full", "partial"])
def test_a_cached_release_gets_the_wheel_bytes_back(cached_release: Path, capsys, edits) -> None:
    model = cached_release / MODEL
    code, out, _ = _apply_json(capsys, str(cached_release), edits, model)
    assert code == 0 and {m["proof"] for m in out["models"]} == {"harness-passed"}, out["models"]
    assert (
        next(f for f in out["files"] if f["path"].endswith(MODEL))["pristine_from"]
        == "wheel sglang-0.5.10-py3-none-any.whl"
    )
    code, _, err = run_cli(capsys, "revert", *SCOPE, "--release", VERSION)
    assert code == 0 and _differs_from_wheel(cached_release) == [], err
    _replace_then_revert(capsys, ("--release", VERSION), model, edits)
    assert _differs_from_wheel(cached_release) == []


@needs_torch
@pytest.mark.parametrize("edits", [FULL, PARTIAL], ids=["full", "partial"])
def test_a_checkout_gets_head_back(checkout: Path, capsys, edits) -> None:
    model = checkout / "python" / "sglang" / MODEL
    code, out, _ = _apply_json(capsys, str(checkout), edits, model)
    assert code == 0 and {m["proof"] for m in out["models"]} == {"harness-passed"}, out["models"]
    assert next(f for f in out["files"] if f["path"].endswith(MODEL))["pristine_from"] == "git HEAD"
    code, _, err = run_cli(capsys, "revert", *SCOPE, str(checkout))
    assert code == 0 and _git(checkout, "status", "--porcelain") == "", err
    _replace_then_revert(capsys, (str(checkout),), model, edits)
    assert _git(checkout, "status", "--porcelain") == ""


@needs_torch
def test_the_replaced_file_is_what_apply_makes_of_the_pristine_one(installed: Path, release_copy, capsys) -> None:
    """Not just "it verifies": byte for byte the file a plain apply writes on an untouched release."""
    fresh = release_copy(VERSION)
    assert run_cli(capsys, "apply", *SCOPE, str(fresh))[0] == 0
    sed_fix(installed / "sglang" / MODEL)
    assert run_cli(capsys, "apply", "--replace-hand-edits", *SCOPE, str(installed))[0] == 0
    assert (installed / "sglang" / MODEL).read_bytes() == (fresh / MODEL).read_bytes()


# -- refusals --


@pytest.mark.parametrize("other", [UNRELATED_IN_FORWARD, UNRELATED_ELSEWHERE], ids=["same-method", "other-class"])
def test_a_hand_edit_elsewhere_is_refused_and_nothing_changes(installed: Path, capsys, other) -> None:
    model = installed / "sglang" / MODEL
    sed_fix(model, FULL + (other,))
    before = {p: p.read_bytes() for p in (installed / "sglang" / "srt" / "models").glob("*.py")}
    line = model.read_text(encoding="utf-8").splitlines().index(other[1].rstrip("\n")) + 1
    code, out, err = run_cli(capsys, "apply", "--replace-hand-edits", *SCOPE, str(installed))
    where = "DeepseekV2Model.forward" if other is UNRELATED_IN_FORWARD else "DeepseekV2ForCausalLM.__init__"
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"deepseek_v2.py:{line} ({where})" in err and "nothing was changed" in err, err
    assert "DeepseekV2Model.__init__" not in err  # the sed hunks are at sites: only the other one is named
    assert {p: p.read_bytes() for p in before} == before


@needs_torch
def test_advice_for_a_file_replace_refuses_names_what_to_undo_first_and_keeps_the_scope(
    installed: Path, capsys
) -> None:
    """The sed fix and an unrelated hand edit: every row's command must succeed once followed, on that file."""
    model = installed / "sglang" / MODEL
    sed_fix(model, FULL + (UNRELATED_ELSEWHERE,))
    code, out, _ = run_cli(capsys, "apply", "--format", "json", *SCOPE, str(installed))
    rows = [m for m in json.loads(out)["models"] if m["proof"] == "harness-failed" and "hand-made" in m["message"]]
    assert code == 1 and rows
    line = model.read_text(encoding="utf-8").splitlines().index(UNRELATED_ELSEWHERE[1].rstrip("\n")) + 1
    command = f"patchcraft apply --replace-hand-edits {' '.join(SCOPE)} {installed / 'sglang'}"
    for row in rows:
        message = row["message"]
        assert f"run: {command}" in message and "first undo" in message, message
        assert f"deepseek_v2.py:{line} (DeepseekV2ForCausalLM.__init__)" in message.split("first undo", 1)[1]
    # Followed as printed: the refusal is what the advice said it would be, then the command succeeds.
    code, _, err = run_cli(capsys, *command.split()[1:])
    assert code == 2 and f"deepseek_v2.py:{line}" in err
    sed_fix(model, ((UNRELATED_ELSEWHERE[1], UNRELATED_ELSEWHERE[0]),))
    code, _, err = run_cli(capsys, *command.split()[1:])
    assert code == 0, err


def _one_line_exit_2(capsys, *argv: str) -> str:
    code, out, err = run_cli(capsys, "apply", "--replace-hand-edits", *SCOPE, *argv)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_no_pristine_text_for_a_plain_copy(release_copy, capsys) -> None:
    package = release_copy(VERSION)
    sed_fix(package / MODEL)
    before = (package / MODEL).read_bytes()
    err = _one_line_exit_2(capsys, str(package))
    assert (
        "deepseek_v2.py: cannot replace its hand edits" in err
        and "not a git checkout" in err
        and "no dist-info RECORD" in err
    ), err
    assert (package / MODEL).read_bytes() == before


def test_a_copy_without_a_version_is_not_told_to_pip_install_a_version(release_copy, capsys) -> None:
    """No version file (a fork built with setuptools-scm, a copied tree): no ``sglang==unknown`` to reinstall."""
    package = release_copy(VERSION)
    for name in ("_version.py", "version.py"):
        (package / name).unlink(missing_ok=True)
    (package / "__init__.py").write_text("\n", encoding="utf-8")
    sed_fix(package / MODEL)
    code, out, _ = run_cli(capsys, "verify", "--no-smoke", "--format", "json", *SCOPE, str(package))
    row = next(m for m in json.loads(out)["models"] if m["model"] == "deepseek_v2.DeepseekV2ForCausalLM")
    assert code == 1 and "pip install" not in row["message"], row
    assert (
        "put back the shipped sglang/srt/models/deepseek_v2.py (git checkout, or copy them from the source of this tree: "
        "no version file names a release to reinstall; closest release 0.5.10)" in row["message"]
    ), row


def test_no_pristine_text_without_a_record_entry(installed: Path, capsys) -> None:
    record = next(installed.glob("sglang-*.dist-info/RECORD"))
    text = record.read_text(encoding="utf-8")
    try:
        record.write_text(
            "".join(l for l in text.splitlines(keepends=True) if not l.startswith("sglang/" + MODEL + ",")),
            encoding="utf-8",
        )
        sed_fix(installed / "sglang" / MODEL)
        err = _one_line_exit_2(capsys, str(installed))
        assert "has no entry for sglang/srt/models/deepseek_v2.py" in err, err
    finally:
        record.write_text(text, encoding="utf-8")


def test_no_pristine_text_without_the_wheel(cached_release: Path, capsys, monkeypatch) -> None:
    """The release's wheel is gone from the cache and pip cannot fetch it (no index here)."""
    for wheel in (cache_dir() / "wheels").glob("*.whl"):
        wheel.unlink()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    sed_fix(cached_release / MODEL)
    err = _one_line_exit_2(capsys, "--release", VERSION)
    assert "cannot replace its hand edits" in err and "pip could not download sglang==0.5.10" in err, err


# -- what a plain apply, verify and verify --smoke say of the sed-fixed tree --


@needs_torch
def test_a_plain_apply_names_the_lines_the_consequence_and_the_command(installed: Path, capsys) -> None:
    model = installed / "sglang" / MODEL
    sed_fix(model)
    before = model.read_bytes()
    forward = "deepseek_v2.py:2044-2047 (DeepseekV2Model.forward)"
    command = f"run: patchcraft apply --replace-hand-edits {' '.join(SCOPE)} {installed / 'sglang'}"
    code, out, _ = run_cli(capsys, "apply", "--format", "json", *SCOPE, str(installed))
    row = next(m for m in json.loads(out)["models"] if m["model"] == "deepseek_v2.DeepseekV2ForCausalLM")
    assert code == 1 and row["proof"] == "harness-failed", row
    for needle in (forward, PP, command, "harness fail: pipeline:"):
        assert needle in row["message"], (needle, row["message"])
    assert model.read_bytes() == before
    code, out, _ = run_cli(capsys, "apply", "--format", "github", *SCOPE, str(installed))
    annotation = next(line for line in out.splitlines() if "DeepseekV2ForCausalLM" in line and line.startswith("::"))
    assert code == 1 and forward in annotation and PP in annotation and command in annotation, annotation
    code, _, err = run_cli(capsys, "apply", *SCOPE, str(installed))
    assert code == 1 and forward in err and PP in err and command in err, err


@needs_torch
def test_verify_smoke_and_apply_report_the_same_harness_failure(release_copy, capsys) -> None:
    """The hand forward is run although the init edits are missing, by all three commands."""
    package = release_copy(VERSION)
    sed_fix(package / MODEL)
    label = "deepseek_v2.DeepseekV2ForCausalLM"
    code, out, err = run_cli(capsys, "verify", "--smoke", "--format", "json", *SCOPE, str(package))
    document = json.loads(out)
    smoke_row = next(r for r in document["smoke"]["models"] if r["model"] == label)
    verify_row = next(m for m in document["models"] if m["model"] == label)
    assert code == 1 and smoke_row["status"] == "fail" and smoke_row["message"].startswith("pipeline:"), smoke_row
    assert verify_row["proof"] == "harness-failed" and PP in verify_row["message"], verify_row
    code, out, _ = run_cli(capsys, "verify", "--format", "json", *SCOPE, str(package))
    plain_row = next(m for m in json.loads(out)["models"] if m["model"] == label)
    code_apply, out, _ = run_cli(capsys, "apply", "--format", "json", *SCOPE, str(package))
    apply_row = next(m for m in json.loads(out)["models"] if m["model"] == label)
    failure = f"harness fail: {smoke_row['message']}"
    assert code == 1 and failure in plain_row["message"], plain_row
    assert code_apply == 1 and failure in apply_row["message"], apply_row


def test_verify_names_the_inits_that_never_set_the_flag_without_torch(release_copy, capsys) -> None:
    """Static too: with the harness off, verify says who crashes at start-up and what to run."""
    package = release_copy(VERSION)
    sed_fix(package / MODEL)
    code, out, _ = run_cli(capsys, "verify", "--no-smoke", "--format", "json", *SCOPE, str(package))
    row = next(m for m in json.loads(out)["models"] if m["model"] == "deepseek_v2.DeepseekV2ForCausalLM")
    assert (
        code == 1
        and "Glm4MoeLiteModel, MistralLarge3EagleModel inherit this forward but their __init__ never sets the flag: it crashes at start-up"
        in row["message"]
    ), row
    assert (
        "deepseek_v2.py DeepseekV2Model.forward" in row["message"] and "then run: patchcraft apply" in row["message"]
    ), row
    assert f"patchcraft apply {' '.join(SCOPE)} {package}" in row["message"], row  # the run's own scope, kept


# -- the pieces --


def test_record_digest_is_pips() -> None:
    """The hash of a real file of the wheel, as its RECORD writes it."""
    with zipfile.ZipFile(_wheel()) as archive:
        record = archive.read("sglang-0.5.10.dist-info/RECORD").decode()
        line = next(l for l in record.splitlines() if l.startswith("sglang/" + MODEL + ","))
        assert line.split(",")[1] == record_digest(archive.read("sglang/" + MODEL))


def test_a_file_is_pristine_patched_or_edited_by_hand(release_copy, capsys) -> None:
    from patchcraft.engine.hand_edits import classify
    from patchcraft.base.pristine import Pristine
    from patchcraft.base.status import FileState

    package = release_copy(VERSION)
    path = package / MODEL
    pristine = Pristine(path.read_text(encoding="utf-8"), "test")

    def state() -> FileState:
        return classify(path, MODEL, path.read_text(encoding="utf-8"), pristine, lambda: ()).state

    assert state() == FileState.PRISTINE
    assert run_cli(capsys, "apply", "--no-smoke", *SCOPE, str(package))[0] == 0
    assert state() == FileState.PATCHED
    sed_fix(path, (UNRELATED_ELSEWHERE,))
    assert state() == FileState.HAND
    assert classify(path, MODEL, "", Pristine(None, "why"), lambda: ()).state == FileState.UNKNOWN


def test_a_patchcraft_patched_install_is_judged_offline(installed: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """Without patchcraft's edits the file hashes to its RECORD entry: no wheel is needed (none here, no index)."""
    assert run_cli(capsys, "apply", "--no-smoke", *SCOPE, str(installed))[0] == 0
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    code, out, _ = run_cli(capsys, "verify", "--format", "json", *SCOPE, str(installed))
    files = {f["path"]: (f["state"], f["pristine_from"]) for f in json.loads(out)["files"]}
    assert code == 0 and files["sglang/" + MODEL] == ("patchcraft-patched", "RECORD"), files
    assert run_cli(capsys, "revert", *SCOPE, str(installed))[0] == 0 and _mismatches(installed) == []


# -- a fork installed by pip under its own name: KTransformers' sglang-kt 0.7.2 (sglang_kt-0.7.2.dist-info) --


@pytest.fixture(scope="module")
def kt_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """site-packages holding ``pip install --no-deps sglang-kt==0.7.2``: ``sglang/`` beside ``sglang_kt-0.7.2.dist-info``."""
    return install_fork(SGLANG_KT, tmp_path_factory.mktemp("sglang-kt")).parent


def _differs_from_record(site: Path, dist_info: str) -> list[str]:
    hashes = _read_record(site / dist_info / "RECORD")
    return sorted(m for m, d in hashes.items() if m.endswith(".py") and record_digest((site / m).read_bytes()) != d)


def test_an_installed_fork_is_judged_against_its_own_record(kt_site: Path, capsys, monkeypatch) -> None:
    """Its RECORD lists every ``sglang/`` file: verify reads it, and the hand fix is replaced from its own wheel."""
    dist_info = "sglang_kt-0.7.2.dist-info"
    assert (kt_site / dist_info / "RECORD").is_file() and not list(kt_site.glob("sglang-*.dist-info"))
    package = kt_site / "sglang"
    _, out, _ = run_cli(capsys, "verify", "--no-smoke", "--format", "json", *SCOPE, str(package))
    files = {f["path"]: (f["state"], f["pristine_from"]) for f in json.loads(out)["files"]}
    assert files["sglang/" + MODEL] == ("pristine", "RECORD") and set(files.values()) == {("pristine", "RECORD")}, files
    model = package / MODEL
    try:
        sed_fix(model)
        monkeypatch.setenv("PIP_NO_INDEX", "1")  # the fixture's download is in the cache: nothing more is fetched
        _, out, _ = run_cli(capsys, "verify", "--no-smoke", "--format", "json", *SCOPE, str(package))
        found = {f["path"]: (f["state"], f["pristine_from"]) for f in json.loads(out)["files"]}["sglang/" + MODEL]
        assert found[0] == "edited-by-hand" and found[1].startswith("RECORD + wheel sglang_kt-0.7.2-"), found
        code, out, err = run_cli(capsys, "apply", "--no-smoke", "--replace-hand-edits", *SCOPE, str(package))
        assert code == 0 and "Rewriting sglang/" + MODEL in out + err, out + err
        assert run_cli(capsys, "revert", *SCOPE, str(package))[0] == 0
        assert _differs_from_record(kt_site, dist_info) == []  # the shipped files, byte for byte
    finally:
        with zipfile.ZipFile(fork_wheel(SGLANG_KT)) as archive:
            for member in _differs_from_record(kt_site, dist_info):
                (kt_site / member).write_bytes(archive.read(member))


@pytest.mark.parametrize(
    "added",
    [
        (
            "        return self.model.embed_tokens\n",
            "        # checked by hand\n        return self.model.embed_tokens\n",
        ),
        (
            "        return self.model.embed_tokens\n",
            "        return self.model.embed_tokens\n        # checked by hand\n",
        ),
    ],
    ids=["top-of-body", "end-of-body"],
)
def test_a_hand_edit_inside_a_method_is_located_in_it(release_copy, added: tuple[str, str]) -> None:
    """Lines added at the top or the end of ``DeepseekV2ForCausalLM.get_input_embeddings`` (0.5.10) are in that
    method, not at module level: the pristine lines around an insertion at a body's edge are the ``def`` line,
    or the next method's."""
    from patchcraft.base.pristine import Pristine
    from patchcraft.engine.hand_edits import classify

    path = release_copy(VERSION) / MODEL
    pristine = path.read_text(encoding="utf-8")
    method = "    def get_input_embeddings(self) -> nn.Embedding:\n" + added[0]
    assert pristine.count(method) == 1
    hand = pristine.replace(method, "    def get_input_embeddings(self) -> nn.Embedding:\n" + added[1])
    [hunk] = classify(path, MODEL, hand, Pristine(pristine, "test"), lambda: ()).hunks
    line = hand.splitlines().index("        # checked by hand") + 1
    assert hunk.label(MODEL) == f"deepseek_v2.py:{line} (DeepseekV2ForCausalLM.get_input_embeddings)", hunk


def test_two_records_listing_the_package_are_named_not_trusted(kt_site: Path, capsys) -> None:
    """sglang-kt installed over an sglang (both RECORDs list ``sglang/``): neither says what the files were."""
    other = kt_site / "sglang-0.5.9.dist-info"
    other.mkdir()
    try:
        shutil.copy(kt_site / "sglang_kt-0.7.2.dist-info" / "RECORD", other / "RECORD")
        _, out, _ = run_cli(capsys, "verify", "--no-smoke", "--format", "json", *SCOPE, str(kt_site / "sglang"))
        reasons = {f["reason"] for f in json.loads(out)["files"]}
        assert len(reasons) == 1, reasons
        assert (
            "has 2 dist-info RECORDs listing its files beside it (sglang-0.5.9.dist-info, sglang_kt-0.7.2.dist-info:"
            in (reasons.pop())
        )
    finally:
        shutil.rmtree(other)
