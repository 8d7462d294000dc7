"""patchcraft.harness.switches: the config switches the harness runs one side of, said and compared (issue 46)."""

from __future__ import annotations

import ast

import pytest

from patchcraft.harness.switches import ATTENTION_RESIDUALS, HYPER_CONNECTIONS, SWITCHES, named_in, reads_config


@pytest.mark.parametrize(
    "switch, fields, side",
    [
        (ATTENTION_RESIDUALS, {}, True),  # Kimi-K3 reads the field with None as no attention residuals
        (ATTENTION_RESIDUALS, {"attn_res_block_size": None}, True),
        (ATTENTION_RESIDUALS, {"attn_res_block_size": 6}, False),
        (HYPER_CONNECTIONS, {}, None),  # GLM-5-Next: a config without `mhc` does not say which layers it builds
        (HYPER_CONNECTIONS, {"mhc": True}, True),
        (HYPER_CONNECTIONS, {"mhc": False}, False),
    ],
)
def test_a_target_config_says_its_side(switch, fields: dict, side) -> None:
    assert switch.side_of(fields) is side


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda s: s.field)
def test_each_condition_names_its_switch(switch) -> None:
    text = switch.condition()
    assert named_in(text) is switch and named_in(f"cuda, rocm: {text}") is switch
    assert f"config.{switch.field} = {switch.ran!r}" in text and "not shown" in text


def test_other_words_name_no_switch() -> None:
    assert named_in("run with config.hc_mult = 4 (streams)") is None
    assert named_in("no runner reads eagle_config") is None


@pytest.mark.parametrize(
    "source, reads",
    [
        ("def f(self):\n    return self.config.mhc\n", True),
        ("def __init__(self, config):\n    self.mhc = config.mhc\n", True),
        ("def f(self):\n    return self.mhc\n", False),  # the model's own attribute is no switch
        ("def f(self, hf_config):\n    return hf_config.mhc\n", False),
    ],
)
def test_only_the_config_s_field_is_read_as_a_switch(source: str, reads: bool) -> None:
    assert reads_config(ast.parse(source).body, "mhc") is reads
