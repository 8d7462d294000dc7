"""Run the real SGLang engine on this CPU: ``VENV/bin/python sglang_run.py SPEC.json RESULT.json``.

Runs with the engine environment's Python (patchcraft is not installed
there): stdlib, torch, transformers, safetensors, sglang and the files beside
this one. RESULT.json is always written, also when the spec is bad or the
engine fails (``ok: false`` with an ``error``); the exit status is 0 when it
was written.

Three processes: this one writes the tiny target and draft and computes
transformers' answers (the target's own ``hs[0..L]`` and greedy tokens); a
driver (this script again, ``--drive``) runs ``sglang.Engine`` offline, with
patchcraft's stand-ins and fixes installed (sglang_runtime.py), bounded by
``timeout_s``; SGLang's scheduler, spawned by the driver, imports this
script as ``__mp_main__`` and so installs the same (the last lines). The
probe at ``ModelRunner.forward`` records what the target handed the EAGLE-3
draft; this process matches each third of it against ``hs[0..L]``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

#: Relative max-abs tolerance for a third of the aux tensor to be called hs[k] (fp32 engine, fp32 reference).
TOLERANCE = 1e-4
DEFAULT_TIMEOUT_S = 900


class SpecError(ValueError):
    pass


def read_spec(path: str) -> dict[str, Any]:
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: cannot read the spec ({exc})") from None
    if not isinstance(spec, dict):
        raise SpecError(f"{path}: the spec is not a JSON object")
    if spec.get("engine", "sglang") != "sglang":
        raise SpecError(f"engine {spec.get('engine')!r}: this script runs sglang")
    family = spec.get("family")
    if family not in ("llama", "deepseek_v3"):
        raise SpecError(f"family {family!r}: expected 'llama' or 'deepseek_v3'")
    num_layers = spec.get("num_layers", 3 if family == "deepseek_v3" else 4)
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or not 2 <= num_layers <= 16:
        raise SpecError(f"num_layers {num_layers!r}: expected an int from 2 to 16")
    ids = spec.get("layer_ids")
    if ids is not None:
        if (
            not isinstance(ids, list)
            or len(ids) != 3
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        ):
            raise SpecError(f"layer_ids {ids!r}: expected three ints or null")
        if not all(-1 <= i < num_layers for i in ids):
            raise SpecError(f"layer_ids {ids}: each must be from -1 to {num_layers - 1}")
    prompts = spec.get("prompt_token_ids")
    if (
        not isinstance(prompts, list)
        or not prompts
        or not all(isinstance(p, list) and p and all(isinstance(t, int) and 0 <= t < 1024 for t in p) for p in prompts)
    ):
        raise SpecError("prompt_token_ids: expected a non-empty list of non-empty lists of token ids below 1024")
    max_tokens = spec.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or not 1 <= max_tokens <= 256:
        raise SpecError(f"max_tokens {max_tokens!r}: expected an int from 1 to 256")
    workdir = spec.get("workdir")
    if not isinstance(workdir, str) or not workdir:
        raise SpecError("workdir: expected a folder path")
    for key in ("draft_dir", "target_dir"):
        value = spec.get(key)
        if value is not None and not (isinstance(value, str) and (Path(value) / "config.json").is_file()):
            raise SpecError(f"{key} {value!r}: not a model folder with a config.json")
    tree = spec.get("tree_kernels", "torch")
    if tree not in ("torch", "triton"):
        raise SpecError(f"tree_kernels {tree!r}: expected 'torch' or 'triton'")
    return {
        "family": family,
        "num_layers": num_layers,
        "layer_ids": ids,
        "workdir": workdir,
        "prompt_token_ids": prompts,
        "max_tokens": max_tokens,
        "seed": int(spec.get("seed", 0)),
        "draft_dir": spec.get("draft_dir"),
        "target_dir": spec.get("target_dir"),
        "tree_kernels": tree,
        "timeout_s": int(spec.get("timeout_s", DEFAULT_TIMEOUT_S)),
        "speculative": spec.get("speculative") or {"num_steps": 1, "topk": 1, "num_draft_tokens": 2},
    }


def sglang_identity() -> tuple[Optional[str], Optional[str]]:
    """(version, path of sglang/__init__.py) without importing sglang (it is heavy)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.origin:
        return None, None
    for name in ("_version.py", "version.py"):
        try:
            lines = (Path(spec.origin).parent / name).read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith(("__version__ =", "version =", "__version__: str =")):
                value = line.split("=", 1)[1].strip().strip("\"'")
                if value and value[0].isdigit():
                    return value, spec.origin
    try:
        import importlib.metadata

        return importlib.metadata.version("sglang"), spec.origin
    except Exception:
        return None, spec.origin


# ---- the driver: the engine itself ---------------------------------------------------------


def engine_kwargs(job: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model_path": job["target"],
        "skip_tokenizer_init": True,
        "device": "cpu",
        "dtype": "float32",
        "attention_backend": "torch_native",
        "disable_cuda_graph": True,
        "disable_radix_cache": True,
        "max_running_requests": 1,
        "max_total_tokens": 4096,
        "context_length": 1024,
        # The CPU's "device memory" is the machine's, shared with every other process: a small fraction fails
        # SGLang's check that the weights leave room (kv_cache_configurator.py) when others use memory;
        # max_total_tokens caps what the KV pool really takes.
        "mem_fraction_static": 0.8,
        "random_seed": job["seed"],
        "log_level": "error",
    }
    if job.get("draft"):
        spec = job["speculative"]
        kwargs.update(
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=job["draft"],
            speculative_num_steps=spec["num_steps"],
            speculative_eagle_topk=spec["topk"],
            speculative_num_draft_tokens=spec["num_draft_tokens"],
        )
    return kwargs


def drive(job_path: str) -> int:
    """In the driver process: run the engine, write the job's output file."""
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    out: dict[str, Any] = {"ok": False}
    try:
        import sglang_runtime

        runtime = sglang_runtime.install()
        out["kernels"], out["notes"] = runtime["kernels"], runtime["notes"]
        import sglang

        out["engine_version"], out["engine_file"] = getattr(sglang, "__version__", None), sglang.__file__
        Path(job["out"]).write_text(json.dumps(out), encoding="utf-8")  # what ran, should SGLang end this process
        kwargs = engine_kwargs(job)
        out["engine_kwargs"] = kwargs
        started = time.monotonic()
        engine = sglang.Engine(**kwargs)
        out["init_s"] = round(time.monotonic() - started, 2)
        try:
            tokens, metas = [], []
            started = time.monotonic()
            for prompt in job["prompts"]:
                result = engine.generate(
                    input_ids=prompt,
                    sampling_params={"temperature": 0.0, "max_new_tokens": job["max_tokens"], "ignore_eos": True},
                )
                tokens.append(list(result["output_ids"]))
                metas.append({k: v for k, v in result.get("meta_info", {}).items() if _jsonable(v)})
            out["generate_s"] = round(time.monotonic() - started, 2)
            out["tokens"], out["meta_info"] = tokens, metas
            try:
                info = engine.get_server_info()
                found = [info] + [s for s in info.get("internal_states") or [] if isinstance(s, dict)]
                out["server_spec"] = {
                    k: v for state in found for k, v in state.items() if k.startswith("avg_spec") and _jsonable(v)
                }
            except Exception as exc:  # the metrics are a report, never the run
                out["server_spec"] = {"error": repr(exc)}
        finally:
            engine.shutdown()
        out["ok"] = True
    except BaseException as exc:  # the driver reports, the parent decides
        import sglang_runtime

        out["error"] = sglang_runtime.error_record(exc)
    Path(job["out"]).write_text(json.dumps(out), encoding="utf-8")
    return 0


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


# ---- the run: models, references, the driver, the comparison --------------------------------


def run(spec: dict[str, Any], started: float) -> dict[str, Any]:
    import torch

    import sglang_models

    work = Path(spec["workdir"])
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"notes": []}
    target = Path(spec["target_dir"]) if spec["target_dir"] else work / f"target-{spec['family']}"
    if not spec["target_dir"]:
        sglang_models.build_target(spec["family"], spec["num_layers"], target, spec["seed"])
    draft: Optional[Path] = None
    if spec["layer_ids"] is not None or spec["draft_dir"]:
        if spec["draft_dir"]:
            draft = Path(spec["draft_dir"])
        else:
            draft = work / ("draft-" + "_".join(str(i) for i in spec["layer_ids"]))
            sglang_models.build_draft(target, spec["layer_ids"], draft, spec["seed"] + 1)
    result["target"], result["draft"] = str(target), str(draft) if draft else None

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    model = sglang_models.reference_model(spec["family"], target)
    references = [sglang_models.hidden_states(model, p) for p in spec["prompt_token_ids"]]
    result["reference_tokens"] = [sglang_models.greedy(model, p, spec["max_tokens"]) for p in spec["prompt_token_ids"]]
    result["reference"] = "transformers greedy, fp32, the same weights (no cache, full forward per token)"
    del model

    probe_dir = work / "probe"
    if probe_dir.exists():
        for old in probe_dir.iterdir():
            old.unlink()
    probe_dir.mkdir(exist_ok=True)
    error_file, job_out = work / "engine-errors.jsonl", work / "engine-out.json"
    for path in (error_file, job_out):
        if path.exists():
            path.unlink()
    job = {
        "target": str(target),
        "draft": str(draft) if draft else None,
        "prompts": spec["prompt_token_ids"],
        "max_tokens": spec["max_tokens"],
        "seed": spec["seed"],
        "speculative": spec["speculative"],
        "out": str(job_out),
    }
    job_path = work / "engine-job.json"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    env = dict(os.environ)
    env.update(
        {
            "PATCHCRAFT_SGLANG_ROLE": "driver",
            "PATCHCRAFT_SGLANG_ERROR_FILE": str(error_file),
            "PATCHCRAFT_SGLANG_TREE_KERNELS": spec["tree_kernels"],
            "PATCHCRAFT_SMOKE_PROBE_DIR": str(probe_dir) if draft else "",
            "SGLANG_USE_CPU_ENGINE": "1",
            "TRITON_INTERPRET": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    log_path = work / "engine.log"
    engine_started = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--drive", str(job_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=spec["timeout_s"])
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        _stop_group(proc)
    result["engine_s"] = round(time.monotonic() - engine_started, 2)
    result["log"] = str(log_path)
    driver: dict[str, Any] = {}
    try:
        driver = json.loads(job_out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    for key in ("engine_version", "engine_file", "kernels", "init_s", "generate_s", "engine_kwargs"):
        if key in driver:
            result[key] = driver[key]
    result["notes"].extend(driver.get("notes", []))
    errors = _read_errors(error_file)
    if timed_out:
        result["error"] = {
            "type": "TimeoutError",
            "message": f"the engine ran past {spec['timeout_s']} s (log: {log_path})",
            "file": None,
            "line": None,
            "where": "the engine driver, stopped with its process group",
        }
    elif errors:
        result["error"] = errors[0]  # the scheduler's own exception: the first thing that stopped it
    elif not driver.get("ok"):
        result["error"] = driver.get("error") or {
            "type": "RuntimeError",
            "message": f"the engine driver exited {proc.returncode} without a result (log: {log_path})",
            "file": None,
            "line": None,
            "where": "the engine driver",
        }
    if "error" in result:
        result["ok"] = False
        return result

    result["tokens"] = driver["tokens"]
    result["greedy_equal"] = result["tokens"] == result["reference_tokens"]
    metas = driver.get("meta_info", [])
    if draft is not None:
        result["spec_metrics"] = _spec_metrics(metas, driver.get("server_spec", {}))
        records = _prefill_records(probe_dir, spec["prompt_token_ids"])
        fed = []
        for prompt, hs in zip(spec["prompt_token_ids"], references):
            record = records.get(tuple(prompt))
            if record is None:
                continue
            fed = _match(record, hs)
            break
        result["fed"] = fed
        result["num_fed"] = len(fed)
        if not fed:
            result["notes"].append("no prefill record of the first prompt's aux hidden states was found")
    result["ok"] = True
    return result


def _stop_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            continue
        time.sleep(0.5)


def _read_errors(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _spec_metrics(metas: list[dict[str, Any]], server: dict[str, Any]) -> dict[str, Any]:
    keys = ("spec_accept_length", "spec_accept_rate", "spec_verify_ct", "spec_num_correct_drafts", "completion_tokens")
    per_request = [{k: m[k] for k in keys if k in m} for m in metas]
    verify = sum(m.get("spec_verify_ct", 0) for m in metas)
    completion = sum(m.get("completion_tokens", 0) for m in metas)
    metrics: dict[str, Any] = {
        "accept_length": round(completion / verify, 4) if verify else None,
        "per_request": per_request,
        "source": "SGLang's meta_info (completion_tokens / spec_verify_ct, summed over the prompts)",
    }
    metrics.update({f"server_{k}": v for k, v in server.items()})
    return metrics


def _prefill_records(probe_dir: Path, prompts: list[list[int]]) -> dict[tuple[int, ...], Any]:
    import torch

    wanted = {tuple(p) for p in prompts}
    found: dict[tuple[int, ...], Any] = {}
    for path in sorted(probe_dir.glob("rec-*.pt")):
        try:
            record = torch.load(str(path), weights_only=False)
        except Exception:
            continue
        ids = tuple(int(t) for t in record["input_ids"].tolist())
        if ids in wanted and ids not in found and "EXTEND" in str(record.get("mode", "")):
            found[ids] = record
    return found


def _match(record: dict[str, Any], hs: list[Any]) -> list[dict[str, Any]]:
    """Per third of the aux tensor: the hs[k] it is (within TOLERANCE, relative), and the closest other."""
    aux = record["hidden_states"].float()
    width = hs[0].shape[-1]
    count = aux.shape[-1] // width
    fed = []
    for slot in range(count):
        chunk = aux[:, slot * width : (slot + 1) * width]
        diffs = []
        for k, state in enumerate(hs):
            if state.shape != chunk.shape:
                diffs.append(float("inf"))
                continue
            diffs.append(float((chunk - state).abs().max()))
        scales = [float(state.abs().max()) or 1.0 for state in hs]
        order = sorted(range(len(hs)), key=lambda k: diffs[k] / scales[k])
        best = order[0]
        state = f"hs[{best}]" if diffs[best] <= TOLERANCE * scales[best] else None
        other = order[1] if state is not None else best
        fed.append(
            {
                "slot": slot,
                "state": state,
                "max_abs_diff": diffs[best] if state else None,
                "best_other": f"hs[{other}]",
                "best_other_diff": diffs[other],
            }
        )
    return fed


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--drive":
        return drive(argv[2])
    if len(argv) != 3:
        print("usage: sglang_run.py SPEC.json RESULT.json", file=sys.stderr)
        return 2
    started = time.monotonic()
    version, origin = sglang_identity()
    result: dict[str, Any] = {
        "ok": False,
        "error": None,
        "engine": "sglang",
        "engine_version": version,
        "engine_file": origin,
        "platform": "cpu",
        "kernels": {},
        "notes": [],
    }
    try:
        spec = read_spec(argv[1])
        result["spec"] = spec
        result.update(run(spec, started))
    except SpecError as exc:
        result["error"] = {"type": "SpecError", "message": str(exc), "file": None, "line": None, "where": "the spec"}
    except Exception as exc:
        result["error"] = {
            "type": type(exc).__name__,
            "message": str(exc)[:2000],
            "file": None,
            "line": None,
            "where": "patchcraft's run script (before or after the engine)",
            "traceback": traceback.format_exc()[-4000:],
        }
    result["wall_s"] = round(time.monotonic() - started, 2)
    try:
        Path(argv[2]).write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"sglang_run.py: cannot write {argv[2]}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
elif __name__ == "__mp_main__":
    # A process SGLang spawned from the driver: the same stand-ins and fixes before it unpickles its target.
    import sglang_runtime

    sglang_runtime.install()
