"""`--format json` and `--format github` against their documented shape (docs/json.md).

The CLI runs in process on a fork-shaped copy of the 0.5.10 release, from
the fork root, as a CI step would.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from conftest import copy_release, run_cli as cli
from patchcraft.ui import machine_output
from patchcraft.engine.file_patch import revert_text
from patchcraft.engine.records import EditResult, Mode, ModelResult, RunResult
from patchcraft.base.status import HarnessStatus
from patchcraft.base.target import SglangTree
from patchcraft.harness.runner import SmokeResult, SmokeRun


ROOT = Path(__file__).resolve().parents[2]

RELEASE = "0.5.10"
MODELS = "python/sglang/srt/models"
QWEN = ("qwen2.Qwen2ForCausalLM", "qwen2_5_vl.Qwen2_5_VLForConditionalGeneration", "qwen3.Qwen3ForCausalLM")
GITHUB_LINE = re.compile(
    r"^::(?P<level>error|warning|notice) "
    r"(?:file=(?P<file>[^,:]+),(?:line=(?P<line>[1-9]\d*),)?)?"
    r"title=(?P<title>[^,:]+)::(?P<message>[^\r\n]+)$"
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    copy_release(RELEASE, root / "python")
    return root


@pytest.fixture
def fork(pristine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A writable fork root (``python/sglang/...``), also the working directory."""
    root = tmp_path / "fork"
    shutil.copytree(pristine, root)
    monkeypatch.chdir(root)
    return root


# -- the documented schema, read from docs/json.md --------------------------------


def doc_tables() -> dict[str, dict[str, str]]:
    """``{section title: {first cell: second cell}}`` for every table in docs/json.md."""
    tables: dict[str, dict[str, str]] = {}
    section, in_fields = "", False
    for line in (ROOT / "docs" / "json.md").read_text().splitlines():
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        if line.startswith("|"):
            in_fields = in_fields or line.startswith("| field |")
        else:
            in_fields = False
        match = re.match(r"^\| `([^`]+)` \| ([^|]+) \|", line)
        if match and in_fields:
            tables.setdefault(section, {})[match.group(1)] = match.group(2).strip()
    return tables


def statuses(paragraph: str) -> set[str]:
    """The status tables follow the paragraph ``Model statuses:`` / ``Edit statuses:``."""
    text = (ROOT / "docs" / "json.md").read_text()
    block = text.split(paragraph, 1)[1].split("\n\n", 2)[1]
    return set(re.findall(r"^\| `([^`]+)` \|", block, re.M))


TYPES = {
    "integer": (int,),
    "string": (str,),
    "object": (dict,),
    "summary": (dict,),
    "integer or null": (int, type(None)),
    "boolean or null": (bool, type(None)),
    "string or null": (str, type(None)),
    "boolean": (bool,),
}


def check_object(value: dict, fields: dict[str, str], optional: tuple[str, ...] = ()) -> None:
    assert set(value) | set(optional) == set(fields), f"undocumented or missing fields: {set(value) ^ set(fields)}"
    for name, item in value.items():
        kind = fields[name].split(" ")[0] if fields[name].startswith("list") else fields[name]
        expected = (list,) if kind == "list" else TYPES[kind]
        assert isinstance(item, expected) and not (isinstance(item, bool) and int in expected), (name, item)


def check_document(document: dict, code: int, with_diff: bool = False) -> None:
    tables = doc_tables()
    judged = document["command"] in ("verify", "apply", "check")
    check_object(
        document, tables["The document"], optional=(() if with_diff else ("diff",)) + (() if judged else ("files",))
    )
    for entry in document.get("files", []):
        check_object(entry, tables["A file"])
    assert document["schema"] == machine_output.SCHEMA_VERSION
    for target in document["targets"]:
        check_object(target, tables["A target"])
    for model in document["models"]:
        check_object(model, tables["A model"])
        assert model["status"] in statuses("Model statuses:")
        assert all(isinstance(f, str) for f in model["files"] + model["notes"])
        for edit in model["edits"]:
            check_object(edit, tables["An edit"])
            assert edit["status"] in statuses("Edit statuses:")
    check_object(document["summary"], tables["The summary"])
    summary = document["summary"]
    assert summary["exit_code"] == code
    assert summary["models"] == len(document["models"]) == sum(summary["by_status"].values())
    assert list(summary["by_status"]) == sorted(summary["by_status"])


def line_at(root: Path, rel: str, number: int) -> str:
    return (root / rel).read_text(encoding="utf-8").splitlines()[number - 1]


# -- JSON ----------------------------------------------------------------------------


def test_json_verify_matches_the_documented_schema(fork: Path, capsys) -> None:
    code, out, err = cli(capsys, "verify", "--format", "json", f"{MODELS}/qwen3.py")
    document = json.loads(out)
    assert code == 1 and err == ""
    check_document(document, code)
    assert document["command"] == "verify"
    assert [m["model"] for m in document["models"]] == list(QWEN)
    assert document["targets"] == [
        {"root": str(fork), "package": str(fork / "python" / "sglang"), "sglang_version": RELEASE}
    ]
    qwen3 = document["models"][2]
    assert [(e["kind"], e["file"], e["status"]) for e in qwen3["edits"]] == [
        ("setter", f"{MODELS}/qwen3.py", "applied"),
        ("init", f"{MODELS}/qwen2.py", "applied"),
        ("forward", f"{MODELS}/qwen2.py", "applied"),
    ]


def test_json_is_stable_across_runs(fork: Path, capsys) -> None:
    first = cli(capsys, "verify", "--format", "json", f"{MODELS}/qwen3.py", f"{MODELS}/llama.py")
    second = cli(capsys, "verify", "--format", "json", f"{MODELS}/llama.py", f"{MODELS}/qwen3.py")
    assert first == second


def test_json_apply_then_verify(fork: Path, capsys) -> None:
    code, out, _ = cli(capsys, "apply", "--format", "json", f"{MODELS}/qwen3.py")
    document = json.loads(out)
    assert code == 0
    check_document(document, code)
    assert document["summary"]["files_changed"] == 3
    assert {m["status"] for m in document["models"]} == {"patched"}
    code, out, _ = cli(capsys, "verify", "--format", "json", f"{MODELS}/qwen3.py")
    assert code == 0 and json.loads(out)["summary"]["by_status"] == {"already-patched": 3}


@pytest.mark.parametrize(
    ("argv", "with_diff"), [(("diff",), True), (("apply", "--check"), False), (("apply", "--check", "--diff"), True)]
)
def test_json_has_a_diff_only_when_asked(fork: Path, capsys, argv: tuple[str, ...], with_diff: bool) -> None:
    code, out, _ = cli(capsys, *argv, "--format", "json", f"{MODELS}/llama.py")
    document = json.loads(out)
    check_document(document, code, with_diff=with_diff)
    assert ("diff" in document) is with_diff
    if with_diff:
        assert f"+++ b/{MODELS}/llama.py" in document["diff"]
    assert document["command"] == ("diff" if argv[0] == "diff" else "check")


def test_json_revert_matches_the_schema(fork: Path, capsys) -> None:
    cli(capsys, "apply", f"{MODELS}/llama.py")
    code, out, _ = cli(capsys, "revert", "--format", "json", f"{MODELS}/llama.py")
    document = json.loads(out)
    check_document(document, code)
    assert code == 0 and "reverted" in document["summary"]["by_status"]


# -- GitHub annotations --------------------------------------------------------------


def workflow_commands(out: str) -> list[dict[str, str]]:
    found = []
    for line in out.splitlines():
        match = GITHUB_LINE.match(line)
        assert match, f"not a documented workflow command: {line!r}"
        found.append(match.groupdict())
    return found


@pytest.mark.parametrize("command", ["apply", "verify", "diff", "revert"])
def test_github_format_is_a_choice_of_every_report_command(fork: Path, capsys, command: str) -> None:
    code, out, _ = cli(capsys, command, "--format", "github", f"{MODELS}/bert.py")
    assert code == 0 and out == ""  # nothing needs attention: no annotation


def test_github_verify_annotates_each_missing_model_at_its_method(fork: Path, capsys) -> None:
    code, out, err = cli(capsys, "verify", "--format", "github", f"{MODELS}/qwen3.py")
    assert code == 1
    found = workflow_commands(out)
    assert [a["message"].split(":")[0] for a in found] == list(QWEN)
    for item in found:
        assert item["level"] == "error" and item["title"] == "patchcraft verify"
        assert (fork / item["file"]).is_file()  # relative to the working directory
        assert re.match(r"\s+def set_eagle3_layers_to_capture\(", line_at(fork, item["file"], int(item["line"])))
        assert re.search(
            r"missing setter \(\w+\.set_eagle3_layers_to_capture\), init \(Qwen2Model\.__init__( in qwen2\.py)?\), forward",
            item["message"],
        )
    assert "qwen3.Qwen3ForCausalLM" in err  # the human summary still goes to stderr


def test_github_apply_notices_then_a_clean_verify_prints_nothing(fork: Path, capsys) -> None:
    code, out, err = cli(capsys, "apply", "--format", "github", f"{MODELS}/qwen3.py")
    assert code == 0 and f"Rewriting {MODELS}/qwen2.py" in err
    found = workflow_commands(out)
    assert [a["level"] for a in found] == ["notice"] * 3
    assert all("patched: added setter" in a["message"] for a in found)
    for item in found:
        assert "def set_eagle3_layers_to_capture(" in line_at(fork, item["file"], int(item["line"]))
    code, out, _ = cli(capsys, "verify", "--format", "github", f"{MODELS}/qwen3.py")
    assert (code, out) == (0, "")


def test_github_points_at_a_missing_edit_in_another_file(fork: Path, capsys) -> None:
    # qwen3.py patched, qwen2.py not (as after a rebase that dropped one file):
    # qwen3's missing edits are Qwen2Model's, in qwen2.py.
    cli(capsys, "apply", f"{MODELS}/qwen3.py")
    qwen2 = fork / MODELS / "qwen2.py"
    qwen2.write_text(revert_text(qwen2.read_text(), qwen2))
    code, out, _ = cli(capsys, "verify", "--format", "github", f"{MODELS}/qwen3.py")
    qwen3 = [a for a in workflow_commands(out) if a["message"].startswith("qwen3.")]
    assert code == 1 and len(qwen3) == 1
    assert qwen3[0]["file"] == f"{MODELS}/qwen2.py"
    assert re.match(r"\s+def __init__\(", line_at(fork, qwen3[0]["file"], int(qwen3[0]["line"])))
    assert (
        qwen3[0]["message"]
        == "qwen3.Qwen3ForCausalLM: missing init (Qwen2Model.__init__ in qwen2.py), forward (Qwen2Model.forward in qwen2.py)"
    )


def test_github_paths_outside_the_working_directory_are_absolute(
    fork: Path, capsys, monkeypatch, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, _ = cli(capsys, "verify", "--format", "github", str(fork / MODELS / "llama.py"))
    assert code == 1
    for item in workflow_commands(out):
        assert Path(item["file"]).is_absolute() and Path(item["file"]).is_file()


# -- levels and escaping, on records built by hand ---------------------------------


def _result(mode: Mode, *models: ModelResult) -> RunResult:
    tree = SglangTree(package=Path("/nowhere/sglang"), root=Path("/nowhere"))
    return RunResult(mode=mode, tree=tree, version="x", models=models, changes=())


def _model(status: str, message: str = "m", edits: tuple[EditResult, ...] = ()) -> ModelResult:
    return ModelResult(model="mod.Cls", path="sglang/srt/models/mod.py", status=status, message=message, edits=edits)


@pytest.mark.parametrize(
    ("mode", "status", "level"),
    [
        (Mode.VERIFY, "already-patched", None),
        (Mode.VERIFY, "would-patch", "error"),
        (Mode.VERIFY, "unsupported", "warning"),  # fails the run only when served (--model, --strict)
        (Mode.VERIFY, "not-applicable", None),
        (Mode.APPLY, "not-applicable", None),
        (Mode.CHECK, "would-patch", "error"),
        (Mode.CHECK, "unsupported", "warning"),
        (Mode.DIFF, "would-patch", "warning"),
        (Mode.APPLY, "patched", "notice"),
        (Mode.APPLY, "already-patched", None),
        (Mode.APPLY, "error", "error"),
        (Mode.REVERT, "reverted", "notice"),
        (Mode.REVERT, "not-patched", None),
    ],
)
def test_github_levels(mode: Mode, status: str, level: str | None) -> None:
    lines = machine_output.github_lines([_result(mode, _model(status))], 0)
    assert [match["level"] for match in map(GITHUB_LINE.match, lines) if match] == ([level] if level else [])
    assert len(lines) == (1 if level else 0)


def test_github_escapes_data_and_properties() -> None:
    lines = machine_output.github_lines([_result(Mode.VERIFY, _model("unsupported", "50% a:b,c\r\nd"))], 2)
    assert (
        machine_output._command("error", None, None, "patchcraft", "bad: x\ny")
        == "::error title=patchcraft::bad: x%0Ay"
    )
    assert (
        lines[0]
        == "::warning file=/nowhere/sglang/srt/models/mod.py,title=patchcraft verify::mod.Cls: unsupported: 50%25 a:b,c%0D%0Ad"
    )
    assert (
        machine_output._command("error", "a,b:c.py", 3, "t:1,2", "m")
        == "::error file=a%2Cb%3Ac.py,line=3,title=t%3A1%2C2::m"
    )


# -- the exit code, decided from the records alone ----------------------------------


def _smoke_run(*statuses: str) -> SmokeRun:
    tree = SglangTree(package=Path("/nowhere/sglang"), root=Path("/nowhere"))
    rows = tuple(
        SmokeResult(f"mod.Cls{i}", "sglang/srt/models/mod.py", HarnessStatus(s)) for i, s in enumerate(statuses)
    )
    return SmokeRun(tree, "x", rows)


def _changed(result: RunResult) -> RunResult:
    return replace(result, changes=(object(),))  # only counted: a run that rewrote one file


@pytest.mark.parametrize(
    ("mode", "fail_on_change", "code"),
    [
        (Mode.APPLY, False, 0),
        (Mode.APPLY, True, 1),  # apply --exit-non-zero-on-fix: formatter-style
        (Mode.REVERT, True, 0),  # only apply's rewrites count
        (Mode.CHECK, True, 1),  # would patch: 1 with or without the flag
    ],
)
def test_fail_on_change_is_apply_s_rewrites(mode: Mode, fail_on_change: bool, code: int) -> None:
    status = {Mode.APPLY: "patched", Mode.REVERT: "reverted", Mode.CHECK: "would-patch"}[mode]
    results = [_changed(_result(mode, _model(status)))]
    assert machine_output.exit_code(results, fail_on_change=fail_on_change) == code
    assert machine_output.exit_code([_result(Mode.APPLY, _model("already-patched"))], fail_on_change=True) == 0


def test_fail_on_change_never_lowers_a_failure() -> None:
    results = [_changed(_result(Mode.APPLY, _model("patched"), _model("error")))]
    assert machine_output.exit_code(results, fail_on_change=True) == machine_output.exit_code(results) == 1


@pytest.mark.parametrize(
    ("statuses", "code"),
    [(("pass", "skipped"), 0), (("pass", "fail"), 1), (("error",), 1), ((), 0), (("n/a",), 0)],
)
def test_a_failed_or_unrunnable_smoke_row_exits_1(statuses: tuple[str, ...], code: int) -> None:
    results = [_result(Mode.VERIFY, _model("already-patched"))]
    assert machine_output.exit_code(results, smoke=[_smoke_run(*statuses)]) == code
    assert machine_output.smoke_failed([_smoke_run(*statuses)]) is bool(code)


def test_the_rows_decide_before_the_smoke() -> None:
    assert machine_output.exit_code([_result(Mode.VERIFY, _model("would-patch"))], smoke=[_smoke_run("pass")]) == 1


def test_a_report_with_one_verdict() -> None:
    assert (machine_output.verdict_code(True), machine_output.verdict_code(False)) == (0, 1)


# -- the CI configs of docs/ci.md, run as written ------------------------------------


def ci_blocks() -> list:
    text = (ROOT / "docs" / "ci.md").read_text()
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def patchcraft_commands(steps: list) -> list[list[str]]:
    """The ``patchcraft ...`` lines of the steps' ``run:`` scripts, without redirections."""
    commands = []
    for step in steps:
        for line in str(step.get("run", "")).splitlines():
            if line.startswith("patchcraft "):
                commands.append(shlex.split(line.split(">")[0].split("||")[0])[1:])
    return commands


def test_ci_job_verifies_the_installed_sglang(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    job = next(b for b in ci_blocks() if isinstance(b, dict) and "jobs" in b)
    commands = patchcraft_commands(job["jobs"]["verify-sglang"]["steps"])
    assert [c[0] for c in commands] == ["apply", "verify", "verify"]
    site = tmp_path / "site-packages"  # what `pip install --no-deps sglang==...` leaves
    copy_release(RELEASE, site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli(capsys, *commands[1])  # before the apply step: the check fails
    assert code == 1 and workflow_commands(out)[0]["file"] == "site-packages/sglang/srt/models/deepseek_v2.py"
    assert cli(capsys, *commands[0])[0] == 0
    assert cli(capsys, *commands[1])[:2] == (0, "")
    code, out, _ = cli(capsys, *commands[2])
    models = {m["model"]: m["status"] for m in json.loads(out)["models"]}
    assert code == 0 and models["deepseek_v2.DeepseekV2ForCausalLM"] == "already-patched"


def test_ci_step_for_a_fork_annotates_repository_paths(fork: Path, capsys) -> None:
    steps = next(
        b for b in ci_blocks() if isinstance(b, list) and any("actions/checkout" in str(s.get("uses")) for s in b)
    )
    (command,) = patchcraft_commands(steps)
    code, out, _ = cli(capsys, *command)
    found = workflow_commands(out)
    assert code == 1 and found
    assert all(a["file"].startswith("python/sglang/srt/") and (fork / a["file"]).is_file() for a in found)
    assert {"deepseek_v2.py", "qwen3.py"} <= {Path(a["file"]).name for a in found}
    assert cli(capsys, "apply", *[a for a in command[1:] if a not in ("--format", "github")])[0] == 0
    assert cli(capsys, *command)[:2] == (0, "")


def test_ci_single_step_snippet_is_the_job_s_step() -> None:
    single = next(b for b in ci_blocks() if isinstance(b, list) and len(b) == 1)
    job = next(b for b in ci_blocks() if isinstance(b, dict) and "jobs" in b)
    assert patchcraft_commands(single)[-1] == patchcraft_commands(job["jobs"]["verify-sglang"]["steps"])[1]


def test_a_harness_skipped_row_says_why_in_json(tmp_path: Path, capsys) -> None:
    """vLLM 0.34.0: a mixin class the harness cannot run itself is written ``harness-skipped``; its JSON row
    carries the harness's reason as a note (docs/json.md), the same words the text's ``proof:`` gives."""
    pytest.importorskip("torch")
    from conftest import vllm_release_package
    from patchcraft.base.fetch import copy_parts
    from patchcraft.base.vllm_fetch import PARTS

    package = copy_parts(vllm_release_package("0.34.0"), tmp_path / "vllm", PARTS)
    code, out, _ = cli(capsys, "apply", "--format", "json", "--engine", "vllm", "--model", "gemma4", str(package))
    skipped = [m for m in json.loads(out)["models"] if m["proof"] == "harness-skipped"]
    assert code == 0 and any(m["model"] == "gemma4.Gemma4ForCausalLM" for m in skipped), skipped
    for row in skipped:
        why = [n for n in row["notes"] if n.startswith(machine_output.HARNESS_SKIPPED_NOTE)]
        assert len(why) == 1 and "the edit is EagleModelMixin's alone, proven on " in why[0], row
