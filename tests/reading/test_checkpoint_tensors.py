"""``reading.checkpoint_tensors``: the target's embedding found through its index, one shard's header read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from patchcraft.base.errors import PatchcraftError  # noqa: E402
from patchcraft.reading.checkpoint_tensors import checkpoint_tensors, embedding_name, target_embedding  # noqa: E402

from probe_drafts import HIDDEN, VOCAB, built  # noqa: E402


def test_the_index_names_the_shard(tmp_path: Path) -> None:
    target = tmp_path / "target"
    shutil.copytree(built("target"), target)
    (target / "model-00002-of-00002.safetensors").write_bytes(b"\xff" * 3)  # not a safetensors file: never opened
    ref = target_embedding(target)
    assert ref.path.name == "model-00001-of-00002.safetensors" and ref.shape == (VOCAB, HIDDEN)


def test_a_missing_shard_is_one_line(tmp_path: Path) -> None:
    target = tmp_path / "target"
    shutil.copytree(built("target"), target)
    (target / "model-00001-of-00002.safetensors").unlink()
    with pytest.raises(PatchcraftError, match="missing \\(the index puts model.embed_tokens.weight in it\\)"):
        target_embedding(target)


def test_no_index_searches_the_files(tmp_path: Path) -> None:
    target = tmp_path / "target"
    shutil.copytree(built("target"), target)
    (target / "model.safetensors.index.json").unlink()
    (target / "model-00002-of-00002.safetensors").unlink()
    assert target_embedding(target).shape == (VOCAB, HIDDEN)


def test_the_text_models_embedding() -> None:
    names = ["vision_tower.embed_tokens.weight", "language_model.model.embed_tokens.weight", "mtp.embed_tokens.weight"]
    assert embedding_name(names) == "language_model.model.embed_tokens.weight"
    assert embedding_name(["lm_head.weight"]) is None


def test_draft_tensors(tmp_path: Path) -> None:
    assert "fc.weight" in checkpoint_tensors(built("draft", (0, 2, 3)))
    (tmp_path / "config.json").write_text(json.dumps({}))
    with pytest.raises(PatchcraftError, match="no .safetensors weights"):
        checkpoint_tensors(tmp_path)
