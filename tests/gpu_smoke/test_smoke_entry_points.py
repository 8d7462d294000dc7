import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_smoke.sh"


def test_package_import_is_lazy():
    code = (
        "import sys, patchcraft.gpu_smoke, patchcraft.gpu_smoke.cuda_smoke, patchcraft.gpu_smoke.worker, patchcraft.gpu_smoke.engines;"
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


def _gpu_ok_env(tmp_path, pythonpath):
    """A PATH whose nvidia-smi reports one GPU, and a PYTHONPATH whose ``pip`` fails."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-fake)'\n")
    smi.chmod(0o755)
    fake_pip = tmp_path / "fakepip" / "pip"
    fake_pip.mkdir(parents=True)
    (fake_pip / "__init__.py").write_text("")
    (fake_pip / "__main__.py").write_text(
        "import sys\nprint('ERROR: Could not find a version that satisfies the requirement (fake pip)', file=sys.stderr)\nsys.exit(1)\n"
    )
    env = dict(os.environ, PATH=f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}", PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "fakepip"), *pythonpath])
    for k in ("SKIP_INSTALL", "SGLANG_VERSION", "WHEEL_DIR"):
        env.pop(k, None)
    return env


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_script_install_failure_is_exit_2(tmp_path):
    # sglang missing: installing sglang==0.5.10 (the default) fails -> 2, not pip's 1
    p = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env=_gpu_ok_env(tmp_path, []), timeout=120
    )
    assert p.returncode == 2, p.stderr
    assert "installing sglang==0.5.10" in p.stderr
    assert "environment error: pip install sglang==0.5.10 failed" in p.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_script_patchcraft_install_failure_is_exit_2(tmp_path):
    # sglang 0.5.10 "installed" (metadata only): the next install, patchcraft[smoke], fails -> 2
    site = tmp_path / "site"
    dist = site / "sglang-0.5.10.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.10\n")
    p = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env=_gpu_ok_env(tmp_path, [str(site)]), timeout=120
    )
    assert p.returncode == 2, p.stderr
    assert "installing sglang" not in p.stderr
    assert "environment error: pip install -e .[smoke] failed" in p.stderr


def _fake_tools(tmp_path):
    """nvidia-smi with one GPU, a PYTHON that passes every check, and a patchcraft that logs its arguments."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    tools = {
        "nvidia-smi": "#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-fake)'\n",
        "python-fake": "#!/bin/sh\ncat >/dev/null\necho 0.5.10\n",
        "patchcraft": f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\n',
    }
    for name, text in tools.items():
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHON=str(fake_bin / "python-fake"),
        SKIP_INSTALL="1",
    )
    env["SMOKE_OUT"] = str(tmp_path / "out")
    return env


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
@pytest.mark.parametrize("mode", ["apply", "run"])
def test_script_modes(tmp_path, mode):
    """MODE=apply patches the install first; MODE=run leaves it alone and asks the smoke for --via-run."""
    env = _fake_tools(tmp_path)
    env["MODE"] = mode
    p = subprocess.run(["bash", str(SCRIPT), "--layer-ids=-1,1,2"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    smoke = f"smoke --device cuda --tp 1 --format text --timeout 200 --out {tmp_path / 'out'} --layer-ids=-1,1,2"
    if mode == "apply":
        assert calls == ["apply", "verify --model deepseek_v2", smoke]
    else:
        assert calls == [smoke.replace("--device cuda", "--device cuda --via-run")]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_script_unknown_mode_is_exit_2(tmp_path):
    p = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env=dict(_fake_tools(tmp_path), MODE="patch"), timeout=60
    )
    assert p.returncode == 2 and "usage error: MODE=patch (apply or run)" in p.stderr
