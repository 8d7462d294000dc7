"""``patchcraft probe``: its text, its JSON, its exit codes, the served wiring, and bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import run_cli  # noqa: E402

from probe_drafts import HIDDEN, TinyTarget, built, dump_plain, sequences  # noqa: E402

A = (0, 2, 3)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def probe(capsys, *args: str, draft: Path | None = None, data: Path | None = None) -> tuple[int, str, str]:
    draft = draft or built("draft", A)
    data = data or built("plain")
    return run_cli(
        capsys, "probe", str(draft), "--data", str(data), "--release", "0.5.10", "--tokens", "96", "--states",
        "hf:0,1,2,3,4", *args,
    )  # fmt: skip


def test_text_names_the_expected_and_the_served_wiring(capsys) -> None:
    code, out, err = probe(capsys, "--served", "hf:1,3,4")
    assert code == 1, err
    assert re.search(
        r"the weights expect hs\[0\], hs\[2\], hs\[3\] \(top-1 (8[5-9]|9\d|100)%; \d+ points over the next\)", out
    )
    served = re.search(r"this install feeds hs\[1\], hs\[3\], hs\[4\] \(top-1 \d+%; rank (\d+) of 60\)", out)
    assert served and int(served.group(1)) > 30, out
    assert "--trained-on hf:0,2,3" in out


def test_served_best_exits_0_and_json(capsys) -> None:
    code, out, _ = probe(capsys, "--served", "hf:0,2,3", "--format", "json")
    document = json.loads(out)
    assert code == 0 and document["exit_code"] == 0 and document["command"] == "probe"
    assert document["best"]["states"] == [0, 2, 3] and document["served"]["rank"] == 1
    assert document["data"]["format"] == "plain" and document["wirings"] == 60


def test_served_from_check_draft_reading(capsys) -> None:
    """Without --served: this install's served states for the draft's ids (0.5.10 llama: +1, so [1, 3, 4] -> hs[2], hs[4], hs[5])."""
    draft = built("draft", (1, 4, 5))  # its config says [0, 3, 4]: served as hs[1], hs[4], hs[5]
    code, out, err = run_cli(
        capsys, "probe", str(draft), "--data", str(built("plain")), "--release", "0.5.10", "--tokens", "96",
        "--target", str(built("target")), "--model", "llama",
    )  # fmt: skip
    assert code == 0, err + out
    assert "this install feeds hs[1], hs[4], hs[5] (top-1 " in out and "rank 1 of" in out
    assert "draft ids [0, 3, 4]" in out


def test_embedding_from_the_target_checkpoint(capsys, tmp_path: Path) -> None:
    """A draft without embed_tokens: the one tensor the target's index names is read from its shard."""
    from safetensors.torch import load_file, save_file

    draft = tmp_path / "draft"
    shutil.copytree(built("draft", A), draft)
    tensors = load_file(str(draft / "model.safetensors"))
    del tensors["embed_tokens.weight"]
    save_file(tensors, str(draft / "model.safetensors"))
    target = tmp_path / "target"
    shutil.copytree(built("target"), target)
    (target / "model-00002-of-00002.safetensors").write_bytes(b"not read")  # the other shard: never opened
    code, out, err = probe(capsys, "--served", "hf:0,2,3", "--target", str(target), draft=draft)
    assert code == 0, err
    assert "the target's" in out and "model-00001-of-00002.safetensors" in out


# -- bad input: one line, exit 2, nothing written ------------------------------------------------------


def refused(capsys, tmp_path: Path, *args: str, **kwargs) -> str:
    report = tmp_path / "report.json"
    code, out, err = probe(capsys, *args, "--report", str(report), **kwargs)
    assert code == 2, out + err
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert not report.exists() and not list(tmp_path.glob(".report.json*"))
    return err


def test_hidden_size_mismatch(capsys, tmp_path: Path) -> None:
    data = dump_plain(tmp_path / "other", TinyTarget(hidden=HIDDEN // 2), sequences(2))
    assert f"its states are {HIDDEN // 2} wide, but the draft takes states {HIDDEN} wide" in refused(
        capsys, tmp_path, data=data
    )


def test_missing_embeddings(capsys, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    draft = tmp_path / "draft"
    shutil.copytree(built("draft", A), draft)
    tensors = load_file(str(draft / "model.safetensors"))
    del tensors["embed_tokens.weight"]
    save_file(tensors, str(draft / "model.safetensors"))
    assert "the draft has no embed_tokens.weight: pass --target DIR" in refused(capsys, tmp_path, draft=draft)


def test_truncated_file(capsys, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(built("plain"), data)
    last = sorted(data.glob("*.safetensors"))[0]
    last.write_bytes(last.read_bytes()[:-100])
    assert "truncated" in refused(capsys, tmp_path, data=data)


def test_wiring_the_dump_cannot_supply(capsys, tmp_path: Path) -> None:
    assert "--served hs[0], hs[2], hs[9]: the dump holds no hs[9]" in refused(capsys, tmp_path, "--served", "hf:0,2,9")
    data = dump_plain(tmp_path / "two", TinyTarget(layers=1), sequences(2))  # hs[0], hs[1] only
    code, _, err = run_cli(capsys, "probe", str(built("draft", A)), "--data", str(data), "--release", "0.5.10")
    assert code == 2 and "holds 2 states (hs[0], hs[1]), the draft's fc takes 3" in err


def test_speculators_dump_needs_its_states(capsys) -> None:
    code, _, err = run_cli(
        capsys, "probe", str(built("draft", A)), "--data", str(built("speculators")), "--release", "0.5.10"
    )
    assert code == 2 and "does not name the states it holds: pass --states" in err


def test_no_torch_is_one_line(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("patchcraft.commands.probe.torch_problem", lambda: "is not installed")
    assert "torch, which is not installed: pip install 'patchcraft[smoke]'" in refused(capsys, tmp_path)
