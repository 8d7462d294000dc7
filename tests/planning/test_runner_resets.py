"""planning.runner_resets: the model runner's calls that reset the ids before CUDA-graph capture, found by structure."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import release_package
from patchcraft.base.target import SglangTree, resolve_target
from patchcraft.planning.runner_resets import RunnerReset, runner_resets

RUNNER = """
class CudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.model_runner.model.set_eagle3_layers_to_capture()

    def configure(self, ids):
        self.model_runner.model.set_eagle3_layers_to_capture(ids)
"""


def tree_with(tmp_path: Path, files: dict[str, str]) -> SglangTree:
    package = tmp_path / "sglang"
    for name, text in files.items():
        path = package / "srt" / "model_executor" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return SglangTree(package=package, root=tmp_path)


def test_a_call_without_ids_is_a_reset_and_one_with_ids_is_not(tmp_path: Path) -> None:
    tree = tree_with(tmp_path, {"cuda_graph_runner.py": RUNNER})
    assert runner_resets(tree) == (RunnerReset("sglang/srt/model_executor/cuda_graph_runner.py", 5, "__init__"),)
    assert runner_resets(tree)[0].where == "sglang/srt/model_executor/cuda_graph_runner.py:5 (__init__)"


def test_a_file_that_does_not_parse_is_passed_over_and_no_runner_is_no_reset(tmp_path: Path) -> None:
    broken = "def _dummy_run(self):\n    self.model.set_eagle3_layers_to_capture(\n"
    tree = tree_with(tmp_path, {"model_runner.py": broken, "cuda_graph_runner.py": RUNNER})
    assert [r.file for r in runner_resets(tree)] == ["sglang/srt/model_executor/cuda_graph_runner.py"]
    assert runner_resets(SglangTree(package=tmp_path / "none", root=tmp_path)) == ()


@pytest.mark.parametrize(
    ("version", "reset"), [("0.4.10", True), ("0.5.6", True), ("0.5.10", True), ("0.5.15", False), ("0.5.23", False)]
)
def test_runner_reset_is_found_by_structure(version: str, reset: bool) -> None:
    resets = runner_resets(resolve_target(str(release_package(version))))
    assert bool(resets) is reset
    if reset:
        assert any("cuda_graph_runner.py" in r.file for r in resets)


def test_the_warm_up_resets_too_from_0_5_6() -> None:
    resets = runner_resets(resolve_target(str(release_package("0.5.10"))))
    assert {r.function for r in resets} == {"__init__", "_dummy_run"}
    assert [(r.file, r.line) for r in resets] == sorted((r.file, r.line) for r in resets)


def test_a_runner_edited_after_a_reading_is_read_again(tmp_path: Path) -> None:
    # The reading is remembered by the files' names, times and sizes: an edit (apply's, or a hand's) shows.
    tree = tree_with(tmp_path, {"cuda_graph_runner.py": RUNNER})
    assert len(runner_resets(tree)) == 1
    path = tree.package / "srt" / "model_executor" / "cuda_graph_runner.py"
    path.write_text(RUNNER.replace("set_eagle3_layers_to_capture()", "set_eagle3_layers_to_capture(ids)"))
    assert runner_resets(tree) == ()
    (path.parent / "model_runner.py").write_text(
        "def _dummy_run(self):\n    self.model.set_eagle3_layers_to_capture()\n"
    )
    assert [r.function for r in runner_resets(tree)] == ["_dummy_run"]
