"""reading.hub_cache: a hub name looked up in a local Hugging Face cache laid out here, never the network."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchcraft.reading.hub_cache import find_snapshot, hub_cache, looks_like_repo_id

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
ENV = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """None of the user's cache variables leak in; HOME is a fresh directory."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def cached(hub: Path, repo_id: str, commit: str = COMMIT, ref: str | None = "main", config: bool = True) -> Path:
    """``models--org--name`` with ``refs/<ref>`` -> ``commit`` and ``snapshots/<commit>/config.json``; its snapshot dir."""
    repository = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repository / "snapshots" / commit
    snapshot.mkdir(parents=True)
    if config:
        (snapshot / "config.json").write_text("{}", encoding="utf-8")
    if ref is not None:
        (repository / "refs").mkdir(exist_ok=True)
        (repository / "refs" / ref).write_text(commit + "\n", encoding="utf-8")
    return snapshot


# -- where the cache is --------------------------------------------------------------


def test_default_is_under_home(tmp_path: Path) -> None:
    assert hub_cache() == tmp_path / "home" / ".cache" / "huggingface" / "hub"


def test_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"


def test_hf_home_wins_over_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache() == tmp_path / "hf" / "hub"


def test_hf_hub_cache_wins_over_everything(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in [
        ("XDG_CACHE_HOME", "xdg"),
        ("HF_HOME", "hf"),
        ("HUGGINGFACE_HUB_CACHE", "old"),
        ("HF_HUB_CACHE", "new"),
    ]:
        monkeypatch.setenv(name, str(tmp_path / value))
    assert hub_cache() == tmp_path / "new"


def test_the_older_variable_wins_over_hf_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "old"))
    assert hub_cache() == tmp_path / "old"


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", "")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache() == tmp_path / "hf" / "hub"


def test_a_tilde_in_the_variable_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", "~/hub")
    assert hub_cache() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", "")
    monkeypatch.setenv("HF_HOME", "~/hf")
    assert hub_cache() == tmp_path / "home" / "hf" / "hub"


# -- what is a repository id -----------------------------------------------------------


@pytest.mark.parametrize("text", ["org/name", "name", "Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B-Instruct", "a_b/c.d"])
def test_repo_ids(text: str) -> None:
    assert looks_like_repo_id(text)


@pytest.mark.parametrize(
    "text", ["./x", "/abs/path", "~/model", "a/b/c", "org/..", "../name", "a..b/c", "", "-org/name", "org/", "org name"]
)
def test_local_paths_and_junk_are_not_repo_ids(text: str) -> None:
    assert not looks_like_repo_id(text)


# -- finding a snapshot ----------------------------------------------------------------


def test_a_cached_repository_is_found_through_refs_main(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    snapshot = cached(hub, "org/target")
    found = find_snapshot("org/target")
    assert found.path == snapshot
    assert found.repository == hub / "models--org--target"
    assert found.ref == hub / "models--org--target" / "refs" / "main"
    assert (found.repo_id, found.revision) == ("org/target", "main")


def test_a_name_without_org(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    snapshot = cached(hub, "gpt2")
    assert find_snapshot("gpt2").path == snapshot and snapshot.parent.parent.name == "models--gpt2"


def test_the_cache_is_looked_up_where_hub_cache_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    snapshot = cached(tmp_path / "hf" / "hub", "org/target")
    assert find_snapshot("org/target").path == snapshot
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert find_snapshot("org/target").path is None


def test_a_named_revision_reads_its_own_ref(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    main = cached(hub, "org/target", COMMIT, "main")
    branch = cached(hub, "org/target", OTHER, "v2")
    assert find_snapshot("org/target").path == main
    assert find_snapshot("org/target", None).path == main
    found = find_snapshot("org/target", "v2")
    assert found.path == branch and found.revision == "v2" and found.ref.name == "v2"


def test_a_commit_hash_as_revision_needs_no_ref(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    snapshot = cached(hub, "org/target", OTHER, ref=None)
    assert find_snapshot("org/target", OTHER).path == snapshot
    assert find_snapshot("org/target").path is None  # no refs/main


def test_a_revision_that_is_neither_a_ref_nor_a_commit_is_not_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    cached(hub, "org/target", COMMIT, ref=None)
    # a snapshot directory named like the revision is not enough: only a 40-hex commit names one without a ref
    for name in ("v9", COMMIT[:12], COMMIT.upper()):
        cached(hub, "org/target", name, ref=None)
    for revision in ("v9", COMMIT[:12], COMMIT.upper()):
        assert find_snapshot("org/target", revision).path is None, revision


def test_a_snapshot_without_config_json_is_not_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    snapshot = cached(hub, "org/target", config=False)
    assert find_snapshot("org/target").path is None
    (snapshot / "config.json").mkdir()  # a directory named config.json is no config
    assert find_snapshot("org/target").path is None


def test_a_ref_to_a_missing_snapshot_is_not_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    cached(hub, "org/target")
    (hub / "models--org--target" / "refs" / "main").write_text(OTHER, encoding="utf-8")
    assert find_snapshot("org/target").path is None


def test_an_unreadable_ref_is_not_found_and_not_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    cached(hub, "org/target")
    ref = hub / "models--org--target" / "refs" / "main"
    ref.write_bytes(b"\xff\xfe not utf-8")
    assert find_snapshot("org/target").path is None
    ref.unlink()
    ref.mkdir()  # reading a directory fails with OSError
    assert find_snapshot("org/target").path is None


def test_an_empty_ref_is_not_the_snapshots_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    cached(hub, "org/target")
    (hub / "models--org--target" / "snapshots" / "config.json").write_text("{}", encoding="utf-8")
    (hub / "models--org--target" / "refs" / "main").write_text("\n", encoding="utf-8")
    assert find_snapshot("org/target").path is None


def test_nothing_cached_at_all(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "absent"))
    found = find_snapshot("org/target", "v1")
    assert found.path is None and found.ref == tmp_path / "absent" / "models--org--target" / "refs" / "v1"
