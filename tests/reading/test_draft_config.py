"""``reading.draft_config``: a draft's and a target's ``config.json``, and the fc width from the weights' header only."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from patchcraft.base.errors import PatchcraftError
from patchcraft.reading.draft_config import fc_input_width, read_draft, read_target, with_ids


def write_config(directory: Path, config: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def write_header(path: Path, tensors: dict[str, list[int]]) -> None:
    """A safetensors file that is only its header: the reading never goes past it."""
    header = {name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]} for name, shape in tensors.items()}
    data = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(data)) + data)


def test_an_sglang_config_gives_eagle_configs_ids_and_the_fc_width(tmp_path: Path) -> None:
    draft = write_config(
        tmp_path / "draft",
        {
            "architectures": ["LlamaForCausalLMEagle3"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]},
            "hidden_size": 7168,
        },
    )
    write_header(draft / "model.safetensors", {"midlayer.mlp.fc.weight": [8, 8], "fc.weight": [7168, 21504]})
    config = read_draft(draft)
    assert config.layer_ids == (1, 29, 57) and config.top_level_ids is None and not config.is_speculators
    assert config.architectures == ("LlamaForCausalLMEagle3",) and config.hidden_size == 7168
    assert (config.fc_in, config.fc_source) == (21504, "fc.weight 7168x21504 in model.safetensors")


def test_a_speculators_config_keeps_its_top_level_ids_and_layer_config_width(tmp_path: Path) -> None:
    draft = write_config(
        tmp_path / "draft",
        {
            "speculators_model_type": "eagle3",
            "eagle_aux_hidden_state_layer_ids": [2, 30, 58],
            "transformer_layer_config": {"hidden_size": 4096},
            "hidden_size": 1,
        },
    )
    config = read_draft(draft)
    assert config.is_speculators and config.layer_ids is None
    assert config.speculators_ids == config.top_level_ids == (2, 30, 58) and config.hidden_size == 4096
    assert (config.fc_in, config.fc_source) == (None, "no fc.weight in a safetensors file")


def test_the_index_names_the_shard_with_the_fc(tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    write_header(draft / "a.safetensors", {"fc.weight": [8, 16]})
    write_header(draft / "b.safetensors", {"fc.weight": [8, 24]})
    (draft / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"fc.weight": "b.safetensors"}}))
    assert fc_input_width(draft) == (24, "fc.weight 8x24 in b.safetensors")


def test_the_target_reads_its_text_config(tmp_path: Path) -> None:
    target = write_config(
        tmp_path / "target",
        {"architectures": ["KimiVL"], "text_config": {"num_hidden_layers": 61, "hidden_size": 7168}},
    )
    config = read_target(target)
    assert (config.architectures, config.num_layers, config.hidden_size) == (("KimiVL",), 61, 7168)
    assert config.path == target / "config.json"


@pytest.mark.parametrize(
    "config, message",
    [
        ([1, 2], "expected a JSON object"),
        ({"eagle_config": [1]}, "eagle_config: expected an object"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, True]}}, "expected a list of integers"),
        ({"target_hidden_size": 0}, "target_hidden_size: expected a positive integer, got 0"),
    ],
)
def test_a_bad_config_is_one_line(tmp_path: Path, config: object, message: str) -> None:
    with pytest.raises(PatchcraftError, match=message):
        read_draft(write_config(tmp_path / "draft", config))


def test_a_missing_config_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PatchcraftError, match="no such file or directory"):
        read_target(tmp_path / "nowhere")
    with pytest.raises(PatchcraftError, match="config.json: no such file"):
        read_draft(tmp_path)


def test_with_ids_sets_eagle_configs_ids_as_a_fix_does(tmp_path: Path) -> None:
    draft = read_draft(write_config(tmp_path / "draft", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1]}}))
    fixed = with_ids(draft, (-1, 2, 30))
    assert fixed.layer_ids == (-1, 2, 30) and fixed.raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        -1,
        2,
        30,
    ]
    assert draft.raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1]  # the config read stays as it was
