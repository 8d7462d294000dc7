"""planning.model_choice: the model class ``--model NAME`` means in one tree (explain, check-draft)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import release_package
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.target import SglangTree, resolve_target
from patchcraft.planning.model_choice import choose_model

SETTER = """
class {name}:
    def __init__(self, config):
        self.model = None

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.model.layers_to_capture = [val + 1 for val in layer_ids]
"""


def tree_with(tmp_path: Path, files: dict[str, str]) -> SglangTree:
    models = tmp_path / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    for name, text in files.items():
        (models / name).write_text(text, encoding="utf-8")
    return SglangTree(package=tmp_path / "sglang", root=tmp_path)


def release(version: str = "0.5.10") -> SglangTree:
    return resolve_target(str(release_package(version)))


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("deepseek_v2", "deepseek_v2.DeepseekV2ForCausalLM"),  # a file of several model classes: the supported one
        ("deepseek_v2.py", "deepseek_v2.DeepseekV2ForCausalLM"),
        ("DeepseekV3ForCausalLM", "deepseek_v2.DeepseekV3ForCausalLM"),  # an architecture that inherits the setter
        ("deepseek_v2.DeepseekV3ForCausalLM", "deepseek_v2.DeepseekV3ForCausalLM"),
        ("kimi_k25", "kimi_k25.KimiK25ForConditionalGeneration"),
    ],
)
def test_a_name_chooses_one_model_class(name: str, label: str) -> None:
    graph, cls = choose_model(release(), name)
    assert cls.label == label
    assert graph.classes[cls.key] is cls


def test_a_model_file_loads_that_file_and_its_bases_files_only() -> None:
    graph, cls = choose_model(release(), "qwen3")
    assert cls.label == "qwen3.Qwen3ForCausalLM"
    assert "qwen2" in graph.loaded and "deepseek_v2" not in graph.loaded


def test_no_match_names_the_nearest_files() -> None:
    with pytest.raises(
        PatchcraftError, match="no model matches --model deepseek_v9: no model file deepseek_v9.py"
    ) as err:
        choose_model(release(), "deepseek_v9")
    assert "the nearest names: deepseek_v2" in str(err.value)


def test_several_matches_ask_for_a_name(tmp_path: Path) -> None:
    tree = tree_with(tmp_path, {"pair.py": SETTER.format(name="AForCausalLM") + SETTER.format(name="BForCausalLM")})
    with pytest.raises(
        PatchcraftError,
        match=r"2 model classes match; pass --model NAME \(one of: pair.AForCausalLM, pair.BForCausalLM\)",
    ):
        choose_model(tree, None)
    assert choose_model(tree, "BForCausalLM")[1].label == "pair.BForCausalLM"


def test_a_file_without_a_setter_says_so_and_no_models_dir_is_no_tree(tmp_path: Path) -> None:
    tree = tree_with(tmp_path, {"plain.py": "class Plain:\n    pass\n"})
    with pytest.raises(PatchcraftError, match="plain.py is in this tree, but none of its classes has"):
        choose_model(tree, "plain")
    with pytest.raises(PatchcraftError, match="not an SGLang tree"):
        choose_model(SglangTree(package=tmp_path / "none", root=tmp_path), "plain")


def whole_tree_choice(tree: SglangTree, name: str) -> str:
    """The class the whole tree's plans choose for ``name`` (the way every name went before the one-file route)."""
    from patchcraft.planning.model_choice import _choose_class
    from patchcraft.planning.model_plans import plan_models, scan

    graph = scan(tree.models_dir)
    return _choose_class(tree, graph, plan_models(graph, inheriting=True), name).label


@pytest.mark.parametrize("name", ["KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM", "LlamaForCausalLM"])
def test_an_architecture_one_file_defines_is_chosen_from_that_file(name: str) -> None:
    tree = release("0.5.23")
    graph, cls = choose_model(tree, name)
    assert cls.label == whole_tree_choice(tree, name)
    # That file and its bases' files, not the tree's hundred-odd model files.
    assert len(graph.loaded) < 10, sorted(graph.loaded)


def test_a_class_name_defined_in_two_files_reads_the_whole_tree(tmp_path: Path) -> None:
    """Names match case-insensitively, so a second ``class`` of the name in any case makes one file not enough."""
    one = SETTER.format(name="AForCausalLM")
    tree = tree_with(tmp_path, {"a.py": one, "b.py": SETTER.format(name="aforcausallm")})
    with pytest.raises(PatchcraftError, match=r"2 model classes match; pass --model NAME \(one of: a.AForCausalLM, b"):
        choose_model(tree, "AForCausalLM")
    # A file stem equal to the name (in any case) is a match too (the module's classes): the whole tree is read.
    tree = tree_with(tmp_path / "stem", {"a.py": one, "AForCausalLM.py": SETTER.format(name="Other")})
    graph, cls = choose_model(tree, "aforcausallm")
    assert cls.label == whole_tree_choice(tree, "aforcausallm") == "a.AForCausalLM"
    assert set(graph.loaded) == {"a", "AForCausalLM"}
    # One definition: that file alone.
    graph, cls = choose_model(
        tree_with(tmp_path / "one", {"a.py": one, "b.py": SETTER.format(name="B")}), "AForCausalLM"
    )
    assert cls.label == "a.AForCausalLM" and graph.loaded == {"a": True}
