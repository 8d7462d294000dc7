"""choices.py: ``--format`` and ``--color`` as str enums, parsed once at the CLI edge."""

from __future__ import annotations

import json

import click
import pytest

from patchcraft.cli import cli
from patchcraft.ui.choices import DOCUMENT_FORMATS, REPORT_FORMATS, Color, OutputFormat


def test_a_choice_is_the_word_itself() -> None:
    assert OutputFormat.JSON == "json" and Color("never") is Color.NEVER
    assert str(OutputFormat.GITHUB) == f"{OutputFormat.GITHUB}" == "github"
    assert f"{Color.AUTO:>8}" == "    auto"
    assert json.dumps({"format": OutputFormat.TEXT}) == '{"format": "text"}'


def _choices(command: click.Command, name: str) -> list[str]:
    (param,) = [p for p in command.params if p.name == name]
    assert isinstance(param.type, click.Choice)
    return list(param.type.choices)


def _command(*path: str) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


@pytest.mark.parametrize(
    ("path", "formats"),
    [
        (("apply",), REPORT_FORMATS),
        (("verify",), REPORT_FORMATS),
        (("smoke",), REPORT_FORMATS),
        (("overlay", "verify"), REPORT_FORMATS),
        (("list",), DOCUMENT_FORMATS),
        (("explain",), DOCUMENT_FORMATS),
        (("check-draft",), DOCUMENT_FORMATS),
        (("overlay", "build"), DOCUMENT_FORMATS),
        (("cache", "prune"), DOCUMENT_FORMATS),
    ],
)
def test_the_cli_offers_the_enum_s_words(path: tuple[str, ...], formats: tuple[OutputFormat, ...]) -> None:
    command = _command(*path)
    assert _choices(command, "output_format") == [f.value for f in formats]
    if "color" in {p.name for p in command.params}:
        assert _choices(command, "color") == [c.value for c in Color]


def test_the_cli_hands_on_members(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from patchcraft.commands import list_

    seen = []
    monkeypatch.setattr(list_, "list_command", lambda targets, output_format, engine: seen.append(output_format) or 0)
    for argv, expected in ((["list"], OutputFormat.TEXT), (["list", "--format", "json"], OutputFormat.JSON)):
        assert CliRunner().invoke(cli, argv).exit_code == 0
        assert seen.pop() is expected
