"""patchcraft.harness.vllm_standins: vLLM's helpers, and imports inside vLLM methods that never load vLLM."""

from __future__ import annotations

import sys

from patchcraft.harness.standins import Nothing, ParallelGroup, World, activate
from patchcraft.harness.vllm_standins import HELPERS, IntermediateTensors, VllmModule, method_builtins


def _run(code: str) -> dict:
    namespace: dict = {"__builtins__": method_builtins()}
    exec(code, namespace)
    return namespace


def test_a_vllm_import_inside_a_method_is_a_stand_in_module() -> None:
    found = _run(
        "from vllm.distributed.parallel_state import get_pp_group, model_parallel_is_initialized, other\n"
        "import vllm.envs as envs\nimport math\n"
    )
    assert found["model_parallel_is_initialized"]() is True
    assert isinstance(found["other"], Nothing) and isinstance(found["envs"], (Nothing, VllmModule))
    assert found["math"] is sys.modules["math"]  # everything else is the real module
    assert "vllm" not in sys.modules


def test_the_groups_follow_the_active_world() -> None:
    with activate(World(pp=ParallelGroup(world_size=2, rank_in_group=1))):
        pp = HELPERS["get_pp_group"]()()
        assert pp.world_size == 2 and not pp.is_first_rank
    assert HELPERS["get_pp_group"]()().is_first_rank
    assert IntermediateTensors({"hidden_states": 1})["hidden_states"] == 1
