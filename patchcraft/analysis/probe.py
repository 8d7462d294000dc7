"""Which hidden states a draft's weights expect, measured: the wiring search of ``patchcraft probe``.

A draft's config says which layer ids to capture; its weights say which
states it was trained on. This module asks the weights: it runs the
draft's first step with the engine's own draft code on a sample of its
training states (:mod:`patchcraft.harness.draft_probe`, SGLang's
``llama_eagle3.py``), once per wiring the dump can supply (every ordered
choice of its states, as many as the fc takes), and ranks them by top-1
accuracy against the next token. The wiring this install serves comes from
:func:`patchcraft.analysis.explain.explain` (what ``check-draft`` proves on
the CPU harness), or ``--served hf:...``.

The search screens every wiring on the first ``screen`` positions, then
scores the best (and up to two runners-up within :data:`CLOSE` of it) and
the served one on all of them (docs/probe.md).
An engine's draft code plugs in as a :class:`DraftEngine`: SGLang's is
:data:`SGLANG`; vLLM's ``llama_eagle3.py`` would be another one.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.target import SglangTree
from patchcraft.reading.checkpoint_tensors import checkpoint_tensors, embedding_name, target_embedding
from patchcraft.reading.training_dumps import Dump, open_dump

#: Wirings tried at most (ordered choices): 6 states into 3 slots is 120.
MAX_WIRINGS = 120
#: Positions every wiring is screened on before the best are scored on all of them.
SCREEN_TOKENS = 128
#: After the screen, the runners-up within this much top-1 of the best are scored on every position too.
CLOSE = 0.10


@dataclass(frozen=True)
class DraftEngine:
    """One engine's draft code: where its files are in a tree (relative to the package)."""

    name: str
    draft_file: str
    layer_file: str


SGLANG = DraftEngine("sglang", "srt/models/llama_eagle3.py", "srt/models/llama.py")


@dataclass(frozen=True)
class WiringScore:
    states: tuple[int, ...]
    tokens: int
    top1: float
    topk: float


@dataclass(frozen=True)
class Served:
    """The wiring this install feeds, how it is known, and its score (None: the dump cannot supply it)."""

    states: tuple[int, ...]
    how: str
    score: Optional[WiringScore] = None
    rank: Optional[int] = None  # 1 = the best
    missing: tuple[int, ...] = ()  # states the dump does not hold
    problem: str = ""  # why it has no score ("" when it has one)


@dataclass(frozen=True)
class ProbeReport:
    draft: Path
    dump: Dump
    engine: str
    version: str
    draft_code: Path
    embedding: str
    tokens: int
    top_k: int
    wirings: int  # how many were tried
    scores: tuple[WiringScore, ...]  # best first
    served: Optional[Served]

    @property
    def best(self) -> WiringScore:
        return self.scores[0]

    @property
    def margin(self) -> float:
        """Top-1 of the best over the next (its whole top-1 when it is the only one)."""
        return self.scores[0].top1 - (self.scores[1].top1 if len(self.scores) > 1 else 0.0)

    @property
    def ok(self) -> bool:
        """The install feeds the wiring the weights expect (nothing to compare with counts as ok)."""
        return self.served is None or self.served.rank == 1


@dataclass(frozen=True)
class ProbeInputs:
    draft_dir: Path
    data: Path
    tree: SglangTree
    states: Optional[tuple[int, ...]] = None  # --states: the dump's HF indices, where it does not name them
    target_dir: Optional[Path] = None  # the target's checkpoint (its embeddings, when the draft has none)
    tokens: int = 512
    top_k: int = 4
    served: Optional[tuple[int, ...]] = None
    served_how: str = ""
    served_strict: bool = False  # --served: a wiring the dump cannot supply is bad input
    screen: int = SCREEN_TOKENS
    max_wirings: int = MAX_WIRINGS
    engine: DraftEngine = SGLANG
    progress: Optional[Callable[[str, int, int], None]] = field(default=None, compare=False)


def _config(draft_dir: Path) -> dict[str, Any]:
    path = draft_dir / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PatchcraftError(f"{path}: no such file") from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise PatchcraftError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(config, dict) or not isinstance(config.get("hidden_size"), int):
        raise PatchcraftError(f"{path}: no hidden_size: not a draft config")
    return config


def wirings(held: Sequence[int], slots: int, cap: int) -> list[tuple[int, ...]]:
    """Every ordered choice of ``slots`` of ``held``; above ``cap``, the choices in layer order."""
    if slots > len(held):
        return []
    ordered = list(itertools.permutations(held, slots))
    if len(ordered) <= cap:
        return ordered
    in_order = list(itertools.combinations(sorted(held), slots))
    if len(in_order) > cap:
        raise PatchcraftError(
            f"the dump holds {len(held)} states: {len(in_order)} wirings of {slots} even in layer order, "
            f"more than {cap}: pass fewer with --states"
        )
    return in_order


def probe(inputs: ProbeInputs) -> ProbeReport:
    """Measure every wiring the dump supplies (see the module docstring); bad input is one :class:`PatchcraftError`."""
    from patchcraft.harness import draft_probe as harness
    from patchcraft.harness.probe_standins import DRAFT_NAMES
    from patchcraft.harness.standins import HarnessError

    config = _config(inputs.draft_dir)
    eagle3_path = inputs.tree.package / inputs.engine.draft_file
    layer_path = inputs.tree.package / inputs.engine.layer_file
    for path in (eagle3_path, layer_path):
        if not path.is_file():
            raise PatchcraftError(f"{path}: no such file: this {inputs.engine.name} has no EAGLE-3 draft code")
    eagle3 = harness.DraftSource(eagle3_path, DRAFT_NAMES)
    llama = harness.DraftSource(layer_path, DRAFT_NAMES)
    tensors = checkpoint_tensors(inputs.draft_dir)
    fc = [n for n in tensors if n.endswith("fc.weight") and "layers." not in n and "midlayer" not in n]
    if not fc or len(tensors[fc[0]].shape) != 2:
        raise PatchcraftError(f"{inputs.draft_dir}: no 2-d fc.weight among the draft's tensors")
    try:
        shape = harness.draft_shape(config, tensors[fc[0]].shape[1], eagle3)
    except (KeyError, TypeError, ValueError) as exc:
        raise PatchcraftError(f"{inputs.draft_dir / 'config.json'}: {exc}") from None
    if tensors[fc[0]].shape[1] % shape.hidden_in:
        raise PatchcraftError(
            f"the draft's fc takes {tensors[fc[0]].shape[1]} inputs, no multiple of its target_hidden_size {shape.hidden_in}"
        )
    dump = open_dump(inputs.data, inputs.states)
    if dump.hidden_size != shape.hidden_in:
        raise PatchcraftError(
            f"{inputs.data}: its states are {dump.hidden_size} wide, but the draft takes states {shape.hidden_in} wide "
            "(target_hidden_size, else hidden_size): a dump of another target"
        )
    if len(dump.states) < shape.states:
        raise PatchcraftError(
            f"{inputs.data}: holds {len(dump.states)} states ({_text(dump.states)}), the draft's fc takes {shape.states}"
        )
    if inputs.served is not None and inputs.served_strict:
        absent = [s for s in inputs.served if s not in dump.states]
        if absent or len(inputs.served) != shape.states:
            why = (
                f"the dump holds no {_text(absent)}"
                if absent
                else f"the draft takes {shape.states} states, not {len(inputs.served)}"
            )
            raise PatchcraftError(f"--served {_text(inputs.served)}: {why}")
    dtype = harness.COMPUTE_DTYPE
    try:
        loaded = harness.load_draft(eagle3, shape, tensors, dtype)
        embedding, where = _embedding(harness, loaded, inputs, shape)
        required = [n for n in loaded.missing if n != "model.embed_tokens.weight"]
        if required:
            raise PatchcraftError(
                f"{inputs.draft_dir}: {eagle3_path.name}'s load_weights found no tensor for {required[0]}"
            )
        step = harness.DraftStep(eagle3, llama, shape, loaded, embedding, dtype)
        return _search(harness, inputs, dump, step, shape.states, where, eagle3_path)
    except HarnessError as exc:
        raise PatchcraftError(f"the probe cannot run {eagle3_path.name} of {inputs.tree.version}: {exc}") from None


def _embedding(harness: Any, loaded: Any, inputs: ProbeInputs, shape: Any) -> tuple[Any, str]:
    if "model.embed_tokens.weight" in loaded.weights:
        return loaded.weights["model.embed_tokens.weight"], f"the draft's embed_tokens ({inputs.draft_dir})"
    if inputs.target_dir is None:
        raise PatchcraftError(
            f"{inputs.draft_dir}: the draft has no embed_tokens.weight: pass --target DIR, the target's checkpoint "
            "(only its embedding tensor is read)"
        )
    ref = target_embedding(inputs.target_dir)
    if len(ref.shape) != 2 or ref.shape[1] != shape.hidden:
        raise PatchcraftError(
            f"{ref.path}: the embedding is {list(ref.shape)}, the draft's hidden_size is {shape.hidden}"
        )
    return harness.tensor_of(ref), f"the target's {embedding_name([ref.path.name]) or 'embedding'} in {ref.path}"


def _search(
    harness: Any, inputs: ProbeInputs, dump: Dump, step: Any, slots: int, where: str, code: Path
) -> ProbeReport:
    candidates = wirings(dump.states, slots, inputs.max_wirings)
    samples = harness.load_samples(dump.samples(), inputs.tokens)
    available = sum(s.scored for s in samples)
    if available == 0:
        raise PatchcraftError(f"{inputs.data}: no sequence of 3 tokens or more to score")
    screen = min(inputs.screen, available)
    served = inputs.served if inputs.served is not None and inputs.served in candidates else None
    done: dict[tuple[int, ...], Any] = {}

    def run(wiring: tuple[int, ...], tokens: int, label: str, index: int, total: int) -> Any:
        if inputs.progress is not None:
            inputs.progress(label, index, total)
        return harness.score(step, samples, wiring, inputs.top_k, tokens)

    for index, wiring in enumerate(candidates):
        done[wiring] = run(wiring, screen, f"screening {_text(wiring)}", index, len(candidates))
    if screen < available:
        ranked = sorted(done.values(), key=_key)
        close = [s.wiring for s in ranked[1:3] if ranked[0].top1_rate - s.top1_rate < CLOSE]
        confirm = [ranked[0].wiring] + close + ([served] if served else [])
        for index, wiring in enumerate(dict.fromkeys(confirm)):
            done[wiring] = run(wiring, available, f"scoring {_text(wiring)}", index, len(confirm))
    # Rates are comparable across sample sizes: a screened wiring ranks by its screen, a confirmed one by all positions.
    ranked = sorted(done.values(), key=_key)
    scores = tuple(WiringScore(s.wiring, s.tokens, s.top1_rate, s.topk_rate) for s in ranked)
    return ProbeReport(
        draft=inputs.draft_dir,
        dump=dump,
        engine=inputs.engine.name,
        version=inputs.tree.version,
        draft_code=code,
        embedding=where,
        tokens=available,
        top_k=inputs.top_k,
        wirings=len(candidates),
        scores=scores,
        served=_served(inputs, dump, scores),
    )


def _key(score: Any) -> tuple:
    return (-score.top1_rate, -score.topk_rate, score.wiring)


def _served(inputs: ProbeInputs, dump: Dump, scores: Sequence[WiringScore]) -> Optional[Served]:
    if inputs.served is None:
        return None
    missing = tuple(s for s in inputs.served if s not in dump.states)
    for rank, found in enumerate(scores, 1):
        if found.states == inputs.served:
            return Served(inputs.served, inputs.served_how, found, rank)
    slots = len(scores[0].states)
    if missing:
        problem = f"the dump holds no {_text(missing)}"
    elif len(inputs.served) != slots:
        problem = f"{len(inputs.served)} states, the draft's fc takes {slots}: SGLang cannot run it"
    else:
        problem = "not among the wirings tried"
    return Served(inputs.served, inputs.served_how, None, None, missing, problem)


def served_states(
    tree: SglangTree, model_name: Optional[str], layer_ids: Optional[Sequence[int]], num_layers: int
) -> tuple[tuple[int, ...], str]:
    """What this install feeds a draft with ``layer_ids`` (check-draft's reading, proven on the harness when it runs)."""
    from patchcraft.analysis.explain import explain
    from patchcraft.analysis.target_model import RUN, load_model

    result = explain(load_model(tree, model_name), layer_ids, num_layers)
    how = "run on the CPU harness" if result.source == RUN else "static reading"
    ids = list(layer_ids) if layer_ids is not None else "none (the default)"
    return tuple(result.served), f"{result.model} on {result.version}, draft ids {ids}: {how}"


def _text(states: Sequence[int]) -> str:
    return ", ".join(f"hs[{s}]" for s in states) if states else "nothing"


states_text = _text
