"""Real-SGLang GPU smoke run for the EAGLE-3 embedding capture (layer id -1).

Modules (torch / transformers / sglang are imported lazily, only where used):

* :mod:`.checkpoint` - tiny random DeepSeek-V3 target + Hugging Face reference ``hs[0..L]``
* :mod:`.draft` - tiny random EAGLE-3 draft (``LlamaForCausalLMEagle3``)
* :mod:`.engine_args` - ``sglang.Engine`` kwargs, checked against ``ServerArgs`` via ``ast``
* :mod:`.compare` - pass/fail logic (aux hidden states, lossless tokens, accept length)
* :mod:`.probe` - recording probe, installed only into a temporary copy of sglang
* :mod:`.worker` - one engine run in a child process
* :mod:`.engines` - starting the workers (directly, or through ``patchcraft run`` with an overlay), time bounds
* :mod:`.probe_records` - probe records matched to the prompts and compared with the reference
* :mod:`.summary` - the frozen summary record and its JSON (``patchcraft.ui.console`` renders the text)
* :mod:`.cuda_smoke` - :func:`run_cuda_smoke`: prepare, run the engines, compare (exit 0 pass / 1 fail;
  a :class:`~patchcraft.base.errors.PatchcraftError`, exit 2, for the environment)
"""

from __future__ import annotations


def run_cuda_smoke(*args, **kwargs) -> int:  # thin lazy wrapper
    from .cuda_smoke import run_cuda_smoke as _run

    return _run(*args, **kwargs)


__all__ = ["run_cuda_smoke"]
