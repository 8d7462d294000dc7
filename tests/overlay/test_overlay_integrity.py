"""Overlays never serve unpatched code silently: readable by a non-root server, intact, atomic, owned, one bootstrap, proven.

Real subprocesses over SGLang 0.5.10 installed with ``pip install --no-deps``
into a throwaway venv, as in tests/commands/test_run.py. The venv lives in a
world-readable temp directory and uses the system's ``python3.11`` (the
development interpreter sits under root's home), so a step can run as
``nobody`` through ``setpriv``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import install_release
from run_child import CHILD, MODULE, RELEASE

SYSTEM_PYTHON = shutil.which("python3.11") if Path("/usr/bin/python3.11").exists() else None
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
PATCHCRAFT = [sys.executable, "-m", "patchcraft"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    """A venv with 0.5.10, and an overlay root built with ``overlay build --out``, all readable by others."""
    root = Path(tempfile.mkdtemp(prefix="patchcraft-overlay-test-"))
    os.chmod(root, 0o755)
    try:
        venv = root / "venv"
        package = install_release(RELEASE, venv, "/usr/bin/python3.11" if SYSTEM_PYTHON else sys.executable)
        python = venv / "bin" / "python"
        overlay = root / "overlay"
        build = subprocess.run(
            PATCHCRAFT + ["overlay", "build", str(package), "--out", str(overlay), "--no-smoke"],
            capture_output=True,
            text=True,
        )
        assert build.returncode == 0, build.stderr
        yield {"root": root, "python": python, "package": package, "overlay": overlay}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def child(world: dict, pythonpath: str, as_nobody: bool = False, code: str = CHILD) -> subprocess.CompletedProcess:
    """``find_spec`` of the patched module in a fresh interpreter of the venv (see tests/commands/test_run.py)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath}
    command = [str(world["python"]), "-c", code, str(world["package"]), MODULE]
    return subprocess.run((NOBODY if as_nobody else []) + command, capture_output=True, text=True, env=env, timeout=120)


def served(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr
    return (
        proc.stdout.split("ORIGIN ", 1)[1].split("\n", 1)[0].strip()
        if "ORIGIN " in proc.stdout
        else proc.stdout.strip()
    )


def patched(path: str) -> bool:
    return "# patchcraft:" in Path(path).read_text(encoding="utf-8")


def patchcraft(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(PATCHCRAFT + list(args), capture_output=True, text=True, env=env, timeout=600)


def clone(world: dict, name: str) -> Path:
    """A copy of the built overlay (a real directory: an overlay too), for a test to damage."""
    dest = world["root"] / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(world["overlay"].resolve(), dest)
    return dest


# -- 1. readable by the server, whoever it runs as -----------------------------------


@pytest.mark.skipif(not SYSTEM_PYTHON or not shutil.which("setpriv"), reason="needs /usr/bin/python3.11 and setpriv")
def test_a_non_root_server_imports_the_patched_file(world: dict) -> None:
    origin = served(child(world, str(world["overlay"]), as_nobody=True))
    assert origin.startswith(str(world["overlay"].resolve())) and patched(origin), origin
    version = world["overlay"].resolve()
    assert oct(version.stat().st_mode & 0o777) == "0o755"
    assert {oct(p.stat().st_mode & 0o777) for p in version.rglob("*") if p.is_file()} == {"0o644"}


def test_verify_overlay_user_names_what_the_server_cannot_read(world: dict) -> None:
    overlay = clone(world, "unreadable")
    ok = patchcraft("verify", "--overlay", str(overlay), "--user", "nobody")
    assert ok.returncode == 0, ok.stderr
    os.chmod(overlay / "sitecustomize.py", 0o600)
    for extra in (["--user", "nobody"], []):
        proc = patchcraft("verify", "--overlay", str(overlay), *extra)
        assert proc.returncode == 2 and str(overlay / "sitecustomize.py") in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    if shutil.which("setpriv") and SYSTEM_PYTHON:  # and what the check foresaw is what happens
        assert not patched(served(child(world, str(overlay), as_nobody=True)))
    os.chmod(overlay / "sitecustomize.py", 0o644)
    os.chmod(overlay, 0o700)
    proc = patchcraft("verify", "--overlay", str(overlay), "--user", "nobody")
    assert proc.returncode == 2 and f"{overlay}: not readable by nobody (mode 700)" in proc.stderr, proc.stderr
    os.chmod(overlay, 0o755)


# -- 2. integrity before use ---------------------------------------------------------

DAMAGE = {
    "bootstrap deleted": lambda o: (o / "sitecustomize.py").unlink(),
    "bootstrap truncated": lambda o: (o / "sitecustomize.py").write_bytes((o / "sitecustomize.py").read_bytes()[:200]),
    "bootstrap reduced to MODULES = {}": lambda o: (o / "sitecustomize.py").write_text("MODULES = {}\n"),
    "table emptied": lambda o: (o / "patchcraft_modules.tsv").write_text(""),
    "overlay file emptied": lambda o: (o / _served_rel(o)).write_text(""),
    "overlay file reverted": lambda o: (o / _served_rel(o)).write_bytes(
        Path(_manifest(o)["modules"][MODULE]["original"]).read_bytes()
    ),
}


def _manifest(overlay: Path) -> dict:
    return json.loads((overlay / "patchcraft_overlay.json").read_text())


def _served_rel(overlay: Path) -> str:
    return _manifest(overlay)["modules"][MODULE]["file"]


def _damaged_name(overlay: Path, how: str) -> str:
    return str(
        overlay
        / (
            "patchcraft_modules.tsv"
            if how == "table emptied"
            else "sitecustomize.py"
            if "bootstrap" in how
            else _served_rel(overlay)
        )
    )


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_overlay_is_refused_naming_the_file(world: dict, how: str) -> None:
    overlay = clone(world, "damaged")
    name = _damaged_name(overlay, how)
    DAMAGE[how](overlay)
    run = patchcraft(
        "run",
        "--target",
        str(world["package"]),
        "--overlay",
        str(overlay),
        "--no-preflight",
        "--",
        str(world["python"]),
        "-c",
        "print('LAUNCHED')",
    )
    assert run.returncode == 2 and "LAUNCHED" not in run.stdout, run.stdout + run.stderr
    assert name in run.stderr and run.stderr.count("\n") == 1, run.stderr
    for command in (["verify", "--overlay", str(overlay)], ["smoke", "--overlay", str(overlay)]):
        proc = patchcraft(*command)
        assert proc.returncode != 0 and name in proc.stderr, (command, proc.stderr)


def test_a_same_size_edit_is_found_after_the_digest_memo_is_warm(world: dict, tmp_path: Path) -> None:
    """patchcraft.base.digests trusts an unchanged stat: an edit of the same size with its mtime put back still changes the ctime."""
    overlay = clone(world, "memo")
    env = dict(os.environ, PATCHCRAFT_CACHE=str(tmp_path / "cache"))
    env.pop("PATCHCRAFT_NO_CACHE", None)
    time.sleep(2.1)  # past the racy window: the clone's files are remembered from now on
    first = patchcraft("verify", "--overlay", str(overlay), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (tmp_path / "cache" / "digests" / f"{os.getuid()}.marshal").is_file()
    served_file = overlay / _served_rel(overlay)
    before = os.stat(served_file)
    served_file.write_bytes(
        served_file.read_bytes().replace(b"capture_embedding_for_eagle3", b"capture_embedding_for_eaglex", 1)
    )
    os.utime(served_file, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(served_file).st_size == before.st_size
    second = patchcraft("verify", "--overlay", str(overlay), env=env)
    assert second.returncode != 0 and str(served_file) in second.stderr, second.stdout + second.stderr


@pytest.mark.parametrize("how", ["overlay file emptied", "overlay file reverted", "table emptied"])
def test_the_bootstrap_itself_refuses_a_damaged_overlay(world: dict, how: str) -> None:
    """With only PYTHONPATH (an image's ENV, no patchcraft in front): an ImportError naming the cause, never the install's file."""
    overlay = clone(world, "damaged-env")
    DAMAGE[how](overlay)
    out = served(child(world, str(overlay)))
    assert out.startswith("IMPORTERROR patchcraft overlay") and "rebuild" in out, out


@pytest.mark.parametrize("how", list(DAMAGE))
def test_run_rebuilds_a_damaged_cache_entry(world: dict, how: str, tmp_path: Path) -> None:
    env = dict(os.environ, PATCHCRAFT_CACHE=str(tmp_path / "cache"))
    command = [
        "run",
        "--target",
        str(world["package"]),
        "--no-smoke",
        "--no-preflight",
        "--",
        str(world["python"]),
        "-c",
        CHILD,
        str(world["package"]),
        MODULE,
    ]
    first = patchcraft(*command, env=env)
    origin = served(first)
    assert patched(origin)
    entry = next((tmp_path / "cache" / "overlays").glob("[0-9a-f]*"))
    version = entry.resolve()
    DAMAGE[how](version)
    second = patchcraft(*command, env=env)
    again = served(second)
    assert patched(again) and not again.startswith(str(version)), (again, second.stderr)
    assert "rebuilt" in second.stderr
    assert entry.resolve() != version


# -- 3. never in the way of a running server -------------------------------------------

POLLER = """
import os, subprocess, sys, time
python, package, module, overlay, stop, child = sys.argv[1:7]
seen = {"missing": 0, "children": 0, "unpatched": []}
last = 0.0
while not os.path.exists(stop):
    if not os.path.exists(os.path.join(overlay, "sitecustomize.py")):
        seen["missing"] += 1
    if time.monotonic() - last > 0.02:
        last = time.monotonic()
        out = subprocess.run([python, "-c", child, package, module], capture_output=True, text=True, env={"PYTHONPATH": overlay}).stdout
        seen["children"] += 1
        origin = out.split("ORIGIN ", 1)[-1].strip()
        try:
            ok = out.startswith("ORIGIN ") and "# patchcraft:" in open(origin).read()
        except OSError as exc:  # the file it was served is gone already
            ok = False
            out += " (%s)" % exc
        if not ok:
            seen["unpatched"].append(out.strip())
print(repr(seen))
"""


def test_rebuilding_under_a_poller_never_serves_the_unpatched_file(world: dict) -> None:
    overlay = world["root"] / "polled"
    assert patchcraft("overlay", "build", str(world["package"]), "--out", str(overlay), "--no-smoke").returncode == 0
    stop = world["root"] / "stop-poller"
    poller = subprocess.Popen(
        [
            sys.executable,
            "-c",
            POLLER,
            str(world["python"]),
            str(world["package"]),
            MODULE,
            str(overlay),
            str(stop),
            CHILD,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(3):
            proc = patchcraft("overlay", "build", str(world["package"]), "--out", str(overlay), "--no-smoke")
            assert proc.returncode == 0, proc.stderr
    finally:
        stop.touch()
        out, _ = poller.communicate(timeout=120)
    assert poller.returncode == 0, out
    seen = eval(out)  # the poller's own repr of a dict of ints and strings
    assert seen["children"] > 10 and seen["missing"] == 0 and seen["unpatched"] == [], seen
    # Old versions nobody holds are removed (the one just replaced is kept a while).
    assert len([p for p in world["root"].iterdir() if p.name.startswith(".polled-")]) <= 2


# -- 4. a shared or hostile cache is refused ----------------------------------------------

PLANT = """
import json, os, sys
entry, marker = sys.argv[1], sys.argv[2]
os.makedirs(entry)
json.dump({"modules": {}, "files": {}}, open(os.path.join(entry, "patchcraft_overlay.json"), "w"))
open(os.path.join(entry, "sitecustomize.py"), "w").write("open(%r, 'w').write('planted code ran')\\n" % marker)
"""


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv")
def test_a_planted_entry_in_a_shared_cache_is_not_executed(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from patchcraft.overlay.build import default_directory
    from patchcraft.base.target import resolve_target

    shared = world["root"] / "shared-cache"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    private_tmp = world["root"] / "tmp"
    private_tmp.mkdir()
    env = dict(os.environ, PATCHCRAFT_CACHE=str(shared), TMPDIR=str(private_tmp))
    # monkeypatch puts the suite's own cache back after the test (a bare del left every later test on ~/.cache)
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(shared))
    entry = default_directory(resolve_target(str(world["package"])), (), True)
    monkeypatch.undo()
    assert entry is not None
    marker = world["root"] / "PLANTED"
    subprocess.run(NOBODY + ["/usr/bin/python3", "-c", PLANT, str(entry), str(marker)], check=True)
    assert entry.stat().st_uid == 65534
    command = [
        "run",
        "--target",
        str(world["package"]),
        "--no-smoke",
        "--no-preflight",
        "--",
        str(world["python"]),
        "-c",
        CHILD,
        str(world["package"]),
        MODULE,
    ]
    proc = patchcraft(*command, env=env)
    assert not marker.exists(), "the planted sitecustomize ran"
    origin = served(proc)
    assert patched(origin) and origin.startswith(str(private_tmp)), origin
    assert "owned by uid 65534" in proc.stderr and "private overlay" in proc.stderr, proc.stderr
    refused = patchcraft(
        "run", "--target", str(world["package"]), "--overlay", str(entry), "--no-preflight", "--", "true", env=env
    )
    assert refused.returncode == 2 and "owned by uid 65534" in refused.stderr and refused.stderr.count("\n") == 1, (
        refused.stderr
    )
    assert not marker.exists()


def test_a_group_writable_overlays_directory_of_ours_is_repaired_not_refused(tmp_path: Path) -> None:
    """A umask of 002 makes the cache 775: ours, so made 755 and used; an others-writable cache that is not sticky is refused."""
    from patchcraft.overlay.build import _untrusted_store

    overlays = tmp_path / "cache" / "overlays"
    overlays.mkdir(parents=True)
    os.chmod(overlays, 0o775)
    os.chmod(overlays.parent, 0o775)
    assert _untrusted_store(overlays) is None and oct(overlays.stat().st_mode & 0o777) == "0o755"
    os.chmod(overlays.parent, 0o777)
    assert "writable by others, and not sticky" in (_untrusted_store(overlays) or "")
    os.chmod(overlays.parent, 0o1777)
    assert _untrusted_store(overlays) is None


def test_a_root_owned_image_overlay_is_accepted_for_another_user(world: dict) -> None:
    """The ownership rule as a non-root server sees an image's overlay: root's is fine, another user's is not."""
    from patchcraft.overlay.check import untrusted

    version = world["overlay"].resolve()
    assert untrusted(world["overlay"], owners={65534, 0}) is None
    assert (
        untrusted(world["overlay"], owners={65534})
        == f"{world['overlay']}: owned by uid 0, not by this user (uid {os.getuid()}) or root"
    )
    writable = clone(world, "group-writable")
    os.chmod(writable / "tree", 0o775)
    assert "writable by group or others" in (untrusted(writable) or "")
    assert version.stat().st_uid == 0


# -- 5. one bootstrap per process -----------------------------------------------------------

COUNTS = (
    CHILD
    + """
finders = [f for f in sys.meta_path if getattr(f, "patchcraft_overlay", None)]
print("FINDERS", len(finders), "META_PATH", len(sys.meta_path))
"""
)


def test_two_overlays_on_the_path_one_finder_their_sitecustomize_once(world: dict) -> None:
    second = clone(world, "second")
    theirs = world["root"] / "theirs"
    theirs.mkdir(exist_ok=True)
    (theirs / "sitecustomize.py").write_text("print('THEIR-SITECUSTOMIZE')\n")
    proc = child(world, os.pathsep.join([str(world["overlay"]), str(second), str(theirs)]), code=COUNTS)
    assert proc.returncode == 0 and "RecursionError" not in proc.stderr, proc.stderr
    assert proc.stdout.count("THEIR-SITECUSTOMIZE") == 1
    assert "FINDERS 1 " in proc.stdout
    assert patched(served(proc))
    plain = child(world, str(theirs), code=COUNTS)
    meta = int(plain.stdout.split("META_PATH ")[1])
    assert int(proc.stdout.split("META_PATH ")[1]) == meta + 1


def test_different_overlays_for_the_same_module_refuse_naming_both(world: dict, tmp_path: Path) -> None:
    copy = tmp_path / "other" / "sglang"
    shutil.copytree(world["package"], copy)
    other = tmp_path / "other-overlay"
    assert patchcraft("overlay", "build", str(copy), "--out", str(other), "--no-smoke").returncode == 0
    out = served(child(world, os.pathsep.join([str(world["overlay"]), str(other)])))
    assert (
        out.startswith("IMPORTERROR patchcraft overlay: ")
        and str(world["overlay"].resolve()) in out
        and str(other.resolve()) in out
    ), out


# -- 8. proof recorded in the manifest --------------------------------------------------------


def test_a_run_that_asks_for_the_harness_proves_an_unproven_overlay(world: dict, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = dict(os.environ, PATCHCRAFT_CACHE=str(tmp_path / "cache"))
    command = ["--no-preflight", "--", str(world["python"]), "-c", CHILD, str(world["package"]), MODULE]
    target = ["--target", str(world["package"])]
    unproven = served(patchcraft("run", *target, "--no-smoke", *command, env=env))
    assert _manifest(Path(unproven).parents[4])["proof"] == "skipped (--no-smoke)"
    proven = served(patchcraft("run", *target, *command, env=env))
    assert _manifest(Path(proven).parents[4])["proof"] == "harness-passed", proven
    assert Path(proven).parents[4] != Path(unproven).parents[4]


def test_the_static_line_is_shown_without_torch(world: dict, tmp_path: Path) -> None:
    broken = tmp_path / "no-torch" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('no torch in this environment')\n")
    pythonpath = os.pathsep.join(filter(None, [str(broken.parent), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PATCHCRAFT_CACHE=str(tmp_path / "cache"), PYTHONPATH=pythonpath)
    for _ in range(2):  # built, then reused (it cannot be proven here): the line both times
        proc = patchcraft("run", "--target", str(world["package"]), "--no-preflight", "--", "true", env=env)
        assert proc.returncode == 0, proc.stderr
        assert "torch is not installed, so the overlay is static" in proc.stderr, proc.stderr


# -- 10. stale temp dirs, cache prune ---------------------------------------------------------


def test_prune_removes_unused_overlays_and_stale_temp_dirs_never_one_in_use(world: dict, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = dict(os.environ, PATCHCRAFT_CACHE=str(cache))
    used = served(
        patchcraft(
            "run",
            "--target",
            str(world["package"]),
            "--no-smoke",
            "--no-preflight",
            "--",
            str(world["python"]),
            "-c",
            CHILD,
            str(world["package"]),
            MODULE,
            env=env,
        )
    )
    overlays = cache / "overlays"
    (entry,) = [p for p in overlays.iterdir() if not p.name.startswith(".")]
    in_use = entry.resolve()
    # A server still running on it: its bootstrap holds the lock.
    server = subprocess.Popen(
        [str(world["python"]), "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        env={"PYTHONPATH": str(in_use)},
    )
    # An unused overlay, and what a build killed mid-write leaves (a lock nobody holds; an older patchcraft's temp dir).
    unused = overlays / "0"
    shutil.copytree(in_use, overlays / ".0-unused")
    os.symlink(".0-unused", unused)
    killed = overlays / f".{entry.name}-killed"
    (killed / "tree").mkdir(parents=True)
    (killed / ".lock").touch()
    legacy = overlays / ".overlay-abcdef"
    legacy.mkdir()
    old = time.time() - 7200
    os.utime(legacy, (old, old))
    try:
        time.sleep(1)  # the server's bootstrap has run
        proc = patchcraft("cache", "prune", "--format", "json", env=env)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert in_use.is_dir() and entry.is_symlink() and str(entry) in report["in_use"]
        assert not (overlays / ".0-unused").exists() and not unused.is_symlink()
        assert not killed.exists() and not legacy.exists()
    finally:
        server.communicate(b"", timeout=30)
    proc = patchcraft("cache", "prune", env=env)
    assert proc.returncode == 0 and not in_use.exists() and not entry.is_symlink(), proc.stderr
    assert Path(used).parts[-1] == "deepseek_v2.py"


def test_a_build_cleans_what_a_killed_build_left(world: dict) -> None:
    overlay = world["root"] / "cleaned"
    killed = world["root"] / ".cleaned-killed1"
    (killed / "tree").mkdir(parents=True)
    (killed / ".lock").touch()
    os.utime(killed, (0, 0))  # older than any version the build will write
    assert patchcraft("overlay", "build", str(world["package"]), "--out", str(overlay), "--no-smoke").returncode == 0
    assert not killed.exists()


# -- the bootstrap is a real module ------------------------------------------------------------


def test_the_bootstrap_is_stdlib_only_and_inert_when_imported() -> None:
    """It runs in every server process: no patchcraft, libcst, rich or torch; importing it as a module installs nothing."""
    import ast

    import patchcraft.overlay.bootstrap as bootstrap

    tree = ast.parse(Path(bootstrap.__file__).read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(
        sys.stdlib_module_names
    )
    assert not any(getattr(f, "patchcraft_overlay", None) for f in sys.meta_path)


def test_the_overlay_bootstrap_is_the_module_verbatim(world: dict) -> None:
    import patchcraft.overlay.bootstrap as bootstrap

    assert (world["overlay"] / "sitecustomize.py").read_bytes() == Path(bootstrap.__file__).read_bytes()
    assert (world["overlay"] / "__pycache__").is_dir()  # its .pyc ships with it
    # The manifest lists every file of the overlay (but itself), the bootstrap, its .pyc, table and lock included.
    version = world["overlay"].resolve()
    files = {p.relative_to(version).as_posix() for p in version.rglob("*") if p.is_file()} - {"patchcraft_overlay.json"}
    listed = _manifest(version)["files"]
    assert set(listed) == files and {"sitecustomize.py", "patchcraft_modules.tsv", ".lock"} <= files
    assert any(name.startswith("__pycache__/sitecustomize.") for name in listed)


def test_out_never_replaces_a_directory_that_is_not_an_overlay(world: dict) -> None:
    """A mistyped --out (an existing directory of other files) is refused, untouched; an older patchcraft's overlay is swapped for the link."""
    other = world["root"] / "not-an-overlay"
    other.mkdir()
    (other / "keep.txt").write_text("mine\n")
    proc = patchcraft("overlay", "build", str(world["package"]), "--out", str(other), "--no-smoke")
    assert proc.returncode == 2 and "is not an overlay" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert (other / "keep.txt").read_text() == "mine\n" and not other.is_symlink()
    legacy = clone(world, "legacy")  # a real directory holding an overlay, as older patchcraft wrote them
    assert patchcraft("overlay", "build", str(world["package"]), "--out", str(legacy), "--no-smoke").returncode == 0
    assert legacy.is_symlink() and patched(served(child(world, str(legacy))))
    assert [p.name for p in world["root"].iterdir() if p.name.startswith(".legacy-old")]  # kept while it may be in use


def test_the_preflight_never_says_ok_about_a_damaged_overlay(world: dict, tmp_path: Path) -> None:
    """An overlay file reverted to the original: refused before the preflight (--overlay), or rebuilt and then preflighted (run)."""
    from drafts import kimi_target, sglang_draft

    server = [
        "--",
        sys.executable,
        "-c",
        "print('LAUNCHED')",
        "--model-path",
        str(kimi_target(tmp_path / "kimi")),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(sglang_draft(tmp_path / "draft", [-1, 2, 30])),
    ]
    flags = ["--target", str(world["package"]), "--no-smoke", "--trained-on", "hf:0,3,31"]
    overlay = clone(world, "reverted")
    DAMAGE["overlay file reverted"](overlay)
    refused = patchcraft("run", *flags, "--overlay", str(overlay), *server)
    assert refused.returncode == 2 and "LAUNCHED" not in refused.stdout, refused.stdout + refused.stderr
    assert (
        _damaged_name(overlay, "overlay file reverted") in refused.stderr
        and "after patchcraft apply" not in refused.stdout + refused.stderr
    )
    env = dict(os.environ, PATCHCRAFT_CACHE=str(tmp_path / "cache"))
    assert patchcraft("run", *flags, *server, env=env).returncode == 0
    (entry,) = [p for p in (tmp_path / "cache" / "overlays").iterdir() if not p.name.startswith(".")]
    DAMAGE["overlay file reverted"](entry.resolve())
    rebuilt = patchcraft("run", *flags, *server, env=env)
    assert rebuilt.returncode == 0 and "LAUNCHED" in rebuilt.stdout and "rebuilt" in rebuilt.stderr, (
        rebuilt.stdout + rebuilt.stderr
    )


def test_the_manifest_proof_counts_a_class_the_harness_skipped_only_when_nothing_else_ran() -> None:
    """vLLM mixin classes the harness could not run share the one edit others proved: the overlay is proven."""
    from patchcraft.base.status import ModelStatus, Proof
    from patchcraft.base.target import SglangTree
    from patchcraft.engine.records import Mode, ModelResult, RunResult
    from patchcraft.overlay.build import proof_of

    def result(*proofs: Proof) -> RunResult:
        models = tuple(ModelResult(f"m.C{i}", "m.py", ModelStatus.PATCHED, proof=p) for i, p in enumerate(proofs))
        return RunResult(Mode.APPLY, SglangTree.__new__(SglangTree), "0", models, ())

    assert proof_of(result(Proof.PASSED, Proof.HARNESS_SKIPPED)) == Proof.PASSED
    assert proof_of(result(Proof.HARNESS_SKIPPED)) == Proof.HARNESS_SKIPPED
    assert proof_of(result(Proof.PASSED, Proof.NO_TORCH)) == Proof.NO_TORCH
