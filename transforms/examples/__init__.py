"""Each transform's before/after examples, one module per transform (``examples/<name>.py``).

They are the transforms' unit tests (``tests/transforms/test_<name>.py``)
and the sections of docs/transforms.md (``scripts/document_transforms.py``).
An examples module imports its transform, never the other way round: a
run never loads them. ``BY_NAME`` is typed with the contract, so mypy
checks every module has ``TRANSFORM`` and ``EXAMPLES``.
"""

from __future__ import annotations

# Relative, as in transforms/__init__.py: the imports mypy resolves, so it checks each module.
from .._contract import TransformExamples
from . import (
    accept_embedding_layer_id,
    capture_embedding_output,
    configure_ids_before_graphs,
    init_capture_flag,
    keep_captured_states_reduced,
    mark_captured_outputs,
    vllm_add_embedding_capture,
    vllm_capture_embedding,
    vllm_copy_before_loop_capture,
    vllm_copy_mixin_embedding,
)

_ALL: tuple[TransformExamples, ...] = (
    init_capture_flag,
    accept_embedding_layer_id,
    capture_embedding_output,
    mark_captured_outputs,
    configure_ids_before_graphs,
    keep_captured_states_reduced,
    vllm_capture_embedding,
    vllm_copy_mixin_embedding,
    vllm_copy_before_loop_capture,
    vllm_add_embedding_capture,
)

#: Transform name -> its examples module.
BY_NAME: dict[str, TransformExamples] = {examples.TRANSFORM.NAME: examples for examples in _ALL}
