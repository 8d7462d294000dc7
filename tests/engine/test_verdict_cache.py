"""engine.verdict_cache: explain's and check-draft's verdicts replayed while nothing they read changed.

Each kind of input gets a test that a changed byte (size and mtime kept) is a miss and the verdict is
computed again; damaged, foreign and misfiled entries are never used; a hit replays the same bytes and
exit code and imports neither torch nor libcst (a child process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SMALL_RELEASE, copy_release, run_cli
from drafts import kimi_target, sglang_draft
from patchcraft.base import digests
from patchcraft.engine import verdict_cache

#: llama of the small release, with Kimi-K2.5's layer count.
MODEL, LAYERS = "llama", "61"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache for this test (the suite's is shared by every test of the run)."""
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PATCHCRAFT_NO_CACHE", raising=False)
    digests.forget()
    yield tmp_path / "cache"
    digests.forget()


@pytest.fixture
def hits(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each lookup found a verdict to replay, in order."""
    found: list[bool] = []
    original = verdict_cache.load

    def load(lookup: str):
        entry = original(lookup)
        found.append(entry is not None)
        return entry

    monkeypatch.setattr(verdict_cache, "load", load)
    return found


@pytest.fixture
def static(monkeypatch: pytest.MonkeyPatch) -> None:
    """No torch: the static reading (seconds less per verdict; what is cached is the same)."""
    monkeypatch.setitem(sys.modules, "torch", None)


def flip(path: Path, old: bytes, new: bytes) -> None:
    """Replace the last ``old`` by ``new`` (same length), keeping the file's size and mtime."""
    assert len(old) == len(new)
    data, info = path.read_bytes(), path.stat()
    at = data.rindex(old)
    path.write_bytes(data[:at] + new + data[at + len(old) :])
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert path.stat().st_size == info.st_size


def setup(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    package = copy_release(SMALL_RELEASE, tmp_path / "tree", ("srt/server_args.py",))
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58])
    target = kimi_target(tmp_path / "target")
    report = tmp_path / "probe.json"
    report.write_text(json.dumps({"command": "probe", "best": {"states": [3, 31, 59], "top1": 0.5}}))
    return package, draft, target, report


def check_draft(capsys, package: Path, draft: Path, target: Path, report: Path) -> tuple[int, str, str]:
    return run_cli(
        capsys,
        "check-draft",
        str(draft),
        str(package),
        "--target",
        str(target),
        "--model",
        MODEL,
        "--trained-on",
        f"measured:{report}",
        "--no-cuda-graph",  # an ok verdict: no fix to prove (seconds less; a mismatch is cached the same way)
    )


#: Each kind of input, and one byte of it changed: (file, old, new), relative to tmp_path.
INPUTS = {
    "model file": ("tree/sglang/srt/models/llama.py", b"\n", b" "),
    "model file the model does not use": ("tree/sglang/srt/models/qwen2.py", b"\n", b" "),
    "model runner": ("tree/sglang/srt/model_executor/model_runner.py", b"\n", b" "),
    "server flags": ("tree/sglang/srt/server_args.py", b"\n", b" "),
    "version file": ("tree/sglang/version.py", b"\n", b" "),
    "draft config.json": ("draft/config.json", b'"num_hidden_layers": 1', b'"num_hidden_layers": 2'),
    "draft safetensors header": ("draft/model.safetensors", b'"pt"', b'"PT"'),
    "target config.json": ("target/config.json", b"7168", b"7169"),
    "probe report": ("probe.json", b"0.5", b"0.6"),
}


@pytest.mark.parametrize("kind", sorted(INPUTS))
def test_a_changed_byte_of_any_input_recomputes_the_verdict(kind, tmp_path, capsys, cache, hits, static) -> None:
    package, draft, target, report = setup(tmp_path)
    first = check_draft(capsys, package, draft, target, report)
    assert first[0] in (0, 1), first
    assert check_draft(capsys, package, draft, target, report) == first
    assert hits == [False, True]
    name, old, new = INPUTS[kind]
    flip(tmp_path / name, old, new)
    check_draft(capsys, package, draft, target, report)
    assert hits[2] is False, f"{kind}: a changed byte was answered from the cache"
    check_draft(capsys, package, draft, target, report)
    assert hits[3] is True  # the new verdict is stored in turn


def test_a_file_added_to_the_models_folder_recomputes(tmp_path, capsys, cache, hits, static) -> None:
    package, draft, target, report = setup(tmp_path)
    check_draft(capsys, package, draft, target, report)
    (package / "srt" / "models" / "zz_new.py").write_text("class Nothing:\n    pass\n")
    check_draft(capsys, package, draft, target, report)
    assert hits == [False, False]


def test_explain_is_replayed_and_a_changed_model_file_recomputes(tmp_path, capsys, cache, hits, static) -> None:
    package = copy_release(SMALL_RELEASE, tmp_path / "tree")
    argv = ("explain", str(package), "--model", MODEL, "--layer-ids", "2,30,58", "--num-layers", LAYERS)
    first = run_cli(capsys, *argv)
    assert first[0] in (0, 1) and "llama" in first[1]
    assert run_cli(capsys, *argv) == first
    assert run_cli(capsys, *argv, "--format", "json") != first  # the options are part of the key
    flip(package / "srt" / "models" / "llama.py", b"\n", b" ")
    run_cli(capsys, *argv)
    assert hits == [False, True, False, False]


def entry_of(cache: Path) -> Path:
    (found,) = (cache / "verdicts").glob("*.json")
    return found


@pytest.mark.parametrize("damage", ["truncated", "output edited", "inputs edited", "another key's", "group-writable"])
def test_a_damaged_or_foreign_entry_is_never_used(damage, tmp_path, capsys, cache, hits, static) -> None:
    package, draft, target, report = setup(tmp_path)
    first = check_draft(capsys, package, draft, target, report)
    path = entry_of(cache)
    entry = json.loads(path.read_text())
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "output edited":  # valid JSON, its sha256 no longer matches
        entry["output"] = [["stdout", "ok: planted\n"]]
        entry["code"] = 0
        path.write_text(json.dumps(entry))
    elif damage == "inputs edited":  # the inputs' digests planted to match anything: the body's digest refuses it
        entry["inputs"] = []
        path.write_text(json.dumps(entry))
    elif damage == "another key's":  # a whole, intact entry filed under another key
        path.rename(path.with_name("0" * 64 + ".json"))
        (path.parent / ("0" * 64 + ".json")).rename(path)
        entry["key"] = "0" * 64
        entry["sha256"] = verdict_cache._body_digest(entry)
        path.write_text(json.dumps(entry))
    else:
        path.chmod(0o664)
    again = check_draft(capsys, package, draft, target, report)
    assert again == first and "planted" not in again[1]
    assert hits == [False, False]
    assert json.loads(entry_of(cache).read_text())["key"] == path.stem  # computed again and stored anew


def test_an_error_is_never_stored(tmp_path, capsys, cache) -> None:
    package = copy_release(SMALL_RELEASE, tmp_path / "tree")
    code, _, err = run_cli(
        capsys, "explain", str(package), "--model", "nosuchmodel", "--layer-ids", "2", "--num-layers", "4"
    )
    assert code == 2 and err
    assert not list((cache / "verdicts").glob("*.json")) if (cache / "verdicts").exists() else True


def test_no_cache_turns_it_off(tmp_path, capsys, cache, hits, static, monkeypatch) -> None:
    package, draft, target, report = setup(tmp_path)
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    check_draft(capsys, package, draft, target, report)
    check_draft(capsys, package, draft, target, report)
    assert hits == [] and not (cache / "verdicts").exists()


CHILD = (
    "import atexit, sys\n"
    "atexit.register(lambda: sys.stderr.write(f\"IMPORTED torch={'torch' in sys.modules} libcst={'libcst' in sys.modules}\\n\"))\n"
    "from patchcraft.cli import main\n"
    "main(sys.argv[1:])\n"
)


def test_a_hit_replays_the_same_bytes_without_importing_torch_or_libcst(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    package, draft, target, report = setup(tmp_path)
    env = dict(os.environ, PATCHCRAFT_CACHE=str(tmp_path / "cache"))
    env.pop("PATCHCRAFT_NO_CACHE", None)
    argv = [
        "check-draft",
        str(draft),
        str(package),
        "--target",
        str(target),
        "--model",
        MODEL,
        "--trained-on",
        "hf:0,3,31",
    ]
    runs = [
        subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, env=env) for _ in range(2)
    ]
    cold, warm = runs
    assert cold.returncode == warm.returncode == 1, cold.stderr
    assert "IMPORTED torch=True" in cold.stderr  # the cold verdict ran the harness
    assert warm.stdout == cold.stdout and "CPU harness" in warm.stdout
    assert "IMPORTED torch=False libcst=False" in warm.stderr
