"""Statuses: what a transform found at one edit site, what a run says of one model, and what proved it.

Both are ``str`` enums, so they compare equal to, and serialise (JSON, text) as,
the strings of the JSON schema: ``EditStatus.APPLIED == "applied"``. Code
compares with the members; "done" is defined once per kind, here.
"""

from __future__ import annotations

import enum


class _Status(str, enum.Enum):
    """A status whose ``str()`` and ``format()`` are its schema string on every Python."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class EditStatus(_Status):
    """What one transform found or did at one edit site."""

    #: The transform made the edit (apply, diff, check: would make it).
    APPLIED = "applied"
    #: patchcraft's own edit is there.
    PRESENT = "present"
    #: An edit by hand that does what patchcraft's edit does.
    HAND_APPLIED = "hand-applied"
    #: Something edited the site, but not in a way that does the job.
    MODIFIED = "modified"
    #: The engine could not run the transform at the site (the file's or the site's error is the detail).
    ERROR = "error"


#: The edit statuses that mean the site does its job already: nothing to write.
EDIT_IN_PLACE = frozenset({EditStatus.PRESENT, EditStatus.HAND_APPLIED})


class ModelStatus(_Status):
    """What a run says of one model (the JSON schema's ``status``)."""

    PATCHED = "patched"
    ALREADY = "already-patched"
    WOULD = "would-patch"
    UNSUPPORTED = "unsupported"
    ERROR = "error"
    REVERTED = "reverted"
    NOT_PATCHED = "not-patched"
    #: The runner row on a release whose graph capture already gets the configured ids.
    NOT_NEEDED = "not-needed"
    #: A class with the setter that is no EAGLE-3 target (a draft or NextN head capturing nothing).
    NOT_APPLICABLE = "not-applicable"


#: The edit statuses of an edit made by hand: one that does patchcraft's job, or one that tries to.
HAND_MADE = frozenset({EditStatus.HAND_APPLIED, EditStatus.MODIFIED})

#: The model statuses of a row whose edits are all in place (verify's "verified", before the compile and proof checks).
MODEL_DONE = frozenset({ModelStatus.ALREADY, ModelStatus.NOT_NEEDED})
#: The model statuses of a row patchcraft cannot, or need not, patch (no edit sites).
MODEL_SKIPPED = frozenset({ModelStatus.UNSUPPORTED, ModelStatus.NOT_APPLICABLE})


class FileState(_Status):
    """What a file patchcraft touches is, against its pristine text (patchcraft.engine.hand_edits)."""

    PRISTINE = "pristine"
    #: Only patchcraft's own marked edits differ: ``revert`` gives the pristine file.
    PATCHED = "patchcraft-patched"
    #: Someone changed it by hand (the hand diff says where).
    HAND = "edited-by-hand"
    #: No pristine text to compare with (no RECORD entry, no wheel, not a git tree).
    UNKNOWN = "unknown"


class Proof(_Status):
    """What proved a model's patched text (the JSON schema's ``proof``; an overlay manifest's ``proof``)."""

    #: The CPU harness ran the patched methods and they captured the right states.
    PASSED = "harness-passed"
    #: The harness ran them and they did not (the text is withheld, never written).
    FAILED = "harness-failed"
    #: The harness could not run this model class (a harness ``error``: the original file does not run
    #: under the stand-ins, say): nothing proved the text, so it is withheld too; ``--no-smoke`` writes it unproven.
    ERROR = "harness-error"
    #: The harness could not run this patched model itself (its row says why, e.g. a vLLM mixin model whose
    #: shared edit other models proved): written, its own methods unproven.
    HARNESS_SKIPPED = "harness-skipped"
    #: torch is not installed: nothing ran (the static reading stands).
    NO_TORCH = "not-run (no torch)"
    #: ``--no-smoke``: the harness was asked not to run.
    SKIPPED = "skipped (--no-smoke)"
    #: An overlay with no model the harness runs (the runner edits only, say).
    NOTHING_TO_PROVE = "nothing to prove"


class HarnessStatus(_Status):
    """What the CPU harness said of one scenario, or of one model class (its first failed scenario's)."""

    PASS = "pass"
    FAIL = "fail"
    #: The harness could not run it (the original file does not run under the stand-ins, say).
    ERROR = "error"
    SKIPPED = "skipped"
    NOT_APPLICABLE = "n/a"


#: The harness verdict -> the ``proof`` a model row records (a skipped or n/a row proves nothing).
PROOF_OF = {HarnessStatus.PASS: Proof.PASSED, HarnessStatus.FAIL: Proof.FAILED, HarnessStatus.ERROR: Proof.ERROR}

#: The proofs that withhold a model's text: never written, the run exits 1.
WITHHELD = frozenset({Proof.FAILED, Proof.ERROR})


class EditKind(_Status):
    """Which of patchcraft's edits an edit site takes (each transform's ``KIND``; the JSON schema's ``kind``)."""

    INIT = "init"
    SETTER = "setter"
    FORWARD = "forward"
    #: Keep a captured state reduced where the layer leaves it to a fused all-reduce (TP > 1).
    FUSION = "fusion"
    #: Mark the captured layers so their all-reduce is not fused away.
    FUSION_MARK = "fusion-mark"
    RUNNER = "runner"
    #: vLLM: id 0 captures a copy of the embedding output before the layer loop (docs/vllm.md).
    VLLM_FORWARD = "vllm-forward"
    #: vLLM 0.18+: ``EagleModelMixin``'s capture of id 0 a copy, not the embedding tensor itself (docs/vllm.md).
    VLLM_MIXIN = "vllm-mixin"
    #: vLLM: a capture before the layer loop appends a copy of the embedding output, not the tensor itself.
    VLLM_BEFORE_LOOP = "vllm-before-loop"
    #: vLLM: a forward capturing only after each layer (DeepSeek-V4) gets id 0's capture before its loop.
    VLLM_ADD_CAPTURE = "vllm-add-capture"
