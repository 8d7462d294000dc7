"""What ``explain --engine vllm`` finds, and how an entry that is the embedding tensor itself is said per setting.

:class:`FindingKind` and :class:`Finding` are the findings' words (the JSON's
``kind``); :func:`norm_findings` judges each alias finding on the settings
asked (a warning where an add-norm writes in place, a note where none does or
where no layer writes into the embedding at all), and :func:`alias_words` is
the fed list's wording for such an entry.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from patchcraft.reading.vllm_norm_dispatch import NormSetting


class FindingKind(str, enum.Enum):
    """What a vLLM finding is about (the JSON's ``kind``)."""

    GATE = "gate"
    IGNORED = "ids-not-read"
    #: A place of the draft's config (SGLang's ``eagle_config``) a runner does not read: a note, not a warning.
    PLACE = "place-not-read"
    #: ``--tp`` above 1: every captured state is reduced, or the reduction could not be read (a note).
    TP = "tp-reduction"
    #: ``--tp`` above 1: a capture reads a per-rank partial sum (a layer leaves its output unreduced).
    PARTIAL = "partial-sums"
    CRASH = "crash"
    DROPPED = "dropped"
    COLLAPSED = "collapsed"
    ALIAS = "alias"
    #: An entry that is the embedding tensor itself, where every judged setting's add-norm is out of place (a note).
    ALIAS_KEPT = "alias-kept"
    NOTHING = "captures-nothing"
    COUNT = "count"
    NOT_RUN = "not-run"
    #: The build serves a platform from a package outside the tree, which is not read (a note).
    PLATFORM = "platform-not-read"
    #: The run took one side of a config switch the forward reads (Kimi-K3's attention residuals): a note
    #: naming the side run and the side not shown.
    ASSUMED = "config-assumed"

    def __str__(self) -> str:
        return str(self.value)


#: Kinds reported as notes: they change nothing for ids kept at top level on one rank (no effect on the exit code).
NOTES = (FindingKind.PLACE, FindingKind.TP, FindingKind.ALIAS_KEPT, FindingKind.PLATFORM, FindingKind.ASSUMED)


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    text: str


def norm_findings(
    findings: Sequence[Finding], judged: Sequence[NormSetting]
) -> tuple[tuple[Finding, ...], tuple[Finding, ...]]:
    """Each alias finding judged on the settings asked: a warning where one writes in place or is unread, else a note."""
    kept: list[Finding] = []
    notes: list[Finding] = []
    for finding in findings:
        if finding.kind is not FindingKind.ALIAS:
            kept.append(finding)
            continue
        head, _, held = finding.text.partition(" | ")
        if held.split(" ")[0] == INTACT:  # the stand-in layers of this shape never wrote into their input
            kept.append(
                Finding(
                    FindingKind.ALIAS,
                    f"{head}: {INTACT_WORDS} (`patchcraft apply --engine vllm --check` says whether this release "
                    "has an edit that makes it a copy)",
                )
            )
            continue
        overwrites = [s for s in judged if s.in_place]
        unread = [s for s in judged if s.in_place is None]
        safe = [s for s in judged if s.in_place is False]
        parts = []
        if overwrites:
            parts.append(f"where the fused add-norm runs in place ({_labels(overwrites)}) the draft reads {held}")
        if unread:
            parts.append(f"on {_labels(unread)} the code does not settle which add-norm runs ({unread[0].why})")
        if safe:
            parts.append(f"on {_labels(safe)} it runs out of place and the draft reads hs[0]")
        text = f"{head}: " + "; ".join(parts) + " (`patchcraft apply --engine vllm` makes it a copy everywhere)"
        if overwrites or unread or not judged:
            kept.append(Finding(FindingKind.ALIAS, text if judged else f"{head}: {held}"))
        else:
            notes.append(Finding(FindingKind.ALIAS_KEPT, text))
    return tuple(kept), tuple(notes)


#: How the harness (its add-norm stand-in writes in place) names an entry that is the embedding tensor itself.
HARNESS_ALIAS = "(not a copy: layer 0 overwrites it in place)"


#: What an embedding entry holds after a forward whose stand-in layers never wrote into their input (GLM-5-Next's
#: mHC layers widen it first; Beam's layer call passes no residual): the release's own layer kernels are not run,
#: so whether one of them adds into the embedding in place is not shown, and the entry stays a warning.
INTACT = "hs[0]"
INTACT_WORDS = (
    "the harness's layers leave it hs[0], but this model's layers take no residual the harness's add-norm writes "
    "into, and whether their own kernels write into their input in place is not run here"
)


def alias_words(judged: Sequence[NormSetting], held: str) -> str:
    """The harness's words for an embedding entry, said for the settings judged."""
    if held == INTACT:
        return (
            "(not a copy: hs[0] after the harness's layers; whether the model's own kernels write into it is not run)"
        )
    if not judged:
        return HARNESS_ALIAS
    if all(s.in_place is False for s in judged):
        return f"(not a copy; kept: the add-norm runs out of place on {', '.join(s.label for s in judged)})"
    if all(s.in_place for s in judged):
        return f"(not a copy: overwritten in place, the draft reads {held})"
    return f"(not a copy: {held} where the add-norm runs in place: {', '.join(s.label for s in judged if s.in_place is not False)})"


def _labels(settings: Sequence[NormSetting]) -> str:
    return ", ".join(f"{s.label}: {s.kernel}" for s in settings)
