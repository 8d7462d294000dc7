"""The static reading and the run agree on every minor release, or the static side says "unknown".

For each minor release (``patchcraft.base.releases.MINOR_RELEASES``) and one
model of each capture shape it has (the L1/L2 list, the collector passed
into the layers, the packer, the layer-boundary list, Gemma's bare
capture, the setter's layer marks, a forward that captures nothing for
EAGLE-3), each id list is read by rules (:func:`patchcraft.analysis.explain.serve`)
and run on the CPU harness (:func:`patchcraft.analysis.explain.run_served`) on the
release as installed, unpatched. One model is loaded once per release and
tried with every id list (the harness compiles it once).
"""

from __future__ import annotations

import pytest

from conftest import release_package
from patchcraft.base.errors import PatchcraftError
from patchcraft.analysis.target_model import Model, load_model, run_served, serve
from patchcraft.base.releases import MINOR_RELEASES
from patchcraft.base.target import resolve_target

pytest.importorskip("torch")

LAYERS = 61
ID_LISTS = (None, (-1, 2, 30), (0, 3, 31), (1, 29, 57), (2, 30, 58), (2, 20, 37))
#: One model per capture shape, the first of each group that the release has with a setter:
#: DeepseekV2 (L1, then the collector into layers, the packer), the Qwen2/Llama list (L2, then
#: layer-boundary), Qwen2-MoE (the setter's layer marks), Gemma 3 (bare capture, after the loop),
#: gpt-oss (max heuristic, a capture at start_layer), Qwen3.5 (marks no EAGLE-3 setter sets).
MODELS = (
    ("deepseek_v2",),
    ("qwen2", "llama"),
    ("qwen2_moe",),
    ("gemma3_causal",),
    ("gpt_oss",),
    ("qwen3_5.Qwen3_5ForConditionalGeneration",),
)


def models_of(version: str) -> list[Model]:
    tree = resolve_target(str(release_package(version)))
    found = []
    for group in MODELS:
        for name in group:
            path = tree.models_dir / f"{name.split('.')[0]}.py"
            if not (path.is_file() and b"set_eagle3_layers_to_capture" in path.read_bytes()):
                continue
            try:
                found.append(load_model(tree, name))
                break
            except PatchcraftError:  # the file's setter belongs to no model class here (a helper)
                continue
    return found


def disagreements(model: Model) -> tuple[list[str], int]:
    """Each id list where the run and the static reading differ and the static side claims to know."""
    name = model.label
    found, compared = [], 0
    for ids in ID_LISTS:
        static = serve(model, ids, LAYERS)
        outcome = run_served(model, ids, LAYERS)
        assert outcome is not None
        if not outcome.ran or static.unknown:
            continue  # the harness cannot follow it, or the static side says "unknown": no claim to hold
        compared += 1
        ran = () if outcome.crash else outcome.states
        if static.run.error:
            agree = bool(outcome.crash) and outcome.stage == "setter"
        else:
            agree = not outcome.crash and ran == static.states and outcome.all_copies
        if not agree:
            found.append(f"{name} ids {ids}: static {static.states}, run {outcome.crash or ran}")
    return found, compared


@pytest.mark.parametrize("version", MINOR_RELEASES)
def test_static_reading_and_run_agree(version):
    problems, compared = [], 0
    for model in models_of(version):
        found, count = disagreements(model)
        problems += found
        compared += count
    assert compared, f"{version}: nothing compared"
    assert not problems, "\n".join(problems)
