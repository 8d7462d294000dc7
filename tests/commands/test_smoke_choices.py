"""_smoke_choices.py: ``smoke --device`` and ``--engine`` as str enums, parsed once at the CLI edge."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from patchcraft.cli import cli
from patchcraft.commands._smoke_choices import Device, Engine


def test_the_words() -> None:
    assert [d.value for d in Device] == ["cpu", "cuda"] and [e.value for e in Engine] == ["sglang", "harness", "vllm"]
    assert Device.CUDA == "cuda" and f"--device {Device.CUDA}" == "--device cuda"


def test_smoke_offers_them_and_hands_on_members(monkeypatch: pytest.MonkeyPatch) -> None:
    from patchcraft.commands import smoke

    command = cli.commands["smoke"]
    choices = {p.name: list(p.type.choices) for p in command.params if isinstance(p.type, click.Choice)}
    assert choices["device"] == ["cpu", "cuda"] and choices["engine"] == ["sglang", "harness", "vllm"]
    seen = []
    monkeypatch.setattr(smoke, "smoke_command", lambda options, **kw: seen.append(kw) or 0)
    assert CliRunner().invoke(cli, ["smoke"]).exit_code == 0
    assert seen[-1]["device"] is Device.CPU and seen[-1]["engine"] is Engine.SGLANG
    assert CliRunner().invoke(cli, ["smoke", "--device", "cuda", "--engine", "harness"]).exit_code == 0
    assert seen[-1]["device"] is Device.CUDA and seen[-1]["engine"] is Engine.HARNESS
    result = CliRunner().invoke(cli, ["smoke", "--device", "tpu"])
    assert result.exit_code == 2 and "'tpu' is not one of 'cpu', 'cuda'" in result.output
