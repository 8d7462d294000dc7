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
from patchcraft.real_engine import environments, sglang_cpu, vllm_cpu

Progress = Callable[[str], None]
#: The engines whose CPU builds run here, each a module with env_spec, package and script.
DIALECTS = {"vllm": vllm_cpu, "sglang": sglang_cpu}
#: The tiny targets the SGLang run builds (inenv/sglang_run.py).
SGLANG_FAMILIES = {"LlamaForCausalLM": "llama", "DeepseekV3ForCausalLM": "deepseek_v3"}
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
    #: True: vLLM's OpenAI server (its engine core in another process), asked one HTTP completion.
    server: bool = False
    #: A target directory to serve instead of a random one (the target a trained --draft was trained on).
    target_dir: Optional[str] = None
    #: The prompts (token ids); None: two fixed ones.
    prompts: Optional[tuple[tuple[int, ...], ...]] = None

    @property
    def family(self) -> str:
        families = SGLANG_FAMILIES if self.engine == "sglang" else vllm_cpu.FAMILIES
        try:
            return families[self.model]
        except KeyError:
            known = ", ".join(families)
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
    #: explain's warning that the draft gets fewer states than ids (its fc then fails on the shape).
    count: str = ""


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
    """One case on ``case.engine``'s real engine (its CPU environment built or reused first)."""
    dialect = DIALECTS.get(case.engine)
    if dialect is None:
        raise PatchcraftError(f"--engine {case.engine}: the real engines here are {', '.join(DIALECTS)}")
    family = case.family
    if (case.release, family) in vllm_cpu.NO_CPU_PATH and case.engine == "vllm":
        raise PatchcraftError(f"{case.model} on vLLM {case.release}: {vllm_cpu.NO_CPU_PATH[(case.release, family)]}")
    if case.engine == "vllm" and family in vllm_cpu.STANDIN_RELEASES:
        _check_standin_case(case, family)
    if case.engine == "sglang" and (case.server or case.norm != "default"):
        raise PatchcraftError(
            "--server and --norm are vLLM's: the SGLang check runs its offline engine (sglang.Engine)"
        )
    env = environments.ensure(dialect.env_spec(case.release), progress)
    package = dialect.package(env)
    work = Path(tempfile.mkdtemp(prefix="patchcraft-engine-", dir=str(keep) if keep else None))
    spec = {
        "family": family,
        "num_layers": case.num_layers,
        "layer_ids": list(case.layer_ids) if case.layer_ids is not None else None,
        "workdir": str(work / "work"),
        "prompt_token_ids": [list(p) for p in case.prompts]
        if case.prompts
        else [[5, 17, 42, 99, 7, 3, 250, 11], [9, 8, 77, 301, 4]],
        "max_tokens": case.max_tokens,
        "seed": case.seed,
        "norm": case.norm,
        "enforce_eager": case.compilation == "eager",
        "draft_dir": case.draft_dir,
        "target_dir": case.target_dir,
    }
    if case.server:
        result, log = _server_run(case, env, package, work, spec, progress)
        return _outcome(case, env, package, result, log)
    (work / "spec.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    command = [str(env.python), str(dialect.script()), str(work / "spec.json"), str(work / "result.json")]
    if case.patched:
        command = [
            sys.executable,
            "-m",
            "patchcraft",
            "run",
            "--engine",
            case.engine,
            "--target",
            str(package),
            "--no-preflight",
            "--",
            *command,
        ]
    progress(
        f"running {case.engine} {case.release} ({'patched, through patchcraft run' if case.patched else 'as installed'}): {case.model} ids {list(case.layer_ids) if case.layer_ids is not None else 'none'}, norm {case.norm}, {case.compilation}"
    )
    log = work / "engine.log"
    with open(log, "w") as out:
        try:
            proc = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, env=environments.environ_for(env), timeout=TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise PatchcraftError(f"the engine ran past {TIMEOUT_S} s; its output: {log}") from None
    return _outcome(case, env, package, _read_result(work / "result.json", log, proc.returncode), log)


def _check_standin_case(case: Case, family: str) -> None:
    """A stand-in case (DeepSeek-V4) runs offline, eager, on the releases its stand-ins were written against."""
    releases = vllm_cpu.STANDIN_RELEASES[family]
    if case.release not in releases:
        raise PatchcraftError(
            f"{case.model} on vLLM {case.release}: this case's CPU kernel stand-ins are written against vllm-cpu "
            f"{', '.join(releases)} only"
        )
    if case.server or case.norm != "default" or case.compilation != "eager" or case.target_dir:
        raise PatchcraftError(
            f"{case.model}: the stand-in case runs vLLM's offline engine, eager, on its own tiny target "
            f"({vllm_cpu.STANDIN_REFUSES} are not supported)"
        )


def tier(result: dict[str, Any]) -> str:
    """What ran, in words: the engine itself, or (a stand-in case) vLLM's Python model code with named stand-ins."""
    standins = result.get("standins")
    if standins is None:
        return "its CPU build, the real engine"
    named = set(result.get("standin_kernels") or ())  # the engine's side names them (inenv: vllm_dsv4_standins)
    kernels = [name for name in standins if name in named]
    others = [name for name in standins if name not in named]
    isa = result.get("isa") or {}
    why = (
        "this CPU lacks AVX-512/AMX"
        if not (isa.get("amx") or isa.get("avx512_bf16"))
        else "absent from the kernel library loaded"
    )
    text = f"its CPU build: vLLM's own Python model code with {len(kernels)} stand-in CPU kernels ({why}): "
    text += ", ".join(kernels) or "none"
    if others:
        text += f"; and {len(others)} other stand-ins: {', '.join(others)}"
    return text + " (patchcraft's pure-torch code, inenv/vllm_dsv4_standins.py)"


def _read_result(path: Path, log: Path, code: int) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise PatchcraftError(
            f"the engine run wrote no result (exit {code}): {tail[0][:300]}; its output: {log}"
        ) from None


def _outcome(case: Case, env: environments.EngineEnv, package: Path, result: dict[str, Any], log: Path) -> Outcome:
    error = result.get("error") or {}
    if error and (error.get("phase", "engine") != "engine" or error.get("where") == "the spec"):
        raise PatchcraftError(
            f"the tiny case could not be set up ({error.get('phase')}): {error.get('type')}: "
            f"{str(error.get('message', ''))[:200]} at {error.get('file')}:{error.get('line')}; its output: {log}"
        )
    tree = _served_tree(package, case, result)
    prediction = predict(tree, case)
    agree, why = compare(result, prediction)
    if case.patched and agree:
        agree, why = _overlay_served(package, result, why)
    served = "patchcraft run's overlay" if case.patched else "the install"
    if case.server:
        served += ", vLLM's OpenAI server"
    return Outcome(case, result, prediction, agree, why, str(env.root), str(tree), served, (f"engine output: {log}",))


def _in_env(env: environments.EngineEnv, work: Path, spec: dict[str, Any], name: str, log: Path) -> dict[str, Any]:
    """One phase of the in-environment script (prepare, match): its result."""
    (work / f"{name}.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    script = str(vllm_cpu.script())
    command = [str(env.python), script, str(work / f"{name}.json"), str(work / f"{name}-result.json")]
    with open(log, "a") as out:
        proc = subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, env=environments.environ_for(env), timeout=TIMEOUT_S
        )
    return _read_result(work / f"{name}-result.json", log, proc.returncode)


def _server_run(
    case: Case, env: environments.EngineEnv, package: Path, work: Path, spec: dict[str, Any], progress: Progress
) -> tuple[dict[str, Any], Path]:
    """vLLM's OpenAI server (through ``patchcraft run`` when patched) asked one completion; the probe in its engine core."""
    import signal
    import socket
    import time
    import urllib.request

    log = work / "engine.log"
    prepared = _in_env(env, work, {**spec, "mode": "prepare"}, "prepare", log)
    if prepared.get("error"):
        return prepared, log
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = [str(env.python), "-m", "vllm.entrypoints.openai.api_server", "--model", prepared["target_dir"]]
    server += [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--seed",
        "0",
    ]
    server += ["--gpu-memory-utilization", "0.1", "--max-num-seqs", "4"]
    if case.compilation == "eager":
        server.append("--enforce-eager")
    if case.norm == "inplace":
        server += ["--ir-op-priority", json.dumps({"fused_add_rms_norm": ["patchcraft_inplace", "native"]})]
    if prepared.get("draft_dir"):
        speculative = {"method": "eagle3", "model": prepared["draft_dir"], "num_speculative_tokens": 2}
        server += ["--speculative-config", json.dumps(speculative)]
    command = server
    if case.patched:
        trained = "hf:" + ",".join(str(i) for i in case.layer_ids or ())
        command = [sys.executable, "-m", "patchcraft", "run", "--engine", "vllm", "--target", str(package)]
        command += ["--trained-on", trained, "--", *server]
    extra = {"PYTHONPATH": prepared["pythonpath"], "PATCHCRAFT_PROBE_DIR": prepared["probe_dir"]}
    if case.norm == "inplace":
        extra["PATCHCRAFT_INPLACE_NORM"] = "1"
    progress(f"starting vLLM's OpenAI server on 127.0.0.1:{port}{' through patchcraft run' if case.patched else ''}")
    with open(log, "a") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environments.environ_for(env, extra),
            start_new_session=True,
        )
    tokens: list[list[int]] = []
    metrics: dict[str, Any] = {}
    try:
        _wait_healthy(proc, port, log)
        for prompt in spec["prompt_token_ids"]:
            body = {
                "model": prepared["target_dir"],
                "prompt": prompt,
                "max_tokens": case.max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=300) as answer:
                text = json.loads(answer.read())["choices"][0]["text"]
            tokens.append([int(word[1:]) for word in text.split() if word[:1] == "t" and word[1:].isdigit()])
        progress(f"the server answered {len(tokens)} HTTP completions")
        metrics = _server_metrics(port)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
    carry: dict[str, Any] = {
        k: prepared[k] for k in ("reference", "reference_tokens", "target_dir", "draft_dir") if k in prepared
    }
    carry |= {
        "spec_metrics": metrics,
        "tokens": tokens,
        "engine_version": case.release,
        "server_pid": proc.pid,
        "http_completions": len(tokens),
    }
    result = _in_env(env, work, {**spec, "mode": "match", "carry": carry}, "match", log)
    result.setdefault("notes", []).append(
        f"the server's process {proc.pid}; the probe recorded in process(es) {result.get('probe_pids')}"
    )
    return result, log


def _server_metrics(port: int) -> dict[str, Any]:
    """vLLM's spec-decode counters from the server's Prometheus ``/metrics`` (summed over label sets)."""
    import urllib.request

    found: dict[str, Any] = {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
            text = answer.read().decode("utf-8", "replace")
    except OSError as exc:
        return {"error": str(exc)}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode_num_") or " " not in line:
            continue
        name, _, value = line.rpartition(" ")
        key = name.split("{")[0].split(":", 1)[1]
        if key.endswith("_created"):  # Prometheus's creation timestamps, not counts
            continue
        key = key.removesuffix("_total")
        if "per_pos" in key:
            found.setdefault(key, []).append(float(value))
        else:
            found[key] = found.get(key, 0.0) + float(value)
    drafts, accepted = found.get("spec_decode_num_drafts"), found.get("spec_decode_num_accepted_tokens")
    if drafts and accepted is not None:
        found["mean_accept_length"] = round(1 + accepted / drafts, 3)
    return found


def _wait_healthy(proc: subprocess.Popen, port: int, log: Path, limit: float = TIMEOUT_S) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise PatchcraftError(
                f"the server exited ({proc.returncode}) before it answered: {tail[0][:300]}; its output: {log}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise PatchcraftError(f"the server did not answer /health within {limit:.0f} s; its output: {log}")


def _served_tree(package: Path, case: Case, result: dict[str, Any]) -> Path:
    """The tree the engine imported: the install, or the overlay's patched copy (checked against the result)."""
    if not case.patched:
        return package
    from patchcraft.base.engines import ServingEngine, resolve_engine_target
    from patchcraft.pipeline.serve import build_overlay
    from patchcraft.overlay.build import package_dir

    overlay = build_overlay(resolve_engine_target(str(package), ServingEngine(case.engine)), smoke=False)
    return package_dir(overlay.directory)


def _overlay_served(package: Path, result: dict[str, Any], why: str) -> tuple[bool, str]:
    """Never silent: a patched case whose engine imported every model module from the install is a failure."""
    if "model_files" not in result:  # the SGLang run records none: the patched behaviour is the evidence
        return True, f"{why} (the install alone cannot feed this: the overlay's patched code ran)"
    install = package.resolve()
    served = sorted(
        m
        for m, f in (result.get("model_files") or {}).items()
        if f and "overlays" in Path(f).parts and not Path(f).resolve().is_relative_to(install)
    )
    if not served:
        return False, f"{why}; but the engine imported no model module from the overlay (the patch was not served)"
    return True, f"{why}; the overlay served {', '.join(served)}"


def _predict_sglang(package: Path, case: Case) -> Prediction:
    """SGLang's explain on the tree the engine ran: the CPU harness's run of its setter and forward."""
    from patchcraft.analysis.explain import explanation, read_ids, run_harness
    from patchcraft.analysis.target_model import load_model
    from patchcraft.base.target import resolve_target

    model = load_model(resolve_target(str(package)), case.model)
    reading = read_ids(model, list(case.layer_ids) if case.layer_ids is not None else None, case.num_layers)
    result = explanation(reading, run_harness(reading))
    outcome = result.outcome
    crash = outcome.crash if outcome is not None and outcome.crash else ""
    fed = tuple(f"hs[{k}]" for k in result.served)
    return Prediction(fed, crash, "cpu, SGLang's offline engine (torch_native)", result)


def predict(package: Path, case: Case) -> Prediction:
    if case.engine == "sglang":
        return _predict_sglang(package, case)
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
    count = next((f.text for f in explanation.findings if f.kind is FindingKind.COUNT), "")
    return Prediction(fed, crash, setting, explanation, count)


def compare(result: dict[str, Any], prediction: Prediction) -> tuple[bool, str]:
    error = result.get("error")
    if prediction.crash:
        if not error:
            return False, f"explain predicts a crash ({prediction.crash}); the engine ran"
        where = f"{Path(error.get('file', '')).name}:{error.get('line')}"
        if where in prediction.crash or error.get("type", "?") in prediction.crash:
            return True, f"both crash: the engine at {error.get('file')}:{error.get('line')} ({error.get('type')})"
        return False, f"both crash, but the engine at {where} ({error.get('type')}) and explain: {prediction.crash}"
    if error and prediction.count and "combine_hidden_states" in error.get("traceback", ""):
        return True, (
            f"explain: {prediction.count}; the engine fails in the draft's combine_hidden_states: "
            f"{error.get('type')}: {str(error.get('message', ''))[:120]} at {error.get('file')}:{error.get('line')}"
        )
    if error:
        return (
            False,
            f"the engine failed: {error.get('type')}: {error.get('message', '')[:200]} at {error.get('file')}:{error.get('line')}; explain predicts {list(prediction.fed)}",
        )
    fed = [slot.get("state") for slot in result.get("fed", [])]
    if fed == list(prediction.fed):
        return True, f"the draft received {', '.join(prediction.fed)}, as explain predicts"
    return False, f"the draft received {fed}; explain predicts {list(prediction.fed)}"
