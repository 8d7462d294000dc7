"""``patchcraft run``'s preflight covers what SGLang reads, and a warm launch reuses its verdict.

Real subprocesses over SGLang 0.5.10 installed with ``pip install --no-deps``
into a throwaway venv; the "server" prints its argv, so a launch shows.
The draft and target are configs written here (test_check_draft): the Kimi
case is the draft ``[2, 30, 58]`` trained on ``hf:0,3,31``, which this
release feeds ``hs[3], hs[31], hs[59]``: it must never launch on an
unchecked "ok". The flag table is read from the real ``server_args.py`` of
several releases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import install_release, release_package
from patchcraft.reading.server_args import parse_server_args, release_flags
from drafts import kimi_target, sglang_draft

RELEASE = "0.5.10"
KIMI, GOOD = [2, 30, 58], [-1, 2, 30]
PRINTS = "import sys; print('LAUNCHED', sys.argv[1:])"


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A venv with the release installed (no dependencies), a cache shared by the module, a target config."""
    root = tmp_path_factory.mktemp("preflight")
    package = install_release(RELEASE, root / "venv")
    return {"package": package, "cache": root / "cache", "kimi": kimi_target(root / "kimi"), "root": root}


def run(
    install: dict, *server_args: str, env: dict | None = None, preflight: bool = True, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "patchcraft",
        "run",
        "--target",
        str(install["package"]),
        "--no-smoke",
        "--trained-on",
        "hf:0,3,31",
    ]
    command += ([] if preflight else ["--no-preflight"]) + ["--", sys.executable, "-c", PRINTS, *server_args]
    environment = {
        **os.environ,
        "PATCHCRAFT_CACHE": str(install["cache"]),
        "HF_HUB_CACHE": str(install["root"] / "no-hub"),
        **(env or {}),
    }
    environment.pop("PATCHCRAFT_NO_CACHE", None)
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600, cwd=cwd)


def assert_refused(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "LAUNCHED" not in proc.stdout
    assert "[-1, 2, 30]" in proc.stdout and "refused to launch" in proc.stderr


def assert_not_checked(proc: subprocess.CompletedProcess, *named: str) -> None:
    """Exit 2, one line saying what was not checked; no launch and no "ok" anywhere."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "LAUNCHED" not in proc.stdout and "ok" not in proc.stdout.split()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not checked" in lines[0] and "--no-preflight" in lines[0], proc.stderr
    for text in named:
        assert text in lines[0], lines[0]


# -- argparse abbreviations, resolved against the release's own flags -----------------


def test_an_abbreviated_algorithm_flag_is_preflighted(install: dict, tmp_path: Path) -> None:
    """``--speculative-algo EAGLE3``: SGLang's parser accepts it, so the Kimi draft is refused, not launched."""
    draft = sglang_draft(tmp_path / "draft", KIMI)
    proc = run(
        install,
        "--model-path",
        str(install["kimi"]),
        "--speculative-algo",
        "EAGLE3",
        "--speculative-draft-model-p=" + str(draft),
        "--tp",
        "8",
    )
    assert_refused(proc)
    assert "--speculative-algo read as --speculative-algorithm" in proc.stderr


def test_an_ambiguous_abbreviation_is_named_not_guessed(install: dict, tmp_path: Path) -> None:
    """``--pp`` matches --pp-size, --pp-max-micro-batch-size and --pp-async-batch-depth on 0.5.10: SGLang refuses it."""
    draft = sglang_draft(tmp_path / "draft", GOOD)
    proc = run(
        install,
        "--model-path",
        str(install["kimi"]),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
        "--pp",
        "2",
    )
    assert_not_checked(proc, "--pp is ambiguous", "--pp-size", "--pp-max-micro-batch-size")


# -- --config FILE, merged as the release's prepare_server_args merges it -----------------


def test_the_flags_of_a_config_file_are_preflighted(install: dict, tmp_path: Path) -> None:
    draft = sglang_draft(tmp_path / "draft", KIMI)
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"speculative-algorithm: EAGLE3\nspeculative-draft-model-path: {draft}\ntp-size: 8\n", encoding="utf-8"
    )
    proc = run(install, "--model-path", str(install["kimi"]), "--config", str(config))
    assert_refused(proc)
    assert f"--config {config} read" in proc.stderr


def test_the_command_line_wins_over_the_config_file(install: dict, tmp_path: Path) -> None:
    """SGLang puts the file's flags first: the command line's draft is the one served."""
    bad, good = sglang_draft(tmp_path / "bad", KIMI), sglang_draft(tmp_path / "good", GOOD)
    config = tmp_path / "serve.yml"
    config.write_text(f"speculative-algorithm: EAGLE3\nspeculative-draft-model-path: {bad}\n", encoding="utf-8")
    proc = run(
        install,
        "--model-path",
        str(install["kimi"]),
        "--config",
        str(config),
        "--speculative-draft-model-path",
        str(good),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "LAUNCHED" in proc.stdout and str(good) in proc.stdout


def test_a_broken_config_file_is_one_line(install: dict, tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("speculative-algorithm: [EAGLE3\n", encoding="utf-8")
    proc = run(install, "--model-path", str(install["kimi"]), "--config", str(config))
    assert proc.returncode == 2 and "LAUNCHED" not in proc.stdout
    assert proc.stderr.strip().count("\n") == 0 and str(config) in proc.stderr and "not valid YAML" in proc.stderr, (
        proc.stderr
    )


# -- hub names: the local Hugging Face cache, or "not checked" -------------------------


def hub_snapshot(
    hub: Path, repo_id: str, source: Path, commit: str = "0123456789abcdef0123456789abcdef01234567"
) -> Path:
    """A hub cache entry as huggingface_hub lays it out: refs/main, snapshots/<commit>/ (symlinks to blobs/)."""
    repository = hub / ("models--" + repo_id.replace("/", "--"))
    (repository / "refs").mkdir(parents=True, exist_ok=True)
    (repository / "refs" / "main").write_text(commit, encoding="utf-8")
    snapshot = repository / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repository / "blobs").mkdir(exist_ok=True)
    for path in source.iterdir():
        blob = repository / "blobs" / path.name
        blob.write_bytes(path.read_bytes())
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def test_a_hub_target_not_in_the_cache_is_not_checked_and_not_launched(install: dict, tmp_path: Path) -> None:
    draft = sglang_draft(tmp_path / "draft", KIMI)
    proc = run(
        install,
        "--model-path",
        "moonshotai/Kimi-K2.5",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
        "--tp",
        "8",
    )
    assert_not_checked(
        proc, "--model-path moonshotai/Kimi-K2.5", "models--moonshotai--Kimi-K2.5", "target's config was not read"
    )


def test_a_hub_target_in_the_local_cache_is_checked(install: dict, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    hub_snapshot(hub, "moonshotai/Kimi-K2.5", install["kimi"])
    argv = [
        "--model-path",
        "moonshotai/Kimi-K2.5",
        "--speculative-algorithm",
        "EAGLE3",
        "--tp",
        "8",
        "--speculative-draft-model-path",
    ]
    refused = run(install, *argv, str(sglang_draft(tmp_path / "kimi-draft", KIMI)), env={"HF_HUB_CACHE": str(hub)})
    assert_refused(refused)
    assert "read from the local Hugging Face cache" in refused.stderr
    launched = run(install, *argv, str(sglang_draft(tmp_path / "good-draft", GOOD)), env={"HF_HUB_CACHE": str(hub)})
    assert launched.returncode == 0 and "LAUNCHED" in launched.stdout, launched.stdout + launched.stderr


def test_a_hub_draft_is_looked_up_too(install: dict, tmp_path: Path) -> None:
    """``--speculative-draft-model-path org/draft``, found under ``$HF_HOME/hub``."""
    home = tmp_path / "hf-home"
    hub_snapshot(home / "hub", "someone/kimi-eagle3", sglang_draft(tmp_path / "draft", KIMI))
    argv = [
        "--model-path",
        str(install["kimi"]),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "someone/kimi-eagle3",
    ]
    assert_refused(run(install, *argv, env={"HF_HOME": str(home), "HF_HUB_CACHE": ""}))
    assert_not_checked(run(install, *argv), "someone/kimi-eagle3", "draft's config was not read")


def test_no_preflight_stays_the_way_out(install: dict, tmp_path: Path) -> None:
    draft = sglang_draft(tmp_path / "draft", KIMI)
    proc = run(
        install,
        "--model-path",
        "moonshotai/Kimi-K2.5",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
        preflight=False,
    )
    assert proc.returncode == 0 and "LAUNCHED" in proc.stdout, proc.stderr


def test_without_torch_the_static_overlay_is_said(install: dict) -> None:
    """The overlay build is quiet, so the preflight says the harness did not run (torch hidden from this process)."""
    hide_torch = "import sys; sys.modules['torch'] = None; from patchcraft.cli import main; main(sys.argv[1:])"
    command = [
        sys.executable,
        "-c",
        hide_torch,
        "run",
        "--target",
        str(install["package"]),
        "--",
        sys.executable,
        "-c",
        PRINTS,
    ]
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**os.environ, "PATCHCRAFT_CACHE": str(install["cache"])},
        timeout=600,
    )
    assert proc.returncode == 0 and "LAUNCHED" in proc.stdout, proc.stderr
    assert "torch is not installed, so the overlay is static" in proc.stderr
    with_smoke_off = subprocess.run(
        [*command[:6], "--no-smoke", *command[6:]],
        capture_output=True,
        text=True,
        env={**os.environ, "PATCHCRAFT_CACHE": str(install["cache"])},
        timeout=600,
    )
    assert with_smoke_off.returncode == 0 and "torch" not in with_smoke_off.stderr, with_smoke_off.stderr


# -- the verdict cache --------------------------------------------------------------


def test_a_warm_launch_reuses_the_verdict_until_an_input_changes(install: dict, tmp_path: Path) -> None:
    draft = sglang_draft(tmp_path / "draft", GOOD)
    argv = [
        "--model-path",
        str(install["kimi"]),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
        "--tp",
        "8",
    ]
    cold = run(install, *argv)
    assert cold.returncode == 0 and "LAUNCHED" in cold.stdout and "reused" not in cold.stderr, cold.stderr
    warm = run(install, *argv)
    assert warm.returncode == 0 and "preflight verdict reused" in warm.stderr, warm.stderr
    assert warm.stdout == cold.stdout  # the same report, replayed, then the launch
    # The draft now says the Kimi ids: the stored "ok" must not be replayed.
    config = json.loads((draft / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = KIMI
    (draft / "config.json").write_text(json.dumps(config))
    assert_refused(run(install, *argv))


def test_a_changed_target_or_patched_tree_is_checked_again(install: dict, tmp_path: Path) -> None:
    target = kimi_target(tmp_path / "target")
    draft = sglang_draft(tmp_path / "draft", GOOD)
    argv = [
        "--model-path",
        str(target),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
    ]
    assert run(install, *argv).returncode == 0
    assert "reused" in run(install, *argv).stderr
    (target / "config.json").write_text((target / "config.json").read_text().replace("7168", "4096"))
    changed = run(install, *argv)
    assert "reused" not in changed.stderr and changed.returncode == 1, changed.stderr  # hidden size no longer matches
    (target / "config.json").write_text((target / "config.json").read_text().replace("4096", "7168"))
    assert run(install, *argv).returncode == 0
    # The served tree changes when the install does (an edited overlay file is not served: run rebuilds it,
    # tests/overlay/test_overlay_integrity.py): the new overlay's files are read again.
    installed = install["package"] / "srt" / "models" / "deepseek_v2.py"
    original = installed.read_bytes()
    try:
        installed.write_bytes(original + b"\n# changed\n")
        assert "reused" not in run(install, *argv).stderr
    finally:
        installed.write_bytes(original)


def test_a_verdict_another_user_wrote_is_not_trusted(install: dict, tmp_path: Path) -> None:
    draft = sglang_draft(tmp_path / "draft", GOOD)
    argv = [
        "--model-path",
        str(install["kimi"]),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
    ]
    assert run(install, *argv).returncode == 0
    entries = sorted((install["cache"] / "preflight").glob("*.json"), key=lambda p: p.stat().st_mtime)
    os.chown(entries[-1], 65534, 65534)
    assert "reused" not in run(install, *argv).stderr


# -- the flag table, read from real releases (in process: ast only) -------------------


@pytest.mark.parametrize("version", ["0.4.6", "0.5.10", "0.5.23"])
def test_flags_come_from_the_release_source(version: str) -> None:
    package = release_package(version)
    flags = release_flags(package)
    assert flags is not None and flags.options["--speculative-algorithm"] == "speculative_algorithm"
    parsed = parse_server_args(["--speculative-algo", "EAGLE3", "--tp", "8", "--model-path", "m"], package)
    assert (parsed.algorithm, parsed.tp, parsed.model_path) == ("EAGLE3", 8, "m")
    assert flags.config == (version != "0.4.6")  # --config FILE from 0.5.3


def test_0_5_23_flags_are_generated_from_annotated_fields() -> None:
    """From 0.5.12 most flags come from ``A[T, Arg(...)]`` fields: their names and aliases count."""
    flags = release_flags(release_package("0.5.23"))
    assert flags is not None
    assert (
        flags.options["--tensor-parallel-size"] == "tp_size"
        and flags.options["--speculative-draft-model"] == "speculative_draft_model_path"
    )


def test_without_the_release_flags_an_abbreviation_is_unchecked() -> None:
    parsed = parse_server_args(["--speculative-algo", "EAGLE3"], None)
    assert parsed.algorithm is None and "algorithm" in parsed.unchecked
