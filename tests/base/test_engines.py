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


def test_the_python_a_command_runs(tmp_path: Path) -> None:
    """The interpreter of a server command: its first word when a Python, else its console script's #! line."""
    import sys

    from patchcraft.base.engines import command_interpreter

    assert command_interpreter([sys.executable, "-m", "vllm"]) == Path(sys.executable)
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nimport sys\n", encoding="utf-8")
    script.chmod(0o755)
    assert command_interpreter([str(script), "serve", "m"]) == Path(sys.executable)
    shell = tmp_path / "serve.sh"
    shell.write_text("#!/bin/sh\nexec true\n", encoding="utf-8")
    shell.chmod(0o755)
    assert command_interpreter([str(shell)]) is None and command_interpreter(["no-such-command-here"]) is None


def test_another_python_is_asked_where_its_engine_is(tmp_path: Path) -> None:
    """A venv's Python: where it imports vllm from (a fake vllm package on its path), or "" when it has none."""
    import subprocess
    import venv

    from patchcraft.base.engines import ServingEngine, package_of_interpreter

    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    assert package_of_interpreter(python, ServingEngine.VLLM) == ""
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    (Path(site) / "vllm").mkdir()
    (Path(site) / "vllm" / "__init__.py").write_text("raise SystemExit('imported: it must not be')\n", encoding="utf-8")
    assert package_of_interpreter(python, ServingEngine.VLLM) == str(Path(site) / "vllm")
