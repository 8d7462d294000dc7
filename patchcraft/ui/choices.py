"""The choices of ``--format`` and ``--color``: what the output looks like.

``str`` enums, so they compare equal to, and print as, the words the user
types (``OutputFormat.JSON == "json"``); the CLI parses them once
(``click.Choice`` over the values) and code compares the members. This
module imports nothing else: the CLI reads it before any command is chosen.
"""

from __future__ import annotations

import enum


class Choice(str, enum.Enum):
    """A command-line choice whose ``str()`` and ``format()`` are the word itself on every Python."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class OutputFormat(Choice):
    """``--format``: the human text, one JSON document (docs/json.md), or GitHub workflow annotations."""

    TEXT = "text"
    JSON = "json"
    #: apply, verify, diff, revert, smoke and overlay verify only.
    GITHUB = "github"


#: The formats of a command that prints a report or a document, not annotations.
DOCUMENT_FORMATS = (OutputFormat.TEXT, OutputFormat.JSON)
#: The formats of the pipeline commands (and smoke, overlay verify).
REPORT_FORMATS = (OutputFormat.TEXT, OutputFormat.JSON, OutputFormat.GITHUB)


class Color(Choice):
    """``--color``: colour a terminal only (``NO_COLOR`` honoured), always, or never."""

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"
