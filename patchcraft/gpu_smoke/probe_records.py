"""What the probe recorded, matched to the prompts and compared with the reference.

Pure once torch is there: the probe's ``.pt`` records in, one
:class:`~patchcraft.harness.gpu_compare.AuxComparison` per phase (prefill,
verify) out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from patchcraft.harness import gpu_compare as compare


@dataclass(frozen=True)
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


def load_records(probe_dir: Path) -> List[Dict[str, Any]]:
    """The probe's records, in file-name order."""
    import torch

    return [
        torch.load(str(path), map_location="cpu", weights_only=False) for path in sorted(probe_dir.glob("rec-*.pt"))
    ]


def assign_records(
    records: Sequence[Dict[str, Any]], prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
) -> Assignment:
    """Attach probe records to prompts and to the token sequence they ran on.

    Prompts run one at a time, so records are chronological per request: a
    prefill (``EXTEND``) whose input ids equal prompt *i* opens request *i*;
    the ``TARGET_VERIFY`` records after it verify a chain ``[last token,
    d1, d2, ...]`` at consecutive positions ``p, p+1, ...`` on top of
    ``(prompt + output)[:p]``.
    """
    assignment = Assignment()
    index = {tuple(prompt): i for i, prompt in enumerate(prompts)}
    current: Optional[int] = None
    for record in sorted(records, key=lambda r: (r.get("pid", 0), r["seq"])):
        mode = str(record.get("mode", "")).upper()
        ids = [int(x) for x in record["input_ids"]]
        positions = [int(x) for x in record["positions"]]
        batch_size = int(record.get("batch_size", 1))
        if batch_size not in (1, -1):
            assignment.skip(f"batch size {batch_size}")
        elif record["hidden_states"].shape[0] != len(ids) or len(positions) != len(ids):
            assignment.skip(f"{mode}: rows != tokens")
        elif "VERIFY" in mode:
            _assign_verify(assignment, record, ids, positions, current, prompts, outputs)
        elif "EXTEND" in mode or "MIXED" in mode:
            current = _assign_prefill(assignment, record, ids, positions, index, current)
        else:
            assignment.skip(f"mode {mode}")
    return assignment


def _assign_prefill(
    assignment: Assignment,
    record: Dict[str, Any],
    ids: List[int],
    positions: List[int],
    index: Dict[Tuple[int, ...], int],
    current: Optional[int],
) -> Optional[int]:
    """A prefill of a smoke prompt opens that prompt's request; returns the request now open."""
    key = tuple(ids)
    if key not in index or positions != list(range(len(ids))):
        assignment.skip(f"{str(record.get('mode', '')).upper()}: not a smoke prompt")
        return current
    assignment.items.append(RecordItem("prefill", index[key], list(ids), positions, record["hidden_states"]))
    return index[key]


def _assign_verify(
    assignment: Assignment,
    record: Dict[str, Any],
    ids: List[int],
    positions: List[int],
    current: Optional[int],
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
) -> None:
    if current is None:
        assignment.skip("verify before any known prefill")
        return
    full = list(prompts[current]) + list(outputs[current])
    start = positions[0] if positions else 0
    if positions != list(range(start, start + len(ids))):
        assignment.skip("verify: positions not a chain (topk > 1?)")
    elif start >= len(full) or full[start] != ids[0]:
        assignment.skip("verify: beyond the returned output")
    else:
        assignment.items.append(RecordItem("verify", current, full[:start] + ids, positions, record["hidden_states"]))


def compare_items(
    items: Sequence[RecordItem],
    layer_ids: Sequence[int],
    reference: Callable[[List[int]], List[Any]],
    **tolerances: Any,
) -> Dict[str, compare.AuxComparison]:
    """Per phase, concatenate all recorded rows and compare with the reference."""
    import torch

    cache: Dict[Tuple[int, ...], List[Any]] = {}
    by_phase: Dict[str, Tuple[List[Any], List[List[Any]]]] = {}
    for item in items:
        key = tuple(item.sequence)
        if key not in cache:
            cache[key] = reference(list(item.sequence))
        hidden_states = cache[key]
        recorded, references = by_phase.setdefault(item.phase, ([], [[] for _ in hidden_states]))
        recorded.append(torch.as_tensor(item.hidden_states).float())
        for k, state in enumerate(hidden_states):
            references[k].append(state[item.positions])
    return {
        phase: compare.compare_aux_hidden_states(
            torch.cat(recorded), [torch.cat(r) for r in references], layer_ids, **tolerances
        )
        for phase, (recorded, references) in by_phase.items()
    }


def compare_items_embedding_only(
    items: Sequence[RecordItem], layer_ids: Sequence[int], embed_rows: Callable[[List[int]], Any]
) -> Dict[str, compare.AuxComparison]:
    """For big targets: only the ``-1`` entry is checked (against the embedding table)."""
    import torch

    if -1 not in layer_ids:
        return {}
    entry = list(layer_ids).index(-1)
    phases: Dict[str, Tuple[List[Any], List[int]]] = {}
    for item in items:
        recorded, ids = phases.setdefault(item.phase, ([], []))
        recorded.append(torch.as_tensor(item.hidden_states).float().chunk(len(layer_ids), dim=-1)[entry])
        ids += [item.sequence[p] for p in item.positions]
    return {
        phase: compare.compare_aux_hidden_states(
            [torch.cat(recorded)], [embed_rows(ids)], [-1], token_rtol=1e-2, min_good_fraction=1.0
        )
        for phase, (recorded, ids) in phases.items()
    }
