"""patchcraft.base.engines: which serving engine a TARGET is (``--engine`` wins), and its tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import copy_release, vllm_release_package
from patchcraft.base.engines import ServingEngine, detect_engine, resolve_engine_target
from patchcraft.base.target import SglangTree
from patchcraft.base.vllm_tree import VllmTree


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("checkout")
    source = vllm_release_package("0.18.0")
    shutil.copytree(source / "model_executor" / "models", root / "vllm" / "model_executor" / "models")
    return root


def test_choice_prints_as_its_word() -> None:
    assert (
        f"{ServingEngine.VLLM}" == str(ServingEngine.VLLM) == "vllm" and ServingEngine("sglang") is ServingEngine.SGLANG
    )


def test_the_engine_is_told_from_the_target(tmp_path: Path, checkout: Path) -> None:
    sglang = copy_release("0.5.2", tmp_path)
    assert detect_engine(str(checkout), None) is ServingEngine.VLLM
    assert detect_engine(str(checkout / "vllm" / "model_executor" / "models" / "llama.py"), None) is ServingEngine.VLLM
    assert detect_engine(str(sglang), None) is ServingEngine.SGLANG
    assert detect_engine(str(checkout), ServingEngine.SGLANG) is ServingEngine.SGLANG  # --engine wins
    assert isinstance(resolve_engine_target(str(sglang), ServingEngine.SGLANG), SglangTree)
    assert isinstance(resolve_engine_target(str(checkout), ServingEngine.VLLM), VllmTree)
