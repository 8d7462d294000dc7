"""vLLM's ``vllm/models/<family>/`` packages (0.22+), read per platform (issues 45.1, 45.2, 45.3, 46.1).

Each family's ``__init__.py`` picks a platform subpackage by ``current_platform``, or falls back to a class
of ``model_executor/models`` (0.32.0's ``deepseek_v32`` on CPU and XPU serves ``DeepseekV32ForCausalLM`` as
``deepseek_v2.DeepseekV3ForCausalLM`` and ``GlmMoeDsaForCausalLM`` as ``deepseek_v2.GlmMoeDsaForCausalLM``).
The rows say which platform serves which class, and what is served somewhere is patched; every test here
runs on the real release files and fails on the planner that read ``model_executor/models`` only.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import run_cli, vllm_release_package

from patchcraft.base.status import EditKind
from patchcraft.base.vllm_tree import VllmTree
from patchcraft.planning.selection import plan_tree
from patchcraft.planning.vllm_plans import plan_vllm

GLM = "deepseek_v2.GlmMoeDsaForCausalLM"


def _tree(package: Path) -> VllmTree:
    return VllmTree(package=package, root=package.parent)


def _plans(package: Path) -> dict[str, object]:
    return {p.label: p for p in plan_vllm(_tree(package))}


@pytest.mark.parametrize("version", ["0.32.0", "0.34.0"])
def test_a_class_a_family_falls_back_to_is_patched_and_says_where_it_serves(version: str) -> None:
    plans = _plans(vllm_release_package(version))
    glm = plans[GLM]
    assert not glm.unsupported and [s.kind for s in glm.sites] == [EditKind.VLLM_FORWARD]
    assert glm.notes == (
        f"vLLM {version} serves GlmMoeDsaForCausalLM with this class on xpu, cpu (models/deepseek_v32/__init__.py:33)",
    )
    assert plans["deepseek_v2.DeepseekV3ForCausalLM"].notes == (
        f"vLLM {version} serves DeepseekV32ForCausalLM with this class on xpu, cpu (models/deepseek_v32/__init__.py:30)",
    )


def test_each_served_family_class_is_a_row_naming_its_platforms() -> None:
    package = vllm_release_package("0.33.0")
    plans = _plans(package)
    assert not any("does not read yet" in (p.unsupported or "") for p in plans.values())
    nvidia = plans["deepseek_v32.nvidia.DeepseekV32ForCausalLM"]
    assert nvidia.path == package / "models" / "deepseek_v32" / "nvidia" / "model.py" and nvidia.platforms == ("cuda",)
    assert [(s.kind, s.path) for s in nvidia.sites] == [(EditKind.VLLM_FORWARD, nvidia.path)]  # its own file's loop
    assert "vLLM 0.33.0 serves DeepseekV32ForCausalLM with this class on cuda (models/deepseek_v32/__init__.py:20)" in (
        nvidia.notes
    )
    assert plans["deepseek_v32.amd.DeepseekV32ForCausalLM"].platforms == ("rocm",)
    for platform in ("nvidia", "amd", "xpu", "cpu"):  # DeepSeek-V4: one module per platform, none reads id 0
        v4 = plans[f"deepseek_v4.{platform}.DeepseekV4ForCausalLM"]
        # its capture after each layer only: id 0's capture added before the loop in that platform's file (issue 46)
        assert [(s.kind, s.path, s.cls) for s in v4.sites] == [(EditKind.VLLM_ADD_CAPTURE, v4.path, "DeepseekV4Model")]
        assert v4.path == package / "models" / "deepseek_v4" / platform / "model.py" and not v4.unsupported
    glm5 = plans["glm5next.common.Glm5NextForCausalLM"]
    assert any(n.startswith("not served on xpu: NotImplementedError") for n in glm5.notes)
    assert (
        not glm5.sites
        and "(`hidden_states, residual, post, comb = ...`) threads hyper-connection state" in glm5.unsupported
        and "(config.mhc false), which the harness does not run" in glm5.unsupported
    )


def test_kimi_k3_builds_another_language_model_on_each_platform() -> None:
    """Kimi-K3 names ``KimiLinearForCausalLM``, which the family serves from ``amd/linear.py`` on ROCm and XPU: the
    mixin's capture (the ``vllm-mixin`` edit) there, its own capture before the loop on CUDA and CPU."""
    plans = _plans(vllm_release_package("0.33.0"))
    for label in ("kimi_k3.amd.KimiK3ForConditionalGeneration", "kimi_k3.nvidia.xpu.KimiK3ForConditionalGeneration"):
        assert [s.kind for s in plans[label].sites] == [EditKind.VLLM_MIXIN]
        assert plans[label].sites[0].cls == "EagleModelMixin"  # past amd/linear.py's override calling super()
    cuda = plans["kimi_k3.nvidia.cuda-cpu.KimiK3ForConditionalGeneration"]
    assert [(s.kind, s.cls, s.method) for s in cuda.sites] == [
        (EditKind.VLLM_BEFORE_LOOP, "KimiLinearModel", "forward")
    ]
    assert cuda.platforms == ("cuda", "cpu") and not cuda.unsupported
    rocm_linear = plans["kimi_k3.amd.KimiLinearForCausalLM"]
    assert rocm_linear.not_applicable and "has no set_aux_hidden_state_layers" in rocm_linear.unsupported


def test_naming_a_family_selects_its_rows() -> None:
    plans = plan_tree(_tree(vllm_release_package("0.33.0")), ["kimi_k3"])
    assert {p.label for p in plans} >= {
        "kimi_k3.nvidia.KimiLinearForCausalLM",
        "kimi_k3.amd.KimiK3ForConditionalGeneration",
        "kimi_k3.nvidia.cuda-cpu.KimiK3ForConditionalGeneration",
    }


def test_a_capture_before_the_loop_is_read_by_what_it_does() -> None:
    """0.32.0's Cohere2MoeModel.forward captures the embedding tensor itself before its loop: the entry is made a
    copy there (``vllm-before-loop``), by what the capture does, as Kimi-Linear's (issue 46)."""
    plan = _plans(vllm_release_package("0.32.0"))["cohere2_moe.Cohere2MoeForCausalLM"]
    assert not plan.not_applicable and not plan.unsupported
    assert [(s.kind, s.path.name, s.cls) for s in plan.sites] == [
        (EditKind.VLLM_BEFORE_LOOP, "cohere2_moe.py", "Cohere2MoeModel")
    ]


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_kimi_linear_before_the_loop_is_planned_on_cuda_and_cpu_only(version: str) -> None:
    """Kimi-Linear's CUDA/CPU module (``nvidia/model.py``) appends the embedding tensor itself before its loop: both
    rows serving it get the ``vllm-before-loop`` edit in that file; ROCm and XPU keep the mixin's (issue 46)."""
    package = vllm_release_package(version)
    plans = _plans(package)
    path = package / "models" / "kimi_k3" / "nvidia" / "model.py"
    for label in ("kimi_k3.nvidia.KimiLinearForCausalLM", "kimi_k3.nvidia.cuda-cpu.KimiK3ForConditionalGeneration"):
        plan = plans[label]
        assert not plan.unsupported and plan.platforms == ("cuda", "cpu"), (label, plan.unsupported)
        assert [(s.kind, s.path, s.cls, s.method) for s in plan.sites] == [
            (EditKind.VLLM_BEFORE_LOOP, path, "KimiLinearModel", "forward")
        ]
    assert [s.kind for s in plans["kimi_k3.nvidia.xpu.KimiK3ForConditionalGeneration"].sites] == [EditKind.VLLM_MIXIN]


def test_vl_wrappers_follow_the_language_model_their_code_builds() -> None:
    plans = _plans(vllm_release_package("0.32.0"))
    qwen3_vl = plans["qwen3_vl.Qwen3VLForConditionalGeneration"]
    assert [s.kind for s in qwen3_vl.sites] == [EditKind.VLLM_MIXIN]
    assert qwen3_vl.notes == (
        "ids reach qwen3_vl.Qwen3LLMModel through its language model qwen3_vl.Qwen3LLMForCausalLM "
        "(`self.language_model`, qwen3_vl.py:2043)",
    )
    mllama4 = plans["mllama4.Llama4ForConditionalGeneration"]  # initialize_model(..., model_class=Llama4ForCausalLM)
    assert mllama4.sites and "llama4.Llama4ForCausalLM (`self.language_model`, mllama4.py:780)" in mllama4.notes[0]
    unknown = sorted(label for label, p in plans.items() if "cannot tell" in (p.unsupported or ""))
    assert unknown == [
        "gemma4_mm.Gemma4ForConditionalGeneration",
        "gemma4_unified.Gemma4UnifiedForConditionalGeneration",
        "lightonocr.LightOnOCRForConditionalGeneration",
        "llava.LlavaForConditionalGeneration",
        "mistral3.Mistral3ForConditionalGeneration",
        "pixtral.PixtralForConditionalGeneration",
    ]
    assert all("init_vllm_registered_model builds it" in plans[label].unsupported for label in unknown)
    assert all("`self.language_model`" in plans[label].unsupported for label in unknown)


def test_explain_on_an_architecture_served_by_a_fallback_runs_that_class(capsys) -> None:
    """One answer for GlmMoeDsaForCausalLM on 0.32.0: the class XPU and CPU serve, as the label's explain runs it."""
    pytest.importorskip("torch")
    package = str(vllm_release_package("0.32.0"))
    answers = []
    for name in ("GlmMoeDsaForCausalLM", GLM):
        args = ("explain", package, "--engine", "vllm", "--model", name, "--layer-ids", "0,2,4", "--num-layers", "8")
        code, out, err = run_cli(capsys, *args)
        answers.append((code, out.replace(GLM, "X").replace("GlmMoeDsaForCausalLM", "X")))
    assert answers[0] == answers[1] and answers[0][0] == 1 and "deepseek_v2.py" in answers[0][1]


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_explain_on_a_family_only_architecture_answers_per_platform(version: str, capsys) -> None:
    """KimiK3ForConditionalGeneration is served from each platform's own module: explain runs each platform's
    (CUDA and CPU through the language model its code names, ``KimiLinearForCausalLM``), and says each answer,
    and on which side of the attention-residual switch it ran."""
    pytest.importorskip("torch")
    package = str(vllm_release_package(version))
    args = ("explain", package, "--engine", "vllm", "--model", "KimiK3ForConditionalGeneration", "--layer-ids", "0,2,4")
    code, out, err = run_cli(capsys, *args, "--num-layers", "8")
    assert code == 1 and err == "", err
    fed = next(line for line in out.splitlines() if line.startswith("vLLM feeds the draft"))
    assert "cuda: hs[0] (not a copy: hs[7] where the add-norm runs in place: cuda eager), hs[2], hs[4]" in fed
    assert (
        "cpu: hs[0] (not a copy; kept: the add-norm runs out of place on cpu eager, cpu compiled), hs[2], hs[4]" in fed
    )
    for platform in ("rocm", "xpu"):  # the residual-stream side of attn_res_block_size (harness.attention_residuals)
        assert (
            f"{platform}: hs[0] (not a copy: hs[7] where the add-norm runs in place: {platform} eager), hs[2], hs[4]"
            in fed
        )
    assert "note: cuda, rocm, xpu, cpu: run with config.attn_res_block_size = None" in out
    code, out, _ = run_cli(capsys, *args, "--num-layers", "8", "--platform", "cuda")
    assert code == 1 and "KimiLinearForCausalLM, the language model of KimiK3ForConditionalGeneration" in out
    assert "does not read yet" not in err and "no such model class" not in err


def test_apply_patches_what_a_fallback_platform_serves(capsys, tmp_path: Path) -> None:
    """``--model GlmMoeDsaForCausalLM`` on 0.32.0: the XPU/CPU class is patched, proven, exit 0; revert gives the bytes
    back (before: unsupported, exit 1)."""
    pytest.importorskip("torch")
    source = vllm_release_package("0.32.0")
    package = tmp_path / "vllm"
    for part in (Path("model_executor") / "models", Path("models")):
        shutil.copytree(source / part, package / part)
    before = {p: p.read_bytes() for p in package.rglob("*.py")}
    code, out, err = run_cli(capsys, "apply", str(package), "--engine", "vllm", "--model", "GlmMoeDsaForCausalLM")
    said = " ".join((out + err).split())
    assert code == 0, said
    assert f"patched {GLM}" in said
    assert run_cli(capsys, "revert", str(package), "--engine", "vllm", "--model", "GlmMoeDsaForCausalLM")[0] == 0
    assert {p: p.read_bytes() for p in package.rglob("*.py")} == before


def test_explain_runs_each_platforms_module() -> None:
    """What DeepSeek-V3.2 feeds for id 0 on 0.33.0, per platform, from running each platform's own forward."""
    pytest.importorskip("torch")
    from patchcraft.analysis.vllm_explain import explain_vllm

    tree = _tree(vllm_release_package("0.33.0"))
    fed = {p: explain_vllm(tree, "DeepseekV32ForCausalLM", (0, 2, 4), 8, platform=p) for p in ("cuda", "rocm", "cpu")}
    assert fed["cuda"].model == "models.deepseek_v32.nvidia.model.DeepseekV32ForCausalLM"
    assert fed["cuda"].fed.startswith("hs[0] (not a copy") and fed["cuda"].fed.endswith("hs[2], hs[4]")
    assert "crash" in fed["rocm"].fed and "model.py:222" in fed["rocm"].fed  # amd/model.py's own sum
    assert fed["cpu"].model == "deepseek_v2.DeepseekV3ForCausalLM" and "deepseek_v2.py:1562" in fed["cpu"].fed


def test_explain_on_a_family_row_judges_only_the_platforms_that_serve_it(capsys) -> None:
    """A row's label names one platform module (0.34.0 ``deepseek_v32.nvidia``: cuda serves it): without
    ``--platform`` only cuda's add-norm settings are judged and printed, not cpu's, rocm's or xpu's, which
    never run that module."""
    pytest.importorskip("torch")
    from patchcraft.analysis.vllm_explain import explain_vllm

    tree = _tree(vllm_release_package("0.34.0"))
    record = explain_vllm(tree, "deepseek_v32.nvidia.DeepseekV32ForCausalLM", (0, 2, 4), 8)
    assert record.served_on == ("cuda",)
    assert {n.platform for n in record.norms} == {"cuda"}
    assert "cpu" not in " ".join(f.text for f in record.findings)
    code, out, _ = run_cli(
        capsys, "explain", str(tree.package), "--engine", "vllm", "--model", "deepseek_v32.nvidia.DeepseekV32ForCausalLM",
        "--layer-ids", "0,2,4", "--num-layers", "8",
    )  # fmt: skip
    platform = next(line for line in out.splitlines() if line.startswith("platform"))
    assert platform.startswith("platform cuda: the platforms that serve this class") and "cpu" not in platform, out
    # an architecture (not a row's label) is judged on every platform as before
    assert explain_vllm(tree, "LlamaForCausalLM", (0, 2, 4), 8).served_on == ()


def test_a_capture_the_harness_cannot_run_is_no_edit_but_said() -> None:
    """0.32.0's ROCm DeepSeek-V4.1 captures after each layer as DeepSeek-V4 does, but its wrapper constructs its
    language model, which the harness does not run: no ``vllm-add-capture`` (an overlay would refuse it unproven, and
    ``patchcraft run`` with it), the row saying why. It was planned, withheld at apply, and broke ``run``."""
    package = vllm_release_package("0.32.0")
    plans = {p.label: p for p in plan_vllm(VllmTree(package=package, root=package.parent))}
    v41 = plans["deepseek_v41.amd.DeepseekV41ForCausalLM"]
    assert not v41.sites and "id 0 captures nothing" in v41.unsupported, v41.unsupported
    assert "(vllm-add-capture) would have to be proven on the harness" in v41.unsupported
    assert [s.kind for s in plans["deepseek_v4.amd.DeepseekV4ForCausalLM"].sites] == [EditKind.VLLM_ADD_CAPTURE]
