"""plan.py: the text-filtered scan finds every model class a full parse finds.

Subclasses inherit the setter from files that name neither the setter nor
``layers_to_capture``; ``plan.scan`` must still load them. Real releases,
planning only.
"""

from __future__ import annotations

import pytest

from conftest import release_package
from patchcraft.reading.class_graph import ModelGraph
from patchcraft.planning.model_plans import plan_models, scan


@pytest.mark.parametrize("version", ["0.5.2", "0.5.23"])
def test_text_filter_loses_no_model_class(version: str) -> None:
    """Parsing every model file finds no model class the filtered scan misses.

    Subclasses inherit the setter from files that name neither the setter
    nor ``layers_to_capture`` (qwen4_exp, qwen3_omni_moe, the EAGLE drafts).
    """
    models = release_package(version) / "srt" / "models"
    full = ModelGraph(models_dir=models)
    for path in sorted(models.glob("*.py")):
        full.load(path.stem, path.read_bytes())
    everything = {(p.label, p.unsupported, tuple(s.key for s in p.sites)) for p in plan_models(full)}
    assert everything == {(p.label, p.unsupported, tuple(s.key for s in p.sites)) for p in plan_models(scan(models))}
