"""``patchcraft smoke --device cuda``: a real-SGLang EAGLE-3 smoke run.

Flow of :func:`run_cuda_smoke`:

1. environment checks (torch + CUDA + enough GPUs, an importable-looking
   sglang whose ``ServerArgs`` accepts our engine kwargs) -> exit 2 on failure;
2. build a tiny DeepSeek-V3 target and/or a random EAGLE-3 draft when not given;
3. copy the installed sglang package to a temporary directory and add a
   recording probe to the *copy* (the installation is never written to);
4. run ``sglang.Engine`` twice in child processes, greedy, decode CUDA graphs
   on (the prefill-side piecewise graph off in both): with EAGLE-3 (probed
   copy) and without speculation (plain install, top-2 logprobs returned);
   each run is bounded by ``timeout_s`` (default 200 s, so the whole smoke
   fits a 10-minute window);
5. compare the recorded aux hidden states (prefill and verify/graph-replay
   batches) with the reference ``[hs[0], hs[a+1], hs[b+1]]``, the token ids of
   both runs up to each prompt's first near tie in the baseline, and
   summarise accept length and throughput.

With ``out_dir``, ``spec.log``, ``base.log`` (the engines' full output), their
results (``spec.json``, ``base.json``) and ``summary.json`` are written there.

Exit codes: 0 pass, 1 a check failed, 2 environment error.  torch, sglang
and transformers are imported lazily, so this module imports anywhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO, Tuple

from . import compare as cmp
from .engine_args import (
    allreduce_fusion_note,
    baseline_generate_kwargs,
    build_engine_kwargs,
    check_engine_kwargs,
    greedy_sampling_params,
    server_args_fields,
)
from .wheels import source_reader

EXIT_PASS, EXIT_FAIL, EXIT_ENV = 0, 1, 2
PROJECT_ROOT = Path(__file__).resolve().parents[2]
HF_REFERENCE_MAX_BYTES = 4 << 30  # larger targets get the embedding-only reference
# Per engine run (start, graph capture, 4 prompts, shutdown): two runs plus the
# checkpoint and the reference fit a 10-minute window.
DEFAULT_ENGINE_TIMEOUT_S = 200.0
SUMMARY_NAME = "summary.json"


class EnvironmentProblem(RuntimeError):
    """Something outside patchcraft is missing (exit code 2)."""


# --------------------------------------------------------------------------
# small pure helpers (CPU-tested)
# --------------------------------------------------------------------------

def parse_layer_ids(text: Optional[str]) -> Optional[List[int]]:
    """``"-1,2,30"`` (or ``"[-1, 2, 30]"``) -> ``[-1, 2, 30]``; None/"" -> None."""
    if text is None or not str(text).strip():
        return None
    raw = str(text).strip().strip("[]")
    try:
        ids = [int(p) for p in raw.replace(" ", "").split(",") if p != ""]
    except ValueError:
        raise ValueError(f"layer ids must be integers separated by commas, got {text!r}") from None
    cmp.expected_hs_indices(ids)  # validates
    return ids


def default_layer_ids(num_layers: int) -> List[int]:
    """``[-1, 1, n // 2]``: embedding plus two layers.

    The first non-negative id is 1, so SGLang's +1 setters and the
    "first id == 1" heuristic of newer deepseek_v2 setters agree on it.
    """
    if num_layers < 3:
        raise ValueError("the smoke target needs at least 3 layers")
    return [-1, 1, max(2, num_layers // 2)]


def make_prompts(vocab_size: int, *, lengths: Sequence[int] = (7, 16, 29, 48), seed: int = 0) -> List[List[int]]:
    """Deterministic token-id prompts, away from the usual special ids."""
    lo, hi = (2, vocab_size) if vocab_size <= 4096 else (1000, min(vocab_size, 100_000))
    rng = random.Random(seed)
    return [[rng.randrange(lo, hi) for _ in range(n)] for n in lengths]


@dataclass
class RecordItem:
    phase: str  # "prefill" or "verify"
    prompt: int
    sequence: List[int]  # token ids whose causal forward gives the reference
    positions: List[int]  # rows of the reference that were recorded
    hidden_states: Any  # [len(positions), n_aux * H]


@dataclass
class Assignment:
    items: List[RecordItem] = field(default_factory=list)
    skipped: Dict[str, int] = field(default_factory=dict)

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def assign_records(records: Sequence[Dict[str, Any]], prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> Assignment:
    """Attach probe records to prompts and to the token sequence they ran on.

    Prompts run one at a time, so records are chronological per request: a
    prefill (``EXTEND``) whose input ids equal prompt *i* opens request *i*;
    the ``TARGET_VERIFY`` records after it verify a chain ``[last token,
    d1, d2, ...]`` at consecutive positions ``p, p+1, ...`` on top of
    ``(prompt + output)[:p]``.
    """
    res = Assignment()
    index = {tuple(p): i for i, p in enumerate(prompts)}
    current: Optional[int] = None
    for rec in sorted(records, key=lambda r: (r.get("pid", 0), r["seq"])):
        mode = str(rec.get("mode", "")).upper()
        ids = [int(x) for x in rec["input_ids"]]
        pos = [int(x) for x in rec["positions"]]
        hs = rec["hidden_states"]
        bs = int(rec.get("batch_size", 1))
        if bs not in (1, -1):
            res.skip(f"batch size {bs}")
            continue
        if hs.shape[0] != len(ids) or len(pos) != len(ids):
            res.skip(f"{mode}: rows != tokens")
            continue
        if "VERIFY" in mode:
            if current is None:
                res.skip("verify before any known prefill")
                continue
            full = list(prompts[current]) + list(outputs[current])
            p0 = pos[0] if pos else 0
            if pos != list(range(p0, p0 + len(ids))):
                res.skip("verify: positions not a chain (topk > 1?)")
                continue
            if p0 >= len(full) or full[p0] != ids[0]:
                res.skip("verify: beyond the returned output")
                continue
            res.items.append(RecordItem("verify", current, full[:p0] + ids, pos, hs))
        elif "EXTEND" in mode or "MIXED" in mode:
            key = tuple(ids)
            if key in index and pos == list(range(len(ids))):
                current = index[key]
                res.items.append(RecordItem("prefill", current, list(ids), pos, hs))
            else:
                res.skip(f"{mode}: not a smoke prompt")
        else:
            res.skip(f"mode {mode}")
    return res


def compare_items(
    items: Sequence[RecordItem],
    layer_ids: Sequence[int],
    reference: Callable[[List[int]], List[Any]],
    **tol: Any,
) -> Dict[str, cmp.AuxComparison]:
    """Per phase, concatenate all recorded rows and compare with the reference."""
    import torch

    cache: Dict[Tuple[int, ...], List[Any]] = {}
    by_phase: Dict[str, Tuple[List[Any], List[List[Any]]]] = {}
    for it in items:
        key = tuple(it.sequence)
        if key not in cache:
            cache[key] = reference(list(it.sequence))
        hs = cache[key]
        rec_rows, ref_rows = by_phase.setdefault(it.phase, ([], [[] for _ in hs]))
        rec_rows.append(torch.as_tensor(it.hidden_states).float())
        for k, h in enumerate(hs):
            ref_rows[k].append(h[it.positions])
    out: Dict[str, cmp.AuxComparison] = {}
    for phase, (rec_rows, ref_rows) in by_phase.items():
        out[phase] = cmp.compare_aux_hidden_states(
            torch.cat(rec_rows), [torch.cat(r) for r in ref_rows], layer_ids, **tol
        )
    return out


def compare_items_embedding_only(items: Sequence[RecordItem], layer_ids: Sequence[int], embed_rows: Callable[[List[int]], Any]) -> Dict[str, cmp.AuxComparison]:
    """For big targets: only the ``-1`` entry is checked (against the embedding table)."""
    import torch

    if -1 not in layer_ids:
        return {}
    j = list(layer_ids).index(-1)
    out: Dict[str, cmp.AuxComparison] = {}
    phases: Dict[str, Tuple[List[Any], List[int]]] = {}
    for it in items:
        rec, ids = phases.setdefault(it.phase, ([], []))
        rec.append(torch.as_tensor(it.hidden_states).float().chunk(len(layer_ids), dim=-1)[j])
        ids += [it.sequence[p] for p in it.positions]
    for phase, (rec, ids) in phases.items():
        out[phase] = cmp.compare_aux_hidden_states([torch.cat(rec)], [embed_rows(ids)], [-1], token_rtol=1e-2, min_good_fraction=1.0)
    return out


def render_text(summary: Dict[str, Any]) -> str:
    if summary.get("error"):
        return f"patchcraft smoke: environment error: {summary['error']}"
    lines = [f"patchcraft smoke (cuda, tp={summary.get('tp')}): {'PASS' if summary['ok'] else 'FAIL'}"]
    lines.append(f"  target     {summary.get('target')}")
    lines.append(f"  draft      {summary.get('draft')}")
    lines.append(f"  layer ids  {summary.get('layer_ids')} -> {summary.get('expected')}  (reference: {summary.get('reference')})")
    if summary.get("sglang"):
        lines.append(f"  sglang     {summary['sglang'].get('version')} ({summary['sglang'].get('file')})")
    eng = summary.get("engine") or {}
    if eng.get("allreduce_fusion"):
        lines.append(f"  allreduce  FlashInfer allreduce fusion: {eng['allreduce_fusion']}")
    for c in summary.get("checks", []):
        lines.append(f"  [{'ok' if c['ok'] else 'FAIL'}]{' ' if c['ok'] else ''} {c['name']}: {c['message']}")
    for line in (summary.get("lossless") or {}).get("info", []):
        lines.append(f"  info   {line}")
    sp = summary.get("speed") or {}
    spec, base = sp.get("speculative") or {}, sp.get("baseline") or {}
    if spec:
        lines.append(
            f"  info   accept length {spec.get('accept_length')}, {spec.get('tokens_per_s')} tok/s "
            f"(baseline {base.get('tokens_per_s')} tok/s, batch 1)"
        )
    if summary.get("work_dir"):
        lines.append(f"  files  {summary['work_dir']}")
    if summary.get("out_dir"):
        lines.append(f"  out    {summary['out_dir']}")
    return "\n".join(lines)


def build_summary(
    *,
    tp: int,
    target: str,
    draft: str,
    layer_ids: Sequence[int],
    reference: str,
    aux: Dict[str, cmp.AuxComparison],
    assignment: Assignment,
    lossless: cmp.LosslessResult,
    spec_run: Dict[str, Any],
    base_run: Dict[str, Any],
    engine: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    checks = []
    for phase, label in (("prefill", "aux hidden states, prefill"), ("verify", "aux hidden states, verify (CUDA graph replay)")):
        c = aux.get(phase)
        if c is None:
            checks.append({"name": label, "ok": False, "message": "no batch of this kind was recorded"})
        else:
            checks.append({"name": f"{label}, {c.num_tokens} tokens", "ok": c.ok, "message": c.message})
    checks.append({"name": "lossless greedy output", "ok": lossless.ok, "message": lossless.message})
    spec_speed = cmp.summarize_speculation(spec_run.get("meta_info", []), spec_run.get("elapsed_s", 0.0))
    base_speed = cmp.summarize_speculation(base_run.get("meta_info", []), base_run.get("elapsed_s", 0.0))
    ok = all(c["ok"] for c in checks)
    return {
        "ok": ok,
        "exit_code": EXIT_PASS if ok else EXIT_FAIL,
        "tp": tp,
        "target": target,
        "draft": draft,
        "layer_ids": list(layer_ids),
        "expected": [f"hs[{k}]" for k in cmp.expected_hs_indices(layer_ids)],
        "reference": reference,
        "sglang": {"version": spec_run.get("sglang_version"), "file": base_run.get("sglang_file")},
        "checks": checks,
        "aux": {k: v.to_dict() for k, v in aux.items()},
        "records": {"used": len(assignment.items), "skipped": assignment.skipped},
        "lossless": lossless.to_dict(),
        "speed": {"speculative": spec_speed, "baseline": base_speed},
        "engine": engine or {},
    }


def emit(summary: Dict[str, Any], output_format: str, stream: TextIO) -> None:
    if output_format == "json":
        stream.write(json.dumps(summary, indent=2, default=str) + "\n")
    else:
        stream.write(render_text(summary) + "\n")
    stream.flush()


# --------------------------------------------------------------------------
# GPU path
# --------------------------------------------------------------------------

def _read_json(p: Path) -> Dict[str, Any]:
    return json.loads(p.read_text())


def _sglang_pkg_dir() -> Path:
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentProblem("sglang is not installed (pip install sglang; then patchcraft apply)")
    return Path(list(spec.submodule_search_locations)[0])


def _check_cuda(tp: Optional[int]) -> int:
    try:
        import torch
    except ImportError:
        raise EnvironmentProblem("torch is not importable (pip install torch, a CUDA build)") from None
    if not torch.cuda.is_available():
        raise EnvironmentProblem("CUDA is not available (torch.cuda.is_available() is False)")
    n = torch.cuda.device_count()
    tp = n if tp is None else int(tp)
    if tp < 1 or tp > n:
        raise EnvironmentProblem(f"--tp {tp} needs {tp} GPUs, {n} visible")
    return tp


def _safetensors_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))


def _embedding_rows_loader(model_dir: Path) -> Callable[[List[int]], Any]:
    """Read only the needed rows of the target's embedding table."""
    import torch
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index)["weight_map"]
    else:
        weight_map = {}
        for f in model_dir.glob("*.safetensors"):
            with safe_open(str(f), "pt") as h:
                weight_map.update({k: f.name for k in h.keys()})
    keys = sorted((k for k in weight_map if k.endswith("embed_tokens.weight") and "mtp" not in k), key=len)
    if not keys:
        raise EnvironmentProblem(f"no embed_tokens.weight in {model_dir}")
    key = keys[0]
    path = model_dir / weight_map[key]

    def rows(ids: List[int]) -> Any:
        with safe_open(str(path), "pt") as h:
            sl = h.get_slice(key)
            return torch.cat([sl[i : i + 1] for i in ids]).float()

    return rows


def _kill_group(proc: "subprocess.Popen[bytes]") -> None:
    """Stop the worker and everything it started (SGLang's scheduler and
    detokenizer processes hold the GPUs): TERM the process group, then KILL."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _run_worker(job: Dict[str, Any], job_path: Path, env: Dict[str, str], timeout_s: float, log_path: Path) -> Dict[str, Any]:
    """One engine run in its own session; past ``timeout_s`` the whole group is stopped."""
    job_path.write_text(json.dumps(job))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "patchcraft.gpu_smoke.worker", str(job_path)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise RuntimeError(f"sglang engine run timed out after {timeout_s:.0f}s (log: {log_path})") from None
        except BaseException:
            _kill_group(proc)
            raise
        _kill_group(proc)  # leftovers of a worker that exited (its children)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"sglang engine run failed (exit {proc.returncode}, log: {log_path}): " + " | ".join(tail))
    return _read_json(Path(job["out"]))


def _load_records(probe_dir: Path) -> List[Dict[str, Any]]:
    import torch

    return [torch.load(str(p), map_location="cpu", weights_only=False) for p in sorted(probe_dir.glob("rec-*.pt"))]


def run_cuda_smoke(
    tp: Optional[int] = None,
    model_path: Optional[str] = None,
    draft_path: Optional[str] = None,
    layer_ids: Optional[Sequence[int]] = None,
    output_format: str = "text",
    *,
    max_new_tokens: int = 24,
    timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S,
    work_dir: Optional[str] = None,
    out_dir: Optional[str] = None,
    keep_work_dir: bool = False,
    mem_fraction_static: Optional[float] = None,
    stream: Optional[TextIO] = None,
) -> int:
    """Run the CUDA smoke test; print a summary; return 0 pass / 1 fail / 2 env error.

    ``tp``: tensor-parallel size, default all visible GPUs.  ``model_path``:
    target checkpoint dir (default: a tiny random DeepSeek-V3 is built).
    ``draft_path``: EAGLE-3 draft dir (default: a random one matching the
    target and ``layer_ids``).  ``layer_ids``: aux ids; taken from the draft
    config when a draft is given (must agree if both), default
    ``[-1, 1, n // 2]``.  ``output_format``: ``"text"`` or ``"json"``.
    ``mem_fraction_static``: default 0.3 for small targets, 0.85 for real
    ones (SGLang's fraction covers the weights too).  ``timeout_s``: limit
    per engine run.  ``out_dir``: where ``spec.log``, ``base.log``, the run
    results and ``summary.json`` go (default: the work directory, logs only).
    """
    stream = stream or sys.stdout
    if output_format not in ("text", "json"):
        raise ValueError("output_format must be 'text' or 'json'")
    tmp_root: Optional[Path] = None
    probed_root: Optional[Path] = None
    out: Optional[Path] = Path(out_dir) if out_dir else None

    def finish(summary: Dict[str, Any]) -> int:
        if out is not None:
            summary["out_dir"] = str(out)
            try:
                out.mkdir(parents=True, exist_ok=True)
                (out / SUMMARY_NAME).write_text(json.dumps(summary, indent=2, default=str) + "\n")
            except OSError as e:  # the summary still goes to the stream
                summary["out_dir_error"] = f"{type(e).__name__}: {e}"
        emit(summary, output_format, stream)
        return summary["exit_code"]

    try:
        if out is not None:
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise EnvironmentProblem(f"--out {out}: {type(e).__name__}: {e}") from None
        tp = _check_cuda(tp)
        pkg_dir = _sglang_pkg_dir()
        read = source_reader(pkg_dir)
        fields = server_args_fields(read)
        for mod in ("safetensors",):
            if importlib.util.find_spec(mod) is None:
                raise EnvironmentProblem(f"{mod} is not installed (pip install -e '.[smoke]')")

        tmp_root = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="patchcraft-smoke-"))
        tmp_root.mkdir(parents=True, exist_ok=True)
        logs = out if out is not None else tmp_root

        from .checkpoint import make_tiny_deepseek_v3, read_config
        from .draft import draft_layer_ids, make_tiny_eagle3_draft

        if model_path is None:
            target = make_tiny_deepseek_v3(tmp_root / "target", tp_size=tp)
        else:
            target = Path(model_path)
            if not (target / "config.json").is_file():
                raise EnvironmentProblem(f"{target} has no config.json (a local checkpoint dir is required)")
        tcfg = read_config(target)
        text_cfg = tcfg.get("text_config") or tcfg
        n_layers = int(text_cfg["num_hidden_layers"])

        if draft_path is not None:
            draft = Path(draft_path)
            ids = draft_layer_ids(draft)
            if layer_ids is not None and list(layer_ids) != ids:
                raise EnvironmentProblem(f"--layer-ids {list(layer_ids)} disagree with the draft's eagle_config {ids}")
        else:
            ids = list(layer_ids) if layer_ids is not None else default_layer_ids(n_layers)
            draft = make_tiny_eagle3_draft(tmp_root / "draft", tcfg, ids, tp_size=tp)
        cmp.expected_hs_indices(ids)

        trust = bool(tcfg.get("auto_map"))
        if mem_fraction_static is None:
            mem_fraction_static = 0.3 if _safetensors_bytes(target) < (8 << 30) else 0.85
        common = dict(tp_size=tp, trust_remote_code=trust, fields=fields, mem_fraction_static=mem_fraction_static)
        spec_kw = build_engine_kwargs(str(target), str(draft), **common)
        base_kw = build_engine_kwargs(str(target), None, speculative=False, **common)
        problems = check_engine_kwargs(spec_kw, read)
        problems += [p for p in check_engine_kwargs(base_kw, read) if p not in problems]
        if problems:
            raise EnvironmentProblem(f"installed sglang ({pkg_dir}) does not accept the smoke settings: " + "; ".join(problems))

        # reference: full HF forward for small DeepSeek-V3 checkpoints, else embedding rows
        use_hf = (
            tcfg.get("model_type") == "deepseek_v3"
            and "quantization_config" not in tcfg
            and _safetensors_bytes(target) <= HF_REFERENCE_MAX_BYTES
        )
        if use_hf and importlib.util.find_spec("transformers") is None:
            raise EnvironmentProblem("transformers is not installed (needed for the reference forward)")

        prompts = make_prompts(int(text_cfg["vocab_size"]))
        sampling = greedy_sampling_params(max_new_tokens)
        probe_dir = tmp_root / "probe"
        probe_dir.mkdir(exist_ok=True)
        for stale in probe_dir.glob("rec-*.pt"):  # a reused --work-dir
            stale.unlink()

        from .probe import ENV_DIR, make_probed_sglang_copy

        probed_root = make_probed_sglang_copy(pkg_dir, tmp_root / "sglang-probed")
        base_env = dict(os.environ)
        pp = base_env.get("PYTHONPATH", "")
        base_env["PYTHONPATH"] = os.pathsep.join(p for p in [str(PROJECT_ROOT), pp] if p)
        base_env.pop(ENV_DIR, None)
        spec_env = dict(base_env)
        spec_env["PYTHONPATH"] = os.pathsep.join(p for p in [str(probed_root), str(PROJECT_ROOT), pp] if p)
        spec_env[ENV_DIR] = str(probe_dir)

        base_gen = baseline_generate_kwargs(read)
        spec_run = _run_worker(
            {"engine_kwargs": spec_kw, "prompts": prompts, "sampling_params": sampling,
             "out": str(logs / "spec.json"), "expect_sglang_under": str(probed_root)},
            tmp_root / "spec-job.json", spec_env, timeout_s, logs / "spec.log",
        )
        base_run = _run_worker(
            {"engine_kwargs": base_kw, "prompts": prompts, "sampling_params": sampling,
             "generate_kwargs": base_gen, "out": str(logs / "base.json"), "expect_sglang_under": None},
            tmp_root / "base-job.json", base_env, timeout_s, logs / "base.log",
        )

        records = _load_records(probe_dir)
        assignment = assign_records(records, prompts, spec_run["output_ids"])
        if use_hf:
            from .checkpoint import hf_reference_hidden_states, load_hf_reference_model

            model = load_hf_reference_model(target)
            import torch

            if torch.cuda.is_available():  # engines have exited; fp32 on one GPU
                torch.backends.cuda.matmul.allow_tf32 = False
                model = model.to("cuda:0")
            aux = compare_items(assignment.items, ids, lambda seq: hf_reference_hidden_states(model, seq))
            reference = "hf-full"
        else:
            aux = compare_items_embedding_only(assignment.items, ids, _embedding_rows_loader(target))
            reference = "embedding-only"
        metas = base_run.get("meta_info") or []
        margins = [cmp.top2_margins(m) for m in metas] if base_gen else None
        lossless = cmp.compare_token_ids(spec_run["output_ids"], base_run["output_ids"], margins)
        if base_gen and lossless.mode == "exact":
            lossless.info.append("the baseline returned no top-2 logprobs: exact comparison")
        elif not base_gen:
            lossless.info.append("this release's Engine.generate takes no top_logprobs_num: exact comparison")
        engine = {
            "speculative": spec_kw, "baseline": base_kw, "baseline_generate": base_gen,
            "timeout_s": timeout_s, "allreduce_fusion": allreduce_fusion_note(spec_kw),
        }
        summary = build_summary(
            tp=tp, target=str(target), draft=str(draft), layer_ids=ids, reference=reference,
            aux=aux, assignment=assignment, lossless=lossless, spec_run=spec_run, base_run=base_run,
            engine=engine,
        )
        if not summary["ok"] or keep_work_dir or work_dir:
            summary["work_dir"] = str(tmp_root)
        return finish(summary)
    except (EnvironmentProblem, ValueError, KeyError, FileNotFoundError) as e:
        # environment, or unusable input (bad draft config, tp the tiny target cannot split, ...)
        msg = str(e) if isinstance(e, EnvironmentProblem) else f"{type(e).__name__}: {e}"
        return finish({"ok": False, "exit_code": EXIT_ENV, "tp": tp, "error": msg})
    except RuntimeError as e:  # engine crashed / timed out: a failed smoke
        summary = {"ok": False, "exit_code": EXIT_FAIL, "tp": tp, "checks": [{"name": "sglang run", "ok": False, "message": str(e)}]}
        if tmp_root:
            summary["work_dir"] = str(tmp_root)
        return finish(summary)
    finally:
        if probed_root is not None:
            shutil.rmtree(probed_root, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m patchcraft.gpu_smoke.run", description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=None)
    ap.add_argument("--model-path")
    ap.add_argument("--draft-path")
    ap.add_argument("--layer-ids", help="e.g. -1,2,30")
    ap.add_argument("--format", choices=["text", "json"], default="text")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--timeout", type=float, default=DEFAULT_ENGINE_TIMEOUT_S, help="per engine run, seconds (default %(default)s)")
    ap.add_argument("--work-dir")
    ap.add_argument("--out", help="write spec.log, base.log, spec.json, base.json and summary.json here")
    ap.add_argument("--mem-fraction-static", type=float, default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, tok in enumerate(argv[:-1]):  # "--layer-ids -1,2,30": value starts with "-"
        if tok == "--layer-ids":
            argv[i : i + 2] = [f"--layer-ids={argv[i + 1]}"]
            break
    a = ap.parse_args(argv)
    try:
        ids = parse_layer_ids(a.layer_ids)
    except ValueError as e:
        print(f"patchcraft smoke: {e}", file=sys.stderr)
        return EXIT_ENV
    return run_cuda_smoke(
        a.tp, a.model_path, a.draft_path, ids, a.format,
        max_new_tokens=a.max_new_tokens, timeout_s=a.timeout, work_dir=a.work_dir,
        out_dir=a.out, mem_fraction_static=a.mem_fraction_static,
    )


if __name__ == "__main__":
    sys.exit(main())
