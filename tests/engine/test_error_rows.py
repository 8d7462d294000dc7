"""One model in ``error`` is that model's: the rest of the tree is judged and written, and the exit code says so.

The tree is SGLang 0.5.2 shaped like a fork that kept a merge leftover:
``Qwen3MoeForCausalLM.set_eagle3_layers_to_capture`` defined three times.
qwen3_moe's inner model is ``qwen2_moe.Qwen2MoeModel`` (its ``__init__`` and
``forward`` live in qwen2_moe.py), so a setter failure that blocked its init
and forward files would also block Qwen2MoeForCausalLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

MODEL = "srt/models/qwen3_moe.py"
SETTER = "    def set_eagle3_layers_to_capture("


def triple_the_setter(package: Path) -> list[int]:
    """Define the setter three times in a row; return the line of each definition."""
    path = package / MODEL
    text = path.read_text(encoding="utf-8")
    start = text.index(SETTER)
    end = min(i for i in (text.find("\n    def ", start + 1), text.find("\nclass ", start + 1)) if i > 0)
    block = text[start:end].rstrip("\n") + "\n"
    text = text[:end] + "\n" + block + "\n" + block + text[end:]
    path.write_text(text, encoding="utf-8")
    return [n for n, line in enumerate(text.splitlines(), 1) if line.startswith(SETTER)]


def _json(capsys, *argv: str) -> tuple[int, dict]:
    code, out, _ = run_cli(capsys, *argv, "--format", "json")
    return code, json.loads(out)


def test_the_rest_of_the_tree_is_patched_and_the_exit_code_and_written_say_so(package: Path, capsys) -> None:
    lines = triple_the_setter(package)
    before = (package / MODEL).read_bytes()
    code, document = _json(capsys, "apply", "--no-smoke", str(package))
    rows = {m["model"]: m for m in document["models"]}
    assert code == 1 and document["summary"]["exit_code"] == 1
    assert rows["qwen3_moe.Qwen3MoeForCausalLM"]["status"] == "error"
    # qwen2_moe shares the inner model's init and forward with qwen3_moe: still patched
    assert rows["qwen2_moe.Qwen2MoeForCausalLM"]["status"] == "patched"
    assert sum(m["status"] == "patched" for m in document["models"]) >= 8
    written = document["summary"]["written"]
    assert "sglang/srt/models/qwen2_moe.py" in written and "sglang/srt/models/llama.py" in written, written
    assert "sglang/" + MODEL not in written and (package / MODEL).read_bytes() == before
    assert len(written) == document["summary"]["files_changed"]
    message = rows["qwen3_moe.Qwen3MoeForCausalLM"]["message"]
    where = ", ".join(map(str, lines))
    assert f"found 3 definitions (lines {where}; Python uses the last one, line {lines[-1]})" in message, message
    assert "remove the copies" in message and "--model" in message, message


def test_verify_check_and_revert_judge_the_others_and_exit_1(package: Path, capsys) -> None:
    triple_the_setter(package)
    assert run_cli(capsys, "apply", "--no-smoke", str(package))[0] == 1
    for argv in (("verify",), ("apply", "--check"), ("apply", "--no-smoke")):
        code, document = _json(capsys, *argv, str(package))
        statuses = {m["model"]: m["status"] for m in document["models"]}
        assert code == 1, (argv, code)
        assert statuses["qwen3_moe.Qwen3MoeForCausalLM"] == "error"
        assert statuses["qwen2_moe.Qwen2MoeForCausalLM"] == "already-patched", (argv, statuses)
        assert document["summary"]["written"] == [], argv
    tripled = package / MODEL
    code, document = _json(capsys, "revert", str(package))
    assert code == 0 and "sglang/srt/models/qwen2_moe.py" in document["summary"]["written"]
    assert "sglang/" + MODEL not in document["summary"]["written"] and tripled.read_text().count(SETTER) == 3


def test_leaving_the_model_out_with_model_exits_0(package: Path, capsys) -> None:
    """qwen3_moe comes along with qwen2_moe (they share qwen2_moe.py): its error row is shown and fails nothing."""
    triple_the_setter(package)
    code, document = _json(capsys, "apply", "--no-smoke", "--model", "qwen2_moe", "--model", "llama", str(package))
    rows = {m["model"]: m for m in document["models"]}
    assert code == 0 and "sglang/srt/models/qwen2_moe.py" in document["summary"]["written"]
    assert rows["qwen3_moe.Qwen3MoeForCausalLM"]["status"] == "error"
    assert rows["qwen3_moe.Qwen3MoeForCausalLM"]["included_by"]
    code, _ = _json(capsys, "verify", "--model", "qwen3_moe", str(package))
    assert code == 1  # named, it fails the run


def test_exit_2_writes_nothing(package: Path, capsys) -> None:
    """A usage error stops the run before any write: exit 2, and no file changed."""
    before = {p: p.read_bytes() for p in package.rglob("*.py")}
    code, _, err = run_cli(capsys, "apply", "--no-smoke", str(package / "srt" / "models" / "no_such_model.py"))
    assert code == 2 and err.count("\n") == 1, err
    assert {p: p.read_bytes() for p in package.rglob("*.py")} == before


@pytest.mark.parametrize("argv", [("verify",), ("apply", "--check")])
def test_a_pristine_tree_with_a_duplicated_setter_is_judged_whole(package: Path, capsys, argv) -> None:
    triple_the_setter(package)
    code, document = _json(capsys, *argv, str(package))
    statuses = [m["status"] for m in document["models"]]
    assert code == 1 and statuses.count("error") == 1 and statuses.count("would-patch") >= 8, statuses
