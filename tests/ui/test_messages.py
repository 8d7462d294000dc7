"""messages.py: the lines more than one command says, worded once."""

from __future__ import annotations

from patchcraft.ui.messages import no_torch_line


def test_the_no_torch_line_of_the_overlay() -> None:
    """``patchcraft run``, ``overlay build`` and the preflight: the overlay stands static."""
    assert no_torch_line("patchcraft run: ") == (
        "patchcraft run: torch is not installed, so the overlay is static: the harness did not run its patched code "
        "(pip install 'patchcraft[smoke]')"
    )


def test_the_no_torch_line_of_a_run() -> None:
    """``apply`` and ``verify``: their run stands static."""
    assert no_torch_line("patchcraft: ", "apply", "the patched code") == (
        "patchcraft: torch is not installed, so apply is static: the harness did not run the patched code "
        "(pip install 'patchcraft[smoke]')"
    )
