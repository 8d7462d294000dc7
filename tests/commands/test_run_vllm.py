"""``patchcraft run -- vllm serve ...``: the vLLM patch served from an overlay, the install untouched.

No vLLM is installed and no GPU is used. The "install" is the fetched vLLM
0.34.0 tree copied into a fake site directory (on ``PYTHONPATH``), with its
``vllm/__init__.py`` and ``model_executor/models/__init__.py`` replaced by
one-line stand-ins (the real ones import torch and all of vLLM) and a
stand-in server: ``bin/vllm`` (the console script) and
``vllm/entrypoints/openai/api_server.py`` (for ``python -m``). The server
asks the import system for ``vllm.model_executor.models.deepseek_v2`` (the
overlay finder's whole job), says which file it got and whether
patchcraft's marker is in it, then starts a worker with multiprocessing's
``spawn`` (a new interpreter, as vLLM starts its workers) that does the same.
Everything lives in a world-readable temp directory and the server runs
on the system's ``python3.11``, so a step can run as ``nobody``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import run_cli, vllm_release_package
from drafts import kimi_target, sglang_draft, speculators_draft

RELEASE = "0.34.0"
MODULE = "vllm.model_executor.models.deepseek_v2"
SYSTEM_PYTHON = "/usr/bin/python3.11" if Path("/usr/bin/python3.11").exists() else None
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
MARKER = "# patchcraft:"

SERVER = f'''
import importlib.util, json, multiprocessing, sys


def where():
    try:
        origin = importlib.util.find_spec("{MODULE}").origin
    except ImportError as exc:
        return ["IMPORTERROR", str(exc)]
    with open(origin, encoding="utf-8") as handle:
        return [origin, "{MARKER}" in handle.read()]


def worker(queue):
    queue.put(where())


if __name__ == "__main__":
    print("ARGV " + json.dumps(sys.argv[1:]))
    print("SERVED " + json.dumps(where()))
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=worker, args=(queue,))
    process.start()
    print("WORKER " + json.dumps(queue.get(timeout=120)))
    process.join()
'''


def _digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest.update(str(path).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def world():
    """The fake site with vLLM 0.34.0, its stand-in server, a draft and a target, all readable by others."""
    root = Path(tempfile.mkdtemp(prefix="patchcraft-run-vllm-"))
    os.chmod(root, 0o755)
    try:
        site = root / "site"
        package = site / "vllm"
        shutil.copytree(vllm_release_package(RELEASE), package)
        (package / "__init__.py").write_text('"""A stand-in for vllm/__init__.py."""\n', encoding="utf-8")
        (package / "model_executor" / "models" / "__init__.py").write_text('"""A stand-in."""\n', encoding="utf-8")
        server = package / "entrypoints" / "openai" / "api_server.py"
        server.parent.mkdir(parents=True)
        (package / "entrypoints" / "__init__.py").write_text("", encoding="utf-8")
        (server.parent / "__init__.py").write_text("", encoding="utf-8")
        server.write_text(SERVER, encoding="utf-8")
        script = root / "bin" / "vllm"
        script.parent.mkdir()
        script.write_text(f"#!{SYSTEM_PYTHON or sys.executable}\n{SERVER}", encoding="utf-8")
        for path in [root, *root.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() or path == script else 0o644)
        yield {
            "root": root,
            "site": site,
            "package": package,
            "bin": script.parent,
            "before": _digest(package),
            "kimi": kimi_target(root / "kimi"),
            "draft": speculators_draft(root / "draft", [0, 3, 31]),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _env(world: dict, cache: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(world["site"]), PATCHCRAFT_CACHE=str(cache))
    env["PATH"] = os.pathsep.join([str(world["bin"]), env.get("PATH", "")])
    env.pop("PATCHCRAFT_NO_CACHE", None)
    return env


def _speculative(draft: Path) -> str:
    return json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3})


def _run(world: dict, tmp_path: Path, *args: str, server: list[str] | None = None) -> subprocess.CompletedProcess:
    command = server or ["vllm", "serve", str(world["kimi"]), "--speculative-config", _speculative(world["draft"])]
    return subprocess.run(
        [sys.executable, "-m", "patchcraft", "run", *args, "--", *command, "-tp", "8"],
        capture_output=True,
        text=True,
        env=_env(world, tmp_path / "cache"),
        timeout=600,
    )


def _line(out: str, tag: str) -> list:
    return json.loads(out.split(tag + " ", 1)[1].split("\n", 1)[0])


def test_vllm_serve_gets_the_patched_module_from_the_overlay(world: dict, tmp_path: Path) -> None:
    """The installed vllm found on PYTHONPATH, the overlay built, checked, exec'd: server and spawned worker patched."""
    proc = _run(world, tmp_path, "--no-smoke")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    origin, marked = _line(proc.stdout, "SERVED")
    assert marked and origin.startswith(str((tmp_path / "cache" / "overlays").resolve())), origin
    assert origin.endswith("/tree/vllm/model_executor/models/deepseek_v2.py")
    assert _line(proc.stdout, "WORKER") == [origin, True]  # multiprocessing spawn: a new interpreter, same overlay
    assert _line(proc.stdout, "ARGV")[:2] == ["serve", str(world["kimi"])]
    assert "ok: vLLM will feed the draft [hs[0], hs[3], hs[31]], as trained" in proc.stderr
    assert _digest(world["package"]) == world["before"]  # the install, byte for byte
    assert not list(world["package"].rglob("*.patchcraft*"))
    # Without the overlay, the same server imports the install's own, unpatched file.
    plain = subprocess.run(
        [str(world["bin"] / "vllm"), "serve"], capture_output=True, text=True, env=_env(world, tmp_path), timeout=300
    )
    assert _line(plain.stdout, "SERVED") == [str(world["package"] / "model_executor/models/deepseek_v2.py"), False]


def test_python_m_api_server_is_vllm_too(world: dict, tmp_path: Path) -> None:
    server = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(world["kimi"])]
    server += [f"--speculative_config={_speculative(world['draft'])}"]
    proc = _run(world, tmp_path, "--no-smoke", server=server)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _line(proc.stdout, "SERVED")[1] is True and _line(proc.stdout, "WORKER")[1] is True


def test_a_draft_fed_other_states_is_not_launched(world: dict, tmp_path: Path) -> None:
    """The incident's config (ids only in eagle_config): vLLM serves its defaults, not what the draft was trained on."""
    draft = sglang_draft(tmp_path / "sgdraft", [2, 30, 58])
    server = ["vllm", "serve", str(world["kimi"]), "--speculative-config", _speculative(draft)]
    proc = _run(world, tmp_path, "--no-smoke", "--trained-on", "hf:0,3,31", server=server)
    assert proc.returncode == 1 and "ARGV" not in proc.stdout, proc.stdout + proc.stderr
    # check-draft --engine vllm's report (stdout), its proven fix on the overlay's patched tree, then the refusal.
    assert "vLLM will feed hs[2], hs[30], hs[58] but the draft was trained on hs[0], hs[3], hs[31]" in proc.stdout
    assert (
        "suggested: set top-level eagle_aux_hidden_state_layer_ids = [0, 3, 31] (this vLLM tree as it is: no patch "
        "needed) [proven by running the code on the CPU harness: vLLM 0.34.0 feeds hs[0], hs[3], hs[31]]"
    ) in proc.stdout, proc.stdout
    assert "refused to launch" in proc.stderr and "--no-preflight" in proc.stderr
    # Without --trained-on, a config that names no pipeline is refused before any check, in one line.
    proc = _run(world, tmp_path, "--no-smoke", server=server)
    assert proc.returncode == 1 and "ARGV" not in proc.stdout
    assert proc.stderr.strip().count("\n") == 0 and "--trained-on" in proc.stderr and "--no-preflight" in proc.stderr


def test_what_cannot_be_read_is_one_line_exit_2(world: dict, tmp_path: Path) -> None:
    for server in (
        ["vllm", "serve", str(world["kimi"]), "--speculative-config.method", "eagle3"],
        ["vllm", "serve", str(world["kimi"]), "--speculative-config", json.dumps({"model": str(world["draft"])})],
        ["vllm", "serve", str(tmp_path / "nowhere"), "--speculative-config", _speculative(world["draft"])],
    ):
        proc = _run(world, tmp_path, "--no-smoke", server=server)
        assert proc.returncode == 2 and "ARGV" not in proc.stdout, proc.stdout + proc.stderr
        assert proc.stderr.strip().count("\n") == 0 and "--no-preflight" in proc.stderr, proc.stderr
    proc = _run(world, tmp_path, "--no-smoke", "--no-preflight", server=server)
    assert proc.returncode == 0 and _line(proc.stdout, "SERVED")[1] is True


def test_a_withheld_patch_is_not_served(world: dict, tmp_path: Path, capsys, monkeypatch) -> None:
    """The harness fails the vLLM proof: nothing is built, nothing is exec'd (exit 2, the row's words)."""
    pytest.importorskip("torch")
    from patchcraft.base.status import HarnessStatus
    from patchcraft.harness import vllm_proof
    from patchcraft.harness.runner import SmokeResult

    def failing(package, label, path, *args, **kwargs):
        return SmokeResult(label, path, HarnessStatus.FAIL, "vllm-id-0: planted failure")

    monkeypatch.setattr(vllm_proof, "prove_model", failing)
    monkeypatch.setattr(os, "execvpe", lambda *a: pytest.fail(f"exec'd {a[0]}"))
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "cache"))
    code, _, err = run_cli(
        capsys, "run", "--target", str(world["package"]), "--trained-on", "speculators", "--", "vllm", "serve", "x"
    )
    assert code == 2 and "no overlay was built" in err, err
    assert not list((tmp_path / "cache").glob("overlays/*/tree"))
    assert _digest(world["package"]) == world["before"]


def test_a_damaged_overlay_is_refused(world: dict, tmp_path: Path) -> None:
    """--overlay DIR: a served file changed is named, exit 2; and the bootstrap itself refuses to serve it."""
    overlay = tmp_path / "overlay"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "patchcraft",
            "overlay",
            "build",
            str(world["package"]),
            "--out",
            str(overlay),
            "--no-smoke",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0 and build.stdout.strip() == f"PYTHONPATH={overlay}", build.stderr
    served = overlay / "tree" / "vllm" / "model_executor" / "models" / "deepseek_v2.py"
    proc = _run(world, tmp_path, "--overlay", str(overlay), "--no-preflight")
    assert proc.returncode == 0 and _line(proc.stdout, "SERVED") == [str(served.resolve()), True], proc.stderr
    served.resolve().chmod(0o644)
    served.resolve().write_text(served.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    proc = _run(world, tmp_path, "--overlay", str(overlay), "--no-preflight")
    assert proc.returncode == 2 and "ARGV" not in proc.stdout
    assert "deepseek_v2.py" in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    # On PYTHONPATH without patchcraft run: the import raises, naming the file; never the unpatched install.
    env = dict(_env(world, tmp_path), PYTHONPATH=os.pathsep.join([str(overlay), str(world["site"])]))
    direct = subprocess.run([str(world["bin"] / "vllm"), "serve"], capture_output=True, text=True, env=env, timeout=300)
    status, message = _line(direct.stdout, "SERVED")
    assert status == "IMPORTERROR" and "deepseek_v2.py" in message and "rebuild" in message


def test_an_overlay_of_sglang_is_not_served_to_vllm(world: dict, tmp_path: Path) -> None:
    from conftest import copy_release

    package = copy_release("0.5.10", tmp_path / "sglang")
    overlay = tmp_path / "overlay"
    build = subprocess.run(
        [sys.executable, "-m", "patchcraft", "overlay", "build", str(package), "--out", str(overlay), "--no-smoke"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr
    proc = _run(world, tmp_path, "--overlay", str(overlay), "--no-preflight", "--target", str(world["package"]))
    assert proc.returncode == 2 and "an overlay of sglang, but the command serves vllm" in proc.stderr, proc.stderr


@pytest.mark.skipif(SYSTEM_PYTHON is None or shutil.which("setpriv") is None, reason="needs python3.11 and setpriv")
def test_a_server_running_as_nobody_gets_the_patch(world: dict) -> None:
    """``--engine vllm`` (the command is setpriv): the overlay is readable by an unprivileged server and its worker."""
    if os.getuid() != 0:
        pytest.skip("setpriv to another user needs root")
    overlay = world["root"] / "overlay-nobody"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "patchcraft",
            "overlay",
            "build",
            str(world["package"]),
            "--out",
            str(overlay),
            "--no-smoke",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr
    server = [*NOBODY, str(world["bin"] / "vllm"), "serve", str(world["kimi"])]
    server += ["--speculative-config", _speculative(world["draft"])]
    proc = subprocess.run(
        [sys.executable, "-m", "patchcraft", "run", "--engine", "vllm", "--overlay", str(overlay), "--no-preflight"]
        + ["--target", str(world["package"]), "--", *server],
        capture_output=True,
        text=True,
        env=_env(world, world["root"] / "cache-nobody"),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    served = str((overlay / "tree" / "vllm" / "model_executor" / "models" / "deepseek_v2.py").resolve())
    assert _line(proc.stdout, "SERVED") == [served, True]
    assert _line(proc.stdout, "WORKER") == [served, True]
    assert _digest(world["package"]) == world["before"]


def test_a_target_on_the_side_the_harness_does_not_run_is_not_launched(world: dict, tmp_path: Path) -> None:
    """Kimi-K3 with attention residuals (its config sets attn_res_block_size): the harness ran the other side, so
    what the server would feed the draft is not shown, and the preflight says that, not "other states"."""
    target = kimi_target(tmp_path / "k3")
    config = json.loads((target / "config.json").read_text())
    config["architectures"] = ["KimiK3ForConditionalGeneration"]
    config["text_config"]["attn_res_block_size"] = 6
    (target / "config.json").write_text(json.dumps(config))
    draft = speculators_draft(tmp_path / "draft", [2, 30, 58])
    server = ["vllm", "serve", str(target), "--speculative-config", _speculative(draft)]
    proc = _run(world, tmp_path, "--no-smoke", "--trained-on", "hf:2,30,58", server=server)
    assert proc.returncode == 1 and "ARGV" not in proc.stdout, proc.stdout + proc.stderr
    assert "FAIL  config" in proc.stdout and "sets attn_res_block_size = 6" in proc.stdout
    assert "refused to launch: what the server would feed the draft is not shown" in proc.stderr, proc.stderr
