"""A checkpoint's tensors by name, from safetensors headers only (no torch, no tensor read).

The probe loads a draft's weights lazily (:mod:`patchcraft.harness.draft_probe`
maps each tensor's bytes when the draft code asks for it) and, when the
draft has no token embedding, reads the one embedding tensor of the
target's checkpoint: ``model.safetensors.index.json`` names its shard, the
shard's header gives its offsets, and nothing else of the target is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from patchcraft.base.errors import PatchcraftError
from patchcraft.reading.training_dumps import TensorRef, safetensors_tensors

INDEX = "model.safetensors.index.json"


def checkpoint_tensors(directory: Path) -> dict[str, TensorRef]:
    """Every tensor of the safetensors files in ``directory`` (the draft: one file or a few shards)."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise PatchcraftError(f"{directory}: no .safetensors weights (the probe reads safetensors only)")
    found: dict[str, TensorRef] = {}
    for path in files:
        found.update(safetensors_tensors(path))
    return found


def _weight_map(directory: Path) -> Optional[dict[str, str]]:
    index = directory / INDEX
    if not index.is_file():
        return None
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise PatchcraftError(f"{index}: not a readable index ({exc})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise PatchcraftError(f"{index}: no weight_map")
    return {str(k): str(v) for k, v in weight_map.items()}


def embedding_name(names: list[str]) -> Optional[str]:
    """The token embedding among ``names``: ``embed_tokens.weight`` under the shortest prefix (the text model's)."""
    found = [n for n in names if n.endswith("embed_tokens.weight") and "vision" not in n and "mtp" not in n]
    return min(found, key=len) if found else None


def target_embedding(directory: Path) -> TensorRef:
    """The token embedding of the target checkpoint in ``directory``: one shard's header read, one tensor located."""
    if not directory.is_dir():
        raise PatchcraftError(f"{directory}: no such directory (the target's checkpoint)")
    weight_map = _weight_map(directory)
    if weight_map is not None:
        name = embedding_name(list(weight_map))
        if name is None:
            raise PatchcraftError(f"{directory / INDEX}: names no embed_tokens.weight")
        shard = directory / weight_map[name]
        if not shard.is_file():
            raise PatchcraftError(f"{shard}: missing (the index puts {name} in it)")
        return safetensors_tensors(shard)[name]
    for path in sorted(directory.glob("*.safetensors")):
        tensors = safetensors_tensors(path)
        name = embedding_name(list(tensors))
        if name is not None:
            return tensors[name]
    raise PatchcraftError(f"{directory}: no embed_tokens.weight in its safetensors files")
