"""patchcraft.base.vllm_fetch: a vLLM release's Python kept slim, checked against the wheel's RECORD.

The offline cases build a small wheel named vllm 9.9.9 (a model file, a
runner, a compiled kernel) and let pip "download" it from a local
directory (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``); the real-release case
reads 0.18.0 through the suite's cache (conftest.vllm_release_package).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from conftest import run_cli, vllm_release_package
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.fetch import digest, slim_wheel, unpack
from patchcraft.base.vllm_fetch import PARTS_REVISION, find_slim, kept, slim_name, fetch_vllm

FAKE = "9.9.9"
MODEL = b"from vllm.config import VllmConfig\nclass LlamaModel:\n    pass\n"


def _wheel(into: Path, damage: bool = False) -> Path:
    members = {
        "vllm/__init__.py": b"",
        "vllm/_version.py": f"__version__ = version = '{FAKE}'\n".encode(),
        "vllm/model_executor/models/llama.py": MODEL,
        "vllm/v1/worker/gpu_model_runner.py": b"class GPUModelRunner:\n    pass\n",
        "vllm/entrypoints/cli.py": b"print('not read')\n",
        "vllm/_C.abi3.so": b"\x7fELF" + b"\0" * 64,
    }
    info = f"vllm-{FAKE}.dist-info"
    members[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: vllm\nVersion: {FAKE}\n".encode()
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    rows = [f"{name},{digest(data)},{len(data)}" for name, data in members.items()]
    if damage:  # the model file's bytes no longer match its RECORD row
        members["vllm/model_executor/models/llama.py"] = MODEL + b"# edited\n"
    members[f"{info}/RECORD"] = ("\n".join(rows + [f"{info}/RECORD,,"]) + "\n").encode()
    into.mkdir(parents=True, exist_ok=True)
    path = into / f"vllm-{FAKE}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_kept_is_the_python_patchcraft_reads() -> None:
    assert kept("vllm/model_executor/models/deepseek_v2.py")
    assert kept("vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py")
    assert kept("vllm/config/speculative.py") and kept("vllm/_version.py")
    assert not kept("vllm/entrypoints/cli.py")
    assert not kept("vllm/_C.abi3.so")
    assert not kept("vllm/model_executor/models/README.md")
    assert not kept("sglang/srt/models/llama.py")


def test_fetch_keeps_a_slim_archive_not_the_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _wheel(tmp_path / "index")
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    package = fetch_vllm(FAKE)
    wheels = tmp_path / "cache" / "wheels"
    assert sorted(p.name for p in wheels.iterdir()) == [slim_name(FAKE)]  # no wheel, no staging left
    assert (package / "model_executor" / "models" / "llama.py").read_bytes() == MODEL
    assert not (package / "entrypoints").exists() and not (package / "_C.abi3.so").exists()
    with zipfile.ZipFile(wheels / slim_name(FAKE)) as slim:
        record = slim.read(f"vllm-{FAKE}.dist-info/RECORD").decode()
    assert f"vllm/model_executor/models/llama.py,{digest(MODEL)}," in record and "entrypoints" not in record
    assert fetch_vllm(FAKE) == package  # the second fetch finds it


def test_a_member_that_does_not_match_the_record_is_refused(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, damage=True)
    with pytest.raises(PatchcraftError) as refused:
        slim_wheel(wheel, tmp_path / slim_name(FAKE), kept)
    assert "llama.py does not match the wheel's RECORD" in str(refused.value)
    assert find_slim(tmp_path, FAKE) is None  # nothing half-written


def test_an_edited_unpacked_file_is_refused_against_the_slim_record(tmp_path: Path) -> None:
    slim = slim_wheel(_wheel(tmp_path / "w"), tmp_path / slim_name(FAKE), kept)
    tampered = tmp_path / "tampered.zip"
    with zipfile.ZipFile(slim) as source, zipfile.ZipFile(tampered, "w") as out:
        for name in source.namelist():
            data = source.read(name)
            out.writestr(name, data + b"# x\n" if name.endswith("llama.py") else data)
    with pytest.raises(PatchcraftError) as refused:
        unpack(tampered, tmp_path / "release", "vllm", "model_executor/models")
    assert "differ from tampered.zip's RECORD" in str(refused.value)


def test_a_real_release_is_a_few_mb_of_python() -> None:
    package = vllm_release_package("0.18.0")
    files = [p for p in package.rglob("*") if p.is_file()]
    assert all(p.suffix == ".py" for p in files)
    assert (package / "model_executor" / "models" / "deepseek_v2.py").is_file()
    assert (package / "v1" / "worker" / "gpu" / "spec_decode" / "eagle" / "eagle3_utils.py").is_file()
    assert sum(p.stat().st_size for p in files) < 30_000_000


def test_cli_fetch_engine_vllm_prints_the_package(tmp_path: Path, monkeypatch, capsys) -> None:
    _wheel(tmp_path / "index")
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    code, out, err = run_cli(capsys, "fetch", "--engine", "vllm", FAKE)
    assert code == 0 and out.strip().endswith(f"releases/vllm-{FAKE}/vllm")
    code, out, err = run_cli(capsys, "fetch", "--engine", "vllm", "not a version")
    assert code == 2 and err.count("\n") == 1 and "is not a release version" in err


def test_a_release_unpacked_with_other_parts_is_unpacked_again(tmp_path: Path, monkeypatch) -> None:
    _wheel(tmp_path / "index")
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    package = fetch_vllm(FAKE)
    (package.parent / "PATCHCRAFT_PARTS").write_text("1\n")  # as an older patchcraft left it
    (package / "model_executor" / "models" / "stale.py").write_text("# not in this revision's archive\n")
    assert fetch_vllm(FAKE) == package
    assert not (package / "model_executor" / "models" / "stale.py").exists()
    assert (package.parent / "PATCHCRAFT_PARTS").read_text() == f"{PARTS_REVISION}\n"
