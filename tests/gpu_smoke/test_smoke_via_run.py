"""``--via-run``: the speculative engine gets the patch from an overlay, through ``patchcraft run``.

No GPU: the launch is checked as data, the overlay against a real release
(0.5.10, unpatched), and the whole chain end to end against the fake sglang
of test_cuda_smoke.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from patchcraft.base.errors import PatchcraftError
from patchcraft.gpu_smoke import engines, probe
from patchcraft.gpu_smoke import cuda_smoke as smoke

RELEASE = "0.5.10"
MODULE = "sglang.srt.models.deepseek_v2"

#: Where the process started by ``patchcraft run`` gets a module from: the parents stubbed
#: (``import sglang`` needs far more than a CPU box has, as in tests/commands/test_run.py).
CHILD = textwrap.dedent(
    """
    import importlib.util, sys, types
    spec = importlib.util.find_spec("sglang")
    root = spec.submodule_search_locations[0]
    for name, path in (("sglang", root), ("sglang.srt", root + "/srt"),
                       ("sglang.srt.models", root + "/srt/models"),
                       ("sglang.srt.model_executor", root + "/srt/model_executor")):
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module
    print(json.dumps({"sglang": root, **{name: importlib.util.find_spec(name).origin for name in sys.argv[1:]}}))
    """
).replace("import importlib.util, sys, types", "import importlib.util, json, sys, types")


def test_the_baseline_launch_is_the_plain_worker(tmp_path: Path) -> None:
    launch = engines.baseline_launch({"PYTHONPATH": "/site", probe.ENV_DIR: "/old", "HOME": "/h"})
    assert launch.command(tmp_path / "job.json") == [
        sys.executable,
        "-m",
        "patchcraft.gpu_smoke.worker",
        str(tmp_path / "job.json"),
    ]
    assert launch.env["PYTHONPATH"] == os.pathsep.join([str(engines.PROJECT_ROOT), "/site"])
    assert probe.ENV_DIR not in launch.env and launch.env["HOME"] == "/h"
    assert launch.expect_sglang_under is None


@pytest.mark.parametrize("overlay", [None, Path("/w/overlay")])
def test_the_speculative_launch_goes_through_patchcraft_run_with_an_overlay(
    tmp_path: Path, overlay: Path | None
) -> None:
    launch = engines.speculative_launch({"PYTHONPATH": "/site"}, Path("/w/sglang-probed"), Path("/w/probe"), overlay)
    worker = [sys.executable, "-m", "patchcraft.gpu_smoke.worker", str(tmp_path / "job.json")]
    through_run = [sys.executable, "-m", "patchcraft", "run", "--overlay", "/w/overlay", "--no-preflight", "--"]
    assert launch.command(tmp_path / "job.json") == (worker if overlay is None else through_run + worker)
    # The copy first: `patchcraft run` and the worker import it, the file the overlay was built from.
    assert launch.env["PYTHONPATH"] == os.pathsep.join(["/w/sglang-probed", str(engines.PROJECT_ROOT), "/site"])
    assert launch.env[probe.ENV_DIR] == "/w/probe" and launch.expect_sglang_under == "/w/sglang-probed"


@pytest.fixture(scope="module")
def probed_release(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An unpatched 0.5.10, its probed copy, and the overlay built from the copy."""
    from conftest import copy_release  # tests/conftest.py: the cached releases

    root = tmp_path_factory.mktemp("via-run")
    package = copy_release(RELEASE, root / "site")
    probed = probe.make_probed_sglang_copy(package, root / "sglang-probed")
    overlay = engines.build_overlay(probed, root / "overlay")
    return {"root": root, "package": package, "probed": probed, "overlay": overlay}


def test_the_overlay_is_built_from_the_probed_copy(probed_release: dict) -> None:
    manifest = json.loads((probed_release["overlay"] / "patchcraft_overlay.json").read_text())
    copy = probed_release["probed"] / "sglang"
    assert manifest["package"] == str(copy.resolve())
    assert MODULE in manifest["modules"]
    assert all(Path(entry["original"]).is_relative_to(copy.resolve()) for entry in manifest["modules"].values())
    # The runner file it serves still carries the probe: the patch is added to the probed text, not instead of it.
    runner = manifest["modules"].get("sglang.srt.model_executor.model_runner")
    if runner is not None:
        assert probe.MARKER in (probed_release["overlay"] / runner["file"]).read_text()
    assert probe.MARKER not in (probed_release["package"] / "srt" / "model_executor" / "model_runner.py").read_text()


def test_patchcraft_run_serves_the_patched_model_to_the_worker(probed_release: dict, tmp_path: Path) -> None:
    """The launch --via-run builds: `patchcraft run` accepts the overlay, and the command it starts gets the patched file."""
    launch = engines.speculative_launch(dict(os.environ), probed_release["probed"], tmp_path, probed_release["overlay"])
    command = [*launch.prefix, sys.executable, "-c", CHILD, MODULE, "sglang.srt.models.mindspore"]
    proc = subprocess.run(command, env=dict(launch.env), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    copy = probed_release["probed"] / "sglang"
    assert Path(seen["sglang"]).resolve() == copy.resolve()
    served = Path(seen[MODULE])
    # The overlay path links to a version directory; the server is given its real path (docs/run.md).
    assert served == probed_release["overlay"].resolve() / "tree" / "sglang" / "srt" / "models" / "deepseek_v2.py"
    assert (
        "# patchcraft:" in served.read_text()
        and "# patchcraft:" not in (copy / "srt" / "models" / "deepseek_v2.py").read_text()
    )
    assert Path(seen["sglang.srt.models.mindspore"]).resolve() == (copy / "srt" / "models" / "mindspore.py").resolve()


def test_an_install_patched_already_is_refused(probed_release: dict, tmp_path: Path) -> None:
    """--via-run on a patched install would test the install, not the overlay: exit 2, saying so."""
    patched = tmp_path / "patched"
    shutil.copytree(probed_release["overlay"] / "tree" / "sglang", patched / "sglang")  # the copy, patched
    with pytest.raises(PatchcraftError, match="patched already"):
        engines.build_overlay(patched, tmp_path / "overlay")


def test_run_cuda_smoke_via_run_end_to_end_with_fake_sglang(
    tmp_path, monkeypatch, capsys, hf_model, tiny_target
) -> None:
    """The whole chain with the spec worker started by `patchcraft run --overlay`; the fake's overlay serves nothing."""
    from .test_cuda_smoke import _fake_sglang, _prepare

    from patchcraft.gpu_smoke.engine_args import build_engine_kwargs
    from patchcraft.pipeline.serve import build_overlay as build
    from patchcraft.base.target import resolve_target

    site = tmp_path / "site"
    package = _fake_sglang(site, set(build_engine_kwargs("m", "d")) | {"cuda_graph_max_bs"})
    (package / "srt" / "models").mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setattr(smoke, "_check_cuda", lambda tp: 1)
    built = []

    def overlay_without_patches(probed_root: Path, directory: Path) -> Path:
        built.append(probed_root)
        return build(resolve_target(str(probed_root / "sglang")), directory, smoke=False).directory

    monkeypatch.setattr(smoke, "build_overlay", overlay_without_patches)
    launches = []

    def recorded(launch, *args, **kwargs):
        launches.append(launch)
        return engines.run_engine(launch, *args, **kwargs)

    monkeypatch.setattr(smoke, "run_engine", recorded)
    script, forwards = _prepare(tmp_path, hf_model)
    monkeypatch.setenv("FAKE_SGLANG_SCRIPT", str(script))
    monkeypatch.setenv("FAKE_SGLANG_FORWARDS", str(forwards))
    work = tmp_path / "work"
    code = smoke.run_cuda_smoke(
        None,
        str(tiny_target),
        None,
        [-1, 1, 2],
        "json",
        max_new_tokens=5,
        timeout_s=120,
        work_dir=str(work),
        via_run=True,
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"], out["checks"]
    assert built == [work / "sglang-probed"]
    assert [launch.prefix[2:5] for launch in launches] == [
        ("patchcraft", "run", "--overlay"),
        (),
    ]  # spec through run; baseline plain
    spec_job = json.loads((work / "spec-job.json").read_text())
    assert spec_job["expect_sglang_under"] == str(work / "sglang-probed")
    assert not (work / "overlay").exists() and not (work / "sglang-probed").exists()  # both removed
