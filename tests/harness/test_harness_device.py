"""The device harness (patchcraft.harness.cuda) through its CPU path: same code, ``device="cpu"``.

The graph is :class:`ReplayGraph` here (a ``torch.cuda.CUDAGraph`` on CUDA):
fresh ids are copied into the static input buffer before every replay and
aux[0] must be their embedding. A graph that never re-runs (stale static
outputs) and a patched file without ``.clone()`` must both go red.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import subprocess  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from harness_support import mutate, patched, row  # noqa: E402

from patchcraft.harness.cuda import ReplayGraph, device_check  # noqa: E402
from patchcraft.harness.runner import FAIL, PASS, smoke_tree  # noqa: E402

LABELS = ["deepseek_v2.DeepseekV2ForCausalLM", "qwen2.Qwen2ForCausalLM"]


class FrozenGraph(ReplayGraph):
    """A broken graph: replay does nothing, so the static outputs keep the captured input's states."""

    def replay(self) -> None:
        pass


SCENARIOS = ["init", "capture", "same", "default", "pipeline", "graph"]


@pytest.mark.parametrize(
    "version, compiled",
    [
        pytest.param("0.5.10", False, id="0.5.10-graph"),
        pytest.param("0.5.23", True, id="0.5.23-graph-compiled", marks=pytest.mark.slow),
    ],
)
def test_scenarios_graph_and_compile_pass_on_cpu(version: str, compiled: bool) -> None:
    state = patched(version)
    run = smoke_tree(state.tree, LABELS, texts=state.texts, check=device_check("cpu", compiled=compiled))
    for label in LABELS:
        result = row(run, label)
        assert result.status == PASS, result.message
        names = [c.name for c in result.checks]
        assert names == SCENARIOS + (["compile", "graph-compiled"] if compiled else []), names


def test_a_stale_replay_fails() -> None:
    state = patched("0.5.10")
    run = smoke_tree(state.tree, LABELS[:1], texts=state.texts, check=device_check("cpu", graph_factory=FrozenGraph))
    result = row(run, LABELS[0])
    assert result.status == FAIL
    graph = next(c for c in result.checks if c.name == "graph")
    assert graph.status == FAIL and "replay 1: aux[0] is not the embedding of the new input ids" in graph.detail, (
        graph.detail
    )
    assert "the previous ids' embedding" in graph.detail


def test_a_missing_clone_fails_the_replay() -> None:
    state = patched("0.5.10")
    texts = mutate("0.5.10", "deepseek_v2", "c-no-clone")
    run = smoke_tree(state.tree, LABELS[:1], texts=texts, check=device_check("cpu"))
    graph = next(c for c in row(run, LABELS[0]).checks if c.name == "graph")
    assert graph.status == FAIL and "aux[0] is not the embedding of the new input ids" in graph.detail, graph.detail


def test_the_device_follows_the_parameter() -> None:
    """Every tensor the scenarios make is on the device given (``meta`` shows it without a GPU)."""
    with torch.device("meta"):
        assert torch.arange(3).device.type == "meta"
    from patchcraft.harness.subject import input_ids

    with torch.device("cpu"):
        assert input_ids().device.type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_harness_without_cuda_exits_2_with_one_line() -> None:
    command = [
        sys.executable,
        "-m",
        "patchcraft",
        "smoke",
        "--device",
        "cuda",
        "--engine",
        "harness",
        "--release",
        "0.5.10",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs a CUDA device" in lines[0], output
