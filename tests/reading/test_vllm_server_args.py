"""A vLLM command line read for the preflight: which commands serve vLLM, the model, the draft, what is not read."""

from __future__ import annotations

import json

from patchcraft.reading.vllm_server_args import parse_vllm_args, serves_vllm

SPEC = json.dumps({"method": "eagle3", "model": "/drafts/kimi-eagle3", "num_speculative_tokens": 3})


def test_which_commands_serve_vllm() -> None:
    assert serves_vllm(["vllm", "serve", "m"])
    assert serves_vllm(["/opt/venv/bin/vllm", "serve", "m"])
    assert serves_vllm(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"])
    assert serves_vllm(["python3", "-u", "-m", "vllm.entrypoints.cli.main", "serve", "m"])
    assert not serves_vllm(["python", "-m", "sglang.launch_server", "--model-path", "m"])
    assert not serves_vllm(["sglang", "serve", "--model-path", "m"])
    assert not serves_vllm(["python", "-m", "vllm_tools.bench"])


def test_serve_reads_the_model_the_draft_and_the_sizes() -> None:
    args = parse_vllm_args(["vllm", "serve", "/models/kimi", "--speculative-config", SPEC, "-tp", "8"])
    assert (args.model, args.draft, args.method, args.tp, args.pp, args.unchecked) == (
        "/models/kimi",
        "/drafts/kimi-eagle3",
        "eagle3",
        8,
        1,
        {},
    )


def test_equals_and_underscores_as_vllm_accepts_them_the_last_one_winning() -> None:
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model=/a", f"--speculative_config={SPEC}"]
    args = parse_vllm_args(argv + ["--model", "/b", "--tensor_parallel_size=2", "--pipeline-parallel-size", "2"])
    assert (args.model, args.draft, args.tp, args.pp) == ("/b", "/drafts/kimi-eagle3", 2, 2)


def test_what_is_not_read_is_named() -> None:
    dotted = parse_vllm_args(["vllm", "serve", "m", "--speculative-config.method", "eagle3"])
    assert "dotted form" in dotted.unchecked["speculative"]
    old = parse_vllm_args(["vllm", "serve", "m", "--speculative-model", "/d"])
    assert "--speculative-model" in old.unchecked["speculative"]
    assert "not JSON" in parse_vllm_args(["vllm", "serve", "m", "--speculative-config", "{"]).unchecked["speculative"]
    assert "--config" in parse_vllm_args(["vllm", "serve", "m", "--config", "serve.yaml"]).unchecked["config"]
    twice = parse_vllm_args(["vllm", "serve", "/a", "--model", "/b"])
    assert "given twice" in twice.unchecked["model"]
    assert parse_vllm_args(["vllm", "serve", "m", "-tp", "x"]).unchecked == {"tp": "--tp x: not a number"}


def test_the_compilation_the_command_asks_for() -> None:
    """--enforce-eager, -O0 and a compilation config of mode 0 run eager; vLLM's default compiles; -O 3 compiles."""
    base = ["vllm", "serve", "m"]
    assert parse_vllm_args(base).compilation == "compiled"
    for eager in (["--enforce-eager"], ["-O0"], ["-O", "0"], ["--compilation-config", '{"mode": 0}'], ["-O=0"]):
        assert parse_vllm_args(base + eager).compilation == "eager", eager
    assert parse_vllm_args(base + ["-O", "3"]).compilation == "compiled"
    assert parse_vllm_args(base + ["--compilation-config", '{"mode": 3}', "--enforce-eager"]).compilation == "eager"


def test_a_compilation_flag_that_is_not_read_is_named() -> None:
    dotted = parse_vllm_args(["vllm", "serve", "m", "-cc.mode=none"])
    assert "dotted form of the compilation config" in dotted.unchecked["compilation"]
    assert "compilation" in parse_vllm_args(["vllm", "serve", "m", "-O"]).unchecked
