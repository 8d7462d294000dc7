"""A Hugging Face hub name, looked up in the local hub cache (never on the network).

SGLang takes ``--model-path org/name`` and downloads it at start-up. The
preflight can only check a draft against a target whose ``config.json`` it
can read, so a hub name is looked up where ``huggingface_hub`` keeps its
downloads: ``$HF_HUB_CACHE`` (or the older ``$HUGGINGFACE_HUB_CACHE``), else
``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub``; the repository is
``models--org--name/snapshots/<commit>/``, the commit read from
``refs/<revision>`` (``main`` by default) or given as the revision itself.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

#: What a hub repository id looks like: ``name`` or ``org/name`` (no path syntax).
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Snapshot:
    """Where a hub name was looked for, and what was found."""

    repo_id: str
    revision: str
    #: ``models--org--name`` in the hub cache.
    repository: Path
    #: The snapshot directory holding ``config.json``, or None when it is not cached.
    path: Path | None
    #: The ``refs/<revision>`` file read to find the commit (part of what the verdict depends on).
    ref: Path


def looks_like_repo_id(text: str) -> bool:
    """``org/name`` or ``name``, and not a local path (``./x``, ``/x``, ``~/x``, ``x/y/z``)."""
    return bool(_REPO_ID.match(text)) and ".." not in text


def hub_cache() -> Path:
    """The local hub cache directory, as ``huggingface_hub`` resolves it."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "huggingface" / "hub"
    return Path(os.path.expanduser("~")) / ".cache" / "huggingface" / "hub"


def find_snapshot(repo_id: str, revision: str | None = None) -> Snapshot:
    """The cached snapshot of ``repo_id`` at ``revision`` (default ``main``) that holds a ``config.json``."""
    revision = revision or "main"
    repository = hub_cache() / ("models--" + repo_id.replace("/", "--"))
    ref = repository / "refs" / revision
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        commit = revision if _COMMIT.match(revision) else ""
    path = repository / "snapshots" / commit if commit else None
    found = path if path is not None and (path / "config.json").is_file() else None
    return Snapshot(repo_id, revision, repository, found, ref)
