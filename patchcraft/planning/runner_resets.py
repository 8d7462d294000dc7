"""The model runner's calls that reset the aux layer ids before CUDA-graph capture, as ``explain`` reports them.

In 0.4.10-0.5.10 the CUDA-graph runner (and ``_dummy_run`` from 0.5.6)
calls ``set_eagle3_layers_to_capture()`` with no ids before graph capture,
so the replayed graphs capture the default layers whatever the draft
config says. The runner transform gives every such call the configured
ids, so on a patched runner none is left; from 0.5.13 there is none to
begin with. The calls are the runner planner's
(:func:`patchcraft.planning.runner_edits.setter_calls`).
"""

from __future__ import annotations

from dataclasses import dataclass

from patchcraft.base.memo import Memo, stamp
from patchcraft.base.target import SglangTree
from patchcraft.planning.runner_edits import setter_calls


@dataclass(frozen=True)
class RunnerReset:
    """A ``set_eagle3_layers_to_capture()`` call with no ids in the model runner."""

    file: str
    line: int
    function: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


def runner_resets(tree: SglangTree) -> tuple[RunnerReset, ...]:
    """Calls in ``srt/model_executor/`` that reset the ids to the defaults, in file and line order.

    A file that does not parse is passed over (``explain`` reports what it can read). Remembered for
    the process while no runner file changes (:mod:`patchcraft.base.memo`): check-draft proves each fix by explaining
    again, and parsing the runner was most of a warm explain's time.
    """
    directory = tree.executor_dir
    if not directory.is_dir():
        return ()
    key = (str(directory.resolve()), str(tree.package.resolve()), str(tree.root))  # rows name files from the root
    return _READ.get(key, lambda: stamp(folders=[(directory, True)]), lambda: _read(tree))


def _read(tree: SglangTree) -> tuple[RunnerReset, ...]:
    calls = [
        RunnerReset(tree.relative(call.path), call.node.lineno, call.function)
        for call in setter_calls(tree.executor_dir, strict=False)
        if not call.has_ids and call.function is not None
    ]
    return tuple(sorted(calls, key=lambda r: (r.file, r.line)))


#: Runner readings remembered, by directory, while no file under it changes (oldest dropped first).
_READ: Memo[tuple[RunnerReset, ...]] = Memo(keep=16)
