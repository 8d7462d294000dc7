"""Run a command as an unprivileged uid (a non-root server, an OpenShift uid with no passwd entry).

The sessions run as root, which ignores file modes, so a permission case
is only real when the step itself runs as another uid (``setpriv``). That
uid must still be able to start this Python: when the interpreter lives
under a directory others cannot enter (``/root`` is 0700), the step runs
in a private mount namespace (``unshare -m``) where that directory is a
0755 tmpfs holding only a bind mount of the interpreter's prefix. Nothing
outside the namespace changes, and it ends with the command.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import pytest

NOBODY = 65534


def _closed_ancestor(path: Path) -> Path | None:
    """The top-most ancestor of ``path`` that others cannot enter (no o+x), or None."""
    for parent in reversed(path.parents):  # "/" first
        if parent != Path("/") and not parent.stat().st_mode & 0o001:
            return parent
    return None


def require_root_tools() -> None:
    """Skip (naming why) where a uid cannot be switched: not root, or no setpriv/unshare."""
    if os.getuid() != 0:
        pytest.skip("switching to an unprivileged uid needs root")
    for tool in ("setpriv", "unshare"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    if not _can_mount():
        pytest.skip("no private mount namespace here (unshare -m and mount need CAP_SYS_ADMIN)")


@functools.lru_cache(maxsize=None)
def _can_mount() -> bool:
    probe = "mount -t tmpfs patchcraft-probe /mnt 2>/dev/null || mount -t tmpfs patchcraft-probe /tmp"
    return (
        subprocess.run(
            ["unshare", "-m", "sh", "-c", f"mount --make-rprivate / && ({probe})"], capture_output=True
        ).returncode
        == 0
    )


def run_as(uid: int, argv: Sequence[str], env: Mapping[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``argv`` as ``uid`` (its own gid, no groups), with exactly ``env``; text output captured."""
    require_root_tools()
    switch = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
    prefix = Path(os.path.realpath(sys.base_prefix))
    closed = _closed_ancestor(prefix)
    if closed is None:
        return subprocess.run(switch, capture_output=True, text=True, env=dict(env), timeout=timeout)
    # /root is 0700: show the interpreter's prefix, and only it, through a 0755 tmpfs in a private namespace.
    script = " && ".join(
        [
            "set -e",
            "mount --make-rprivate /",
            "view=$(mktemp -d)",
            f'mount --bind {shlex.quote(str(prefix))} "$view"',
            f"mount -t tmpfs -o mode=755 patchcraft-test {shlex.quote(str(closed))}",
            f"mkdir -p {shlex.quote(str(prefix))}",
            f'mount --move "$view" {shlex.quote(str(prefix))}',
            'rmdir "$view"',
            'exec "$@"',
        ]
    )
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", *switch],
        capture_output=True,
        text=True,
        env=dict(env),
        timeout=timeout,
    )


def open_directory() -> Path:
    """A fresh directory under the system temp dir that any uid can enter and read (pytest's are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="patchcraft-open-"))
    path.chmod(0o755)
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """A minimal environment: PATH, and what the caller adds (no HOME unless given)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
    env.update(extra)
    return env
