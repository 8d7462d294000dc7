"""End to end with the real pre-commit: the hooks of .pre-commit-hooks.yaml on an SGLang fork.

The fork is a git repository laid out like upstream (``python/sglang/srt/
models/...``, from the 0.5.10 release). The hook repository is a snapshot
of this checkout's installable files as they are on disk, committed with a
fixed identity and date so that its revision changes only when they do.
PRE_COMMIT_HOME lives under ~/.cache/patchcraft, so the hook environment
(a virtualenv pip-installed from PyPI) is built once and reused by later
runs and by CI reruns that keep ~/.cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import copy_release
from patchcraft.pipeline.stages import resolve_targets


ROOT = Path(__file__).resolve().parent.parent

RELEASE = "0.5.10"
MODELS = "python/sglang/srt/models"
#: What pip needs to install patchcraft, plus the hook manifest. Tests and
#: docs are left out so that editing them does not rebuild the hook environment.
HOOK_PATHS = ("pyproject.toml", "README.md", ".pre-commit-hooks.yaml", "patchcraft", "transforms")
CACHE = Path(os.environ.get("PATCHCRAFT_PRE_COMMIT_CACHE", Path.home() / ".cache" / "patchcraft" / "pre-commit"))
HOOK_IDS = ("patchcraft-verify", "patchcraft-apply")
FIXED_DATE = "2000-01-01T00:00:00+0000"


# -- plumbing ------------------------------------------------------------------


def _env() -> dict[str, str]:
    """A clean environment: our PRE_COMMIT_HOME, no inherited git state, no colour."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PRE_COMMIT"))}
    env.update(PRE_COMMIT_HOME=str(CACHE / "home"), NO_COLOR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def _git(cwd: Path, *args: str) -> str:
    env = dict(_env(), GIT_AUTHOR_DATE=FIXED_DATE, GIT_COMMITTER_DATE=FIXED_DATE)
    identity = (
        "-c",
        "user.name=patchcraft tests",
        "-c",
        "user.email=tests@patchcraft.invalid",
        "-c",
        "commit.gpgsign=false",
    )
    result = subprocess.run(["git", *identity, *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"git {' '.join(args)}: {result.stderr}"
    return result.stdout


def _hook_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files under HOOK_PATHS, as on disk."""
    listed = _git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *HOOK_PATHS)
    return sorted({name for name in listed.split("\0") if name and (ROOT / name).is_file()})


def _snapshot() -> tuple[Path, str]:
    """A git repository holding the hook files; (path, revision). Reused while unchanged."""
    files = _hook_files()
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes() + b"\0")
    parent = CACHE / "hook-repo"
    repo = parent / digest.hexdigest()[:16]
    if not (repo / ".git").is_dir():
        parent.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(dir=parent, prefix=".build-"))
        for name in files:
            (build / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, build / name)
        _git(build, "init", "-q")
        _git(build, "add", "-A")
        _git(build, "commit", "-q", "-m", "patchcraft hook snapshot")
        try:
            build.rename(repo)
        except OSError:  # another run made the same snapshot first
            shutil.rmtree(build)
    for old in parent.iterdir():  # earlier snapshots: pre-commit keeps its own clone
        if old != repo and not old.name.startswith(".build-"):
            shutil.rmtree(old, ignore_errors=True)
    return repo, _git(repo, "rev-parse", "HEAD").strip()


def _pre_commit(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pre_commit", *args]
    return subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


def _hook_run(hooks: "HookRepo", fork: Path, hook: str, *files: str) -> subprocess.CompletedProcess:
    return _pre_commit(fork, "run", hook, "-c", str(hooks.config), "--color", "never", "--files", *files)


class HookRepo:
    """The snapshot, the config naming it, and the time pre-commit took to install it."""

    def __init__(self, path: Path, rev: str, config: Path) -> None:
        self.path, self.rev, self.config = path, rev, config
        self.install_seconds = 0.0

    def env_dirs(self) -> list[Path]:
        """The virtualenvs pre-commit built for the hooks, read from its store database.

        The store is ours and gc ran before the install, so these are exactly
        the environments the current config uses (additional_dependencies,
        were there any, would get their own entry, and be checked too).
        """
        with sqlite3.connect(CACHE / "home" / "db.db") as db:
            rows = db.execute("SELECT repo, path FROM repos WHERE ref = ?", (self.rev,)).fetchall()
        assert rows and all(repo.startswith(str(self.path)) for repo, _ in rows), rows
        return sorted(env for _, path in rows for env in Path(path).glob("py_env-*"))


@pytest.fixture(scope="session")
def pristine_fork(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A committed fork of SGLang 0.5.10 (cloned per test, which is cheap)."""
    repo = tmp_path_factory.mktemp("pristine-fork")
    copy_release(RELEASE, repo / "python")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"sglang {RELEASE}")
    return repo


@pytest.fixture
def fork(pristine_fork: Path, tmp_path: Path) -> Path:
    clone = tmp_path / "fork"
    _git(tmp_path, "clone", "-q", str(pristine_fork), str(clone))
    return clone


@pytest.fixture(scope="session")
def hooks(pristine_fork: Path) -> HookRepo:
    """Snapshot the hook repository, write a config for it, build the hook environment."""
    path, rev = _snapshot()
    config = CACHE / "pre-commit-config.yaml"
    config.write_text(
        yaml.safe_dump({"repos": [{"repo": str(path), "rev": rev, "hooks": [{"id": h} for h in HOOK_IDS]}]})
    )
    hook_repo = HookRepo(path, rev, config)
    # gc keeps what a known config still names (this one), dropping environments of old snapshots.
    _pre_commit(pristine_fork, "gc")
    start = time.monotonic()
    result = _pre_commit(pristine_fork, "install-hooks", "-c", str(config))
    hook_repo.install_seconds = time.monotonic() - start
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"\npre-commit hook environment ready in {hook_repo.install_seconds:.1f} s (rev {rev[:12]})")
    return hook_repo


def _output(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def _changed(fork: Path) -> list[str]:
    return sorted(_git(fork, "diff", "--name-only").split())


# -- the manifest (no pre-commit run needed) ------------------------------------


def _manifest() -> dict[str, dict]:
    return {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


def test_manifest_is_valid_for_pre_commit() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pre_commit", "validate-manifest", str(ROOT / ".pre-commit-hooks.yaml")],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert set(_manifest()) == set(HOOK_IDS)


@pytest.mark.parametrize("hook_id", HOOK_IDS)
def test_manifest_hooks_are_serial_python_hooks_without_torch(hook_id: str) -> None:
    hook = _manifest()[hook_id]
    assert hook["language"] == "python"
    assert hook["require_serial"] is True
    assert not hook.get("additional_dependencies"), "the hook environment is patchcraft's own dependencies only"
    assert hook.get("pass_filenames", True) is True
    assert hook["entry"].split()[0] == "patchcraft"


@pytest.mark.parametrize(
    ("path", "matches"),
    [
        (f"{MODELS}/qwen2.py", True),
        ("sglang/srt/models/qwen2.py", True),
        ("third_party/sglang/srt/models/deepseek_v2.py", True),
        ("python/sglang/srt/model_executor/model_runner.py", False),
        ("python/sglang/srt/models/README.md", False),
        ("python/sglang/srt/models/deepseek_common/utils.py", False),
        ("python/mysglang/srt/models/qwen2.py", False),
    ],
)
def test_manifest_files_pattern(path: str, matches: bool) -> None:
    for hook in _manifest().values():
        assert bool(re.search(hook["files"], path)) is matches, (hook["id"], path)


def test_configs_in_the_docs_are_valid_and_match_the_manifest(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "pre-commit.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert len(blocks) >= 3
    manifest = _manifest()
    for index, block in enumerate(blocks):
        config = tmp_path / f"config{index}.yaml"
        config.write_text(block)
        result = subprocess.run(
            [sys.executable, "-m", "pre_commit", "validate-config", str(config)],
            capture_output=True,
            text=True,
            env=_env(),
        )
        assert result.returncode == 0, (block, result.stdout + result.stderr)
        for repo in yaml.safe_load(block)["repos"]:
            for hook in repo["hooks"]:
                assert hook["id"] in manifest
                if repo["repo"] == "local":  # the copy of the manifest's hook must stay a copy
                    ours = manifest[hook["id"]]
                    assert (hook["entry"], hook["files"], hook["require_serial"]) == (
                        ours["entry"],
                        ours["files"],
                        True,
                    )


# -- many filenames, one run (no pre-commit needed) ------------------------------


def test_file_targets_of_one_package_become_one_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for package in ("python/sglang", "vendor/sglang"):
        models = tmp_path / package / "srt" / "models"
        models.mkdir(parents=True)
        for name in ("a", "b"):
            (models / f"{name}.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    a, b = f"{MODELS}/a.py", f"{MODELS}/b.py"
    trees = resolve_targets([a, b, a, "vendor/sglang/srt/models/a.py"])
    assert [t.package for t in trees] == [tmp_path / "python/sglang", tmp_path / "vendor/sglang"]
    assert trees[0].only_files == (tmp_path / a, tmp_path / b)
    assert trees[0].root == tmp_path
    whole = resolve_targets([a, ".", b])
    assert len(whole) == 1 and whole[0].only_files == ()


# -- end to end -----------------------------------------------------------------


def test_verify_fails_on_an_unpatched_file_with_one_line_per_model(hooks: HookRepo, fork: Path) -> None:
    # Only qwen3.py is given, but its init and capture live in qwen2.py, which
    # qwen2 and qwen2_5_vl use too: the whole class graph is checked.
    result = _hook_run(hooks, fork, "patchcraft-verify", f"{MODELS}/qwen3.py")
    assert result.returncode == 1, _output(result)
    assert "Failed" in result.stdout
    for model, missing in (
        ("qwen3.Qwen3ForCausalLM", "missing: setter, init via qwen2.py Qwen2Model, forward via qwen2.py Qwen2Model"),
        ("qwen2.Qwen2ForCausalLM", "missing: setter, init, forward"),
        ("qwen2_5_vl.Qwen2_5_VLForConditionalGeneration", "missing: setter, init via qwen2.py Qwen2Model"),
    ):
        lines = [line for line in _output(result).splitlines() if model in line]
        assert len(lines) == 1, (model, lines)
        assert missing in lines[0], (missing, lines[0])
    assert _changed(fork) == []


def test_apply_fixes_fails_once_then_passes(hooks: HookRepo, fork: Path) -> None:
    first = _hook_run(hooks, fork, "patchcraft-apply", f"{MODELS}/qwen3.py")
    # patchcraft's own exit code, not only pre-commit noticing modified files.
    assert first.returncode == 1 and "- exit code: 1" in first.stdout, _output(first)
    written = [f"{MODELS}/{name}.py" for name in ("qwen2", "qwen2_5_vl", "qwen3")]
    for path in written:
        assert f"Rewriting {path}" in _output(first)
    assert _changed(fork) == written
    _git(fork, "add", "-u")
    second = _hook_run(hooks, fork, "patchcraft-apply", f"{MODELS}/qwen3.py", *written)
    assert second.returncode == 0, _output(second)
    assert _changed(fork) == []
    verify = _hook_run(hooks, fork, "patchcraft-verify", *written)
    assert verify.returncode == 0, _output(verify)


def test_a_patched_file_passes(hooks: HookRepo, fork: Path) -> None:
    target = f"{MODELS}/deepseek_v2.py"
    patched = subprocess.run(
        [sys.executable, "-m", "patchcraft", "apply", target], cwd=fork, capture_output=True, text=True
    )
    assert patched.returncode == 0, patched.stderr
    _git(fork, "commit", "-q", "-am", "patch deepseek_v2")
    for hook in HOOK_IDS:
        result = _hook_run(hooks, fork, hook, target)
        assert result.returncode == 0, (hook, _output(result))
        assert "Passed" in result.stdout
    assert _changed(fork) == []


def test_files_without_eagle3_relevance_pass(hooks: HookRepo, fork: Path) -> None:
    files = (f"{MODELS}/bert.py", f"{MODELS}/registry.py", "python/sglang/srt/model_executor/model_runner.py")
    for hook in HOOK_IDS:
        result = _hook_run(hooks, fork, hook, *files)
        assert result.returncode == 0, (hook, _output(result))
    assert _changed(fork) == []
    skipped = _hook_run(hooks, fork, "patchcraft-verify", "python/sglang/srt/model_executor/model_runner.py")
    assert "(no files to check)Skipped" in skipped.stdout


def test_many_files_are_one_run_with_each_model_once(hooks: HookRepo, fork: Path) -> None:
    files = [f"{MODELS}/{name}.py" for name in ("qwen2", "qwen3", "qwen2_5_vl", "bert")]
    result = _pre_commit(
        fork, "run", "patchcraft-verify", "-c", str(hooks.config), "--color", "never", "--verbose", "--files", *files
    )
    assert result.returncode == 1, _output(result)
    assert _output(result).count(f"sglang {RELEASE} at ") == 1
    for model in ("qwen3.Qwen3ForCausalLM", "qwen2.Qwen2ForCausalLM"):
        assert _output(result).count(model) == 1


def test_hook_environment_has_no_torch(hooks: HookRepo) -> None:
    envs = hooks.env_dirs()
    assert envs
    for env in envs:
        _check_environment(env / "bin" / "python")


def _check_environment(python: Path) -> None:
    probe = r"""
import json, re
from importlib import metadata
def name(text):
    return re.split(r"[\s\[;(<>=!~]", text.strip(), 1)[0].lower().replace("_", "-")
installed = {name(d.metadata["Name"]): d for d in metadata.distributions()}
needed, todo = set(), ["patchcraft"]
while todo:
    current = todo.pop()
    if current in needed or current not in installed:
        continue
    needed.add(current)
    for req in installed[current].requires or []:
        if "extra ==" not in req.replace('"', "").replace("'", ""):
            todo.append(name(req))
print(json.dumps({"installed": sorted(installed), "needed": sorted(needed)}))
"""
    result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    installed, needed = set(found["installed"]), set(found["needed"])
    assert {"patchcraft", "libcst", "click", "rich"} <= installed
    assert not {"torch", "triton", "sglang"} & installed
    assert not [n for n in installed if n.startswith("nvidia-")]
    # Nothing beyond patchcraft's own dependency closure (and the venv's installers).
    assert installed - needed <= {"pip", "setuptools", "wheel"}, installed - needed
