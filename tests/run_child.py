"""The child process that asks which file an import of an SGLang module would load (overlay or install).

``import sglang`` itself needs far more than a ``--no-deps`` install has, so
the child stubs the parent packages (``sglang``, ``sglang.srt``,
``sglang.srt.models``) with their real directories as ``__path__`` and asks
``importlib.util.find_spec`` for the module: that is the overlay finder's
whole job. Run it as ``python -c CHILD PACKAGE MODULE``.
"""

from __future__ import annotations

import textwrap

RELEASE = "0.5.10"
MODULE = "sglang.srt.models.deepseek_v2"

CHILD = textwrap.dedent(
    """
    import importlib.util, sys, types
    root = sys.argv[1]
    for name, path in (("sglang", root), ("sglang.srt", root + "/srt"), ("sglang.srt.models", root + "/srt/models")):
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module
    try:
        print("ORIGIN", importlib.util.find_spec(sys.argv[2]).origin)
    except ImportError as exc:
        print("IMPORTERROR", exc)
    """
)
