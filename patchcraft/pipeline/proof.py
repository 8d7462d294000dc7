"""Proof before write: the CPU harness runs the code a command is about to write.

``apply`` runs the harness (docs/harness.md) on the patched text of every
model it changes, before anything is written; a model whose run fails or
errors is withheld (:func:`patchcraft.engine.tree_run.withhold`), with its files,
and the others are written. ``verify`` runs it on models whose edits were
made by hand: a hand fix is where running it pays. Without torch the
commands stay static and say so once; the pre-commit hook's environment
has no torch on purpose.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from patchcraft.base.status import PROOF_OF, WITHHELD, EditStatus, HarnessStatus, ModelStatus, Proof
from patchcraft.engine.records import ModelResult, ProofVerdict, RunResult
from patchcraft.harness import torch_problem
from patchcraft.harness.verdict import verdict_of
from patchcraft.ui import console, messages

#: What a row withheld by a harness ``error`` adds: the harness could not judge it, and the one way to write it.
CANNOT_RUN = (
    "the harness cannot run this model class, so nothing proved the patch; "
    "`--no-smoke` writes it without that proof (the patched code is then first run by your server)"
)

#: The modes whose writes (or hand fixes) the harness proves.
PROVED_MODES = ("apply", "verify")


def hand_fix_to_prove(model: ModelResult) -> bool:
    """A model with a hand-made edit that does patchcraft's job, done or with patchcraft's edits still to add:
    the harness runs what the model would be (the hand edits plus the missing ones), as apply would write it."""
    hand = any(e.status == EditStatus.HAND_APPLIED for e in model.edits)
    return (
        model.is_model_class and hand and model.status in (ModelStatus.ALREADY, ModelStatus.WOULD, ModelStatus.PATCHED)
    )


def _written(model: ModelResult) -> bool:
    return model.is_model_class and model.status == ModelStatus.PATCHED


def _written_or_hand_fix(model: ModelResult) -> bool:
    """apply proves what it writes, and a hand fix it leaves as it is: verify would run that one too."""
    return _written(model) or hand_fix_to_prove(model)


def gate(mode_value: str, smoke: bool, quiet: bool = False) -> Callable[[RunResult], RunResult] | None:
    """The proof step for a command (``apply`` or ``verify``), or None for the others.

    torch is imported only when a run has something to prove: a verify with
    no hand-made edit, or an apply with nothing to write, costs nothing.
    """
    chosen = {"apply": _written_or_hand_fix, "verify": hand_fix_to_prove}.get(mode_value)
    if chosen is None:
        return None
    said: list[bool] = []

    def step(result: RunResult) -> RunResult:
        if not any(chosen(m) for m in result.models):
            return result
        if not smoke:
            return _mark(result, chosen, Proof.SKIPPED)
        kept = _kept_run(result, [m for m in result.models if chosen(m)])
        if kept is not None:  # every row kept for exactly these bytes (harness.run_cache): nothing runs, no torch
            return record(result, kept)
        if torch_problem() is not None:
            if not said and not quiet:
                said.append(True)
                console.print_line(messages.no_torch_line("patchcraft: ", mode_value, "the patched code"))
            return _mark(result, chosen, Proof.NO_TORCH)
        return prove(result, chosen, shown=not quiet)

    return step


def _mark(result: RunResult, chosen: Callable[[ModelResult], bool], proof: Proof) -> RunResult:
    models = tuple(replace(m, proof=proof) if chosen(m) else m for m in result.models)
    return replace(result, models=models)


def prove(result: RunResult, chosen: Callable[[ModelResult], bool], shown: bool = True) -> RunResult:
    """Run the harness on the chosen models of ``result`` (on the text it would write); withhold failures.

    ``shown``: a progress line on an interactive stderr (:func:`patchcraft.ui.console.progress`).
    """
    models = [m for m in result.models if chosen(m)]
    if not models:
        return result
    with console.progress(f"{result.mode.value}: harness", shown=shown, unit="models") as status:
        status.update("importing torch")
        if result.tree.engine == "vllm":  # vLLM's setter and forward, patched and as released (docs/vllm.md)
            from patchcraft.harness.vllm_proof import prove_tree

            run = prove_tree(result.tree, [as_written(m) for m in models], texts=texts_of(result))
        else:
            from patchcraft.harness.runner import smoke_tree

            run = smoke_tree(
                result.tree, (), models=[as_written(m) for m in models], texts=texts_of(result), on_row=status.update
            )
    return record(result, run)


def _kept_run(result: RunResult, models: list[ModelResult]) -> Any:
    """The harness's run of ``models`` as kept by harness.run_cache for the bytes apply would write, or None."""
    if result.tree.engine == "vllm":  # vLLM's proof rows (harness.vllm_proof), put together without torch
        from patchcraft.harness.vllm_proof_rows import kept_proof_rows

        return kept_proof_rows(result.tree, [as_written(m) for m in models], texts_of(result))
    from patchcraft.harness.rows import SmokeRun, kept_rows

    rows = kept_rows(result.tree, [as_written(m) for m in models], texts_of(result))
    return None if rows is None else SmokeRun(tree=result.tree, version=result.tree.version, results=rows)


def texts_of(result: RunResult) -> dict:
    """The text of every file the run would write (what the harness runs instead of the file)."""
    return {change.source.path: change.after for change in result.changes}


def as_written(model: ModelResult) -> ModelResult:
    """A hand-made model still missing patchcraft's edits, as the harness must see it: patched
    (the hand edits plus the missing ones, as apply would write them), so that it is run, not skipped."""
    return (
        replace(model, status=ModelStatus.PATCHED)
        if model.status == ModelStatus.WOULD and hand_fix_to_prove(model)
        else model
    )


def _reason(status: HarnessStatus, message: str) -> str:
    """What a withheld row says of its harness verdict (shown; the record keeps the fields)."""
    if status == HarnessStatus.FAIL:
        return f"harness fail: {message}"
    if status == HarnessStatus.ERROR:
        return f"harness error: {message}; {CANNOT_RUN}"
    return ""


def record(result: RunResult, run: Any, only: Callable[[ModelResult], bool] | None = None) -> RunResult:
    """Each harness row of ``run`` as its model's proof (``only``: of the models it accepts); withhold failures."""
    wanted = {m.model for m in result.models if only is None or only(m)}
    verdicts: dict[str, ProofVerdict] = {}
    patched = {m.model for m in result.models if m.status == ModelStatus.PATCHED}
    for row in run.results:
        if row.model not in wanted:
            continue
        harness = verdict_of(row)
        if row.status in PROOF_OF:
            verdicts[row.model] = ProofVerdict(PROOF_OF[harness.status], _reason(harness.status, row.message), harness)
        elif row.status == HarnessStatus.SKIPPED and row.model in patched:  # written unproven: the row says why
            verdicts[row.model] = ProofVerdict(Proof.HARNESS_SKIPPED, row.message, harness)
    if any(v.proof in WITHHELD for v in verdicts.values()) and not _changes_compile(result):
        return result  # the write refuses the whole run, naming the file that does not compile (exit 2)
    from patchcraft.engine.tree_run import withhold  # late: a warm `patchcraft run` builds the gate but never calls it

    return withhold(result, verdicts)


def _changes_compile(result: RunResult) -> bool:
    for change in result.changes:
        try:
            compile(change.after, str(change.source.path), "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            return False
    return True
