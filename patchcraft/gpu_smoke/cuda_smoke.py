"""``patchcraft smoke --device cuda``: a real-SGLang EAGLE-3 smoke run.

:func:`run_cuda_smoke` runs three steps:

1. :func:`prepare`: environment checks (torch + CUDA + enough GPUs, an
   importable-looking sglang whose ``ServerArgs`` accepts our engine kwargs),
   then a tiny DeepSeek-V3 target and/or a random EAGLE-3 draft when not
   given. A problem here is a :class:`~patchcraft.base.errors.PatchcraftError`
   (one line, exit 2).
2. :func:`run_engines`: a copy of the installed sglang package gets a
   recording probe (the installation is never written to), then
   ``sglang.Engine`` runs twice in child processes (:mod:`.engines`), greedy,
   decode CUDA graphs on (the prefill-side piecewise graph off in both): with
   EAGLE-3 on the probed copy, and without speculation on the plain install
   (top-2 logprobs returned). Each run is bounded by ``timeout_s`` (default
   200 s, so the whole smoke fits a 10-minute window); a crash or a timeout
   fails the smoke (exit 1).
3. :func:`compare_runs`: the recorded aux hidden states (prefill and
   verify/graph-replay batches) against the reference ``[hs[0], hs[a+1],
   hs[b+1]]``, the token ids of both runs up to each prompt's first near tie
   in the baseline, and accept length and throughput.

With ``out_dir``, ``spec.log``, ``base.log`` (each engine's whole output),
their results (``spec.json``, ``base.json``) and ``summary.json`` are
written there. Exit codes (patchcraft.base.errors): 0 pass, 1 a check failed,
2 environment error. torch, sglang and transformers are imported lazily, so
this module imports anywhere.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from patchcraft.ui import console, documents
from patchcraft.ui.machine_output import verdict_code
from patchcraft.base.errors import PatchcraftError

from patchcraft.harness import gpu_compare as compare
from .engine_args import (
    allreduce_fusion_note,
    baseline_generate_kwargs,
    build_engine_kwargs,
    check_engine_kwargs,
    greedy_sampling_params,
    server_args_fields,
)
from .engines import EngineRunFailed, baseline_launch, build_overlay, run_engine, speculative_launch
from .probe_records import assign_records, compare_items, compare_items_embedding_only, load_records
from patchcraft.harness.gpu_summary import (
    Comparison,
    CudaSmokeSummary,
    build_summary,
    engine_failure,
    speed,
    write_summary,
)
from .wheels import source_reader

HF_REFERENCE_MAX_BYTES = 4 << 30  # larger targets get the embedding-only reference
# Per engine run (start, graph capture, 4 prompts, shutdown): two runs plus the
# checkpoint and the reference fit a 10-minute window.
DEFAULT_ENGINE_TIMEOUT_S = 200.0


# --------------------------------------------------------------------------
# small pure helpers (CPU-tested)
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# 1. prepare
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """Everything both engine runs and the comparison need, checked before any engine starts."""

    tp: int
    package: Path  # the installed sglang package
    work_dir: Path
    logs_dir: Path  # --out, else the work directory
    target: Path
    draft: Path
    layer_ids: Tuple[int, ...]
    hf_reference: bool  # a full HF forward (small DeepSeek-V3), else the embedding rows only
    speculative_kwargs: Dict[str, Any]
    baseline_kwargs: Dict[str, Any]
    baseline_generate: Dict[str, Any]  # top-2 logprobs where this release's Engine.generate takes them
    prompts: List[List[int]]
    sampling: Dict[str, Any]
    timeout_s: float


def _sglang_package() -> Path:
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise PatchcraftError("sglang is not installed (pip install sglang; then patchcraft apply)")
    return Path(list(spec.submodule_search_locations)[0])


def _check_cuda(tp: Optional[int]) -> int:
    try:
        import torch
    except ImportError:
        raise PatchcraftError("torch is not importable (pip install torch, a CUDA build)") from None
    if not torch.cuda.is_available():
        raise PatchcraftError("CUDA is not available (torch.cuda.is_available() is False)")
    visible = torch.cuda.device_count()
    tp = visible if tp is None else int(tp)
    if tp < 1 or tp > visible:
        raise PatchcraftError(f"--tp {tp} needs {tp} GPUs, {visible} visible")
    return tp


def _require_module(name: str, why: str) -> None:
    if importlib.util.find_spec(name) is None:
        raise PatchcraftError(f"{name} is not installed ({why})")


def _make_dir(path: Path, what: str) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PatchcraftError(f"{what} {path}: {type(exc).__name__}: {exc}") from None
    return path


def _safetensors_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))


def _target_and_draft(
    work_dir: Path, tp: int, model_path: Optional[str], draft_path: Optional[str], layer_ids: Optional[Sequence[int]]
) -> Tuple[Path, Path, Tuple[int, ...], Dict[str, Any]]:
    """The target (given, or a tiny random DeepSeek-V3), the draft (given, or a random one for the ids), the ids, the target's config.

    A checkpoint that cannot be read, or a tiny one that cannot be built for
    this ``tp``, is unusable input: a PatchcraftError.
    """
    from .checkpoint import make_tiny_deepseek_v3, read_config
    from .draft_builder import draft_layer_ids, make_tiny_eagle3_draft

    try:
        if model_path is None:
            target = make_tiny_deepseek_v3(work_dir / "target", tp_size=tp)
        else:
            target = Path(model_path)
            if not (target / "config.json").is_file():
                raise PatchcraftError(f"{target} has no config.json (a local checkpoint dir is required)")
        config = read_config(target)
        num_layers = int((config.get("text_config") or config)["num_hidden_layers"])
        if draft_path is not None:
            draft = Path(draft_path)
            ids = draft_layer_ids(draft)
            if layer_ids is not None and list(layer_ids) != ids:
                raise PatchcraftError(f"--layer-ids {list(layer_ids)} disagree with the draft's eagle_config {ids}")
        else:
            ids = list(layer_ids) if layer_ids is not None else default_layer_ids(num_layers)
            draft = make_tiny_eagle3_draft(work_dir / "draft", config, ids, tp_size=tp)
        _check_layer_ids(ids, num_layers)
    except (ValueError, KeyError, OSError) as exc:
        raise PatchcraftError(f"{type(exc).__name__}: {exc}") from None
    return target, draft, tuple(ids), config


def _check_layer_ids(ids: Sequence[int], num_layers: int) -> None:
    compare.expected_hs_indices(ids)  # ValueError for ids below -1
    beyond = [i for i in ids if i >= num_layers]
    if beyond:
        raise ValueError(f"layer ids {beyond} are beyond the target's {num_layers} layers")


def _engine_kwargs(
    package: Path,
    read: Callable[[str], Optional[str]],
    target: Path,
    draft: Path,
    tp: int,
    trust_remote_code: bool,
    mem_fraction_static: float,
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Both engines' kwargs, checked against this release's ``ServerArgs`` (read, never imported)."""
    try:
        fields = server_args_fields(read)
    except (ValueError, OSError) as exc:
        raise PatchcraftError(f"installed sglang ({package}): cannot read its ServerArgs: {exc}") from None
    speculative = build_engine_kwargs(
        str(target),
        str(draft),
        tp_size=tp,
        trust_remote_code=trust_remote_code,
        fields=fields,
        mem_fraction_static=mem_fraction_static,
    )
    baseline = build_engine_kwargs(
        str(target),
        None,
        speculative=False,
        tp_size=tp,
        trust_remote_code=trust_remote_code,
        fields=fields,
        mem_fraction_static=mem_fraction_static,
    )
    problems = check_engine_kwargs(speculative, read)
    problems += [p for p in check_engine_kwargs(baseline, read) if p not in problems]
    if problems:
        raise PatchcraftError(
            f"installed sglang ({package}) does not accept the smoke settings: " + "; ".join(problems)
        )
    return speculative, baseline


def prepare(
    tp: Optional[int],
    model_path: Optional[str],
    draft_path: Optional[str],
    layer_ids: Optional[Sequence[int]],
    *,
    work_dir: Optional[str],
    out: Optional[Path],
    max_new_tokens: int,
    timeout_s: float,
    mem_fraction_static: Optional[float],
) -> Prepared:
    """Check the environment and write what the engines load; PatchcraftError (exit 2) for anything missing."""
    checked_tp = _check_cuda(tp)
    package = _sglang_package()
    read = source_reader(package)
    _require_module("safetensors", "pip install -e '.[smoke]'")
    work = _make_dir(Path(work_dir), "--work-dir") if work_dir else Path(tempfile.mkdtemp(prefix="patchcraft-smoke-"))
    target, draft, ids, config = _target_and_draft(work, checked_tp, model_path, draft_path, layer_ids)
    if mem_fraction_static is None:
        mem_fraction_static = 0.3 if _safetensors_bytes(target) < (8 << 30) else 0.85
    speculative, baseline = _engine_kwargs(
        package, read, target, draft, checked_tp, bool(config.get("auto_map")), mem_fraction_static
    )
    hf_reference = (
        config.get("model_type") == "deepseek_v3"
        and "quantization_config" not in config
        and _safetensors_bytes(target) <= HF_REFERENCE_MAX_BYTES
    )
    if hf_reference:
        _require_module("transformers", "needed for the reference forward")
    return Prepared(
        tp=checked_tp,
        package=package,
        work_dir=work,
        logs_dir=out or work,
        target=target,
        draft=draft,
        layer_ids=ids,
        hf_reference=hf_reference,
        speculative_kwargs=speculative,
        baseline_kwargs=baseline,
        baseline_generate=baseline_generate_kwargs(read),
        prompts=make_prompts(int((config.get("text_config") or config)["vocab_size"])),
        sampling=greedy_sampling_params(max_new_tokens),
        timeout_s=timeout_s,
    )


# --------------------------------------------------------------------------
# 2. run the engines
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineRuns:
    speculative: Dict[str, Any]  # the worker's result: output_ids, meta_info, elapsed_s, sglang_file, sglang_version
    baseline: Dict[str, Any]
    records: List[Dict[str, Any]]  # what the probe recorded in the speculative run


def _fresh_probe_dir(work_dir: Path) -> Path:
    probe_dir = work_dir / "probe"
    probe_dir.mkdir(exist_ok=True)
    for stale in probe_dir.glob("rec-*.pt"):  # a reused --work-dir
        stale.unlink()
    return probe_dir


def run_engines(prepared: Prepared, via_run: bool = False) -> EngineRuns:
    """The speculative run on a probed copy of the install, then the baseline on the install; EngineRunFailed on a crash or timeout.

    ``via_run``: the install is not patched; the speculative worker starts
    through ``patchcraft run`` with an overlay built from the probed copy.
    """
    from .probe import make_probed_sglang_copy

    probe_dir = _fresh_probe_dir(prepared.work_dir)
    probed_root = prepared.work_dir / "sglang-probed"
    overlay_dir = prepared.work_dir / "overlay"
    try:
        make_probed_sglang_copy(prepared.package, probed_root)
        overlay = build_overlay(probed_root, overlay_dir) if via_run else None
        speculative = run_engine(
            speculative_launch(os.environ, probed_root, probe_dir, overlay),
            _job(prepared, prepared.speculative_kwargs, "spec", {}),
            prepared.work_dir / "spec-job.json",
            prepared.timeout_s,
            prepared.logs_dir / "spec.log",
        )
        baseline = run_engine(
            baseline_launch(os.environ),
            _job(prepared, prepared.baseline_kwargs, "base", prepared.baseline_generate),
            prepared.work_dir / "base-job.json",
            prepared.timeout_s,
            prepared.logs_dir / "base.log",
        )
    finally:
        shutil.rmtree(probed_root, ignore_errors=True)
        from patchcraft.overlay.build import remove

        remove(overlay_dir)  # the link and the version it points to
    return EngineRuns(speculative, baseline, load_records(probe_dir))


def _job(
    prepared: Prepared, engine_kwargs: Dict[str, Any], name: str, generate_kwargs: Dict[str, Any]
) -> Dict[str, Any]:
    job = {
        "engine_kwargs": engine_kwargs,
        "prompts": prepared.prompts,
        "sampling_params": prepared.sampling,
        "out": str(prepared.logs_dir / f"{name}.json"),
    }
    if generate_kwargs:
        job["generate_kwargs"] = generate_kwargs
    return job


# --------------------------------------------------------------------------
# 3. compare
# --------------------------------------------------------------------------


def _embedding_rows_loader(model_dir: Path) -> Callable[[List[int]], Any]:
    """Read only the needed rows of the target's embedding table."""
    import json

    import torch
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
    else:
        weight_map = {}
        for f in model_dir.glob("*.safetensors"):
            with safe_open(str(f), "pt") as handle:
                weight_map.update({k: f.name for k in handle.keys()})
    keys = sorted((k for k in weight_map if k.endswith("embed_tokens.weight") and "mtp" not in k), key=len)
    if not keys:
        raise PatchcraftError(f"no embed_tokens.weight in {model_dir}")
    key = keys[0]
    path = model_dir / weight_map[key]

    def rows(ids: List[int]) -> Any:
        with safe_open(str(path), "pt") as handle:
            table = handle.get_slice(key)
            return torch.cat([table[i : i + 1] for i in ids]).float()

    return rows


def _aux_comparisons(
    prepared: Prepared, runs: EngineRuns
) -> Tuple[Dict[str, compare.AuxComparison], str, int, Dict[str, int]]:
    """Per phase, the recorded aux states against the reference; the reference's name; records used and skipped."""
    assignment = assign_records(runs.records, prepared.prompts, runs.speculative["output_ids"])
    if not prepared.hf_reference:
        aux = compare_items_embedding_only(
            assignment.items, prepared.layer_ids, _embedding_rows_loader(prepared.target)
        )
        return aux, "embedding-only", len(assignment.items), assignment.skipped
    import torch

    from .checkpoint import hf_reference_hidden_states, load_hf_reference_model

    model = load_hf_reference_model(prepared.target)
    if torch.cuda.is_available():  # engines have exited; fp32 on one GPU
        torch.backends.cuda.matmul.allow_tf32 = False
        model = model.to("cuda:0")
    aux = compare_items(
        assignment.items, prepared.layer_ids, lambda sequence: hf_reference_hidden_states(model, sequence)
    )
    return aux, "hf-full", len(assignment.items), assignment.skipped


def _lossless(prepared: Prepared, runs: EngineRuns) -> compare.LosslessResult:
    """Token ids of both runs, compared up to each prompt's first near tie in the baseline."""
    metas = runs.baseline.get("meta_info") or []
    margins = [compare.top2_margins(m) for m in metas] if prepared.baseline_generate else None
    lossless = compare.compare_token_ids(runs.speculative["output_ids"], runs.baseline["output_ids"], margins)
    if prepared.baseline_generate and lossless.mode == "exact":
        lossless.info.append("the baseline returned no top-2 logprobs: exact comparison")
    elif not prepared.baseline_generate:
        lossless.info.append("this release's Engine.generate takes no top_logprobs_num: exact comparison")
    return lossless


def compare_runs(prepared: Prepared, runs: EngineRuns) -> Comparison:
    aux, reference, used, skipped = _aux_comparisons(prepared, runs)
    engine = {
        "speculative": prepared.speculative_kwargs,
        "baseline": prepared.baseline_kwargs,
        "baseline_generate": prepared.baseline_generate,
        "timeout_s": prepared.timeout_s,
        "allreduce_fusion": allreduce_fusion_note(prepared.speculative_kwargs),
    }
    return Comparison(
        target=str(prepared.target),
        draft=str(prepared.draft),
        layer_ids=prepared.layer_ids,
        reference=reference,
        sglang_version=runs.speculative.get("sglang_version"),
        sglang_file=runs.baseline.get("sglang_file"),
        aux=aux,
        records_used=used,
        records_skipped=skipped,
        lossless=_lossless(prepared, runs),
        speed=speed(runs.speculative, runs.baseline),
        engine=engine,
    )


# --------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------


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
    via_run: bool = False,
) -> int:
    """Run the CUDA smoke test; print the summary; return 0 pass / 1 fail (PatchcraftError: exit 2).

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
    ``via_run``: the speculative engine gets the patch from an overlay,
    through ``patchcraft run``, not from a patched install (:mod:`.engines`).
    """
    out = _make_dir(Path(out_dir), "--out") if out_dir else None
    prepared = prepare(
        tp,
        model_path,
        draft_path,
        layer_ids,
        work_dir=work_dir,
        out=out,
        max_new_tokens=max_new_tokens,
        timeout_s=timeout_s,
        mem_fraction_static=mem_fraction_static,
    )
    work = str(prepared.work_dir)
    summary: CudaSmokeSummary
    try:
        runs = run_engines(prepared, via_run)
    except EngineRunFailed as exc:
        summary = engine_failure(prepared.tp, str(exc), work)
    else:
        summary = build_summary(prepared.tp, compare_runs(prepared, runs))
        if not summary.ok or keep_work_dir or work_dir:
            summary = replace(summary, work_dir=work)
    if out is not None:
        summary = write_summary(summary, out, documents.cuda_smoke_json)
    return console.print_report(
        output_format,
        verdict_code(summary.ok),
        lambda: documents.cuda_smoke_json(summary),
        lambda: console.render_cuda_smoke(summary) + "\n",
    )
