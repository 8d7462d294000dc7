"""planning.records: an edit site's key and typed parameters, a plan's label and files."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchcraft.planning.records import EditSite, ForwardParams, FusionParams, ModelPlan, SetterParams


def site(kind: str, path: str, cls: str = "LlamaModel", params=None) -> EditSite:
    return EditSite(kind, Path(path), Path(path).stem, cls, "forward" if kind == "forward" else "__init__", params)


def test_a_site_without_parameters_takes_its_kinds_defaults() -> None:
    assert site("init", "llama.py").params_as(SetterParams) == SetterParams()
    assert site("forward", "llama.py").params_as(ForwardParams) == ForwardParams()


def test_a_site_with_another_kinds_parameters_is_a_type_error() -> None:
    forward = site("forward", "llama.py", params=ForwardParams(gate="pp.is_first_rank", copies=True))
    assert forward.params_as(ForwardParams).copies
    with pytest.raises(TypeError, match="forward site LlamaModel.forward has ForwardParams, not FusionParams"):
        forward.params_as(FusionParams)


def test_a_sites_key_is_its_file_class_and_kind() -> None:
    assert site("init", "a/llama.py").key == ("a/llama.py", "LlamaModel", "init")


def test_a_plans_files_are_its_sites_files_once_in_site_order() -> None:
    sites = (site("setter", "llama.py"), site("init", "qwen2.py"), site("forward", "llama.py"))
    plan = ModelPlan("llama", "LlamaForCausalLM", Path("llama.py"), sites)
    assert plan.label == "llama.LlamaForCausalLM"
    assert plan.files == (Path("llama.py"), Path("qwen2.py"))
