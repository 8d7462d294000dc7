"""patchcraft.base.layer_ids: the one parser of ``--layer-ids`` (explain, smoke --device cuda)."""

from __future__ import annotations

import pytest

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.layer_ids import parse_layer_ids


@pytest.mark.parametrize("text", ["-1,2,30", "[-1, 2, 30]", " -1, 2,30 ", "-1,2,30,"])
def test_comma_separated_ids(text: str) -> None:
    assert parse_layer_ids(text) == (-1, 2, 30)


def test_none_is_the_defaults() -> None:
    assert parse_layer_ids("none") is None and parse_layer_ids(" None ") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b", "--layer-ids 'a,b': expected comma-separated integers like -1,2,30"),
        ("1.5", "--layer-ids '1.5': expected comma-separated integers like -1,2,30"),
        ("", "--layer-ids: no ids given"),
        ("[]", "--layer-ids: no ids given"),
    ],
)
def test_bad_ids_are_one_line(text: str, message: str) -> None:
    with pytest.raises(PatchcraftError) as caught:
        parse_layer_ids(text)
    assert str(caught.value) == message
