"""The ``--trained-on`` presets, on draft configs written here from the fields of real ones.

The SpecForge drafts copy the fields that matter of SpecForge's own
``configs/deepseek-v3-671b-eagle3.json`` (ids ``[1, 29, 57]``, hidden 7168,
no ``target_hidden_size``) and ``configs/llama3-8B-eagle3.json`` (no ids at
all, hidden 4096); the targets carry the fields of DeepSeek-V3's and
Llama-3-8B's ``config.json`` that the check reads. Each runs through the
real CLI on real releases.
"""

from __future__ import annotations

import ast
import json
import struct
from pathlib import Path

import pytest

from conftest import release_package, run_cli as cli
from drafts import HIDDEN, kimi_target, sglang_draft
from patchcraft.reading.draft_config import DraftConfig, read_draft
from patchcraft.base.errors import PatchcraftError
from patchcraft.analysis.training import FIRST_ID_RAW, Training, expected_states, parse_training


def write_weights(path: Path, tensors: dict[str, list[int]]) -> None:
    """A safetensors file holding only its header: the shapes are all the check reads."""
    header = {name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]} for name, shape in tensors.items()}
    data = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(data)) + data)


def specforge_draft(directory: Path, ids: list[int] | None, hidden: int, extra: dict | None = None) -> Path:
    """A SpecForge draft: ``LlamaForCausalLMEagle3``, ids in ``eagle_config`` (or none), no target_hidden_size."""
    directory.mkdir(parents=True, exist_ok=True)
    config: dict = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": hidden,
        "num_hidden_layers": 1,
        "model_type": "llama",
        "draft_vocab_size": 32000,
        **(extra or {}),
    }
    if ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    (directory / "config.json").write_text(json.dumps(config))
    write_weights(directory / "model.safetensors", {"fc.weight": [hidden, 3 * hidden]})
    return directory


def target(directory: Path, arch: str, layers: int, hidden: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [arch], "num_hidden_layers": layers, "hidden_size": hidden}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def deepseek_v3(tmp_path: Path) -> Path:
    return target(tmp_path / "DeepSeek-V3", "DeepseekV3ForCausalLM", 61, 7168)


def llama3_8b(tmp_path: Path) -> Path:
    return target(tmp_path / "Llama-3-8B", "LlamaForCausalLM", 32, 4096)


def check_json(capsys, draft: Path, target_dir: Path, release: str, *extra: str) -> tuple[int, dict, str]:
    code, out, err = cli(
        capsys, "check-draft", str(draft), "--target", str(target_dir), "--release", release, "--format", "json", *extra
    )
    return code, json.loads(out), err


def checks(document: dict) -> dict[str, bool | None]:
    return {c["name"]: c["ok"] for c in document["checks"]}


# -- the two real SpecForge configs ---------------------------------------------------


@pytest.mark.parametrize("release", ["0.5.10", "0.5.14", "0.5.23"])
def test_specforge_deepseek_v3_config_passes(tmp_path, capsys, release):
    draft = specforge_draft(tmp_path / "draft", [1, 29, 57], 7168)
    code, doc, _ = check_json(capsys, draft, deepseek_v3(tmp_path), release, "--trained-on", "specforge")
    assert code == 0, doc["checks"]
    assert doc["trained_on"]["hs"] == [2, 30, 58]
    assert doc["explain"]["served"] == [2, 30, 58]
    assert checks(doc)["hidden-size"] is True  # from hidden_size: the config has no target_hidden_size


@pytest.mark.parametrize("release", ["0.5.10", "0.5.23"])
def test_specforge_llama3_8b_config_without_ids_passes(tmp_path, capsys, release):
    draft = specforge_draft(tmp_path / "draft", None, 4096)
    code, doc, _ = check_json(capsys, draft, llama3_8b(tmp_path), release, "--trained-on", "specforge")
    assert code == 0, doc["checks"]
    # SpecForge's defaults [1, 15, 28] for 32 layers = SGLang's defaults [2, 16, 29] after +1.
    assert doc["trained_on"]["hs"] == [2, 16, 29]
    assert "defaults" in doc["trained_on"]["how"]
    assert doc["explain"]["served"] == [2, 16, 29]


def test_specforge_rejects_negative_ids(tmp_path, capsys):
    draft = specforge_draft(tmp_path / "draft", [-1, 2, 30], 7168)
    code, doc, _ = check_json(capsys, draft, deepseek_v3(tmp_path), "0.5.10", "--trained-on", "specforge")
    assert code == 1
    assert "SpecForge rejects negative ids" in doc["trained_on"]["problem"]


# -- SpecForge captures through SGLang 0.5.14's own setter ------------------------------


def _raw_setter_files(version: str) -> set[str]:
    """Model files of ``version`` whose setter tests ``layer_ids[0] == 1`` (ids raw otherwise)."""
    found = set()
    for path in sorted((release_package(version) / "srt" / "models").glob("*.py")):
        text = path.read_text(encoding="utf-8-sig")
        if "layer_ids[0] == 1" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.FunctionDef)
                and node.name == "set_eagle3_layers_to_capture"
                and "layer_ids[0] == 1" in ast.unparse(node)
            ):
                found.add(path.stem)
    return found


@pytest.mark.parametrize("version", ["0.5.13", "0.5.14"])
def test_first_id_raw_files_are_the_real_releases(version):
    assert _raw_setter_files(version) == FIRST_ID_RAW


def test_the_raw_file_scan_sees_a_plus_one_release():
    assert _raw_setter_files("0.5.10") == set()  # the scan can come back empty: 0.5.10 is +1 everywhere


def draft_ids(layer_ids=None, top_level_ids=None) -> DraftConfig:
    return DraftConfig(Path("config.json"), (), layer_ids, None, False, None, None, None, "", top_level_ids)


@pytest.mark.parametrize(
    ("text", "modules", "states"),
    [
        ("specforge", ("kimi_k25", "deepseek_v2"), (2, 30, 58)),  # 0.5.14's heuristic keeps [2, 30, 58] raw
        ("specforge", ("llama",), (3, 31, 59)),  # +1 on every other model
        ("specforge@0.5.6", ("kimi_k25", "deepseek_v2"), (3, 31, 59)),  # SGLang 0.5.6: +1 everywhere
    ],
)
def test_specforge_meaning_follows_the_setter_it_captured_through(text, modules, states):
    expected = expected_states(parse_training(text), draft_ids((2, 30, 58)), 3, 61, modules)
    assert expected is not None and not expected.problem
    assert expected.states == states


def test_specforge_takes_exactly_three_ids():
    expected = expected_states(parse_training("specforge"), draft_ids((1, 10, 20, 30)), 4, 61, ("llama",))
    assert expected is not None and "exactly three" in expected.problem


def test_specforge_before_0_5_14_reads_minus_1_as_the_embedding():
    expected = expected_states(parse_training("specforge@0.5.6"), draft_ids((-1, 2, 30)), 3, 61, ("deepseek_v2",))
    assert expected is not None and expected.states == (0, 3, 31) and not expected.problem


# -- speculators, EAGLE, Hugging Face -------------------------------------------------------


def test_speculators_current_format_is_hs_j_and_drops_the_verifier_state():
    expected = expected_states(parse_training("speculators"), draft_ids(top_level_ids=(2, 30, 58, 61)), 3, 61)
    assert expected is not None and expected.states == (2, 30, 58)
    assert "verifier" in expected.how


def test_speculators_defaults_without_ids():
    expected = expected_states(parse_training("speculators"), draft_ids(), 3, 61)
    assert expected is not None and expected.states == (2, 30, 58)


def test_speculators_0_4_worker_appends_after_each_layer():
    expected = expected_states(parse_training("speculators@0.4"), draft_ids(top_level_ids=(2, 30, 58, 60)), 3, 61)
    assert expected is not None and expected.states == (3, 31, 59)
    defaults = expected_states(parse_training("speculators@0.4"), draft_ids(), 3, 61)
    assert defaults is not None and defaults.states == (3, 31, 59)


def test_eagle_inputs_of_layers_2_half_and_n_minus_3(tmp_path, capsys):
    draft = specforge_draft(tmp_path / "draft", None, 4096)
    code, doc, _ = check_json(capsys, draft, llama3_8b(tmp_path), "0.5.23", "--trained-on", "eagle")
    assert doc["trained_on"]["hs"] == [2, 16, 29]
    assert code == 0, doc["checks"]  # SGLang's no-id defaults are EAGLE's states


def test_hf_last_state_is_after_the_final_norm():
    expected = expected_states(parse_training("hf:0,3,61"), draft_ids(), 3, 61)
    assert expected is not None and "after the final norm" in expected.problem
    fine = expected_states(parse_training("hf:0,3,60"), draft_ids(), 3, 61)
    assert fine is not None and not fine.problem


# -- names ------------------------------------------------------------------------------------


def test_parse_training_names():
    assert parse_training("speculators@0.4") == Training("speculators@0.4")
    assert parse_training("SpecForge@0.5.6").sglang == (0, 5, 6)
    assert parse_training("specforge@0.5.6").label == "specforge@0.5.6"
    assert parse_training("specforge").label == "specforge"
    for bad in ("specforge@", "speculators@0.3", "hf:0,x"):
        with pytest.raises(PatchcraftError, match="--trained-on"):
            parse_training(bad)


def test_speculators_v1_still_works_with_a_deprecation_line(tmp_path, capsys):
    draft = specforge_draft(tmp_path / "draft", [2, 30, 58], 7168)
    code, doc, err = check_json(capsys, draft, deepseek_v3(tmp_path), "0.5.10", "--trained-on", "speculators-v1")
    assert err.count("\n") == 1 and "speculators-v1 is deprecated" in err and "`speculators`" in err
    assert doc["trained_on"]["hs"] == [2, 30, 58]  # the same meaning as `speculators`
    assert code == 1  # 0.5.10 serves hs[3], hs[31], hs[59]


# -- the smaller gaps ---------------------------------------------------------------------------


def test_top_level_ids_outside_the_speculators_format_are_named(tmp_path, capsys):
    draft = specforge_draft(tmp_path / "draft", [1, 29, 57], 7168, {"eagle_aux_hidden_state_layer_ids": [0, 3, 31]})
    assert read_draft(draft).top_level_ids == (0, 3, 31)
    code, doc, _ = check_json(capsys, draft, deepseek_v3(tmp_path), "0.5.10")
    assert doc["draft"]["top_level_ids"] == [0, 3, 31]
    code, out, _ = cli(capsys, "check-draft", str(draft), "--target", str(deepseek_v3(tmp_path)), "--release", "0.5.10")
    assert "top-level eagle_aux_hidden_state_layer_ids [0, 3, 31]: SGLang ignores it" in out
    assert "vLLM reads it" in out


def test_hidden_size_is_compared_without_target_hidden_size(tmp_path, capsys):
    draft = specforge_draft(tmp_path / "draft", [1, 29, 57], 4096)  # a Llama-3-8B draft against DeepSeek-V3
    code, doc, _ = check_json(capsys, draft, deepseek_v3(tmp_path), "0.5.10", "--trained-on", "specforge")
    assert code == 1
    assert checks(doc)["hidden-size"] is False
    message = next(c["message"] for c in doc["checks"] if c["name"] == "hidden-size")
    assert "hidden_size (no target_hidden_size" in message and "4096" in message and "7168" in message


# -- the layer-output pipelines: Model-Optimizer, TorchSpec, AngelSlim, Automodel ------------------
#
# Each preset as read in its repository (docs/layer-ids.md cites file and commit): id j is the
# output of layer j (hs[j+1]), defaults [1, n//2-1, n-4]; the two vLLM exceptions read hs[j].
# A draft config as each pipeline's export writes it: Model-Optimizer writes eagle_config's ids
# (its defaults included), AngelSlim a top-level aux_hidden_states_layer_ids (no engine reads it),
# TorchSpec and Automodel no ids of their own.

N = 61  # the Kimi-shaped target of tests/drafts.py


def raw_draft(config: dict) -> DraftConfig:
    """The fields the presets read, as read_draft takes them from ``config``."""
    eagle = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = config.get("eagle_aux_hidden_state_layer_ids")
    return DraftConfig(
        Path("config.json"),
        (),
        tuple(eagle) if eagle else None,
        None,
        False,
        None,
        None,
        None,
        "",
        tuple(top) if top else None,
        config,
    )


NO_IDS: dict = {}
EAGLE_IDS = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}
ANGELSLIM_IDS = {"aux_hidden_states_layer_ids": [3, 30, 57]}


@pytest.mark.parametrize(
    ("preset", "config", "states"),
    [
        # Model-Optimizer: eagle_config's ids, hooked on the layer's output; sorted, as its hooks fire.
        ("modelopt", NO_IDS, (2, 30, 58)),
        ("modelopt", EAGLE_IDS, (3, 31, 59)),
        ("modelopt", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [57, 1, 29]}}, (2, 30, 58)),
        ("modelopt", ANGELSLIM_IDS, (2, 30, 58)),  # a field Model-Optimizer does not write
        # Its vLLM dump passed the ids to extract_hidden_states unshifted: hs[j].
        ("modelopt@vllm-dump", NO_IDS, (1, 29, 57)),
        ("modelopt@vllm-dump", EAGLE_IDS, (2, 30, 58)),
        # TorchSpec writes none of its ids: always its defaults, whatever the config's template says.
        ("torchspec", NO_IDS, (2, 30, 58)),
        ("torchspec", EAGLE_IDS, (2, 30, 58)),
        ("torchspec@vllm-ebf869e", NO_IDS, (1, 29, 57)),
        ("torchspec@vllm-ebf869e", EAGLE_IDS, (1, 29, 57)),
        # AngelSlim reads (and saves) a top-level aux_hidden_states_layer_ids.
        ("angelslim", NO_IDS, (2, 30, 58)),
        ("angelslim", EAGLE_IDS, (2, 30, 58)),
        ("angelslim", ANGELSLIM_IDS, (4, 31, 58)),
        ("angelslim", {"aux_hidden_states_layer_ids": [57, 1, 29]}, (58, 2, 30)),  # concatenated as given
        # Automodel writes none: its recipe's aux_layer_ids stay in the YAML.
        ("automodel", NO_IDS, (2, 30, 58)),
        ("automodel", EAGLE_IDS, (2, 30, 58)),
    ],
)
def test_layer_output_presets_for_61_layers(preset, config, states):
    expected = expected_states(parse_training(preset), raw_draft(config), 3, N)
    assert expected is not None and not expected.problem, expected
    assert expected.states == states
    assert ("hs[j+1]" in expected.how) == (not preset.endswith(("vllm-dump", "vllm-ebf869e")))


def _how(preset: str, config: dict) -> str:
    expected = expected_states(parse_training(preset), raw_draft(config), 3, N)
    assert expected is not None
    return expected.how


def test_each_preset_says_where_its_ids_come_from():
    both = EAGLE_IDS | ANGELSLIM_IDS
    assert "from eagle_config.eagle_aux_hidden_state_layer_ids" in _how("modelopt", both)
    assert "from aux_hidden_states_layer_ids (which neither SGLang nor vLLM reads)" in _how("angelslim", both)
    torchspec = _how("torchspec", both)
    assert "inference.aux_hidden_states_layers, never written to the config" in torchspec
    assert "--trained-on hf:3,31,59" in torchspec  # the config's [2, 30, 58], had TorchSpec trained on them
    assert "recipe_args.aux_layer_ids" in _how("automodel", both)


def test_layer_output_ids_outside_the_target_have_no_meaning():
    negative = expected_states(
        parse_training("modelopt"), raw_draft({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 30]}}), 3, N
    )
    assert negative is not None and "id -1 has no meaning under modelopt" in negative.problem
    past = expected_states(parse_training("angelslim"), raw_draft({"aux_hidden_states_layer_ids": [1, 29, 61]}), 3, N)
    assert past is not None and "id 61" in past.problem and "0..60" in past.problem


def test_layer_output_preset_names_parse():
    for name in ("modelopt", "modelopt@vllm-dump", "torchspec", "torchspec@vllm-ebf869e", "angelslim", "automodel"):
        assert parse_training(name.upper()).label == name
    for bad in ("modelopt@", "torchspec@vllm", "angelslim@0.1"):
        with pytest.raises(PatchcraftError, match="modelopt@vllm-dump"):
            parse_training(bad)


def angelslim_draft(directory: Path, extra: dict) -> Path:
    """An AngelSlim export: its Eagle3 draft config as save_pretrained writes it (no eagle_config)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["Eagle3LlamaForCausalLM"], "hidden_size": HIDDEN, "num_hidden_layers": 1, **extra}
    (directory / "config.json").write_text(json.dumps(config))
    write_weights(directory / "model.safetensors", {"fc.weight": [HIDDEN, 3 * HIDDEN]})
    return directory


def test_ids_in_a_field_no_engine_reads_are_lost(tmp_path, capsys):
    draft = angelslim_draft(tmp_path / "draft", ANGELSLIM_IDS)
    code, doc, _ = check_json(capsys, draft, kimi_target(tmp_path / "kimi"), "0.5.10", "--trained-on", "angelslim")
    assert doc["trained_on"]["hs"] == [4, 31, 58]
    assert doc["explain"]["served"] == [2, 30, 58]  # SGLang's defaults: it reads only eagle_config
    assert checks(doc)["convention"] is False and code == 1


def test_a_malformed_unread_field_is_one_line_exit_2(tmp_path, capsys):
    draft = angelslim_draft(tmp_path / "draft", {"aux_hidden_states_layer_ids": "1,29,57"})
    code, out, err = cli(
        capsys,
        "check-draft",
        str(draft),
        "--target",
        str(kimi_target(tmp_path / "kimi")),
        "--release",
        "0.5.10",
        "--trained-on",
        "angelslim",
    )
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "aux_hidden_states_layer_ids: expected a list of integers" in err


_SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("preset", "ids", "trained", "code", "release"),
    [
        # What Model-Optimizer's export writes for 61 layers: the states SGLang feeds, on both.
        ("modelopt", [1, 29, 57], [2, 30, 58], 0, "0.5.10"),
        ("modelopt", [1, 29, 57], [2, 30, 58], 0, "0.5.23"),
        # Its vLLM dump trained one layer earlier than SGLang feeds for those ids.
        ("modelopt@vllm-dump", [1, 29, 57], [1, 29, 57], 1, "0.5.10"),
        pytest.param("modelopt@vllm-dump", [1, 29, 57], [1, 29, 57], 1, "0.5.23", marks=_SLOW),
        # No ids of their own: SGLang's defaults are their defaults, one layer on.
        pytest.param("torchspec", None, [2, 30, 58], 0, "0.5.10", marks=_SLOW),
        ("torchspec", None, [2, 30, 58], 0, "0.5.23"),
        pytest.param("torchspec@vllm-ebf869e", None, [1, 29, 57], 1, "0.5.10", marks=_SLOW),
        pytest.param("torchspec@vllm-ebf869e", None, [1, 29, 57], 1, "0.5.23", marks=_SLOW),
        pytest.param("automodel", None, [2, 30, 58], 0, "0.5.10", marks=_SLOW),
        pytest.param("automodel", None, [2, 30, 58], 0, "0.5.23", marks=_SLOW),
        pytest.param("angelslim", None, [2, 30, 58], 0, "0.5.23", marks=_SLOW),
    ],
)
def test_layer_output_presets_on_real_releases(tmp_path, capsys, preset, ids, trained, code, release):
    draft = sglang_draft(tmp_path / "draft", ids)
    got, doc, _ = check_json(capsys, draft, kimi_target(tmp_path / "kimi"), release, "--trained-on", preset)
    assert doc["trained_on"]["hs"] == trained
    assert doc["explain"]["served"] == [2, 30, 58]
    assert checks(doc)["convention"] is (code == 0)
    assert got == code, doc["checks"]
