"""Draft and target directories written for tests: configs and header-only safetensors, no torch.

A SpecForge / SGLang-format draft (``eagle_config`` holds the ids), a vLLM
speculators-format one, and a Kimi-K2.5-shaped target config. Shared by the
check-draft, explain, run and preflight tests and by bench/ and scripts/.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

LAYERS, HIDDEN = 61, 7168  # Kimi-K2.5
FC_IN = 3 * HIDDEN  # 21504


def write_weights(path: Path, tensors: dict[str, list[int]]) -> None:
    header = {name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]} for name, shape in tensors.items()}
    header["__metadata__"] = {"format": "pt"}
    data = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(data)) + data)


def sglang_draft(
    directory: Path, ids: list[int] | None, fc_in: int | None = FC_IN, target_hidden: int = HIDDEN
) -> Path:
    """A SpecForge / SGLang-format EAGLE-3 draft (``eagle_config`` holds the ids)."""
    directory.mkdir(parents=True, exist_ok=True)
    config: dict = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": HIDDEN,
        "target_hidden_size": target_hidden,
        "num_hidden_layers": 1,
    }
    if ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    (directory / "config.json").write_text(json.dumps(config))
    if fc_in is not None:
        write_weights(
            directory / "model.safetensors", {"fc.weight": [HIDDEN, fc_in], "embed_tokens.weight": [163840, HIDDEN]}
        )
    return directory


def speculators_draft(directory: Path, ids: list[int]) -> Path:
    """A vLLM speculators-format draft: top-level ids, 0 = embedding, no eagle_config."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {"model_type": "llama", "hidden_size": HIDDEN, "num_hidden_layers": 1},
        "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "moonshotai/Kimi-K2.5"}},
        "target_hidden_size": HIDDEN,
        "eagle_aux_hidden_state_layer_ids": ids,
    }
    (directory / "config.json").write_text(json.dumps(config))
    write_weights(directory / "model.safetensors", {"fc.weight": [HIDDEN, FC_IN]})
    return directory


def kimi_target(directory: Path, hidden: int = HIDDEN) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {"num_hidden_layers": LAYERS, "hidden_size": hidden},
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory
