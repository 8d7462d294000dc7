"""``patchcraft run`` and the overlay, in real subprocesses against a real SGLang release.

SGLang 0.5.10 is installed with ``pip install --no-deps`` into a throwaway
venv. ``import sglang`` itself needs far more than is installed, so the
child processes stub the parent packages (``sglang``, ``sglang.srt``,
``sglang.srt.models``) with their real directories as ``__path__``, and ask
``importlib.util.find_spec`` for the patched module: that is the finder's
whole job.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import install_release
from drafts import kimi_target, sglang_draft

from run_child import CHILD, MODULE, RELEASE


def _digest(package: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path).encode() + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A venv with SGLang installed (no dependencies), and an overlay built for it."""
    root = tmp_path_factory.mktemp("run")
    package = install_release(RELEASE, root / "venv")
    python = root / "venv" / "bin" / "python"
    before = _digest(package)
    overlay = root / "overlay"
    build = subprocess.run(
        [sys.executable, "-m", "patchcraft", "overlay", "build", str(package), "--out", str(overlay), "--no-smoke"],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    assert build.stdout.strip() == f"PYTHONPATH={overlay}"
    return {"python": python, "package": package, "overlay": overlay, "before": before, "root": root}


def _child(install: dict, module: str = MODULE, pythonpath: str | None = None, code: str = CHILD) -> str:
    env = dict(os.environ, PYTHONPATH=pythonpath or str(install["overlay"]))
    proc = subprocess.run(
        [str(install["python"]), "-c", code, str(install["package"]), module],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_patched_module_comes_from_the_overlay(install: dict) -> None:
    origin = _child(install).split("ORIGIN ", 1)[1].strip()
    # The real path of the version the overlay path links to (overlay_store): what the process resolved at start.
    assert origin == str(install["overlay"].resolve() / "tree" / "sglang" / "srt" / "models" / "deepseek_v2.py")
    assert "# patchcraft:" in Path(origin).read_text(encoding="utf-8")
    # A module patchcraft did not patch is left to the normal import system.
    assert _child(install, "sglang.srt.models.mindspore").split("ORIGIN ", 1)[1].strip() == str(
        install["package"] / "srt" / "models" / "mindspore.py"
    )
    # Without the overlay on the path, the install's own file.
    plain = _child(install, pythonpath=str(install["root"]))
    assert plain.split("ORIGIN ", 1)[1].strip() == str(install["package"] / "srt" / "models" / "deepseek_v2.py")


def test_a_spawned_grandchild_sees_the_overlay_too(install: dict) -> None:
    code = CHILD.replace(
        '    print("ORIGIN", importlib.util.find_spec(sys.argv[2]).origin)', "    pass"
    ) + textwrap.dedent(
        """
        import multiprocessing, subprocess

        def grandchild(root, name, queue):
            import importlib.util, sys, types
            for part, path in (("sglang", root), ("sglang.srt", root + "/srt"), ("sglang.srt.models", root + "/srt/models")):
                module = types.ModuleType(part)
                module.__path__ = [path]
                sys.modules[part] = module
            queue.put(importlib.util.find_spec(name).origin)

        if __name__ == "__main__":
            context = multiprocessing.get_context("spawn")
            queue = context.Queue()
            process = context.Process(target=grandchild, args=(sys.argv[1], sys.argv[2], queue))
            process.start()
            print("GRANDCHILD", queue.get(timeout=60))
            process.join()
        """
    )
    script = install["root"] / "spawn_child.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(install["overlay"]))
    proc = subprocess.run(
        [str(install["python"]), str(script), str(install["package"]), MODULE],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("GRANDCHILD ", 1)[1].strip().startswith(str(install["overlay"].resolve()))


def test_an_existing_sitecustomize_still_runs(install: dict) -> None:
    theirs = install["root"] / "theirs"
    theirs.mkdir(exist_ok=True)
    (theirs / "sitecustomize.py").write_text("print('THEIR-SITECUSTOMIZE')\n", encoding="utf-8")
    out = _child(install, pythonpath=os.pathsep.join([str(install["overlay"]), str(theirs)]))
    assert "THEIR-SITECUSTOMIZE" in out and f"ORIGIN {install['overlay'].resolve()}" in out


def test_the_installed_tree_is_unchanged(install: dict) -> None:
    _child(install)
    assert _digest(install["package"]) == install["before"]
    assert not list(install["package"].rglob("*.py.patchcraft*"))


def test_a_changed_install_is_refused_by_name(install: dict) -> None:
    """SGLang upgraded under a built overlay: the finder raises, naming the file; never serves stale code."""
    path = install["package"] / "srt" / "models" / "deepseek_v2.py"
    data, stat = path.read_bytes(), path.stat()
    try:
        path.write_bytes(data + b"\n# a newer release\n")
        out = _child(install)
        assert out.startswith("IMPORTERROR patchcraft overlay: ") and str(path) in out and "rebuild" in out, out
        verify = subprocess.run(
            [sys.executable, "-m", "patchcraft", "overlay", "verify", str(install["overlay"])],
            capture_output=True,
            text=True,
        )
        assert verify.returncode == 2 and "changed since the overlay was built" in verify.stderr
    finally:
        path.write_bytes(data)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert _child(install).startswith("ORIGIN ")


def test_overlay_verify_checks_it_is_fully_patched(install: dict) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "patchcraft",
            "verify",
            "--overlay",
            str(install["overlay"]),
            str(install["package"]),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(proc.stdout)
    assert {m["status"] for m in document["models"]} <= {
        "already-patched",
        "not-needed",
        "unsupported",
        "not-applicable",
    }


# -- patchcraft run: preflight, then exec -------------------------------------------

PRINTS = "import os, sys; print('ARGV', sys.argv[1:]); print('PYTHONPATH', os.environ['PYTHONPATH'])"


def _run(
    install: dict, tmp_path: Path, ids, *extra: str, trained_on: str = "hf:0,3,31", draft: Path | None = None
) -> subprocess.CompletedProcess:
    draft = draft if draft is not None else sglang_draft(tmp_path / "draft", ids)
    target = kimi_target(tmp_path / "kimi")
    command = [
        sys.executable,
        "-m",
        "patchcraft",
        "run",
        "--target",
        str(install["package"]),
        "--no-smoke",
        "--trained-on",
        trained_on,
        "--",
        sys.executable,
        "-c",
        PRINTS,
        "--model-path",
        str(target),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
        "--tp",
        "8",
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH="/already/there", PATCHCRAFT_CACHE=str(install["root"] / "cache"))
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def test_run_refuses_the_kimi_mismatch(install: dict, tmp_path: Path) -> None:
    """[2, 30, 58] trained on hf:0,3,31: the check-draft lines and the suggested ids, no launch."""
    proc = _run(install, tmp_path, [2, 30, 58])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ARGV" not in proc.stdout
    assert "[-1, 2, 30]" in proc.stdout + proc.stderr
    assert "refused to launch" in proc.stderr


def test_run_launches_a_matching_draft_with_the_overlay(install: dict, tmp_path: Path) -> None:
    proc = _run(install, tmp_path, [-1, 2, 30])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argv = proc.stdout.split("ARGV ", 1)[1].splitlines()[0]
    assert "'--speculative-algorithm', 'EAGLE3'" in argv and "'--tp', '8'" in argv
    pythonpath = proc.stdout.split("PYTHONPATH ", 1)[1].strip().split(os.pathsep)
    assert pythonpath[1:] == ["/already/there"]
    assert (Path(pythonpath[0]) / "sitecustomize.py").is_file()


def test_run_refuses_minus_one_with_several_pipeline_stages(install: dict, tmp_path: Path) -> None:
    proc = _run(install, tmp_path, [-1, 2, 30], "--pp-size", "2")  # `--pp` is ambiguous on 0.5.10: SGLang refuses it
    assert proc.returncode == 1 and "first pipeline stage" in proc.stderr, proc.stderr
    assert "ARGV" not in proc.stdout


def test_run_with_a_missing_draft_is_one_line_exit_2(install: dict, tmp_path: Path) -> None:
    proc = _run(install, tmp_path, None, draft=tmp_path / "nowhere")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "does not exist" in proc.stderr, proc.stderr


def test_preflight_reads_tp_and_refuses_partial_sums(tmp_path: Path, capsys) -> None:
    """The same check as check-draft --tp: an install whose fusion decision is not patched refuses TP 8."""
    from conftest import copy_release, run_cli
    from patchcraft.commands.run import parse_server_args, preflight

    # The fusion decision lives in srt/layers/communicator.py, which release copies leave out by default.
    package = copy_release(RELEASE, tmp_path / "release", extra=("srt/layers/communicator.py", "srt/server_args.py"))
    code, _, err = run_cli(capsys, "apply", "--no-smoke", "--no-fusion-fix", str(package))
    assert code == 0, err
    draft, target = sglang_draft(tmp_path / "draft", [-1, 2, 30]), kimi_target(tmp_path / "kimi")
    argv = [
        "--model-path",
        str(target),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
    ]
    assert (
        preflight(parse_server_args([*argv, "--tp", "1"], package), package, "hf:0,3,31") == 0
    )  # --tp: a prefix of --tp-size
    capsys.readouterr()
    assert preflight(parse_server_args([*argv, "--tp-size=8"], package), package, "hf:0,3,31") == 1
    out, err = capsys.readouterr()
    assert "per-rank partial sums" in out + err and "refused to launch" in err
