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

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

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


def _split_recorded(recorded: Any, n_entries: int) -> list:
    """Accept a list of [T, H] tensors or one concatenated [T, n*H] tensor."""
    import torch

    if isinstance(recorded, (list, tuple)):
        return [torch.as_tensor(t) for t in recorded]
    t = torch.as_tensor(recorded)
    if t.dim() != 2:
        raise ValueError(f"recorded aux hidden states must be 2-D, got shape {tuple(t.shape)}")
    if t.shape[-1] % n_entries:
        raise ValueError(f"recorded width {t.shape[-1]} is not divisible by {n_entries} aux entries")
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
            raise ValueError(f"layer id {k - 1} needs hs[{k}] but the reference has only {len(ref)} entries")
    n_tok = ref[0].shape[0]

    try:
        rec = _split_recorded(recorded, len(layer_ids))
    except ValueError as e:
        return AuxComparison(ok=False, num_tokens=n_tok, message=str(e))
    if len(rec) != len(layer_ids):
        return AuxComparison(
            ok=False,
            num_tokens=n_tok,
            message=(f"recorded {len(rec)} aux entries, expected {len(layer_ids)} for layer ids {layer_ids}"),
        )

    entries: List[EntryResult] = []
    for i, (lid, k, r) in enumerate(zip(layer_ids, want, rec)):
        r = r.reshape(-1, r.shape[-1]).float()
        if tuple(r.shape) != tuple(ref[k].shape):
            entries.append(
                EntryResult(
                    index=i,
                    layer_id=lid,
                    expected_hs=k,
                    ok=False,
                    rel_err=float("inf"),
                    max_token_rel_err=float("inf"),
                    good_fraction=0.0,
                    closest_hs=None,
                    closest_rel_err=None,
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
                index=i,
                layer_id=lid,
                expected_hs=k,
                ok=ok,
                rel_err=rel,
                max_token_rel_err=float(tok.max()) if n_tok else 0.0,
                good_fraction=good,
                closest_hs=closest,
                closest_rel_err=closest_err,
                message=msg,
            )
        )

    first_bad = next((e.index for e in entries if not e.ok), None)
    ok = first_bad is None
    message = (
        f"all {len(entries)} aux entries match [{', '.join(f'hs[{k}]' for k in want)}]"
        if first_bad is None
        else entries[first_bad].message
    )
    return AuxComparison(ok=ok, num_tokens=n_tok, entries=entries, first_mismatch=first_bad, message=message)


def compare_embedding_entry(
    recorded_entry: Any, embed_weight: Any, input_ids: Sequence[int], *, token_rtol: float = 1e-2
) -> AuxComparison:
    """Check only the ``-1`` entry against an embedding-table lookup.

    Used for real (large) targets where a full HF reference forward is not
    affordable: the embedding row is exact in bf16, so this is a strict check.
    """
    import torch

    ids = torch.as_tensor(list(input_ids), dtype=torch.long)
    ref0 = torch.as_tensor(embed_weight)[ids].float()
    return compare_aux_hidden_states([recorded_entry], [ref0], [-1], token_rtol=token_rtol, min_good_fraction=1.0)


# Greedy speculative decoding reproduces the baseline only up to rounding: the
# target verifies 4 tokens at once (M=4) where the baseline decodes one (M=1),
# and bf16 GEMMs round differently per shape.  Where the baseline's top two
# candidates are closer than this (log-probabilities, i.e. logits, in nats),
# a flip is rounding, not a bug.  bf16 rounds a logit of 8 to steps of 0.0625,
# and a 1 % hidden-state error moves the tiny target's logits (std ~4.5) by
# ~0.05; its top-2 gap is typically ~1.
DEFAULT_TIE_MARGIN = 0.25


def top2_margins(meta_info: Dict[str, Any]) -> Optional[List[Optional[float]]]:
    """Per output token, the baseline's top-1 minus top-2 log-probability.

    ``meta_info["output_top_logprobs"]`` as SGLang's ``Engine.generate``
    returns it with ``return_logprob=True, top_logprobs_num=2``: one entry per
    output token, each a list of ``(logprob, token_id, text)`` (lists after
    JSON).  None when the key is missing or empty; an entry with fewer than two
    finite candidates gives None at that position.
    """
    tops = (meta_info or {}).get("output_top_logprobs")
    if not tops:
        return None
    out: List[Optional[float]] = []
    for entry in tops:
        vals = []
        for cand in entry or []:
            try:
                v = float(cand[0])
            except (TypeError, ValueError, IndexError):
                continue
            if math.isfinite(v):
                vals.append(v)
        vals.sort(reverse=True)
        out.append(vals[0] - vals[1] if len(vals) >= 2 else None)
    return out


@dataclass
class LosslessResult:
    ok: bool
    num_prompts: int
    num_tokens_compared: int  # tokens that gate the check (before each prompt's first near tie)
    first_divergence: Optional[Dict[str, int]]  # {"prompt": i, "position": j}
    message: str
    mode: str = "exact"  # "exact" (no margins) or "margin" (gated up to the first near tie)
    tie_margin: Optional[float] = None
    num_tokens_total: int = 0
    near_ties: List[Dict[str, Any]] = field(default_factory=list)  # {"prompt", "position", "margin"}
    info: List[str] = field(default_factory=list)  # after a near tie: reported, never gating


def _gate_end(n: int, margins: Optional[Sequence[Optional[float]]], tie_margin: float) -> Tuple[int, Optional[float]]:
    """First position that does not gate (a near tie or an unknown margin), and its margin."""
    if margins is None:
        return n, None
    for j in range(n):
        m = margins[j] if j < len(margins) else None
        if m is None or not math.isfinite(m) or m < tie_margin:
            return j, m
    return n, None


def compare_token_ids(
    spec: Sequence[Sequence[int]],
    base: Sequence[Sequence[int]],
    margins: Optional[Sequence[Optional[Sequence[Optional[float]]]]] = None,
    *,
    tie_margin: float = DEFAULT_TIE_MARGIN,
) -> LosslessResult:
    """Greedy speculative decoding must reproduce the non-speculative tokens.

    Without ``margins`` every token must be identical.  With ``margins`` (per
    prompt, from :func:`top2_margins` of the baseline; None for a prompt
    means exact), a prompt's tokens are compared up to its first position
    whose baseline top-2 margin is below ``tie_margin`` (or unknown).  From
    there on the two runs may legitimately part: what happens is reported in
    ``info`` and never fails the check.  A divergence before that point,
    where the baseline's choice was clear, fails.  Different lengths fail
    (the smoke ignores EOS, so both runs return ``max_new_tokens``).
    """
    mode = "margin" if margins is not None and any(m is not None for m in margins) else "exact"
    total = sum(len(b) for b in base)
    common: Dict[str, Any] = dict(
        num_prompts=len(base), mode=mode, tie_margin=tie_margin if mode == "margin" else None, num_tokens_total=total
    )
    if len(spec) != len(base) or (margins is not None and len(margins) != len(base)):
        n_m = "" if margins is None else f", {len(margins)} margin lists"
        return LosslessResult(
            ok=False,
            num_tokens_compared=0,
            first_divergence=None,
            message=f"{len(spec)} speculative outputs vs {len(base)} baseline outputs{n_m}",
            **common,
        )
    compared = 0
    ties: List[Dict[str, Any]] = []
    info: List[str] = []
    for i, (s, b) in enumerate(zip(spec, base)):
        s, b = list(s), list(b)
        m_i = margins[i] if margins is not None else None
        end, tie = _gate_end(len(b), m_i, tie_margin)
        for j in range(min(end, len(s))):
            if s[j] != b[j]:
                why = ""
                if m_i is not None:
                    why = f"; baseline top-2 margin {m_i[j]:.3g} >= {tie_margin:g}, a clear choice"
                return LosslessResult(
                    ok=False,
                    num_tokens_compared=compared + j,
                    first_divergence={"prompt": i, "position": j},
                    message=f"prompt {i}: speculative output diverges at token {j} (spec {s[j]} vs baseline {b[j]}{why})",
                    near_ties=ties,
                    info=info,
                    **common,
                )
        if len(s) != len(b):
            return LosslessResult(
                ok=False,
                num_tokens_compared=compared + min(end, len(s)),
                first_divergence={"prompt": i, "position": min(len(s), len(b))},
                message=f"prompt {i}: speculative output has {len(s)} tokens, baseline {len(b)}",
                near_ties=ties,
                info=info,
                **common,
            )
        compared += end
        if end < len(b):
            ties.append({"prompt": i, "position": end, "margin": tie})
            what = f"margin {tie:.3g} < {tie_margin:g}" if tie is not None and math.isfinite(tie) else "margin unknown"
            diff = next((j for j in range(end, len(b)) if s[j] != b[j]), None)
            after = "identical to the end" if diff is None else f"the outputs differ from token {diff} on"
            info.append(f"prompt {i}: near tie at token {end} ({what}); not compared from there: {after}")
    n_tied = len(ties)
    if mode == "exact":
        message = f"speculative output identical to baseline ({compared} tokens, {len(base)} prompts)"
    elif n_tied == 0:
        message = (
            f"speculative output identical to baseline ({compared} tokens, {len(base)} prompts; "
            f"no baseline top-2 margin below {tie_margin:g})"
        )
    else:
        message = (
            f"speculative output identical to baseline up to each prompt's first near tie "
            f"({compared} of {total} tokens compared, {len(base)} prompts; {n_tied} with a top-2 margin "
            f"below {tie_margin:g}, reported as info)"
        )
        if compared == 0:
            message += "; no token was compared"
    return LosslessResult(
        ok=True,
        num_tokens_compared=compared,
        first_divergence=None,
        message=message,
        near_ties=ties,
        info=info,
        **common,
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
