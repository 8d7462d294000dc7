"""Hand edits in a run: each file it touches against its pristine text, the replace step, the advice.

``verify``, ``apply`` and ``apply --check`` judge every model file of the
run against its pristine text (:mod:`patchcraft.base.pristine`,
:mod:`patchcraft.engine.hand_edits`). ``apply --replace-hand-edits`` then patches
the pristine text of each file whose hand edits all sit at patchcraft's
edit sites, and refuses, before anything is written, a file with other
hand edits or a hand fix with no pristine text to put back. A refusal of
a hand fix (by the harness, or verify's static verdict) gets the lines,
the consequence its harness verdict records and the command
(:mod:`patchcraft.engine.hand_advice`).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

from patchcraft.engine import hand_advice
from patchcraft.base.errors import PatchcraftError
from patchcraft.planning.records import EditSite
from patchcraft.engine.hand_edits import FileReport, classify
from patchcraft.engine.file_patch import revert_text
from patchcraft.base.pristine import Pristine, PristineSource
from patchcraft.engine.records import Mode, ModelResult, RunResult
from patchcraft.planning.selection import plan_tree
from patchcraft.base.sources import read_source
from patchcraft.base.status import EditStatus, FileState, ModelStatus, WITHHELD
from patchcraft.harness.verdict import UNKNOWN_CONSEQUENCE

#: The runs whose files are judged against their pristine text.
JUDGED = (Mode.VERIFY, Mode.APPLY, Mode.CHECK)


def _model_files(result: RunResult) -> list[str]:
    """The model files of the run's model class rows (the tree rows' files are not model files)."""
    return list(dict.fromkeys(f for m in result.models if m.is_model_class for f in m.files))


def file_reports(result: RunResult) -> dict[str, FileReport]:
    """Each model file of ``result`` against its pristine text, by its path relative to the tree root."""
    tree = result.tree
    source = PristineSource(tree)

    @functools.cache
    def sites() -> tuple[EditSite, ...]:
        return tuple(s for plan in plan_tree(tree) for s in plan.sites)

    reports: dict[str, FileReport] = {}
    for rel in _model_files(result):
        path = tree.root / rel
        if not source.offers:
            reports[rel] = classify(path, rel, "", source.pristine(path), sites)
            continue
        try:
            current = read_source(path)
        except PatchcraftError:
            continue  # the run's own row names the file's problem
        try:
            # Without patchcraft's edits the file may be the shipped one: RECORD tells, no wheel needed.
            pristine = source.pristine(path, (current.encode(revert_text(current.text, path)),))
        except PatchcraftError as exc:
            pristine = Pristine(None, f"no pristine text: {exc}")
        reports[rel] = classify(path, rel, current.text, pristine, sites)
    return reports


def _hand_files(result: RunResult) -> set[str]:
    """Files holding an edit its transform found made by hand."""
    hand = (EditStatus.HAND_APPLIED, EditStatus.MODIFIED)
    return {e.file for m in result.models for e in m.edits if e.status in hand}


def replacements(result: RunResult, reports: Mapping[str, FileReport]) -> dict[Path, str]:
    """The pristine text of every file to restore before patching; a refusal is one line (exit 2), nothing written."""
    refused = [r for r in reports.values() if r.state == FileState.HAND and r.others]
    if refused:
        named = "; ".join(f"{r.rel}: {', '.join(h.label(r.rel) for h in r.others)}" for r in refused)
        raise PatchcraftError(
            f"refusing to replace hand edits: these are at no patchcraft edit site, so replacing would drop them: {named}; "
            "undo them (or move them out of the file) and run again; nothing was changed"
        )
    unknown = sorted(rel for rel in _hand_files(result) if rel in reports and reports[rel].state == FileState.UNKNOWN)
    if unknown:
        raise PatchcraftError(
            f"{unknown[0]}: cannot replace its hand edits: {reports[unknown[0]].origin}; nothing was changed"
        )
    return {r.path: r.pristine for r in reports.values() if r.replaceable and r.pristine is not None}


def advise(
    result: RunResult, reports: Mapping[str, FileReport], scope: hand_advice.Scope = hand_advice.Scope()
) -> RunResult:
    """Add the lines, the consequence and the command (with the run's ``scope``) to every refused hand fix of ``result``."""
    models = tuple(_advised(result, m, reports, scope) for m in result.models)
    return replace(result, models=models)


def _advised(
    result: RunResult, model: ModelResult, reports: Mapping[str, FileReport], scope: hand_advice.Scope
) -> ModelResult:
    if not model.is_model_class or not model.hand_made:
        return model
    if model.proof in WITHHELD:
        # Its own failed scenario's consequence; withheld for another model's failure: the general one.
        what = (model.harness.consequence if model.harness is not None else "") or UNKNOWN_CONSEQUENCE
    elif result.mode is Mode.VERIFY and model.status == ModelStatus.WOULD:
        what = hand_advice.missing_init(model) or ""
    else:
        return model
    if not what:
        return model
    return replace(model, message=f"{model.message}; {hand_advice.advice(result.tree, model, what, reports, scope)}")


def replaced_files(
    reports: Sequence[Mapping[str, FileReport]], bases: Sequence[Mapping[Path, str]]
) -> list[FileReport]:
    """The reports of the files restored to pristine before patching."""
    return [r for rep, base in zip(reports, bases) for r in rep.values() if r.path in base]
