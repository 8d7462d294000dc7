"""Golden diffs for vLLM releases (golden/vllm/<release>/<stem>.diff): the one pipeline on a vLLM tree.

For each release and model: ``apply --model STEM`` (proven by the harness first) gives the golden diff
byte for byte, ``verify`` and ``apply --check`` then exit 0, and ``revert`` gives the release back
byte for byte. ``deepseek_v2``: the top-of-layer capture (0.34.0 in the fast tier, 0.18.0 in the full
tier); ``llama`` on 0.11.2 and 0.17.0: the same edit in the pre-mixin ``LlamaModel.forward`` (0.17.0
fast); ``llama`` on 0.18.0 and 0.34.0: ``EagleModelMixin``'s capture of id 0 made a copy, in
``interfaces.py``, for every mixin model (full tier: the proof runs ~40 models); ``gpt_oss`` on 0.11.2
(0.17.0 full tier): the same edit where the loop threads ``x``. ``pytest --update-golden`` rewrites the
files for review.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
from conftest import GOLDEN, run_cli, vllm_release_package

from patchcraft.base.engines import ServingEngine
from patchcraft.base.fetch import copy_parts
from patchcraft.base.vllm_fetch import PARTS
from patchcraft.engine.diffs import unified_diffs
from patchcraft.engine.records import Mode
from patchcraft.pipeline.stages import Options, run_trees

pytest.importorskip("torch")

VERSIONS = ["0.34.0", pytest.param("0.18.0", marks=pytest.mark.slow)]


def _copy(version: str, dest: Path) -> Path:
    """The parts of the release patchcraft reads (models, runners, config: explain runs on the copy too)."""
    return copy_parts(vllm_release_package(version), dest / "vllm", PARTS)


@pytest.mark.parametrize("version", VERSIONS)
def test_apply_verify_check_revert(version: str, tmp_path: Path, update_golden: bool) -> None:
    # The class, not the file: from 0.29 deepseek_v2.py's GlmMoeDsaForCausalLM is served from vllm/models/
    # (unsupported), so --model deepseek_v2 names an unsupported row (tests/planning/test_vllm_families.py).
    name = "DeepseekV3ForCausalLM"
    _check_golden(version, "deepseek_v2", "deepseek_v2.DeepseekV3ForCausalLM", tmp_path, update_golden, name=name)


@pytest.mark.parametrize(
    "version",
    [
        "0.17.0",
        pytest.param("0.11.2", marks=pytest.mark.slow),
        pytest.param("0.18.0", marks=pytest.mark.slow),
        pytest.param("0.34.0", marks=pytest.mark.slow),
    ],
)
def test_llama_before_and_with_the_mixin(version: str, tmp_path: Path, update_golden: bool, capsys) -> None:
    explain = ("explain", "--model", "LlamaForCausalLM", "--layer-ids", "0,2,3", "--num-layers", "6")

    def explained(package: Path) -> None:  # on the patched tree: hs[0] a copy, no alias or crash warning
        code, out, _ = run_cli(capsys, explain[0], str(package), *explain[1:])
        assert code == 0 and "warning" not in out and "hs[0], hs[2], hs[3]" in out, out

    rows = _check_golden(version, "llama", "llama.LlamaForCausalLM", tmp_path, update_golden, explained)
    mixin = version in ("0.18.0", "0.34.0")
    assert {e.kind.value for e in rows["llama.LlamaForCausalLM"].edits} == {"vllm-mixin" if mixin else "vllm-forward"}
    if mixin:  # one edit serves every mixin model: each row says so
        qwen3 = rows["qwen3.Qwen3ForCausalLM"]
        assert qwen3.status.value == "patched" and "via interfaces.py EagleModelMixin" in qwen3.message


@pytest.mark.parametrize("version", ["0.11.2", pytest.param("0.17.0", marks=pytest.mark.slow)])
def test_gpt_oss_threading_x(version: str, tmp_path: Path, update_golden: bool, capsys) -> None:
    """GPT-OSS before the mixin: its loop threads ``x`` (the embedding output, found by structure), and its
    capture fed the embedding tensor itself for id 0; patched, explain reads a copy of hs[0]."""
    explain = ("explain", "--model", "GptOssForCausalLM", "--layer-ids", "0,2,4", "--num-layers", "8")

    def explained(package: Path) -> None:
        code, out, _ = run_cli(capsys, explain[0], str(package), *explain[1:])
        assert code == 0 and "warning" not in out and "hs[0], hs[2], hs[4]" in out, out

    rows = _check_golden(version, "gpt_oss", "gpt_oss.GptOssForCausalLM", tmp_path, update_golden, explained)
    assert {e.kind.value for e in rows["gpt_oss.GptOssForCausalLM"].edits} == {"vllm-forward"}


def _check_golden(
    version: str, stem: str, proven: str, tmp_path: Path, update_golden: bool, on_patched=None, name: str = ""
) -> dict:
    package = _copy(version, tmp_path)
    models = package / "model_executor" / "models"
    pristine = {path: path.read_bytes() for path in models.glob("*.py")}
    options = Options(targets=(str(package),), models=(name or stem,), output_format="json", engine=ServingEngine.VLLM)
    applied = run_trees(options, Mode.APPLY)
    assert applied.code == 0
    rows = {m.model: m for m in applied.results[0].models}
    assert rows[proven].proof.value == "harness-passed"
    if stem == "deepseek_v2":
        assert rows["kimi_k25.KimiK25ForConditionalGeneration"].included_by
    diff = unified_diffs(applied.results[0].changes)
    golden = GOLDEN / "vllm" / version / f"{stem}.diff"
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(diff)
    assert diff == golden.read_text()
    assert run_trees(options, Mode.VERIFY).code == 0
    assert run_trees(options, Mode.CHECK).code == 0
    if on_patched is not None:
        on_patched(package)
    assert run_trees(options, Mode.REVERT).code == 0
    assert {path: path.read_bytes() for path in models.glob("*.py")} == pristine
    return rows


def test_a_vllm_tree_is_told_from_its_target(tmp_path: Path) -> None:
    package = _copy("0.34.0", tmp_path)
    checked = run_trees(Options(targets=(str(package),), models=("deepseek_v2",), output_format="json"), Mode.CHECK)
    assert checked.results[0].tree.engine == "vllm" and checked.code == 1  # would change: not applied yet


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_a_family_platform_module(version: str, tmp_path: Path, update_golden: bool, capsys) -> None:
    """DeepSeek-V3.2 (issue 46): vLLM serves it from vllm/models/deepseek_v32/, nvidia/ on CUDA and amd/ on ROCm,
    each module capturing at the top of each layer; ``--model DeepseekV32ForCausalLM`` patches both platform
    files, proven on the harness running each module, and the patched CUDA module feeds hs[0], hs[2], hs[4]."""
    package = _copy(version, tmp_path)
    pristine = {path: path.read_bytes() for path in package.rglob("*.py")}
    options = Options(
        targets=(str(package),), models=("DeepseekV32ForCausalLM",), output_format="json", engine=ServingEngine.VLLM
    )
    applied = run_trees(options, Mode.APPLY)
    assert applied.code == 0
    rows = {m.model: m for m in applied.results[0].models}
    for platform in ("nvidia", "amd"):
        assert rows[f"deepseek_v32.{platform}.DeepseekV32ForCausalLM"].proof.value == "harness-passed"
    diff = unified_diffs(applied.results[0].changes)
    golden = GOLDEN / "vllm" / version / "deepseek_v32.diff"
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(diff)
    assert diff == golden.read_text()
    assert "vllm/models/deepseek_v32/nvidia/model.py" in diff and "vllm/models/deepseek_v32/amd/model.py" in diff
    assert run_trees(options, Mode.VERIFY).code == 0
    assert run_trees(options, Mode.CHECK).code == 0
    label = "deepseek_v32.nvidia.DeepseekV32ForCausalLM"
    explain = ("explain", str(package), "--model", label, "--layer-ids", "0,2,4", "--num-layers", "8")
    code, out, _ = run_cli(capsys, *explain)
    assert code == 0 and "warning" not in out and "hs[0], hs[2], hs[4]" in out, out
    assert run_trees(options, Mode.REVERT).code == 0
    assert {path: path.read_bytes() for path in package.rglob("*.py")} == pristine


KIMI_ROWS = ("kimi_k3.nvidia.KimiLinearForCausalLM", "kimi_k3.nvidia.cuda-cpu.KimiK3ForConditionalGeneration")


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_kimi_linear_capture_before_the_loop(version: str, tmp_path: Path, update_golden: bool, capsys) -> None:
    """Kimi-Linear (issue 46): vLLM serves it on CUDA and CPU from vllm/models/kimi_k3/nvidia/model.py, whose forward
    appends the embedding tensor itself before its loop; ``apply`` makes that entry a copy (``vllm-before-loop``),
    proven on the harness running the module (Kimi-K3's row through its language model), and the patched tree feeds
    a copy of hs[0] on every platform that serves it; ``revert`` gives the release back byte for byte."""
    package, options, pristine, diff = _family_golden(
        version, tmp_path, update_golden, KIMI_ROWS[0], KIMI_ROWS, "vllm-before-loop", "kimi_k3"
    )
    assert "vllm/models/kimi_k3/nvidia/model.py" in diff and diff.count("\n+ ") == 2
    for platform in ("cuda", "cpu"):  # the platforms serving this module: a copy of hs[0], no alias warning
        explain = ("explain", str(package), "--model", KIMI_ROWS[0], "--layer-ids", "0,2,4", "--num-layers", "8")
        code, out, _ = run_cli(capsys, *explain, "--platform", platform)
        assert code == 0 and "warning" not in out and "): hs[0], hs[2], hs[4]\n" in out, out
    wrapper = ("explain", str(package), "--model", "KimiK3ForConditionalGeneration", "--layer-ids", "0,2,4")
    code, out, _ = run_cli(capsys, *wrapper, "--num-layers", "8")
    assert "cuda: hs[0], hs[2], hs[4]; " in out and "; cpu: hs[0], hs[2], hs[4]\n" in out, out
    assert run_trees(options, Mode.REVERT).code == 0
    assert {path: path.read_bytes() for path in package.rglob("*.py")} == pristine


def test_kimi_k3_whose_language_model_has_no_setter_runs_its_own_setter(tmp_path: Path, capsys) -> None:
    """0.27.0's Kimi-K3 (CUDA, XPU, CPU): its language model ``KimiLinearForCausalLM`` (nvidia/model.py) has no
    setter of its own, so the wrapper's setter runs, reaching ``self.language_model.model``; the edit is proven
    there (it was withheld, nothing else running that forward), and explain answers per platform."""
    package = _copy("0.27.0", tmp_path)
    pristine = {path: path.read_bytes() for path in package.rglob("*.py")}
    label = "kimi_k3.nvidia.KimiK3ForConditionalGeneration"
    options = Options(targets=(str(package),), models=(label,), output_format="json", engine=ServingEngine.VLLM)
    applied = run_trees(options, Mode.APPLY)
    rows = {m.model: m for m in applied.results[0].models}
    assert applied.code == 0 and rows[label].proof.value == "harness-passed", rows[label]
    wrapper = ("explain", str(package), "--model", "KimiK3ForConditionalGeneration", "--layer-ids", "0,2,4")
    code, out, _ = run_cli(capsys, *wrapper, "--num-layers", "8")
    assert "cuda: hs[0], hs[2], hs[4]; " in out and "; cpu: hs[0], hs[2], hs[4]\n" in out, out
    assert run_trees(options, Mode.REVERT).code == 0
    assert {path: path.read_bytes() for path in package.rglob("*.py")} == pristine


V4_ROWS = tuple(f"deepseek_v4.{p}.DeepseekV4ForCausalLM" for p in ("nvidia", "amd", "xpu", "cpu"))


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_deepseek_v4_capture_added_before_the_loop(version: str, tmp_path: Path, update_golden: bool, capsys) -> None:
    """DeepSeek-V4 (issue 46): vllm/models/deepseek_v4/{nvidia,amd,xpu,cpu}/model.py capture after each layer only,
    so id 0 captured nothing on any platform (the draft got one state fewer than its ids); ``apply`` adds id 0's
    capture before the loop (``vllm-add-capture``) in each platform's module, proven on the harness running that
    module as its platform runs it, and the patched tree feeds hs[0], hs[2], hs[4] on every platform, where the
    release fed hs[2], hs[4]; ``revert`` gives the release back byte for byte."""
    package = _copy(version, tmp_path)
    pristine = {path: path.read_bytes() for path in package.rglob("*.py")}
    explain = ("explain", str(package), "--model", "DeepseekV4ForCausalLM", "--layer-ids", "0,2,4", "--num-layers", "8")
    code, out, _ = run_cli(capsys, *explain)
    assert code == 1 and "id 0 captures nothing" in out and "cpu: hs[2], hs[4]\n" in out, out  # 1: a warning
    _, options, _, diff = _family_golden(
        version, tmp_path, update_golden, "DeepseekV4ForCausalLM", V4_ROWS, "vllm-add-capture", "deepseek_v4", package
    )
    for platform in ("nvidia", "amd", "xpu", "cpu"):
        assert f"vllm/models/deepseek_v4/{platform}/model.py" in diff
    code, out, _ = run_cli(capsys, *explain)
    fed = "cuda: hs[0], hs[2], hs[4]; rocm: hs[0], hs[2], hs[4]; xpu: hs[0], hs[2], hs[4]; cpu: hs[0], hs[2], hs[4]\n"
    assert code == 0 and "warning" not in out and fed in out, out
    assert run_trees(options, Mode.REVERT).code == 0
    assert {path: path.read_bytes() for path in package.rglob("*.py")} == pristine


def _family_golden(
    version: str,
    tmp_path: Path,
    update_golden: bool,
    model: str,
    labels: tuple[str, ...],
    kind: str,
    stem: str,
    package: Optional[Path] = None,
) -> tuple[Path, Options, dict, str]:
    """``apply --model MODEL`` on a copy of ``version``: each of ``labels`` patched by ``kind`` and harness-passed, the
    diff equal to golden/vllm/<version>/<stem>.diff, then ``verify`` and ``apply --check`` exit 0. Returns the package,
    the options, the pristine bytes of every file and the diff."""
    package = package or _copy(version, tmp_path)
    pristine = {path: path.read_bytes() for path in package.rglob("*.py")}
    options = Options(targets=(str(package),), models=(model,), output_format="json", engine=ServingEngine.VLLM)
    applied = run_trees(options, Mode.APPLY)
    assert applied.code == 0
    rows = {m.model: m for m in applied.results[0].models}
    for label in labels:
        assert rows[label].status.value == "patched" and rows[label].proof.value == "harness-passed", rows[label]
        assert {e.kind.value for e in rows[label].edits} == {kind}
    diff = unified_diffs(applied.results[0].changes)
    golden = GOLDEN / "vllm" / version / f"{stem}.diff"
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(diff)
    assert diff == golden.read_text()
    assert run_trees(options, Mode.VERIFY).code == 0
    assert run_trees(options, Mode.CHECK).code == 0
    return package, options, pristine, diff
