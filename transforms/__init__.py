"""The transforms, one per file, in the order they are applied and reported.

Each module has ``NAME``, ``KIND`` (the edit site it handles), a one-line
``DESCRIPTION``, ``EXAMPLES`` (before/after pairs that are also unit tests
and docs), and ``apply(module, site) -> (module, Outcome)``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from patchcraft.transforms import accept_embedding_layer_id, capture_embedding_output, init_capture_flag, mark_captured_outputs

#: Model-file transforms, in report order: init, setter, forward, and the setter's layer marks
#: (only in models whose capture reads a deferred all-reduce sum).
MODEL_TRANSFORMS: tuple[ModuleType, ...] = (
    init_capture_flag,
    accept_embedding_layer_id,
    capture_embedding_output,
    mark_captured_outputs,
)

BY_KIND: dict[str, ModuleType] = {t.KIND: t for t in MODEL_TRANSFORMS}


def __getattr__(name: str) -> Any:
    """``RUNNER_TRANSFORMS``: the transforms of ``srt/model_executor/`` (not of a model class);
    ``TREE_TRANSFORMS``: those and the all-reduce fusion transform of ``srt/layers/``.

    They run once per tree, are reported as their own row and are skipped
    with ``--no-runner``. Imported on first use: a pre-commit run on model
    files never needs them.
    """
    if name == "RUNNER_TRANSFORMS":
        from patchcraft.transforms import configure_ids_before_graphs

        return (configure_ids_before_graphs,)
    if name == "TREE_TRANSFORMS":
        # Once per tree, each its own row: the runner (--no-runner) and the all-reduce fusion decision (--no-fusion-fix).
        from patchcraft.transforms import configure_ids_before_graphs, keep_captured_states_reduced

        return (configure_ids_before_graphs, keep_captured_states_reduced)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
