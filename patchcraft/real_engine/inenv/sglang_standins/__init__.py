"""patchcraft's ``sgl_kernel`` for SGLang's CPU engine: the 8 CPU ops, installed before sglang is imported.

:func:`install` puts a module named ``sgl_kernel`` into ``sys.modules`` that
exports the ops of :mod:`.ops` (pure torch). With ``tree="triton"`` the two
tree ops instead run SGLang's own Triton kernels for them
(``sgl_build_tree_kernel_triton``, ``verify_tree_greedy_triton`` of
``kernels/ops/speculative/spec_tree.py``) under Triton's CPU interpreter
(``TRITON_INTERPRET=1``), imported on first call. Any other name asked of the
module is an ``AttributeError`` naming it, so a release that needs a ninth op
stops at that op's import with its name. Its submodules are placeholders
(``absent.serve_submodules``).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
from typing import Any, Callable

from . import absent, ops

MODULE = "sgl_kernel"

#: What ran for each op, as the result's "kernels" reports it.
PURE_TORCH = "patchcraft stand-in, pure torch (sglang_standins/ops.py)"
TRITON_TREE = {
    "build_tree_kernel_efficient_cpu": "SGLang's own sgl_build_tree_kernel_triton (spec_tree.py), TRITON_INTERPRET=1",
    "verify_tree_greedy_cpu": "SGLang's own verify_tree_greedy_triton (spec_tree.py), TRITON_INTERPRET=1",
}


def _triton_build_tree(*args: Any) -> None:
    from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode, sgl_build_tree_kernel_triton

    *head, mode = args
    sgl_build_tree_kernel_triton(*head, tree_mask_mode=TreeMaskMode(int(mode)))


def _triton_verify(**kwargs: Any) -> None:
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    verify_tree_greedy_triton(
        predicts=kwargs["predicts"],
        accept_index=kwargs["accept_index"],
        accept_token_num=kwargs["accept_token_num"],
        candidates=kwargs["candidates"],
        retrieve_index=kwargs["retrive_index"],
        retrieve_next_token=kwargs["retrive_next_token"],
        retrieve_next_sibling=kwargs["retrive_next_sibling"],
        target_predict=kwargs["target_predict"],
    )


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"sgl_kernel.{name}: patchcraft's CPU stand-ins provide only {', '.join(sorted(ops.OPS))}")


def install(tree: str = "torch") -> dict[str, str]:
    """Install the stand-in ``sgl_kernel`` into ``sys.modules``; return what runs for each op.

    ``tree``: ``"torch"`` (every op pure torch) or ``"triton"`` (the two tree
    ops through SGLang's own Triton kernels; sets ``TRITON_INTERPRET=1``).
    """
    if tree not in ("torch", "triton"):
        raise ValueError(f"tree must be 'torch' or 'triton', not {tree!r}")
    module = _StandinModule(MODULE, __doc__)
    module.__spec__ = importlib.machinery.ModuleSpec(MODULE, None, is_package=True)
    module.__file__ = ops.__file__
    module.__path__ = []
    # Its submodules (sgl_kernel.kvcacheio, which 0.5.10's host KV pool imports, ...) are placeholders: imported,
    # never run on a CPU text model; a call raises naming it.
    absent.serve_submodules(MODULE)
    kernels: dict[str, str] = {}
    functions: dict[str, Callable[..., None]] = dict(ops.OPS)
    if tree == "triton":
        os.environ["TRITON_INTERPRET"] = "1"
        functions["build_tree_kernel_efficient_cpu"] = _triton_build_tree
        functions["verify_tree_greedy_cpu"] = _triton_verify
    for name, function in functions.items():
        setattr(module, name, function)
        kernels[name] = TRITON_TREE[name] if tree == "triton" and name in TRITON_TREE else PURE_TORCH
    sys.modules[MODULE] = module
    return kernels
