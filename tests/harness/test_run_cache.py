"""Harness runs kept by the bytes they ran (patchcraft.harness.run_cache): any input changed runs again.

Each kind of input the key is made of gets a case where one byte (or one
value) changes and the run is computed again, beside the case where
nothing changed and the stored value answers; a damaged, foreign or
writable-by-others entry is never used. The last case runs ``explain``
twice with its verdict cache emptied in between: the second answers the
same, by running the code, without importing torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from patchcraft.engine import result_cache, verdict_cache
from patchcraft.harness import run_cache

from conftest import flip_one_byte, run_reporting_torch

LLAMA = Path("srt") / "models" / "llama.py"


class Counter:
    """A run that counts how often it really ran, and returns its count."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict:
        self.calls += 1
        return {"ran": self.calls}


def remembered(package: Path, compute: Counter, texts: dict | None = None, asked: object = ("Llama", (2, 3), 6)):
    return run_cache.remembered("served", package, texts, asked, compute, lambda value: value, dict)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PATCHCRAFT_NO_CACHE", raising=False)
    return tmp_path / "cache" / "harness-runs"


def test_the_same_bytes_answer_from_the_cache(package: Path, cache: Path) -> None:
    compute = Counter()
    assert remembered(package, compute) == {"ran": 1}
    assert remembered(package, compute) == {"ran": 1}
    assert compute.calls == 1
    assert len(list(cache.glob("*.json"))) == 1


def test_another_copy_of_the_same_release_is_answered_too(package: Path, cache: Path, tmp_path: Path) -> None:
    import shutil

    compute = Counter()
    remembered(package, compute)
    other = tmp_path / "elsewhere" / "sglang"
    shutil.copytree(package, other)
    assert remembered(other, compute) == {"ran": 1}, "keyed by content, not by path"
    assert compute.calls == 1


@pytest.mark.parametrize(
    "change",
    ["a model file", "the aux module", "a text handed in", "the ids asked", "patchcraft's code", "torch's version"],
)
def test_any_input_changed_runs_again(change: str, package: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compute = Counter()
    texts = {package / LLAMA: (package / LLAMA).read_text(encoding="utf-8")}
    asked: object = ("Llama", (2, 3), 6)
    remembered(package, compute, texts, asked)
    assert remembered(package, compute, texts, asked) == {"ran": 1}
    if change == "a model file":
        flip_one_byte(package / "srt" / "models" / "qwen2.py", b"import", b"imporT")  # size and mtime kept
    elif change == "the aux module":
        aux = package / run_cache.AUX
        aux.parent.mkdir(parents=True, exist_ok=True)
        aux.write_text("# the release's collector\n", encoding="utf-8")
    elif change == "a text handed in":
        texts = {package / LLAMA: texts[package / LLAMA] + "\n"}
    elif change == "the ids asked":
        asked = ("Llama", (2, 4), 6)
    elif change == "patchcraft's code":
        monkeypatch.setattr(result_cache, "code_hash", lambda: "another build of patchcraft")
    else:
        real = verdict_cache.version_text
        monkeypatch.setattr(
            verdict_cache, "version_text", lambda module, file: "9.9.9" if module == "torch" else real(module, file)
        )
    assert remembered(package, compute, texts, asked) == {"ran": 2}, f"{change} changed: the run must be made again"


@pytest.mark.parametrize("other", ["srt/model_executor/model_runner.py", "srt/models/a_table.json"])
def test_a_run_that_read_another_file_of_the_tree_is_not_kept(other: str, package: Path, cache: Path) -> None:
    runner = package / other
    if not runner.exists():
        runner.write_text("{}", encoding="utf-8")  # data beside the model files: not in the key either
    calls: list[int] = []

    def reads_the_runner() -> dict:
        calls.append(len(runner.read_bytes()))
        return {"ran": len(calls)}

    asked = ("reads", 1)
    run_cache.remembered("served", package, None, asked, reads_the_runner, lambda v: v, dict)
    run_cache.remembered("served", package, None, asked, reads_the_runner, lambda v: v, dict)
    assert len(calls) == 2, f"{other} is not in the key: a run that read it is made every time"


def test_a_value_naming_the_tree_s_own_path_is_not_kept(package: Path, cache: Path) -> None:
    calls: list[int] = []

    def names_its_path() -> dict:
        calls.append(1)
        return {"crash": f"at {package}/srt/models/llama.py"}

    for _ in range(2):
        run_cache.remembered("served", package, None, ("path",), names_its_path, lambda v: v, dict)
    assert len(calls) == 2


def _only_entry(cache: Path) -> Path:
    (entry,) = cache.glob("*.json")
    return entry


def test_a_damaged_entry_is_refused_and_run_again(package: Path, cache: Path) -> None:
    compute = Counter()
    remembered(package, compute)
    entry = _only_entry(cache)
    data = json.loads(entry.read_text())
    data["value"] = {"ran": 41}  # the body no longer matches its sha256
    entry.write_text(json.dumps(data))
    assert remembered(package, compute) == {"ran": 2}
    assert remembered(package, compute) == {"ran": 2}, "stored anew, intact"


def test_an_entry_of_another_shape_is_refused_and_run_again(package: Path, cache: Path) -> None:
    compute = Counter()
    remembered(package, compute)

    def strict(value: object) -> dict:
        raise ValueError("not a value of this kind")

    assert run_cache.remembered("served", package, None, ("Llama", (2, 3), 6), compute, lambda v: v, strict) == {
        "ran": 2
    }


def test_an_entry_others_can_write_is_never_used(package: Path, cache: Path) -> None:
    compute = Counter()
    remembered(package, compute)
    os.chmod(_only_entry(cache), 0o666)
    assert remembered(package, compute) == {"ran": 2}


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_another_user_s_entry_is_never_used(package: Path, cache: Path) -> None:
    compute = Counter()
    remembered(package, compute)
    os.chown(_only_entry(cache), 65534, 65534)
    assert remembered(package, compute) == {"ran": 2}


def test_no_cache_runs_every_time(package: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATCHCRAFT_NO_CACHE", "1")
    compute = Counter()
    remembered(package, compute)
    assert remembered(package, compute) == {"ran": 2}
    assert not cache.exists()


def test_explain_answers_from_kept_runs_without_torch(package: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    argv = ["explain", str(package), "--model", "llama", "--layer-ids", "2,3", "--num-layers", "6"]

    def explain() -> tuple[str, str]:
        done = run_reporting_torch(argv, tmp_path / "cache")
        return done.stdout, done.stderr

    first, said = explain()
    assert "by running the code on the CPU harness" in first and "torch imported: True" in said, first + said
    import shutil

    shutil.rmtree(tmp_path / "cache" / "verdicts")  # the verdict is computed again; the harness runs are kept
    second, said = explain()
    assert second == first, second + said
    assert "torch imported: False" in said, said
