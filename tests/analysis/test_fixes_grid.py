"""The fix grid, full tier: every printed suggestion, applied as printed, makes check-draft pass.

Releases 0.5.6, 0.5.10, 0.5.13, 0.5.14, 0.5.18 and 0.5.23; DeepseekV2,
GLM-4-MoE, gpt-oss, Llama and Qwen3-MoE; the draft's ids as layer outputs
and with -1; every ``--trained-on`` preset; TP 1 and 8; CUDA graphs on and
off (tests/fix_grid.py says what a cell does). Every release, model, id
list and preset is crossed; the four (TP, CUDA graphs) settings rotate over
them so that each setting meets every preset, model, release and id list
(a quarter of the full product, 720 cells: measured 5 min 20 s on two
shared cores, 9 min 40 s with another suite beside it; a cell whose release and model
are warm takes well under a second, the first of each (release, model)
5-40 s: the copy, ``patchcraft apply --model`` with its proof, the harness
compiling the model). The full product (2880 cells) passed once too, in
20 minutes, before it was cut to this size.
A portable claim ("means the same on every release") is then checked on
every release of the grid.
"""

from __future__ import annotations

import itertools

import pytest

from fix_grid import ID_LISTS, MODELS, PRESETS, RELEASES, Cell, run_cell, served_after_apply

pytest.importorskip("torch")

SETTINGS = ((1, True), (8, True), (1, False), (8, False))


def cells() -> list[Cell]:
    found = []
    for (r, version), (m, model), (i, ids), (p, preset) in itertools.product(
        enumerate(RELEASES), enumerate(MODELS), enumerate(ID_LISTS), enumerate(PRESETS)
    ):
        tp, graphs = SETTINGS[(r + m + 2 * i + p) % len(SETTINGS)]
        found.append(Cell(version, model, ids, preset, tp, graphs))
    return found


CLAIMS: set[tuple[str, tuple[int, ...]]] = set()


@pytest.mark.slow
@pytest.mark.parametrize("cell", cells(), ids=str)
def test_every_printed_fix_applied_as_printed_passes(cell, tmp_path):
    CLAIMS.update(run_cell(cell, tmp_path))


@pytest.mark.slow
def test_the_grid_crosses_every_setting_with_every_factor():
    grid = cells()
    for index, values in enumerate((RELEASES, tuple(MODELS), ID_LISTS, PRESETS)):
        for value, setting in itertools.product(values, SETTINGS):
            assert any(
                (c.version, c.model, c.ids, c.preset)[index] == value and (c.tp, c.cuda_graph) == setting for c in grid
            ), (value, setting)


@pytest.mark.slow
def test_a_portable_claim_holds_on_every_release_of_the_grid():
    claims = CLAIMS or {(model, (-1, 2, n // 2)) for model, (_, n) in MODELS.items()}
    for model, ids in sorted(claims):
        served = served_after_apply(model, ids)
        assert len(set(served.values())) == 1, (model, ids, served)
