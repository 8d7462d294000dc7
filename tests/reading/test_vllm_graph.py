"""patchcraft.reading.vllm_graph: vLLM's absolute sibling imports resolve in the class graph."""

from __future__ import annotations

import ast

from conftest import vllm_release_package
from patchcraft.reading.class_graph import ModelGraph
from patchcraft.reading.vllm_graph import VllmGraph, absolute_imports


def test_absolute_imports() -> None:
    tree = ast.parse(
        "from vllm.model_executor.models.llama import LlamaForCausalLM as Base, LlamaModel\n"
        "from vllm.model_executor.models import qwen3_5\n"
        "import vllm.model_executor.models.gemma as g\n"
        "from vllm.model_executor.models.llama.sub import X\n"
        "from vllm.config import VllmConfig\n"
    )
    names, modules = absolute_imports(tree)
    assert names == {"Base": ("llama", "LlamaForCausalLM"), "LlamaModel": ("llama", "LlamaModel")}
    assert modules == {"qwen3_5": "qwen3_5", "g": "gemma"}


def test_mistral_reaches_the_eagle3_setter_only_with_them() -> None:
    models = vllm_release_package("0.34.0") / "model_executor" / "models"
    shared, vllm = ModelGraph(models), VllmGraph(models)
    for graph in (shared, vllm):
        graph.load("mistral")
    assert shared.find_method(shared.classes[("mistral", "MistralForCausalLM")], "set_aux_hidden_state_layers") is None
    found = vllm.find_method(vllm.classes[("mistral", "MistralForCausalLM")], "set_aux_hidden_state_layers")
    assert found is not None and found[0].label == "interfaces.SupportsEagle3"
