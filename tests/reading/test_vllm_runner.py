"""patchcraft.reading.vllm_runner: each release's own id resolution and model-type gate, run from its code.

Fast tier: 0.11.2 (the old runner alone, reading top-level ids; a gate) and
0.34.0 (the V2 runner alone; no gate). The full tier adds 0.9.2 and 0.10.2
(the ids never read from the draft) and 0.17.0 / 0.18.0 (both runners, the
old one the default). Planted trees show each reading failing on what it
must not accept.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import vllm_release_package
from patchcraft.reading.vllm_runner import (
    DRAFT_CONFIG,
    EAGLE_CONFIG,
    EAGLE_CONFIG_LAYER_IDS,
    PLACES,
    TOP_LEVEL,
    Gate,
    read_gate,
    read_runners,
)

IDS = (0, 3, 31)


def test_0_11_2_the_old_runner_reads_top_level_ids_only() -> None:
    (runner,) = read_runners(vllm_release_package("0.11.2"), IDS)
    assert runner.name == "old runner v1/worker/gpu_model_runner.py" and runner.default
    assert runner.function.startswith("v1/worker/gpu_model_runner.py:")
    assert runner.ids_for(TOP_LEVEL) == IDS and runner.ids_for(EAGLE_CONFIG) is None
    assert runner.default_getter == "get_eagle3_aux_hidden_state_layers"


def test_0_34_0_ships_the_v2_runner_alone() -> None:
    (runner,) = read_runners(vllm_release_package("0.34.0"), IDS)
    assert runner.name == "V2 runner v1/worker/gpu/model_runner.py" and runner.default
    assert runner.function.startswith("v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:")
    assert runner.ids_for(TOP_LEVEL) == IDS and runner.ids_for(EAGLE_CONFIG) is None
    assert runner.default_getter == "get_eagle3_default_aux_hidden_state_layers"
    assert runner.ids_for(EAGLE_CONFIG_LAYER_IDS) == IDS  # its own key in eagle_config, never SGLang's


def test_no_ids_resolve_to_none_everywhere() -> None:
    (runner,) = read_runners(vllm_release_package("0.34.0"), None)
    assert runner.resolved == tuple((place, None) for place in PLACES)


def test_gates() -> None:
    old = read_gate(vllm_release_package("0.11.2"))
    assert old.names == ("llama", "qwen", "minicpm", "gpt_oss") and old.where.startswith("config/speculative.py:")
    assert (
        old.admits("qwen3_moe") and old.admits("llama") and not old.admits("deepseek_v3")
    )  # the release's substring rule
    assert read_gate(vllm_release_package("0.34.0")) == Gate(None)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.9.2", "0.10.2"])
def test_before_0_11_the_draft_s_ids_are_never_read(version: str) -> None:
    (runner,) = read_runners(vllm_release_package(version), IDS)
    assert runner.default and runner.function == "" and runner.resolved == ()
    assert runner.default_getter == "get_eagle3_aux_hidden_state_layers"


@pytest.mark.slow
@pytest.mark.parametrize(
    "version, getter",
    [("0.17.0", "get_eagle3_aux_hidden_state_layers"), ("0.18.0", "get_eagle3_default_aux_hidden_state_layers")],
)
def test_both_runners_the_old_one_default(version: str, getter: str) -> None:
    old, v2 = read_runners(vllm_release_package(version), IDS)
    assert old.default and not v2.default
    assert old.ids_for(TOP_LEVEL) == v2.ids_for(TOP_LEVEL) == IDS
    assert old.ids_for(EAGLE_CONFIG) is None and v2.ids_for(EAGLE_CONFIG) is None
    assert old.ids_for(EAGLE_CONFIG_LAYER_IDS) is None and v2.ids_for(EAGLE_CONFIG_LAYER_IDS) is None
    assert old.default_getter == getter


@pytest.mark.slow
@pytest.mark.parametrize(
    "version, names",
    [
        ("0.9.2", ("llama",)),
        ("0.10.2", ("llama", "qwen")),
        ("0.18.0", ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25")),
    ],
)
def test_gate_by_release(version: str, names: tuple[str, ...]) -> None:
    gate = read_gate(vllm_release_package(version))
    assert gate.names is not None and set(names) <= set(gate.names)


# -- planted trees: what the readings must not accept ------------------------------------------

V2_FUNCTION = """
def get_eagle3_aux_layers_from_config(spec_config):
    hf_config = spec_config.draft_model_config.hf_config
    layer_ids = getattr(hf_config, "eagle_aux_hidden_state_layer_ids", None)
    if not layer_ids:
        layer_ids = (getattr(hf_config, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")
    return tuple(layer_ids) if layer_ids else None
"""


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_function_s_own_code_decides_and_the_env_default_picks_the_runner(tmp_path: Path) -> None:
    package = _plant(
        tmp_path,
        {
            "v1/worker/gpu_model_runner.py": "class GPUModelRunner:\n    pass\n",
            "v1/worker/gpu/model_runner.py": "x = 1\n",
            "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py": V2_FUNCTION,
            "envs.py": 'import os\nx = os.getenv("VLLM_USE_V2_MODEL_RUNNER", "1")\n',
        },
    )
    old, v2 = read_runners(package, IDS)
    assert v2.default and not old.default  # the env default is "1" here
    assert old.function == "" and v2.ids_for(EAGLE_CONFIG) == IDS  # this planted V2 reads eagle_config too


def test_a_function_the_stand_ins_cannot_run_is_an_error_not_a_crash(tmp_path: Path) -> None:
    package = _plant(
        tmp_path,
        {
            "v1/worker/gpu/model_runner.py": "x = 1\n",
            "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py": (
                "def get_eagle3_aux_layers_from_config(spec_config):\n    return open('/etc/passwd')\n"
            ),
        },
    )
    (runner,) = read_runners(package, IDS)
    assert runner.error.startswith("NameError") and runner.resolved == ()  # open is not among the safe builtins


def test_a_model_type_test_outside_the_eagle3_check_is_no_gate(tmp_path: Path) -> None:
    package = _plant(
        tmp_path,
        {
            "config.py": (
                "def f(hf_config, self):\n"
                '    if "gemma3" not in hf_config.model_type:\n        pass\n'
                '    if self.method == "eagle3" and "llama" not in self.target.model_type:\n        raise ValueError\n'
            )
        },
    )
    assert read_gate(package) == Gate(("llama",), "config.py:4")


def test_the_registry_maps_architectures_to_classes() -> None:
    from patchcraft.reading.vllm_runner import read_registry

    table = read_registry(vllm_release_package("0.11.2"))
    assert table["MistralForCausalLM"] == ("llama", "LlamaForCausalLM")
    assert table["DeepseekV3ForCausalLM"] == ("deepseek_v2", "DeepseekV3ForCausalLM")
    assert read_registry(Path("/nonexistent")) == {}


def test_an_env_default_of_none_leaves_the_choice_to_vllm_config(tmp_path: Path) -> None:
    files = {
        "v1/worker/gpu_model_runner.py": "class GPUModelRunner:\n    pass\n",
        "v1/worker/gpu/model_runner.py": "x = 1\n",
        "envs.py": 'import os\nx = maybe_convert_bool(os.getenv("VLLM_USE_V2_MODEL_RUNNER", None))\n',
    }
    prefers = "class VllmConfig:\n    @property\n    def use_v2_model_runner(self):\n        if x:\n            return False\n        return True\n"
    old, v2 = read_runners(_plant(tmp_path / "a", {**files, "config/vllm.py": prefers}), None)
    assert v2.default and not old.default
    old, v2 = read_runners(
        _plant(tmp_path / "b", {**files, "config/vllm.py": prefers.replace("return True", "return x")}), None
    )
    assert old.default and not v2.default  # no plain `return True`: the old runner stays the default


@pytest.mark.slow
def test_0_33_0_v2_is_the_default_and_the_old_runner_reads_eagle_config() -> None:
    old, v2 = read_runners(vllm_release_package("0.33.0"), IDS)
    assert v2.default and not old.default
    assert old.ids_for(EAGLE_CONFIG) == IDS and v2.ids_for(EAGLE_CONFIG) is None
    assert v2.ids_for(EAGLE_CONFIG_LAYER_IDS) == IDS and old.ids_for(EAGLE_CONFIG_LAYER_IDS) is None


def test_the_draft_s_whole_config_is_run_through_the_runner() -> None:
    """``config=``: the release's function on the draft's config.json as it is (top level first on 0.34.0)."""
    package = vllm_release_package("0.34.0")
    both = {"eagle_aux_hidden_state_layer_ids": [0, 3, 31], "eagle_config": {"layer_ids": [2, 30, 58]}}
    (runner,) = read_runners(package, None, config=both)
    assert runner.ids_for(DRAFT_CONFIG) == (0, 3, 31)
    (runner,) = read_runners(package, None, config={"eagle_config": {"layer_ids": [2, 30, 58]}})
    assert runner.ids_for(DRAFT_CONFIG) == (2, 30, 58)
    (runner,) = read_runners(package, None, config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}})
    assert runner.ids_for(DRAFT_CONFIG) is None  # SGLang's key: never read
    (runner,) = read_runners(package, IDS)
    assert DRAFT_CONFIG not in dict(runner.resolved)  # only when a config is given
