"""The choices of ``smoke --device`` and ``smoke --engine``: where the patched code runs, and on what.

Parsed once by the CLI (``click.Choice`` over the values), compared as
members by :mod:`patchcraft.commands.smoke`. Light on purpose: the CLI
reads it before any command is chosen.
"""

from __future__ import annotations

from patchcraft.ui.choices import Choice


class Device(Choice):
    """``--device``: the CPU harness on stand-ins, or CUDA (the GPU smoke test, or ``--engine harness`` there)."""

    CPU = "cpu"
    CUDA = "cuda"


class Engine(Choice):
    """``--engine``: with ``--device cuda``, the real SGLang run, or the CPU harness's checks on the GPU;
    ``vllm``: the tree is vLLM's (told from TARGET otherwise), its patched code run on the CPU harness."""

    SGLANG = "sglang"
    HARNESS = "harness"
    VLLM = "vllm"
