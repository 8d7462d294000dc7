"""The fix grid: every suggestion check-draft prints, applied as printed, makes check-draft pass.

A cell is a release, a target model, a draft id list (layer outputs, or
with -1), a ``--trained-on`` preset, the server's TP and whether CUDA
graphs are on. For each printed fix the cell does what the line says: it
writes the ids into a new draft config, runs ``patchcraft apply`` for the
model on the release (a private copy, once per release and model), serves with the
flags it names (as check-draft's settings) and checks with the
``--trained-on`` it names; check-draft must then pass. The first fix
printed must therefore clear every FAIL. Shared by the fast slice
(tests/analysis/test_fixes.py) and the full grid
(tests/analysis/test_fixes_grid.py).
"""

from __future__ import annotations

import atexit
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from conftest import copy_release, release_package
from drafts import HIDDEN, sglang_draft
from patchcraft.analysis.draft_check import DraftReport, check_draft
from patchcraft.reading.draft_config import read_draft, read_target
from patchcraft.analysis.target_model import Model, load_model
from patchcraft.analysis.training import LAYER_OUTPUT, parse_training
from patchcraft.base.target import resolve_target

if TYPE_CHECKING:
    from patchcraft.analysis.fixes import Fix

#: SGLang's server flags a fix may name (patchcraft.analysis.fixes says the same).
FUSION_FLAG = "--enforce-disable-flashinfer-allreduce-fusion"
CUDA_GRAPH_FLAG = "--disable-cuda-graph"
RELEASES = ("0.5.6", "0.5.10", "0.5.13", "0.5.14", "0.5.18", "0.5.23")
#: name -> (model class, num_hidden_layers of the real model)
MODELS = {
    "DeepseekV2": ("deepseek_v2.DeepseekV2ForCausalLM", 61),
    "GLM-4-MoE": ("glm4_moe.Glm4MoeForCausalLM", 92),
    "gpt-oss": ("gpt_oss.GptOssForCausalLM", 36),
    "Llama": ("llama.LlamaForCausalLM", 32),
    "Qwen3-MoE": ("qwen3_moe.Qwen3MoeForCausalLM", 48),
}
PRESETS = ("hf", "specforge", "specforge@0.5.6", "speculators", "speculators@0.4", "eagle", *LAYER_OUTPUT)
ID_LISTS = ("outputs", "with -1")
#: What the full tier needs besides the parts copy_release copies: the fusion decision and the server's flags.
_SERVED_PARTS = ("srt/layers", "srt/server_args.py", "srt/arg_groups")
_LIST = r"\[(-?\d+(?:, -?\d+)*)\]"


def draft_ids(kind: str, n: int) -> list[int]:
    return [1, n // 2 - 1, n - 4] if kind == "outputs" else [-1, 2, n // 2]


def trained_on(preset: str, n: int) -> str:
    return f"hf:0,3,{n // 2}" if preset == "hf" else preset


@lru_cache(maxsize=None)
def pristine(version: str, label: str) -> Model:
    return load_model(resolve_target(str(release_package(version))), label)


@lru_cache(maxsize=None)
def applied_package(version: str, label: str) -> Path:
    """``patchcraft apply --model LABEL`` (its closure, the runner, the fusion decision) on a private copy."""
    root = Path(tempfile.mkdtemp(prefix=f"fix-grid-{version}-"))
    atexit.register(shutil.rmtree, root, True)
    package = copy_release(version, root, extra=_SERVED_PARTS)
    # The command as the user runs it: the harness proves the patched code first and withholds what fails.
    applied = subprocess.run(
        [sys.executable, "-m", "patchcraft", "apply", "--model", label, str(package)], capture_output=True, text=True
    )
    assert applied.returncode == 0, applied.stdout + applied.stderr
    return package


@lru_cache(maxsize=None)
def applied(version: str, label: str) -> Model:
    return load_model(resolve_target(str(applied_package(version, label))), label)


@dataclass(frozen=True)
class Action:
    """What one printed fix line tells the user to do."""

    ids: tuple[int, ...]
    apply: bool
    flags: tuple[str, ...]
    trained_on: str


def parse_fix(line: str) -> Action:
    """The action of a printed fix (``keep``/``set`` the ids, apply, the flags, the --trained-on)."""
    found = re.search(rf"(?:keep|set) eagle_config\.eagle_aux_hidden_state_layer_ids = {_LIST}", line)
    assert found, line
    pinned = re.search(r"--trained-on (hf:[\d,]+)", line)
    return Action(
        ids=tuple(int(v) for v in found.group(1).split(", ")),
        apply="`patchcraft apply`" in line,
        flags=tuple(f for f in (FUSION_FLAG, CUDA_GRAPH_FLAG) if f in line),
        trained_on=pinned.group(1) if pinned else "",
    )


def fix_lines(report: DraftReport) -> list[str]:
    """The printed fix lines (the first, and each ``or:``), without the claim lines under them."""
    if not report.fixes:
        return []
    lines = report.suggestion_text.splitlines()
    return [lines[0]] + [line for line in lines[1:] if line.startswith("  or: ")]


def claim_lines(report: DraftReport) -> list[str]:
    return [line for line in report.suggestion_text.splitlines() if line.startswith("    ")]


@dataclass(frozen=True)
class Cell:
    version: str
    model: str
    ids: str
    preset: str
    tp: int
    cuda_graph: bool

    def __str__(self) -> str:
        graphs = "graphs" if self.cuda_graph else "no-graphs"
        return f"{self.version}/{self.model}/{self.ids}/{self.preset}/tp{self.tp}/{graphs}"


def write_target(directory: Path, n: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"num_hidden_layers": n, "hidden_size": HIDDEN}))
    return directory


def check(cell: Cell, directory: Path, ids: tuple[int, ...] | list[int], model: Model, how: str, flags=()):
    label, n = MODELS[cell.model]
    draft = read_draft(sglang_draft(directory / "draft", list(ids)))
    target = read_target(write_target(directory / "target", n))
    serving = {"allreduce_fusion": False} if FUSION_FLAG in flags else {}
    graphs = cell.cuda_graph and CUDA_GRAPH_FLAG not in flags
    return check_draft(model, draft, target, parse_training(how), n, cuda_graph=graphs, tp=cell.tp, **serving)


def run_cell(cell: Cell, directory: Path) -> list[tuple[str, tuple[int, ...]]]:
    """Check the cell, then apply every printed fix as printed and check again; the portable claims made."""
    label, n = MODELS[cell.model]
    how = trained_on(cell.preset, n)
    report = check(cell, directory / "as-given", draft_ids(cell.ids, n), pristine(cell.version, label), how)
    lines = fix_lines(report)
    assert len(lines) == len(report.fixes), (str(cell), report.suggestion_text)
    if report.ok:
        assert not report.fixes and not report.suggestion_text, (str(cell), report.suggestion_text)
        return []
    if not report.fixes:  # nothing offered: what blocks it is said
        assert report.suggestion_text, (str(cell), report.verdict)
    claims = []
    for index, (line, fix) in enumerate(zip(lines, report.fixes)):
        action = parse_fix(line)
        assert _matches(action, fix), (str(cell), line, fix)
        model = applied(cell.version, label) if action.apply else pristine(cell.version, label)
        again = check(cell, directory / f"fix-{index}", action.ids, model, action.trained_on or how, action.flags)
        failed = [f"{c.name}: {c.message}" for c in again.checks if c.ok is False]
        assert again.ok, f"{cell}: fix {index + 1} ({line.strip()}) still fails: {failed}"
        if fix.portable:
            claims.append((cell.model, fix.ids))
    for claim in claim_lines(report):
        portable = "same on every release" in claim
        ids = tuple(int(v) for v in re.search(_LIST, claim).group(1).split(", "))  # type: ignore[union-attr]
        assert portable == any(f.portable for f in report.fixes if f.ids == ids), (str(cell), claim)
    return claims


def _matches(action: Action, fix: Fix) -> bool:
    return (
        action.ids == fix.ids
        and action.apply == fix.after_apply
        and action.flags == fix.flags
        and action.trained_on == fix.trained_on
    )


def served_after_apply(
    model: str, ids: tuple[int, ...], releases: tuple[str, ...] = RELEASES
) -> dict[str, tuple[int, ...]]:
    """What ``ids`` serve after ``patchcraft apply`` on each release (a portable claim must hold on all)."""
    from patchcraft.analysis.draft_check import explained

    label, n = MODELS[model]
    return {v: explained(applied(v, label), ids, n, 1).served for v in releases}
