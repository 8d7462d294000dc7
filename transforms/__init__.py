"""The transforms, one per file, in the order they are applied and reported.

Each module satisfies :class:`~patchcraft.transforms._contract.Transform`:
``NAME``, ``KIND`` (the edit site it handles), a one-line ``DESCRIPTION``
and ``apply(module, site) -> (module, Outcome)``; the registries below are
typed with it, so mypy checks every module against the contract. Its
before/after examples (also unit tests and docs) are
``transforms/examples/<name>.py``.
"""

from __future__ import annotations

from typing import Any

# Relative imports: mypy knows this folder as ``transforms`` (package-dir makes it ``patchcraft.transforms``
# only when installed), so only these resolve for it, and only they check each module against the contract.
from . import (
    accept_embedding_layer_id,
    capture_embedding_output,
    init_capture_flag,
    mark_captured_outputs,
    vllm_add_embedding_capture,
    vllm_capture_embedding,
    vllm_copy_before_loop_capture,
    vllm_copy_mixin_embedding,
)
from ._contract import RunnerTransform, Transform

#: Model-file transforms, in report order: init, setter, forward, and the setter's layer marks
#: (only in models whose capture reads a deferred all-reduce sum).
MODEL_TRANSFORMS: tuple[Transform, ...] = (
    init_capture_flag,
    accept_embedding_layer_id,
    capture_embedding_output,
    mark_captured_outputs,
)

#: vLLM's model-file transforms (docs/vllm.md): planned only on a vLLM tree (``planning.vllm_plans``).
#: Each also changes a line in place, so it undoes that itself (``revert``).
VLLM_TRANSFORMS: tuple[RunnerTransform, ...] = (
    vllm_capture_embedding,
    vllm_copy_mixin_embedding,
    vllm_copy_before_loop_capture,
    vllm_add_embedding_capture,
)

BY_KIND: dict[str, Transform] = {t.KIND: t for t in (*MODEL_TRANSFORMS, *VLLM_TRANSFORMS)}

# Bound on first use by __getattr__ below; declared here for mypy.
RUNNER_TRANSFORMS: tuple[RunnerTransform, ...]
TREE_TRANSFORMS: tuple[Transform, ...]


def __getattr__(name: str) -> Any:
    """``RUNNER_TRANSFORMS``: the transforms of ``srt/model_executor/`` (not of a model class);
    ``TREE_TRANSFORMS``: those and the all-reduce fusion transform of ``srt/layers/``.

    They run once per tree, are reported as their own row and are skipped
    with ``--no-runner``. Imported on first use: a pre-commit run on model
    files never needs them.
    """
    if name == "RUNNER_TRANSFORMS":
        return _runner_transforms()
    if name == "TREE_TRANSFORMS":
        return _tree_transforms()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _runner_transforms() -> tuple[RunnerTransform, ...]:
    from . import configure_ids_before_graphs

    return (configure_ids_before_graphs,)


def _tree_transforms() -> tuple[Transform, ...]:
    # Once per tree, each its own row: the runner (--no-runner) and the all-reduce fusion decision (--no-fusion-fix).
    from . import configure_ids_before_graphs, keep_captured_states_reduced

    return (configure_ids_before_graphs, keep_captured_states_reduced)
