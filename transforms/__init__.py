"""The transforms, one per file, in the order they are applied and reported.

Each module has ``NAME``, ``KIND`` (the edit site it handles), a one-line
``DESCRIPTION``, ``EXAMPLES`` (before/after pairs that are also unit tests
and docs), and ``apply(module, site) -> (module, Outcome)``.
"""

from __future__ import annotations

from types import ModuleType

from patchcraft.transforms import (
    accept_embedding_layer_id,
    capture_embedding_output,
    configure_ids_before_graphs,
    init_capture_flag,
)

#: Model-file transforms, in report order: init, setter, forward.
MODEL_TRANSFORMS: tuple[ModuleType, ...] = (
    init_capture_flag,
    accept_embedding_layer_id,
    capture_embedding_output,
)

BY_KIND: dict[str, ModuleType] = {t.KIND: t for t in MODEL_TRANSFORMS}

#: Transforms of ``srt/model_executor/`` (not of a model class): run once per
#: tree, reported as their own row, skipped with ``--no-runner``.
RUNNER_TRANSFORMS: tuple[ModuleType, ...] = (configure_ids_before_graphs,)
