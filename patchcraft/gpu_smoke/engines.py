"""The smoke's engine runs: each ``sglang.Engine`` in its own worker process and process group, bounded in time.

The speculative run imports a probed copy of SGLang (:mod:`.probe`), first on
``PYTHONPATH``; the baseline imports the plain install. The patch reaches the
speculative run one of two ways:

- **apply** (default): the install was patched (``patchcraft apply``), so its
  copy carries the patch;
- **via run** (``--via-run``): the install is left as it is. An overlay is
  built from the probed copy (``patchcraft overlay build COPY --out DIR``) and
  the worker starts through ``patchcraft run --overlay DIR --no-preflight --``,
  the way a server would. The overlay serves a module only to a process that
  imports the very file it was built from, which the copy first on
  ``PYTHONPATH`` makes the copy's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from patchcraft.base.errors import PatchcraftError

from .probe import ENV_DIR

PROJECT_ROOT = Path(__file__).resolve().parents[2]
WORKER = ("-m", "patchcraft.gpu_smoke.worker")


class EngineRunFailed(Exception):
    """An engine crashed or timed out: a failed smoke (exit 1), not an environment error."""


@dataclass(frozen=True)
class Launch:
    """How one engine's worker process starts: the command before the worker, its environment, the sglang it must import."""

    prefix: Tuple[str, ...]
    env: Mapping[str, str]
    expect_sglang_under: Optional[str]

    def command(self, job_path: Path) -> list[str]:
        return [*self.prefix, sys.executable, *WORKER, str(job_path)]


def _pythonpath(environ: Mapping[str, str], *first: Path) -> str:
    inherited = environ.get("PYTHONPATH", "")
    return os.pathsep.join(p for p in [*(str(f) for f in first), str(PROJECT_ROOT), inherited] if p)


def baseline_launch(environ: Mapping[str, str]) -> Launch:
    """The plain install, no probe."""
    env = {k: v for k, v in environ.items() if k != ENV_DIR}
    env["PYTHONPATH"] = _pythonpath(environ)
    return Launch((), env, None)


def speculative_launch(
    environ: Mapping[str, str], probed_root: Path, probe_dir: Path, overlay: Optional[Path] = None
) -> Launch:
    """The probed copy first on ``PYTHONPATH``; with ``overlay``, launched through ``patchcraft run``."""
    env = dict(environ)
    env["PYTHONPATH"] = _pythonpath(environ, probed_root)
    env[ENV_DIR] = str(probe_dir)
    prefix: Tuple[str, ...] = ()
    if overlay is not None:
        prefix = (sys.executable, "-m", "patchcraft", "run", "--overlay", str(overlay), "--no-preflight", "--")
    return Launch(prefix, env, str(probed_root))


def build_overlay(probed_root: Path, directory: Path) -> Path:
    """``patchcraft overlay build <probed copy> --out DIR``, in process (the harness proof included).

    Refuses a copy with nothing to patch: the install is patched already, and
    the run would test the install, not the overlay.
    """
    from patchcraft.pipeline.serve import build_overlay as build
    from patchcraft.base.target import resolve_target

    overlay = build(resolve_target(str(probed_root / "sglang")), directory)
    if not overlay.modules:
        raise PatchcraftError(
            "--via-run: the installed sglang is patched already, so the overlay has nothing to serve; "
            "`patchcraft revert` it first, or run the smoke without --via-run"
        )
    return overlay.directory


def _kill_group(proc: "subprocess.Popen[bytes]") -> None:
    """Stop the worker and everything it started (SGLang's scheduler and
    detokenizer processes hold the GPUs): TERM the process group, then KILL."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_engine(launch: Launch, job: Dict[str, Any], job_path: Path, timeout_s: float, log_path: Path) -> Dict[str, Any]:
    """One engine run in its own session; past ``timeout_s`` the whole group is stopped."""
    job = dict(job, expect_sglang_under=launch.expect_sglang_under)
    job_path.write_text(json.dumps(job))
    with open(log_path, "w") as log:
        try:
            proc = subprocess.Popen(
                launch.command(job_path),
                env=dict(launch.env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise PatchcraftError(f"cannot start the engine worker: {exc}") from None
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise EngineRunFailed(f"sglang engine run timed out after {timeout_s:.0f}s (log: {log_path})") from None
        except BaseException:
            _kill_group(proc)
            raise
        _kill_group(proc)  # leftovers of a worker that exited (its children)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
        raise EngineRunFailed(
            f"sglang engine run failed (exit {proc.returncode}, log: {log_path}): " + " | ".join(tail)
        )
    result: Dict[str, Any] = json.loads(Path(job["out"]).read_text())
    return result
