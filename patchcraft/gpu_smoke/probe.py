"""Recording probe for the smoke run.  Standalone: torch + stdlib only.

:func:`make_probed_sglang_copy` copies the installed ``sglang`` package into a
temporary directory, drops this file into the copy as
``sglang/srt/_patchcraft_smoke_probe.py`` and appends two lines to the copy's
``model_executor/model_runner.py`` that wrap ``ModelRunner.forward``.  The
smoke worker runs with that directory first on ``PYTHONPATH``; the user's
installation is never written to.

The wrapper sits *outside* any CUDA graph: whether the target forward ran
eagerly or replayed a graph, ``ModelRunner.forward`` returns the logits
output whose ``hidden_states`` is the concatenated aux hidden states that
SGLang hands to the EAGLE-3 draft.  Each call of the target (not the draft)
on TP rank 0 is saved as one ``.pt`` file: forward mode, input ids,
positions, batch size and the aux hidden states (copied to CPU at once).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

ENV_DIR = "PATCHCRAFT_SMOKE_PROBE_DIR"
PROBE_MODULE = "_patchcraft_smoke_probe"
MARKER = "# patchcraft smoke probe (temporary copy only)"
HOOK = f"\n\n{MARKER}\nfrom sglang.srt import {PROBE_MODULE} as _pc_probe\n_pc_probe.install(ModelRunner)\n"

_state = {"seq": 0}


def _tp_rank(runner) -> int:
    """``ModelRunner.tp_rank`` where it exists (0.5.10, 0.5.14); releases that
    dropped the attribute (0.5.16 to 0.5.18, 0.5.22, 0.5.23: the rank lives in
    a parallel-state object) get the process's ``torch.distributed`` rank.  The smoke runs with pp 1, where the
    global rank is the tp rank."""
    rank = getattr(runner, "tp_rank", None)
    if rank is not None:
        return int(rank)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return 0


def _record(runner, forward_batch, result) -> None:
    out_dir = os.environ.get(ENV_DIR)
    if not out_dir:
        return
    if getattr(runner, "is_draft_worker", False) or _tp_rank(runner) != 0:
        return
    logits_output = getattr(result, "logits_output", result)
    hs = getattr(logits_output, "hidden_states", None)
    if hs is None or not hasattr(hs, "shape"):
        return
    import torch

    mode = getattr(forward_batch, "forward_mode", None)
    rec = {
        "seq": _state["seq"],
        "pid": os.getpid(),
        "mode": getattr(mode, "name", str(mode)),
        "batch_size": int(getattr(forward_batch, "batch_size", -1)),
        "input_ids": forward_batch.input_ids.detach().to("cpu", torch.long).clone(),
        "positions": forward_batch.positions.detach().to("cpu", torch.long).clone(),
        "hidden_states": hs.detach().float().to("cpu").clone(),
    }
    _state["seq"] += 1
    path = Path(out_dir) / f"rec-{os.getpid()}-{rec['seq']:06d}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(rec, str(tmp))
    os.replace(tmp, path)


def install(model_runner_cls) -> None:
    if getattr(model_runner_cls, "_patchcraft_probe", False):
        return
    orig = model_runner_cls.forward

    def forward(self, forward_batch, *args, **kwargs):
        result = orig(self, forward_batch, *args, **kwargs)
        try:
            _record(self, forward_batch, result)
        except Exception as e:  # never break the engine; the comparison will notice
            print(f"[patchcraft probe] recording failed: {e!r}", flush=True)
        return result

    forward.__wrapped__ = orig  # type: ignore[attr-defined]
    model_runner_cls.forward = forward
    model_runner_cls._patchcraft_probe = True


def make_probed_sglang_copy(sglang_pkg_dir: os.PathLike, dest: Optional[os.PathLike] = None) -> Path:
    """Copy the ``sglang`` package and add the probe to the copy.

    Returns the directory to put first on ``PYTHONPATH`` (it contains ``sglang/``).
    """
    src = Path(sglang_pkg_dir)
    runner = Path("srt") / "model_executor" / "model_runner.py"
    if not (src / runner).is_file():
        raise FileNotFoundError(f"{src / runner} not found: not an sglang package directory")
    root = Path(dest) if dest else Path(tempfile.mkdtemp(prefix="patchcraft-sglang-"))
    pkg = root / "sglang"
    if pkg.exists():
        raise FileExistsError(f"{pkg} already exists")
    shutil.copytree(src, pkg, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copyfile(Path(__file__), pkg / "srt" / f"{PROBE_MODULE}.py")
    target = pkg / runner
    text = target.read_bytes().decode("utf-8-sig")
    if "class ModelRunner" not in text:
        raise ValueError(f"{target} defines no ModelRunner")
    target.write_text(text + HOOK, encoding="utf-8")
    return root
