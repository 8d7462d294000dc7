"""An overlay is judged as ``apply`` judges the same install: the same stages, the same rows, the same refusal.

The tree carries the field's sed fix (tests/hand_fix.py) on ``exaone_moe.py``
of 0.5.10: the harness fails it at PP > 1 (no first-stage gate). ``apply``
withholds it, with the hand-made lines, the consequence and the command;
``overlay build`` of the same install refuses with those very words and
builds nothing. Before the overlay ran the pipeline, it ran the engine and
the proof alone: no hand review, no advice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import copy_release, run_cli
from hand_fix import sed_fix

RELEASE = "0.5.10"
EXAONE = "exaone_moe.ExaoneMoEForCausalLM"


@pytest.fixture
def sed_fixed(tmp_path: Path) -> Path:
    package = copy_release(RELEASE, tmp_path / "install")
    sed_fix(package / "srt" / "models" / "exaone_moe.py")
    return package


def _row(err: str, model: str) -> str:
    (line,) = [line for line in err.splitlines() if f" {model} " in f" {line} "]
    return line.split(model, 1)[1].strip()


def test_overlay_build_refuses_with_the_words_of_apply(sed_fixed: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("torch")
    target = str(sed_fixed / "srt" / "models" / "exaone_moe.py")
    out = tmp_path / "overlay"
    code, _, err = run_cli(capsys, "overlay", "build", "--no-runner", target, "--out", str(out))
    assert code == 2 and not out.exists(), err
    overlay_row = _row(err, EXAONE)  # the rows apply prints, then the refusal
    refusal = err.strip().splitlines()[-1]
    assert refusal.startswith(f"patchcraft: error: {EXAONE}: ") and refusal.endswith("; no overlay was built"), err
    words = refusal[len(f"patchcraft: error: {EXAONE}: ") : -len("; no overlay was built")]
    before = (sed_fixed / "srt" / "models" / "exaone_moe.py").read_bytes()
    code, _, err = run_cli(capsys, "apply", "--no-runner", target)
    assert code == 1 and (sed_fixed / "srt" / "models" / "exaone_moe.py").read_bytes() == before
    row = _row(err, EXAONE)
    assert row == f"{words}; proof: harness-failed", (row, words)
    assert overlay_row == row
    # The hand review's advice is in both: the hand-made lines, the consequence, the command.
    assert "hand-made exaone_moe.py" in words and "at PP > 1 later stages capture the wrong tensor" in words
    assert "run: " in words


def test_an_overlay_tree_is_refused_as_a_target_when_its_bootstrap_is_damaged(tmp_path: Path, capsys) -> None:
    """``verify``/``smoke`` of ``<overlay>/tree/sglang``: the overlay's full check first, naming the file."""
    package = copy_release(RELEASE, tmp_path / "install")
    out = tmp_path / "overlay"
    code, _, err = run_cli(capsys, "overlay", "build", "--no-smoke", str(package), "--out", str(out))
    assert code == 0, err
    tree = out / "tree" / "sglang"
    code, _, err = run_cli(capsys, "verify", "--no-runner", str(tree), "--model", "llama")
    assert code == 0, err
    bootstrap = out / "sitecustomize.py"
    for damage in ("emptied", "changed", "missing"):
        text = bootstrap.read_bytes()
        bootstrap.chmod(0o644)
        if damage == "missing":
            bootstrap.unlink()
        else:
            bootstrap.write_bytes(b"" if damage == "emptied" else text + b"\n# edited\n")
        code, _, err = run_cli(capsys, "verify", "--no-runner", str(tree), "--model", "llama")
        assert code == 2 and "sitecustomize.py" in err and err.count("\n") == 1, (damage, err)
        if damage != "missing":
            bootstrap.write_bytes(text)


@pytest.mark.parametrize("damage", ["missing", "emptied", "changed"])
def test_check_draft_and_explain_refuse_an_overlay_whose_bootstrap_is_damaged(
    damage: str, tmp_path: Path, capsys
) -> None:
    """``--overlay`` on check-draft and explain: the overlay's full check, naming sitecustomize.py (exit 2)."""
    from drafts import kimi_target, sglang_draft

    package = copy_release(RELEASE, tmp_path / "install")
    out = tmp_path / "overlay"
    assert run_cli(capsys, "overlay", "build", "--no-smoke", str(package), "--out", str(out))[0] == 0
    draft = sglang_draft(tmp_path / "draft", [-1, 2, 30])
    target = kimi_target(tmp_path / "kimi")
    check_draft = ("check-draft", str(draft), "--target", str(target), "--overlay", str(out))
    explain = (
        "explain",
        "--overlay",
        str(out),
        "--layer-ids",
        "-1,2,30",
        "--num-layers",
        "61",
        "--model",
        "deepseek_v2",
    )
    for argv in (check_draft, explain):
        code, _, err = run_cli(capsys, *argv)
        assert code != 2, (argv, err)  # intact: a verdict
    bootstrap = out / "sitecustomize.py"
    if damage == "missing":
        bootstrap.unlink()
    else:
        bootstrap.write_bytes(b"" if damage == "emptied" else bootstrap.read_bytes() + b"\nimport os\n")
    for argv in (check_draft, explain):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and "sitecustomize.py" in err and err.count("\n") == 1, (argv, err)


def test_usage_says_why_apply_and_overlay_build_exit_differently() -> None:
    """The test above: apply exits 1 (it writes the others), overlay build 2 (nothing built); docs/usage.md says why."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text(encoding="utf-8")
    section = text.split("### Why `apply` exits 1 and `overlay build` exits 2 for the same refusal")[1].split("\n## ")[
        0
    ]
    assert "it cannot exit 2" in section and "no overlay was built" in section and "exit 2" in section
