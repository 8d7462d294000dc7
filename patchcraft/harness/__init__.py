"""The CPU smoke harness: run the real patched methods on tiny tensors.

Structural checks prove that the edits are present; this proves that the
patched code captures the right tensors. For every patched model class it
compiles the file's own ``set_eagle3_layers_to_capture``, inner ``forward``
and literal ``__init__`` assignments, runs them on stand-in layers with a
real ``torch.nn.Embedding``, and compares the aux hidden states with an
independent Hugging Face numbered reference and with the unpatched file.
See docs/harness.md for what is real, what is a stand-in, and the limits.

torch is needed (``pip install 'patchcraft[smoke]'``) and imported only
when the harness runs: ``from patchcraft.harness.runner import smoke_tree``
after :func:`require_torch`.
"""

from __future__ import annotations

import importlib.util

from patchcraft.base.errors import PatchcraftError

INSTALL_HINT = "pip install 'patchcraft[smoke]'"


def torch_problem() -> str | None:
    """Why torch cannot be imported here (not installed, or a broken install), or None when it can."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):  # sys.modules["torch"] is None, or a broken package
        spec = None
    if spec is None:
        return "is not installed"
    try:
        import torch  # noqa: F401
    except Exception as exc:  # a broken install: say so in one line
        return f"failed to import ({exc})"
    return None


def require_torch() -> None:
    """Raise a one-line :class:`PatchcraftError` unless torch can be imported."""
    problem = torch_problem()
    if problem is not None:
        raise PatchcraftError(f"the CPU smoke harness needs torch, which {problem}: {INSTALL_HINT}") from None
