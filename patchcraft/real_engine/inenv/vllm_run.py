"""One real vLLM engine run with EAGLE-3 on a tiny random target: what the draft received, and the tokens.

``ENV/bin/python vllm_run.py SPEC.json RESULT.json``, inside an engine
environment (patchcraft is not installed there: stdlib, torch, transformers,
safetensors, vLLM and the files beside this one). It builds the target and
the draft (tiny_models), installs the probe as a vLLM general plugin (so it
runs in whichever process holds the draft), runs ``vllm.LLM`` greedy, and
writes RESULT.json, always, also when the engine fails (the exception and
the last frame inside the ``vllm`` package).

SPEC keys: family, num_layers, layer_ids (or null: no speculation), workdir,
prompt_token_ids, max_tokens, seed, norm ("default", or "inplace": the
fused add-norm forced to an in-place implementation, the semantics of the
``vllm_c`` kernel CUDA runs without compilation), enforce_eager, draft_dir,
num_speculative_tokens.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PLUGIN = "patchcraft_engine_probe"
INPLACE = "patchcraft_inplace"


def main(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    result: dict[str, Any] = {"ok": False, "engine": "vllm", "platform": "cpu", "error": None, "notes": []}
    result.update(spec.get("carry") or {})  # a server run's match: what prepare and the server gave
    started = time.monotonic()
    try:
        run(spec, result)
        result["ok"] = result["error"] is None
    except BaseException as exc:  # the result file says what stopped the run, whatever it was
        result["error"] = describe(exc) | {"phase": result.get("phase", "setup")}
    result["wall_s"] = round(time.monotonic() - started, 1)
    Path(result_path).write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    return 0


def describe(exc: BaseException) -> dict[str, Any]:
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if "/vllm/" in f.filename]
    chosen = inside or list(frames)
    last = chosen[-1] if chosen else None
    error: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)[:500]}
    if last is not None:
        filename = last.filename
        error["file"] = "vllm/" + filename.split("/vllm/", 1)[1] if "/vllm/" in filename else filename
        error["line"] = last.lineno
    error["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]
    return error


def install_probe(workdir: Path) -> Path:
    """A dist-info on sys.path (and PYTHONPATH, for the processes vLLM starts) naming the probe as a plugin."""
    plugin_dir = workdir / "plugin"
    dist = plugin_dir / f"{PLUGIN}-0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN}\nVersion: 0\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{PLUGIN} = engine_probe:register\n", encoding="utf-8"
    )
    probe_dir = workdir / "probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    for entry in (str(HERE), str(plugin_dir)):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(plugin_dir), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    os.environ["PATCHCRAFT_PROBE_DIR"] = str(probe_dir)
    return probe_dir


def run(spec: dict[str, Any], result: dict[str, Any]) -> None:
    """``mode`` offline (the default): prepare, the engine in this process, match. ``prepare`` and ``match``
    are the two ends of a server run, whose engine the caller starts (through ``patchcraft run``)."""
    mode = spec.get("mode", "offline")
    if mode in ("offline", "prepare"):
        prepare(spec, result)
    if mode == "offline":
        try:
            offline(spec, result)
        except BaseException as exc:  # DeepSeek-V4: what the draft received before the failure is still matched
            if spec["family"] != "deepseek_v4":
                raise
            result["error"] = describe(exc) | {"phase": "engine"}
    if mode in ("offline", "match"):
        match(spec, result)


def prepare(spec: dict[str, Any], result: dict[str, Any]) -> None:
    """The tiny target (with a tokenizer, for a server) and draft, the reference, the probe's plugin."""
    import tiny_models
    import torch

    workdir = Path(spec["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    family, num_layers, ids = spec["family"], int(spec["num_layers"]), spec.get("layer_ids")
    seed = int(spec.get("seed", 0))
    result["phase"] = "tiny models"
    if family == "deepseek_v4":
        return prepare_dsv4(spec, result, workdir)
    if spec.get("target_dir"):  # a given target (a trained draft's): its own config says its size
        target_dir = Path(spec["target_dir"])
    else:
        target_dir = tiny_models.build_target(family, num_layers, workdir / "target", seed)
    if spec.get("mode") == "prepare" and not (target_dir / "tokenizer.json").exists():
        tiny_models.build_tokenizer(target_dir)
    target_config = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))
    prompts = [list(p) for p in spec["prompt_token_ids"]]
    result["reference"] = "transformers greedy, the target alone (same weights, float32)"
    result["reference_tokens"] = [
        tiny_models.reference_greedy(family, target_dir, p, int(spec["max_tokens"])) for p in prompts
    ]
    states = tiny_models.reference_states(family, target_dir, prompts[0])
    torch.save({"states": states}, workdir / "reference.pt")
    result["target_dir"] = str(target_dir)
    if ids is not None:
        arch = "Eagle3DeepseekV2ForCausalLM" if family == "deepseek_v3" else "LlamaForCausalLMEagle3"
        draft_dir = Path(spec["draft_dir"]) if spec.get("draft_dir") else None
        if draft_dir is None:
            draft_dir = tiny_models.build_draft(target_config, list(ids), workdir / "draft", seed, arch)
        result["draft_dir"] = str(draft_dir)
    result["probe_dir"] = str(install_probe(workdir))
    result["pythonpath"] = os.environ["PYTHONPATH"]


def prepare_dsv4(spec: dict[str, Any], result: dict[str, Any], workdir: Path) -> None:
    """DeepSeek-V4: a config-only target (no transformers class: no reference model), a bf16 Llama draft."""
    import vllm_dsv4

    num_layers, ids = int(spec["num_layers"]), spec.get("layer_ids")
    target_dir = vllm_dsv4.build_target(num_layers, workdir / "target")
    result["reference"] = None  # transformers has no DeepSeek-V4: the engine's own states are the reference
    result["target_dir"] = str(target_dir)
    if ids is not None:
        config = vllm_dsv4.target_config(num_layers)
        result["draft_dir"] = str(vllm_dsv4.build_draft(config, list(ids), workdir / "draft", int(spec.get("seed", 0))))
    result["probe_dir"] = str(install_probe(workdir))
    result["pythonpath"] = os.environ["PYTHONPATH"]


def offline(spec: dict[str, Any], result: dict[str, Any]) -> None:
    """``vllm.LLM`` greedy in this process (its engine core too)."""
    result["phase"] = "engine"
    dsv4 = spec["family"] == "deepseek_v4"
    seed = int(spec.get("seed", 0))
    prompts = [list(p) for p in spec["prompt_token_ids"]]
    if spec.get("norm") == "inplace":
        os.environ["PATCHCRAFT_INPLACE_NORM"] = "1"
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm
    from vllm import LLM, SamplingParams

    result["engine_version"] = vllm.__version__
    result["engine_file"] = vllm.__file__
    kwargs: dict[str, Any] = {
        "model": result["target_dir"],
        "skip_tokenizer_init": True,
        "dtype": "float32",
        "max_model_len": 256,
        "seed": seed,
        "enforce_eager": bool(spec.get("enforce_eager", True)),
        "disable_log_stats": False,
        "max_num_seqs": 4,
        # On the CPU backend this fraction of the host's memory is reserved (vLLM's own words): keep it small.
        "gpu_memory_utilization": float(spec.get("memory_fraction", 0.1)),
    }
    if spec.get("norm") == "inplace":
        kwargs["ir_op_priority"] = {"fused_add_rms_norm": [INPLACE, "native"]}
    if result.get("draft_dir"):
        kwargs["speculative_config"] = speculative_config(spec, result["draft_dir"])
    if dsv4:  # vLLM's Python model code on this CPU: the stand-ins first, then the recorders of its own states
        import vllm_dsv4
        import vllm_dsv4_standins

        result["standins"] = vllm_dsv4_standins.install()
        result["standin_kernels"] = [name for name in result["standins"] if name in vllm_dsv4_standins.KERNELS]
        result["isa"] = isa()
        vllm_dsv4.widen_dummy_init()
        vllm_dsv4.install_recorders()
        kwargs.update(vllm_dsv4.engine_kwargs(int(spec["num_layers"])))
        kwargs["max_num_seqs"] = 2
    params = SamplingParams(temperature=0.0, max_tokens=int(spec["max_tokens"]), ignore_eos=True)
    try:
        llm = LLM(**kwargs)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    finally:  # what the engine computed is kept also when it failed (the draft's fc on too few states)
        if dsv4:
            vllm_dsv4.save_records(Path(spec["workdir"]) / "dsv4-states.pt")
    result["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
    result["spec_metrics"] = spec_metrics(llm)
    result["kernels"] = kernels()
    prefixes = ("vllm.model_executor.models.", "vllm.models.deepseek_v4.") if dsv4 else ("vllm.model_executor.models.",)
    result["model_files"] = {
        name: getattr(module, "__file__", None)
        for name, module in sorted(sys.modules.items())
        if name.startswith(prefixes) and module is not None
    }


def speculative_config(spec: dict[str, Any], draft_dir: str) -> dict[str, Any]:
    return {
        "method": "eagle3",
        "model": draft_dir,
        "num_speculative_tokens": int(spec.get("num_speculative_tokens", 2)),
    }


def match(spec: dict[str, Any], result: dict[str, Any]) -> None:
    """What the probe recorded, wherever the engine ran, against the reference states."""
    import torch

    result["phase"] = "matching"
    workdir = Path(spec["workdir"])
    if spec["family"] == "deepseek_v4":
        return match_dsv4(spec, result, workdir)
    states = torch.load(workdir / "reference.pt")["states"]
    probe_dir = workdir / "probe"
    prompts = [list(p) for p in spec["prompt_token_ids"]]
    if "tokens" in result:
        result["greedy_equal"] = result["tokens"] == result["reference_tokens"]
    calls = sorted(probe_dir.glob("call-*.pt"))
    result["probe_calls"] = len(calls)
    result["probe_pids"] = sorted({int(p.name.split("-")[1]) for p in calls})
    if calls and not result.get("model_files"):
        result["model_files"] = torch.load(calls[0]).get("model_files") or {}
    if spec.get("layer_ids") is not None:
        rows, total = len(prompts[0]), sum(len(p) for p in prompts)
        result["fed"], result["num_fed"] = fed_states(calls, states, rows, total)
        own = engine_states(sorted(probe_dir.glob("layer-*.pt")), states[0], rows, total, int(spec["num_layers"]))
        if own:
            result["reference_gap"] = max(
                float((a[:rows] - b[:rows]).abs().max() / (b[:rows].abs().max() or 1.0)) for a, b in zip(own, states)
            )
            if result["reference_gap"] > 1e-3:  # transformers and the engine compute the target differently
                result["notes"].append(
                    f"transformers' states differ from the engine's own layer outputs by up to "
                    f"{result['reference_gap']:.3f} (relative): entries are matched against the engine's own"
                )
                result["fed_transformers"] = result["fed"]
                result["fed"], _ = fed_states(calls, own, rows, total)


def match_dsv4(spec: dict[str, Any], result: dict[str, Any], workdir: Path) -> None:
    """The draft's input against the engine's own states (no transformers reference exists for DeepSeek-V4)."""
    import torch
    import vllm_dsv4

    prompts = [list(p) for p in spec["prompt_token_ids"]]
    rows, total = len(prompts[0]), sum(len(p) for p in prompts)
    calls = sorted((workdir / "probe").glob("call-*.pt"))
    result["probe_calls"] = len(calls)
    result["probe_pids"] = sorted({int(p.name.split("-")[1]) for p in calls})
    path = workdir / "dsv4-states.pt"
    records = torch.load(path) if path.exists() else []
    states, id0 = vllm_dsv4.engine_states(records, rows, total, int(spec["num_layers"]))
    result["reference"] = "none: transformers has no DeepSeek-V4; the engine's own states instead"
    result["notes"].append(
        "no transformers reference exists for deepseek_v4: each entry is matched against the engine's own recorded "
        "states (the embedding output, hs[0], and each decoder layer's output, hs[k], reduced as the capture "
        "reduces them: .mean(dim=1) over the 4 hc streams), from the same forward as the draft's input"
    )
    result["notes"].append(
        f"weights: vLLM's dummy loader (load_format=dummy, U(-{vllm_dsv4.DUMMY_RANGE}, {vllm_dsv4.DUMMY_RANGE})), "
        "bf16; greedy tokens are not compared (no reference model)"
    )
    result["engine_id0"] = id0
    if id0.get("aux_entries"):
        shared = "one shares" if id0["an_entry_shares_the_embedding"] else "none shares"
        result["notes"].append(
            f"the prefill forward returned {id0['aux_entries']} aux states; {shared} the embedding output's storage"
        )
    if spec.get("layer_ids") is None:
        return
    if not states:
        if not result.get("error"):
            result["error"] = {"type": "NoRecord", "message": "no forward recorded every layer", "phase": "matching"}
            result["error"]["where"] = "the recorders"
        return
    result["distinct"] = vllm_dsv4.check_distinct(states, rows)
    result["notes"] += result["distinct"]
    result["fed"], result["num_fed"] = fed_states(calls, states, rows, total)


def isa() -> dict[str, Any]:
    """Which vLLM kernel library this CPU loads, and why (what the stand-ins replace)."""
    import sys as _sys

    import torch

    return {
        "amx": bool(torch.cpu._is_amx_tile_supported()),
        "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
        "libraries": sorted(m for m in _sys.modules if m.startswith("vllm._C")),
    }


def fed_states(calls: list[Path], states: list[Any], rows: int, total: int) -> tuple[list[dict[str, Any]], int]:
    """The first probe call that holds the whole first prompt (its prefill: at least its rows, at most every
    prompt's; the engine's warm-up batches are larger), matched state by state."""
    import tiny_models
    import torch

    for path in calls:
        record = torch.load(path)
        tensor = record["tensor"]
        if rows <= tensor.shape[0] <= total:
            hidden = states[0].shape[-1]
            return tiny_models.match_states(tensor, states, rows), tensor.shape[-1] // hidden
    return [], 0


def engine_states(records: list[Path], embedding: Any, rows: int, total: int, num_layers: int) -> list[Any]:
    """``[hs[0], ..., hs[L]]`` as the engine computed them: the first L target-layer records of a batch holding the
    first prompt (its prefill), each layer's ``hidden_states + residual``; hs[0] is transformers' embedding (the
    embedding is one lookup, matched exactly in every run). [] when fewer than L such records were made."""
    import torch

    streams = []
    for path in records:
        record = torch.load(path)
        if rows <= record["stream"].shape[0] <= total:
            streams.append(record["stream"])
        if len(streams) == num_layers:
            return [embedding, *streams]
    return []


def spec_metrics(llm: Any) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    try:
        for metric in llm.get_metrics():
            name = getattr(metric, "name", "")
            if name.startswith("vllm:spec_decode"):
                value = getattr(metric, "value", None)
                if value is None:
                    value = getattr(metric, "values", None)
                metrics[name.split(":", 1)[1]] = value
    except Exception as exc:  # metrics are a report, not the check
        metrics["error"] = f"{type(exc).__name__}: {exc}"
    drafts = metrics.get("spec_decode_num_drafts")
    accepted = metrics.get("spec_decode_num_accepted_tokens")
    if isinstance(drafts, (int, float)) and drafts and isinstance(accepted, (int, float)):
        metrics["mean_accept_length"] = round(1 + accepted / drafts, 3)
    return metrics


def kernels() -> dict[str, Any]:
    try:
        from vllm import ir

        return {name: getattr(ir.ops, name).get_priority() for name in ("rms_norm", "fused_add_rms_norm")}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
