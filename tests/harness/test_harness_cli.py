"""``patchcraft smoke`` and ``patchcraft verify --smoke``: exit codes, reports, torch only when asked."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from harness_support import root_conftest

from patchcraft.cli import main

RELEASE = "0.5.10"
DEEPSEEK = "deepseek_v2.DeepseekV2ForCausalLM"
EXAONE = "exaone_moe.ExaoneMoEForCausalLM"


def _run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code


def _hand_fixed(package: Path, clone: bool, stem: str = "deepseek_v2") -> Path:
    """A model file (deepseek_v2.py by default) with the three sed edits users apply by hand (docs: the field fix)."""
    path = package / "srt" / "models" / f"{stem}.py"
    text = path.read_text(encoding="utf-8")
    entry = (
        "hidden_states.clone() if residual is None else hidden_states + residual"
        if clone
        else ("hidden_states if residual is None else hidden_states + residual")
    )
    edits = [
        (
            "        self.layers_to_capture = []\n",
            "        self.layers_to_capture = []\n        self.capture_embedding_for_eagle3 = False\n",
        ),
        (
            "            self.model.layers_to_capture = [val + 1 for val in layer_ids]\n",
            "            self.model.capture_embedding_for_eagle3 = (-1 in layer_ids)\n"
            "            self.model.layers_to_capture = [val + 1 for val in layer_ids if val >= 0]\n",
        ),
        (
            "        aux_hidden_states = []\n",
            "        aux_hidden_states = []\n"
            "        if self.capture_embedding_for_eagle3:\n"
            f"            aux_hidden_states.append({entry})\n",
        ),
    ]
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def release_tree(tmp_path: Path) -> Path:
    return root_conftest().copy_release(RELEASE, tmp_path / RELEASE)


def test_smoke_passes_on_a_patched_tree(release_tree: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    qwen2 = str(release_tree / "srt" / "models" / "qwen2.py")
    assert _run(["apply", "--no-runner", qwen2]) == 0
    capsys.readouterr()
    assert _run(["smoke", "--no-runner", qwen2]) == 0
    err = capsys.readouterr().err
    assert "PASS  qwen2.Qwen2ForCausalLM" in err and "FAIL" not in err


def test_verify_refuses_a_hand_fix_without_clone(release_tree: Path, capsys: pytest.CaptureFixture) -> None:
    """A hand fix is judged by what it does: an un-copied embedding fails plain verify, naming the line."""
    target = [str(_hand_fixed(release_tree, clone=False)), "--model", DEEPSEEK]
    capsys.readouterr()
    assert _run(["verify", "--no-runner", *target]) == 1  # the model's error row
    err = capsys.readouterr().err
    assert "does not append a copy of the embedding output" in err


def test_the_field_hand_fix_captures_the_received_tensor_on_a_later_stage(
    release_tree: Path, capsys: pytest.CaptureFixture
) -> None:
    """With .clone(), the sed fix is right on one stage; with no first-stage gate it is not on a later one.

    (On deepseek_v2.py itself the field fix is incomplete since 0.5.8: Glm4MoeLiteModel runs the same
    forward with its own __init__, which the fix leaves without the flag; exaone_moe.py stands alone.)
    """
    pytest.importorskip("torch")
    target = str(_hand_fixed(release_tree, clone=True, stem="exaone_moe"))
    assert _run(["verify", "--smoke", "--no-runner", "--format", "json", target, "--model", EXAONE]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["command"] == "verify" and document["smoke"]["device"] == "cpu"
    (row,) = [r for r in document["smoke"]["models"] if r["model"] == EXAONE]
    checks = {c["name"]: c for c in row["checks"]}
    assert row["status"] == "fail" and row["seconds"] > 0
    assert all(checks[name]["status"] == "pass" for name in ("init", "capture", "same", "default"))
    assert checks["pipeline"]["status"] == "fail"
    assert "-1 was accepted" in checks["pipeline"]["detail"] and "got 3 [received hs[4]" in checks["pipeline"]["detail"]


def test_smoke_on_an_unpatched_tree_skips_and_exits_1(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    pristine = str(root_conftest().release_package(RELEASE))
    assert _run(["smoke", "--no-runner", pristine, "--model", "qwen2"]) == 1
    err = capsys.readouterr().err
    assert "skip  qwen2.Qwen2ForCausalLM" in err and "would-patch" in err


def test_without_torch_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import patchcraft.harness as harness

    fake = types.SimpleNamespace(util=types.SimpleNamespace(find_spec=lambda name: None))
    monkeypatch.setattr(harness, "importlib", fake)
    assert _run(["smoke", str(root_conftest().release_package(RELEASE))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "patchcraft: error: the CPU smoke harness needs torch, which is not installed: pip install 'patchcraft[smoke]'"
    ]


def test_torch_that_fails_to_import_is_one_line_exit_2(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from patchcraft.cli import main\n"
        f"main(['verify', '--smoke', {str(root_conftest().release_package(RELEASE))!r}])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs torch" in lines[0] and "Traceback" not in proc.stderr


def test_torch_is_not_imported_by_help_apply_no_smoke_or_verify(release_tree: Path) -> None:
    """torch loads only to prove something: apply's harness (``--no-smoke`` skips it), hand-made edits in verify."""
    target = str(release_tree / "srt" / "models" / "qwen2.py")
    code = (
        "import sys\n"
        "from patchcraft.cli import main\n"
        f"for argv in (['--help'], ['smoke', '--help'], ['apply', '--no-runner', '--no-smoke', {target!r}], ['verify', '--no-runner', {target!r}]):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "NO-TORCH", proc.stdout + proc.stderr


def test_cuda_device_without_the_gpu_module_is_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "patchcraft.gpu_smoke.cuda_smoke", None)
    assert _run(["smoke", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA smoke test is not available" in err[0]


def test_cuda_device_calls_the_gpu_smoke_test(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    fake = types.ModuleType("patchcraft.gpu_smoke.cuda_smoke")
    fake.run_cuda_smoke = lambda **kwargs: calls.append(kwargs) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "patchcraft.gpu_smoke.cuda_smoke", fake)
    assert _run(["smoke", "--device", "cuda", "--format", "json"]) == 0
    assert calls == [{"tp": None, "model_path": None, "draft_path": None, "layer_ids": None, "output_format": "json"}]


def test_cuda_device_takes_no_target(capsys: pytest.CaptureFixture) -> None:
    assert _run(["smoke", "--device", "cuda", "some/target"]) == 2
    assert "takes no TARGET" in capsys.readouterr().err
