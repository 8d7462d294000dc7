"""patchcraft.base.vllm_tree and base.engines: what a vLLM TARGET is, and which engine a TARGET means."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import copy_release, vllm_release_package
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.vllm_tree import VllmTree, is_vllm_path, resolve_vllm_target

VERSION = "0.18.0"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout-like directory holding vllm/ (the release's models and version only)."""
    root = tmp_path_factory.mktemp("checkout")
    source = vllm_release_package(VERSION)
    shutil.copytree(source / "model_executor" / "models", root / "vllm" / "model_executor" / "models")
    shutil.copy2(source / "_version.py", root / "vllm" / "_version.py")
    return root


def test_package_checkout_and_model_file_resolve(checkout: Path) -> None:
    package = checkout / "vllm"
    for target in (package, checkout):
        tree = resolve_vllm_target(str(target))
        assert tree == VllmTree(package=package.resolve(), root=checkout.resolve())
        assert tree.version == VERSION
    model = package / "model_executor" / "models" / "llama.py"
    tree = resolve_vllm_target(str(model))
    assert tree.only_files == (model.resolve(),) and tree.relative(model) == "vllm/model_executor/models/llama.py"


def test_a_renamed_package_is_taken_when_its_files_import_vllm(tmp_path: Path, checkout: Path) -> None:
    shutil.copytree(checkout / "vllm", tmp_path / "vendored")
    assert resolve_vllm_target(str(tmp_path / "vendored")).package == (tmp_path / "vendored").resolve()


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p, "not a vLLM tree"),
        (lambda p: p / "missing", "no such file or directory"),
        (lambda p: (p / "x.txt").write_text("x") and p / "x.txt", "not a Python file"),
        (lambda p: (p / "x.py").write_text("x = 1\n") and p / "x.py", "not inside a vLLM tree"),
    ],
)
def test_what_is_no_vllm_tree_is_one_line(tmp_path: Path, make, words: str) -> None:
    with pytest.raises(PatchcraftError) as refused:
        resolve_vllm_target(str(make(tmp_path)))
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_an_sglang_tree_is_no_vllm_tree(tmp_path: Path) -> None:
    package = copy_release("0.5.2", tmp_path)
    assert not is_vllm_path(package) and not is_vllm_path(package / "srt" / "models" / "llama.py")
    with pytest.raises(PatchcraftError, match="not a vLLM tree"):
        resolve_vllm_target(str(package))


def test_the_installed_vllm_is_found_without_importing_it(tmp_path: Path, checkout: Path, monkeypatch) -> None:
    import sys

    monkeypatch.syspath_prepend(str(checkout))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    tree = resolve_vllm_target(None)
    assert tree.package == (checkout / "vllm").resolve() and "vllm" not in sys.modules


def test_no_installed_vllm_is_one_line(monkeypatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PatchcraftError, match="no installed vllm found.*fetch --engine vllm"):
        resolve_vllm_target(None)
