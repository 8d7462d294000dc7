"""Lines more than one command says, worded once.

Plain text: :mod:`patchcraft.ui.console` prints them (``console.print_line``).
"""

from __future__ import annotations

#: How to get the CPU harness (torch, as an extra).
SMOKE_EXTRA = "pip install 'patchcraft[smoke]'"


def no_torch_line(prefix: str, static: str = "the overlay", code: str = "its patched code") -> str:
    """The line said once when torch is missing, so the harness did not run: what was made stands unproven.

    ``patchcraft run`` and ``overlay build`` (the overlay, built or reused:
    ``no_torch_line("patchcraft run: ")``) and the preflight say it of the
    overlay; ``apply`` and ``verify`` of their run
    (``no_torch_line("patchcraft: ", "apply", "the patched code")``).
    """
    return f"{prefix}torch is not installed, so {static} is static: the harness did not run {code} ({SMOKE_EXTRA})"
