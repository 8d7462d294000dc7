"""patchcraft.reading.vllm_norm_dispatch: which add-norm each platform and compilation runs, read from real releases."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import vllm_release_package
from patchcraft.reading.vllm_norm_dispatch import read_norm_dispatch, setting_for


def _by_label(package: Path) -> dict[str, tuple[object, str]]:
    return {s.label: (s.in_place, s.kernel) for s in read_norm_dispatch(package)}


def test_0_32_0_ir_era() -> None:
    """CPU runs the functional native add-norm in both modes; CUDA runs vllm_c in place only without compilation."""
    found = _by_label(vllm_release_package("0.32.0"))
    assert found["cpu eager"] == (False, "native") and found["cpu compiled"] == (False, "native")
    assert found["cuda eager"] == (True, "vllm_c") and found["cuda compiled"] == (False, "native")
    eager = setting_for(read_norm_dispatch(vllm_release_package("0.32.0")), "cuda", "eager")
    assert len(eager) == 1 and "platforms/cuda.py:" in eager[0].why and "kernels/vllm_c.py:" in eager[0].why


def test_0_18_0_custom_op_era() -> None:
    """Before the IR ops: custom ops on (eager) run forward_cuda's C kernel in place; CPU falls back to forward_native."""
    found = _by_label(vllm_release_package("0.18.0"))
    assert found["cuda eager"] == (True, "RMSNorm.forward_cuda")
    assert found["cuda compiled"] == (False, "RMSNorm.forward_native")
    assert found["cpu eager"] == (False, "RMSNorm.forward_native")


def _copy(tmp_path: Path, version: str) -> Path:
    package = tmp_path / "vllm"
    shutil.copytree(vllm_release_package(version), package)
    return package


def test_a_platform_that_picks_an_in_place_kernel_is_read_so(tmp_path: Path) -> None:
    """Broken input: CPU's platform given vllm_c first, or vllm_c registered without inplace: the reading follows."""
    package = _copy(tmp_path, "0.32.0")
    cpu = package / "platforms" / "cpu.py"
    cpu.write_text(
        cpu.read_text(encoding="utf-8")
        + "\n\nclass _Extra:\n    @classmethod\n    def get_default_ir_op_priority(cls, vllm_config):\n"
        "        from vllm.config.kernel import IrOpPriorityConfig\n"
        "        return IrOpPriorityConfig.with_default(['vllm_c', 'native'])\n",
        encoding="utf-8",
    )
    assert _by_label(package)["cpu eager"] == (True, "vllm_c")
    kernel = package / "kernels" / "vllm_c.py"
    kernel.write_text(kernel.read_text(encoding="utf-8").replace("inplace=True", "inplace=False"), encoding="utf-8")
    assert _by_label(package)["cuda eager"] == (False, "vllm_c")


def test_what_cannot_be_read_is_said(tmp_path: Path) -> None:
    package = _copy(tmp_path, "0.32.0")
    (package / "model_executor" / "layers" / "layernorm.py").unlink()
    settings = read_norm_dispatch(package)
    assert {s.in_place for s in settings} == {None} and "layernorm.py is not in this tree" in settings[0].why
