"""cli.py end to end, as a user runs it, on a real release (DeepseekV2, 0.5.6 and 0.5.10); the process entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import copy_release

MODEL = "sglang/srt/models/deepseek_v2.py"


#: Root ignores file modes; without these capabilities it obeys them like any user.
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


def patchcraft(*args: str, cwd: Path | None = None, obey_modes: bool = False) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "patchcraft", *args]
    if obey_modes:
        command = [*NO_DAC, *command]
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture(params=["0.5.6", "0.5.10"])
def tree(request, tmp_path: Path) -> Path:
    """A private copy of a release: <tmp>/<version>/sglang; the target root is its parent."""
    copy_release(request.param, tmp_path / request.param)
    return tmp_path / request.param


def test_check_apply_verify_revert_round_trip(tree: Path) -> None:
    model = tree / MODEL
    original = model.read_bytes()
    package = str(tree / "sglang")

    check = patchcraft("apply", "--check", "--model", "deepseek_v2", package)
    assert check.returncode == 1, check.stderr
    assert model.read_bytes() == original

    before = patchcraft("verify", "--model", "deepseek_v2", package)
    assert before.returncode == 1
    assert "missing" in before.stderr

    first = patchcraft("apply", "--model", "deepseek_v2", package)
    assert first.returncode == 0, first.stderr
    assert "Rewriting sglang/srt/models/deepseek_v2.py" in first.stderr
    patched = model.read_bytes()
    assert patched != original and b"capture_embedding_for_eagle3" in patched

    second = patchcraft("apply", "--model", "deepseek_v2", package)
    assert second.returncode == 0
    assert "already-patched" in second.stderr
    assert model.read_bytes() == patched

    verified = patchcraft("verify", "--model", "deepseek_v2", "--format", "json", package)
    assert verified.returncode == 0, verified.stdout
    doc = json.loads(verified.stdout)
    [entry] = [m for m in doc["models"] if m["model"] == "deepseek_v2.DeepseekV2ForCausalLM"]
    assert entry["status"] == "already-patched" and entry["compiles"] and entry["idempotent"]
    # The models sharing its edit sites come along, each saying why, and so does the release-wide
    # runner row (CUDA-graph decode needs it).
    rows = {m["model"]: m for m in doc["models"]}
    siblings = SHARING_DEEPSEEK_V2.get(tree.name, [])
    assert list(rows) == ["deepseek_v2.DeepseekV2ForCausalLM", *siblings, "runner"]
    assert entry["included_by"] is None
    for sibling in siblings:
        assert rows[sibling]["included_by"] == "shares DeepseekV2Model.forward with deepseek_v2.DeepseekV2ForCausalLM"
    assert all(row["status"] == "already-patched" for row in rows.values() if row["model"] != "runner")
    assert {e["status"] for e in entry["edits"]} == {"present"}

    reverted = patchcraft("revert", "--model", "deepseek_v2", package)
    assert reverted.returncode == 0
    assert model.read_bytes() == original


#: The model classes that run DeepseekV2Model.forward, per release (0.5.6 has none).
SHARING_DEEPSEEK_V2 = {
    "0.5.10": [
        "glm4_moe_lite.Glm4MoeLiteForCausalLM",
        "kimi_k25.KimiK25ForConditionalGeneration",
        "mistral_large_3_eagle.MistralLarge3ForCausalLMEagle",
    ],
}


def test_diff_is_a_patch_that_git_and_patch_accept(tree: Path, tmp_path: Path) -> None:
    result = patchcraft("diff", "--model", "deepseek_v2", str(tree / "sglang"))
    assert result.returncode == 0
    assert result.stdout.startswith(f"--- a/{MODEL}\n+++ b/{MODEL}\n")
    assert "\x1b[" not in result.stdout  # plain when piped
    patch_file = tmp_path / "fix.patch"
    patch_file.write_text(result.stdout)
    subprocess.run(["git", "apply", "--check", str(patch_file)], cwd=tree, check=True)
    subprocess.run(["patch", "-p1", "-s", "-i", str(patch_file)], cwd=tree, check=True)
    assert patchcraft("verify", "--model", "deepseek_v2", str(tree / "sglang")).returncode == 0


def test_checkout_root_and_single_file_targets(tmp_path: Path) -> None:
    checkout = tmp_path / "fork"
    copy_release("0.5.10", checkout / "python")
    diff = patchcraft("diff", "--model", "deepseek_v2", str(checkout))
    assert diff.stdout.startswith("--- a/python/sglang/srt/models/deepseek_v2.py")
    single = patchcraft("apply", str(checkout / "python" / MODEL))
    assert single.returncode == 0, single.stderr
    assert "deepseek_v2.DeepseekV2ForCausalLM" in single.stderr


def test_json_schema_is_stable(tree: Path) -> None:
    result = patchcraft("apply", "--check", "--format", "json", "--model", "deepseek_v2", str(tree / "sglang"))
    doc = json.loads(result.stdout)
    assert list(doc) == ["schema", "patchcraft", "command", "targets", "models", "summary", "files"]
    [entry] = [m for m in doc["models"] if m["model"] == "deepseek_v2.DeepseekV2ForCausalLM"]
    assert set(entry) == {
        "path",
        "model",
        "status",
        "edits",
        "files",
        "compiles",
        "idempotent",
        "notes",
        "message",
        "included_by",
        "proof",
    }
    assert entry["status"] == "would-patch"
    # DeepseekV2 on 0.5.6 and 0.5.10 captures a deferred all-reduce sum, so its setter also marks the layers (docs/fusion.md).
    assert {e["kind"] for e in entry["edits"]} == {"init", "setter", "forward", "fusion-mark"}
    assert doc["summary"]["exit_code"] == result.returncode == 1


def test_list_names_transforms_and_their_sites(tree: Path) -> None:
    result = patchcraft("list", str(tree / "sglang"))
    assert result.returncode == 0
    for name in ("init_capture_flag", "accept_embedding_layer_id", "capture_embedding_output"):
        assert name in result.stdout
    assert "sglang/srt/models/deepseek_v2.py:DeepseekV2Model.forward" in result.stdout


# -- broken input: exit 2, one clear line, file unchanged ------------------------


def _broken(tree: Path, old: str, new: str, count: int = 1) -> tuple[Path, bytes]:
    model = tree / MODEL
    text = model.read_text()
    assert old in text
    model.write_text(text.replace(old, new, count))
    return model, model.read_bytes()


def _assert_refused(
    result: subprocess.CompletedProcess, model: Path, data: bytes, *needles: str, code: int = 1
) -> None:
    """Refused: an ``error`` row is exit 1 (a syntax error, which stops the run, 2); the only model named
    with --model failed, so nothing at all is written (not the runner files either)."""
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Rewriting" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert lines, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)
    assert model.read_bytes() == data


def test_missing_anchor_names_file_class_method_and_expectation(tree: Path) -> None:
    model, data = _broken(tree, "        self.layers_to_capture = []\n", "")
    result = patchcraft("apply", "--model", "deepseek_v2", str(tree / "sglang"))
    # Without the init anchor the class graph no longer finds an init owner:
    # the model is reported with the precise reason, and nothing is written.
    assert result.returncode in (1, 2)
    assert "layers_to_capture" in result.stderr and "DeepseekV2Model" in result.stderr
    assert model.read_bytes() == data


def test_missing_collector_anchor(tree: Path) -> None:
    model, data = _broken(tree, "        aux_hidden_states = []\n", "")
    result = patchcraft("apply", "--model", "deepseek_v2", str(tree / "sglang"))
    _assert_refused(result, model, data, "deepseek_v2.py", "DeepseekV2Model.forward", "aux collector")


def test_ambiguous_anchor(tree: Path) -> None:
    model, data = _broken(
        tree,
        "        self.layers_to_capture = []\n",
        "        self.layers_to_capture = []\n        self.layers_to_capture = []\n",
    )
    result = patchcraft("apply", "--model", "deepseek_v2", str(tree / "sglang"))
    _assert_refused(result, model, data, "DeepseekV2Model.__init__", "ambiguous")


def test_syntax_error(tree: Path) -> None:
    model, data = _broken(tree, "    def set_eagle3_layers_to_capture(", "    def set_eagle3_layers_to_capture((")
    result = patchcraft("apply", "--model", "deepseek_v2", str(tree / "sglang"))
    _assert_refused(result, model, data, "deepseek_v2.py", "syntax error", code=2)


def test_missing_path(tmp_path: Path) -> None:
    result = patchcraft("apply", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"patchcraft: error: {tmp_path / 'nowhere'}: no such file or directory"


@pytest.mark.parametrize("what", ["file", "directory"])
def test_read_only_file_or_directory(tree: Path, what: str) -> None:
    """Run apply without root's override of file modes, on a read-only file or directory."""
    model = tree / MODEL
    data = model.read_bytes()
    target = model if what == "file" else model.parent
    target.chmod(0o444 if what == "file" else 0o555)
    try:
        result = patchcraft("apply", "--model", "deepseek_v2", str(tree / "sglang"), obey_modes=True)
    finally:
        target.chmod(0o644 if what == "file" else 0o755)
    _assert_refused(result, model, data, "read-only", "deepseek_v2.py", code=2)


def test_failed_write_leaves_original_and_no_temp_files(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the write itself fail (os.replace), in process: exit 2, file untouched."""
    from patchcraft.commands._pipeline import run_pipeline
    from patchcraft.pipeline.stages import Options
    from patchcraft.engine.records import Mode
    from patchcraft.base.errors import PatchcraftError

    model = tree / MODEL
    data = model.read_bytes()

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PatchcraftError, match="cannot write"):
        run_pipeline(Options(targets=(str(tree / "sglang"),), models=("deepseek_v2",)), Mode.APPLY)
    assert model.read_bytes() == data
    assert not list(model.parent.glob(".*.patchcraft"))


def test_help_and_version() -> None:
    assert patchcraft("--help").returncode == 0
    assert "patchcraft" in patchcraft("--version").stdout


def test_shared_options_are_declared_once() -> None:
    """``--format``, ``--color`` and ``--overlay`` have one declaration each in the click modules (cli.py,
    cli_options.py, cli_drafts.py), and explain and check-draft share one ``--tp`` (smoke's ``--tp`` is the GPU
    smoke's own: other range, no default): same words everywhere."""
    import click

    import patchcraft.cli as cli_module

    source = "".join(
        (Path(cli_module.__file__).parent / f"{name}.py").read_text(encoding="utf-8")
        for name in ("cli", "cli_options", "cli_drafts")
    )
    assert [source.count(f'"{name}"') for name in ("--format", "--color", "--overlay", "--tp")] == [1, 1, 1, 2]

    def option(path: tuple[str, ...], name: str) -> click.Option:
        command: click.Command = cli_module.cli
        for part in path:
            assert isinstance(command, click.Group)
            command = command.commands[part]
        (found,) = [p for p in command.params if isinstance(p, click.Option) and name in p.opts]
        return found

    tps = [option((c,), "--tp") for c in ("explain", "check-draft")]
    assert tps[0].help == tps[1].help and tps[0].default == tps[1].default == 1
    assert option(("verify",), "--overlay").help != option(("smoke",), "--overlay").help  # each says what DIR is
    assert option(("list",), "--format").default == option(("apply",), "--format").default == "text"


def test_fetch_prints_the_package_root() -> None:
    result = patchcraft("fetch", "0.5.10")
    assert result.returncode == 0
    root = Path(result.stdout.strip())
    assert (root / "srt" / "models" / "deepseek_v2.py").is_file()
    bad = patchcraft("fetch", "not a version")
    assert bad.returncode == 2 and "not a release version" in bad.stderr


def test_the_collector_is_off_only_for_the_process_entry_point() -> None:
    """``patchcraft`` as a process runs without the cyclic GC; an in-process caller keeps it."""
    code = (
        "import gc, sys\n"
        "from patchcraft.cli import main\n"
        "sys.argv = ['patchcraft', '--version']\n"
        "try:\n    main({argv})\nexcept SystemExit:\n    pass\n"
        "print(gc.isenabled())\n"
    )
    for argv, enabled in (("", "False"), ("['--version']", "True")):
        run = subprocess.run([sys.executable, "-c", code.format(argv=argv)], capture_output=True, text=True, timeout=60)
        assert run.stdout.split()[-1] == enabled, (argv, run.stdout, run.stderr)
