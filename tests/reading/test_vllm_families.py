"""reading.vllm_families: each family's ``__init__.py`` run per platform on stand-ins (0.32.0's real files)."""

from __future__ import annotations

from pathlib import Path

from conftest import vllm_release_package

from patchcraft.reading.vllm_families import family_dispatch, read_tables, served


def test_the_dispatch_is_read_per_platform_from_the_familys_own_code() -> None:
    package = vllm_release_package("0.32.0")
    found = {(s.architecture, s.platform): s for s in family_dispatch(package)}
    v32 = {p: (found["DeepseekV32ForCausalLM", p].file, found["DeepseekV32ForCausalLM", p].cls) for p in
           ("cuda", "rocm", "xpu", "cpu")}  # fmt: skip
    assert v32 == {
        "cuda": ("models/deepseek_v32/nvidia/model.py", "DeepseekV32ForCausalLM"),
        "rocm": ("models/deepseek_v32/amd/model.py", "DeepseekV32ForCausalLM"),
        "xpu": ("model_executor/models/deepseek_v2.py", "DeepseekV3ForCausalLM"),
        "cpu": ("model_executor/models/deepseek_v2.py", "DeepseekV3ForCausalLM"),
    }
    assert found["GlmMoeDsaForCausalLM", "cpu"].where == "models/deepseek_v32/__init__.py:33"
    assert found["GlmMoeDsaForCausalLM", "cpu"].stem == "deepseek_v2"
    assert found["GlmMoeDsaForCausalLM", "cuda"].cls == "DeepseekV32ForCausalLM"  # imported under another name
    xpu = found["Glm5NextForCausalLM", "xpu"]
    assert not xpu.module and xpu.refused.startswith("NotImplementedError: GLM-5.3-Flash")
    # the multimodal table is read too: Kimi-K3 itself
    assert found["KimiK3ForConditionalGeneration", "cuda"].file == "models/kimi_k3/nvidia/model.py"
    assert found["KimiK3ForConditionalGeneration", "rocm"].file == "models/kimi_k3/amd/model.py"
    assert read_tables(package)["KimiK3ForConditionalGeneration"] == (
        "vllm.models.kimi_k3",
        "KimiK3ForConditionalGeneration",
    )


def test_a_lazy_module_getattr_is_followed() -> None:
    """0.33.0's flint/__init__.py binds its class only in ``__getattr__`` (``from . import model``)."""
    package = vllm_release_package("0.33.0")
    rows = served(package, "FlintForCausalLM", "vllm.models.flint", "FlintForCausalLM")
    assert {s.file for s in rows} == {"models/flint/model.py"} and len(rows) == 4


def test_a_broken_init_is_a_refusal_not_a_traceback(tmp_path: Path) -> None:
    family = tmp_path / "vllm" / "models" / "broken"
    family.mkdir(parents=True)
    (family / "__init__.py").write_text(
        "from vllm.platforms import current_platform\nif current_platform.is_magic():\n"
    )
    rows = served(tmp_path / "vllm", "BrokenForCausalLM", "vllm.models.broken", "BrokenForCausalLM")
    assert all(s.refused and not s.module for s in rows)
    (family / "__init__.py").write_text(
        "from vllm.platforms import current_platform\nx = current_platform.is_magic()\n"
    )
    rows = served(tmp_path / "vllm", "BrokenForCausalLM", "vllm.models.broken", "BrokenForCausalLM")
    assert all("not read: current_platform.is_magic" in s.refused for s in rows)
