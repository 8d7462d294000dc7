"""patchcraft.analysis.vllm_findings: an embedding entry judged per add-norm setting, and one no layer writes into."""

from __future__ import annotations

from patchcraft.analysis.vllm_findings import (
    INTACT,
    Finding,
    FindingKind,
    alias_words,
    norm_findings,
)
from patchcraft.reading.vllm_norm_dispatch import NormSetting

IN_PLACE = NormSetting("cuda", "eager", True, "vllm_c", "")
OUT_OF_PLACE = NormSetting("cpu", "eager", False, "native", "")


def _alias(held: str) -> Finding:
    return Finding(FindingKind.ALIAS, f"entry 0 is the embedding output itself, not a copy | {held} instead of hs[0]")


def test_an_entry_overwritten_in_place_is_a_warning_where_a_setting_writes_in_place() -> None:
    warnings, notes = norm_findings([_alias("hs[7]")], [IN_PLACE, OUT_OF_PLACE])
    assert [f.kind for f in warnings] == [FindingKind.ALIAS] and notes == ()
    assert "(cuda eager: vllm_c) the draft reads hs[7]" in warnings[0].text
    assert (
        alias_words([IN_PLACE, OUT_OF_PLACE], "hs[7]")
        == "(not a copy: hs[7] where the add-norm runs in place: cuda eager)"
    )


def test_an_entry_the_stand_in_layers_never_wrote_into_stays_a_warning_that_says_what_is_not_run() -> None:
    """GLM-5-Next's mHC layers widen the embedding first, Beam's layer call passes no residual: after the harness's
    forward the entry still holds hs[0], but the model's own layer kernels were not run, so no setting is cleared."""
    warnings, notes = norm_findings([_alias(INTACT)], [IN_PLACE, OUT_OF_PLACE])
    assert notes == ()
    assert [f.kind for f in warnings] == [FindingKind.ALIAS]
    assert "the harness's layers leave it hs[0]" in warnings[0].text
    assert "whether their own kernels write into their input in place is not run here" in warnings[0].text
    assert "not run" in alias_words([IN_PLACE], INTACT)


def test_other_findings_pass_through() -> None:
    other = Finding(FindingKind.DROPPED, "id 0 captures nothing")
    assert norm_findings([other], [IN_PLACE]) == ((other,), ())
