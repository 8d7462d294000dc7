import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patchcraft.gpu_smoke import run as smoke

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_smoke.sh"


def test_module_main_rejects_bad_layer_ids(capsys):
    assert smoke.main(["--layer-ids", "x,1"]) == 2
    assert "layer ids must be integers" in capsys.readouterr().err


def test_module_main_forwards_arguments(monkeypatch):
    seen = {}

    def fake(tp, model_path, draft_path, layer_ids, output_format, **kw):
        seen.update(tp=tp, model=model_path, draft=draft_path, ids=layer_ids, fmt=output_format, **kw)
        return 1

    monkeypatch.setattr(smoke, "run_cuda_smoke", fake)
    rc = smoke.main(["--tp", "8", "--model-path", "/m", "--draft-path", "/d", "--layer-ids", "-1,2,30", "--format", "json"])
    assert rc == 1
    assert seen["tp"] == 8 and seen["model"] == "/m" and seen["draft"] == "/d"
    assert seen["ids"] == [-1, 2, 30] and seen["fmt"] == "json"


def test_package_import_is_lazy():
    code = (
        "import sys, patchcraft.gpu_smoke, patchcraft.gpu_smoke.run, patchcraft.gpu_smoke.worker;"
        "print(sorted(m for m in ('torch', 'transformers', 'sglang', 'safetensors') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_script_syntax_and_no_gpu_exit(tmp_path):
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2
    assert "no NVIDIA GPU visible" in p.stderr
