"""Pure comparison logic for the GPU smoke run.

Everything here works on tensors / lists that were already recorded, so it is
fully testable on a CPU.  ``torch`` is imported lazily inside the functions
that need it.

Numbering follows Hugging Face ``output_hidden_states``: ``hs[0]`` is the
embedding output and ``hs[k]`` the output of decoder layer ``k-1`` (before the
final norm).  An EAGLE-3 draft config id ``a >= 0`` means ``hs[a+1]``; the
patchcraft id ``-1`` means ``hs[0]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

# bf16 has an 8-bit mantissa (relative step 2**-8 ~ 0.4 %).  A few layers of
# bf16 kernels against an fp32 reference stay around 1 %; a capture of the
# wrong layer is off by tens of percent.  The per-token fraction absorbs the
# odd token whose MoE routing flips on a near tie between two experts.
DEFAULT_TOKEN_RTOL = 0.05
DEFAULT_MIN_GOOD_FRACTION = 0.9


def expected_hs_indices(layer_ids: Sequence[int]) -> List[int]:
    """Map EAGLE-3 aux layer ids to Hugging Face hidden-state indices.

    ``-1`` -> ``hs[0]`` (embedding output), ``a >= 0`` -> ``hs[a + 1]``.
    """
    out = []
    for lid in layer_ids:
        if isinstance(lid, bool) or not isinstance(lid, int):
            raise ValueError(f"layer id {lid!r} is not an int")
        if lid < -1:
            raise ValueError(f"layer id {lid} is invalid (only -1 or >= 0 allowed)")
        out.append(0 if lid == -1 else lid + 1)
    return out


@dataclass
class EntryResult:
    index: int  # position of the entry in the aux list
    layer_id: int
    expected_hs: int
    ok: bool
    rel_err: float  # ||rec - ref||_F / ||ref||_F over all tokens
    max_token_rel_err: float
    good_fraction: float  # fraction of tokens within token_rtol
    closest_hs: Optional[int]  # hs index the recorded entry is closest to
    closest_rel_err: Optional[float]
    message: str


@dataclass
class AuxComparison:
    ok: bool
    num_tokens: int
    entries: List[EntryResult] = field(default_factory=list)
    first_mismatch: Optional[int] = None  # index into entries
    message: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _split_recorded(recorded: Any, n_entries: int) -> list:
    """Accept a list of [T, H] tensors or one concatenated [T, n*H] tensor."""
    import torch

    if isinstance(recorded, (list, tuple)):
        return [torch.as_tensor(t) for t in recorded]
    t = torch.as_tensor(recorded)
    if t.dim() != 2:
        raise ValueError(f"recorded aux hidden states must be 2-D, got shape {tuple(t.shape)}")
    if t.shape[-1] % n_entries:
        raise ValueError(
            f"recorded width {t.shape[-1]} is not divisible by {n_entries} aux entries"
        )
    return list(t.chunk(n_entries, dim=-1))


def _token_rel_err(rec, ref):
    import torch

    num = (rec - ref).norm(dim=-1)
    den = ref.norm(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
    return num / den


def _rel_err(rec, ref) -> float:
    den = float(ref.norm())
    num = float((rec - ref).norm())
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def compare_aux_hidden_states(
    recorded: Any,
    reference_hs: Sequence[Any],
    layer_ids: Sequence[int],
    *,
    token_rtol: float = DEFAULT_TOKEN_RTOL,
    min_good_fraction: float = DEFAULT_MIN_GOOD_FRACTION,
) -> AuxComparison:
    """Compare recorded SGLang aux hidden states with the HF reference.

    ``recorded``: list of ``[T, H]`` tensors, one per layer id, or the
    concatenated ``[T, len(layer_ids) * H]`` tensor SGLang hands to the draft.
    ``reference_hs``: the full HF list ``hs[0..L]`` (each ``[T, H]``) for the
    same tokens.  An entry passes when at least ``min_good_fraction`` of its
    tokens have a relative error ``<= token_rtol`` *and* the entry's global
    relative error is within ``token_rtol``.  The result names the first entry
    that fails and which ``hs[k]`` it actually resembles.
    """
    import torch

    layer_ids = list(layer_ids)
    want = expected_hs_indices(layer_ids)
    if not reference_hs:
        raise ValueError("reference_hs is empty")
    ref = [torch.as_tensor(r).reshape(-1, torch.as_tensor(r).shape[-1]).float() for r in reference_hs]
    for k in want:
        if k >= len(ref):
            raise ValueError(
                f"layer id {k - 1} needs hs[{k}] but the reference has only {len(ref)} entries"
            )
    n_tok = ref[0].shape[0]

    try:
        rec = _split_recorded(recorded, len(layer_ids))
    except ValueError as e:
        return AuxComparison(ok=False, num_tokens=n_tok, message=str(e))
    if len(rec) != len(layer_ids):
        return AuxComparison(
            ok=False,
            num_tokens=n_tok,
            message=(
                f"recorded {len(rec)} aux entries, expected {len(layer_ids)} "
                f"for layer ids {layer_ids}"
            ),
        )

    entries: List[EntryResult] = []
    for i, (lid, k, r) in enumerate(zip(layer_ids, want, rec)):
        r = r.reshape(-1, r.shape[-1]).float()
        if tuple(r.shape) != tuple(ref[k].shape):
            entries.append(
                EntryResult(
                    index=i, layer_id=lid, expected_hs=k, ok=False,
                    rel_err=float("inf"), max_token_rel_err=float("inf"),
                    good_fraction=0.0, closest_hs=None, closest_rel_err=None,
                    message=(
                        f"entry {i} (layer id {lid}): shape {tuple(r.shape)} != "
                        f"reference hs[{k}] shape {tuple(ref[k].shape)}"
                    ),
                )
            )
            continue
        finite = bool(torch.isfinite(r).all())
        tok = _token_rel_err(r, ref[k]) if finite else torch.full((n_tok,), float("inf"))
        good = float((tok <= token_rtol).float().mean()) if n_tok else 1.0
        rel = _rel_err(r, ref[k]) if finite else float("inf")
        # Which reference entry does it look like? (diagnoses off-by-one,
        # un-cloned embedding, default layers frozen in a CUDA graph, ...)
        dists = [(_rel_err(r, h), j) for j, h in enumerate(ref) if h.shape == r.shape]
        closest_err, closest = min(dists) if dists and finite else (None, None)
        ok = finite and good >= min_good_fraction and rel <= token_rtol
        if ok:
            msg = f"entry {i} (layer id {lid}) matches hs[{k}] (rel err {rel:.2e})"
        elif not finite:
            msg = f"entry {i} (layer id {lid}): contains NaN/Inf, expected hs[{k}]"
        else:
            msg = (
                f"entry {i} (layer id {lid}): expected hs[{k}], rel err {rel:.3g} "
                f"(tolerance {token_rtol:g}; {good:.0%} of tokens within it)"
            )
            if closest is not None and closest != k:
                msg += f"; closest reference is hs[{closest}] (rel err {closest_err:.3g})"
        entries.append(
            EntryResult(
                index=i, layer_id=lid, expected_hs=k, ok=ok, rel_err=rel,
                max_token_rel_err=float(tok.max()) if n_tok else 0.0,
                good_fraction=good, closest_hs=closest, closest_rel_err=closest_err,
                message=msg,
            )
        )

    first_bad = next((e.index for e in entries if not e.ok), None)
    ok = first_bad is None
    message = (
        f"all {len(entries)} aux entries match [{', '.join(f'hs[{k}]' for k in want)}]"
        if ok
        else entries[first_bad].message
    )
    return AuxComparison(ok=ok, num_tokens=n_tok, entries=entries, first_mismatch=first_bad, message=message)


def compare_embedding_entry(recorded_entry: Any, embed_weight: Any, input_ids: Sequence[int], *, token_rtol: float = 1e-2) -> AuxComparison:
    """Check only the ``-1`` entry against an embedding-table lookup.

    Used for real (large) targets where a full HF reference forward is not
    affordable: the embedding row is exact in bf16, so this is a strict check.
    """
    import torch

    ids = torch.as_tensor(list(input_ids), dtype=torch.long)
    ref0 = torch.as_tensor(embed_weight)[ids].float()
    return compare_aux_hidden_states([recorded_entry], [ref0], [-1], token_rtol=token_rtol, min_good_fraction=1.0)


@dataclass
class LosslessResult:
    ok: bool
    num_prompts: int
    num_tokens_compared: int
    first_divergence: Optional[Dict[str, int]]  # {"prompt": i, "position": j}
    message: str

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def compare_token_ids(spec: Sequence[Sequence[int]], base: Sequence[Sequence[int]]) -> LosslessResult:
    """Greedy speculative decoding must reproduce the non-speculative tokens."""
    if len(spec) != len(base):
        return LosslessResult(
            ok=False, num_prompts=len(base), num_tokens_compared=0, first_divergence=None,
            message=f"{len(spec)} speculative outputs vs {len(base)} baseline outputs",
        )
    compared = 0
    for i, (s, b) in enumerate(zip(spec, base)):
        s, b = list(s), list(b)
        n = min(len(s), len(b))
        for j in range(n):
            if s[j] != b[j]:
                return LosslessResult(
                    ok=False, num_prompts=len(base), num_tokens_compared=compared + j,
                    first_divergence={"prompt": i, "position": j},
                    message=(
                        f"prompt {i}: speculative output diverges at token {j} "
                        f"(spec {s[j]} vs baseline {b[j]})"
                    ),
                )
        compared += n
        if len(s) != len(b):
            return LosslessResult(
                ok=False, num_prompts=len(base), num_tokens_compared=compared,
                first_divergence={"prompt": i, "position": n},
                message=f"prompt {i}: speculative output has {len(s)} tokens, baseline {len(b)}",
            )
    return LosslessResult(
        ok=True, num_prompts=len(base), num_tokens_compared=compared, first_divergence=None,
        message=f"speculative output identical to baseline ({compared} tokens, {len(base)} prompts)",
    )


def summarize_speculation(meta_infos: Sequence[Dict[str, Any]], elapsed_s: float) -> Dict[str, Any]:
    """Accept length and throughput from SGLang ``meta_info`` dicts.

    Accept length = generated tokens / verify steps (``spec_verify_ct``), the
    number SGLang itself logs; 1.0 means no draft token was ever accepted.
    """
    completion = 0
    verify = 0
    have_verify = False
    for m in meta_infos:
        completion += int(m.get("completion_tokens", 0) or 0)
        if m.get("spec_verify_ct") is not None:
            have_verify = True
            verify += int(m["spec_verify_ct"])
    out: Dict[str, Any] = {
        "completion_tokens": completion,
        "elapsed_s": round(float(elapsed_s), 4),
        "tokens_per_s": round(completion / elapsed_s, 2) if elapsed_s > 0 else None,
        "verify_steps": verify if have_verify else None,
        "accept_length": round(completion / verify, 3) if have_verify and verify > 0 else None,
    }
    return out
