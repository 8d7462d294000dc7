"""The training presets: which hidden states a draft was trained on.

``--trained-on`` names how a draft was trained; this module turns that,
the draft config's ids and the target's layer count into the states the
draft takes, in Hugging Face numbering (``hs[0]`` embedding, ``hs[k]`` the
output of layer ``k-1``, before the final norm). Each preset follows the
training code it is named after, as read in its repository
(docs/layer-ids.md names the file and function of each):

- ``specforge`` (``specforge@0.5.14``): SpecForge since it pinned SGLang
  0.5.14. It passes the ids to SGLang's own ``set_eagle3_layers_to_capture``,
  so id ``i`` is ``hs[i+1]``, except on the models whose 0.5.14 setter keeps
  the ids raw unless the first is 1 (``deepseek_v2`` and ``glm4_moe_lite``):
  there ``hs[i]``. It rejects negative ids. No ids: ``[1, n//2-1, n-4]``.
- ``specforge@X`` with an SGLang release ``X`` before 0.5.13 (SpecForge
  pinned 0.5.4, then 0.5.6): the same, with the +1 rule on every model and
  ``-1`` read as the embedding (a patched SGLang).
- ``speculators``: the current format, data extracted by vLLM (id ``j`` is
  ``hs[j]``, 0 the embedding). The data's last id is the verifier's state,
  ``n``: a list one longer than the fc takes drops it. No ids:
  ``[2, n//2, n-3]``.
- ``speculators@0.4``: data from the v0.3/v0.4 ``custom_worker``, which
  appends after each layer: id ``j`` is ``hs[j+1]``, no embedding. No ids:
  ``[2, n//2, n-3]`` (and ``n-1``, the verifier's state).
- ``eagle``: SafeAILab EAGLE's eagle3 training, the inputs of layers 2,
  ``n//2`` and ``n-3``; its configs hold no ids.
- the layer-output pipelines (``LAYER_OUTPUT``): ``modelopt`` (NVIDIA
  Model-Optimizer), ``torchspec``, ``angelslim`` (Tencent AngelSlim) and
  ``automodel`` (NeMo Automodel) hook the output of layer ``j``: id ``j`` is
  ``hs[j+1]``, no embedding, defaults ``[1, n//2-1, n-4]``. Each reads its
  ids where that pipeline writes them into the exported config, or takes
  its defaults where it writes none. Two versioned exceptions passed the
  ids to vLLM's ``extract_hidden_states`` unshifted, so id ``j`` is
  ``hs[j]``: ``modelopt@vllm-dump`` and ``torchspec@vllm-ebf869e``.
- ``measured:REPORT``: the best wiring ``patchcraft probe`` measured by
  running the draft's weights on its training states (``hf:`` states).
- ``hf:0,3,31``: the states themselves (``hs[n]`` of Hugging Face's
  ``hidden_states`` is after the final norm, which no engine captures).

``speculators-v1``, the name of the current speculators meaning before
these presets, still works and says it is deprecated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from patchcraft.base.errors import PatchcraftError

DEPRECATED = {"speculators-v1": "speculators"}

#: SGLang model files whose setter keeps the ids raw unless the first id is 1,
#: in 0.5.13 and 0.5.14 (the release SpecForge captures through);
#: tests/analysis/test_training.py reads them from the real 0.5.14.
FIRST_ID_RAW = frozenset({"deepseek_v2", "glm4_moe_lite"})

#: The SGLang release current SpecForge pins (its pyproject.toml, since 2026-06-27).
SPECFORGE_SGLANG = (0, 5, 14)
_HEURISTIC_FROM = (0, 5, 13)  # the first release with the first-id heuristic


class DraftIds(Protocol):
    """What the presets read of a draft config (``patchcraft.reading.draft_config.DraftConfig``)."""

    @property
    def layer_ids(self) -> tuple[int, ...] | None: ...  # eagle_config's

    @property
    def top_level_ids(self) -> tuple[int, ...] | None: ...  # eagle_aux_hidden_state_layer_ids at the top level

    @property
    def raw(self) -> Mapping[str, Any]: ...  # the whole config.json, for fields no engine reads

    @property
    def path(self) -> Path: ...


@dataclass(frozen=True)
class Training:
    """How the draft was trained: a preset, or the HF states themselves."""

    kind: str  # "hf" | "specforge" | "speculators" | "speculators@0.4" | "eagle"
    states: tuple[int, ...] = ()
    sglang: tuple[int, ...] = SPECFORGE_SGLANG  # specforge only: the release it captured through
    deprecation: str = ""  # one line when the name given is deprecated
    source: str = ""  # hf states measured by ``patchcraft probe``: ``measured:REPORT`` (its label)

    @property
    def label(self) -> str:
        if self.source:
            return self.source
        if self.kind == "hf":
            return f"hf:{','.join(map(str, self.states))}"
        if self.kind == "specforge" and self.sglang != SPECFORGE_SGLANG:
            return "specforge@" + ".".join(map(str, self.sglang))
        return self.kind


def parse_training(text: str) -> Training:
    """``hf:0,3,31``, ``specforge``, ``specforge@0.5.6``, ``speculators``, ``speculators@0.4`` or ``eagle``."""
    value = text.strip().lower()
    if value in DEPRECATED:
        new = DEPRECATED[value]
        return Training(
            new,
            deprecation=f"--trained-on {value} is deprecated: it means `{new}` (id j = hs[j]); "
            "data from speculators' v0.4 worker is `speculators@0.4`",
        )
    if value in ("specforge", "speculators", "speculators@0.4", "eagle") or value in LAYER_OUTPUT:
        return Training(value)
    found = re.fullmatch(r"specforge@(\d+)\.(\d+)\.(\d+)(?:\.post\d+)?", value)
    if found:
        return Training("specforge", sglang=tuple(int(g) for g in found.groups()))
    if value.startswith("measured:"):
        return measured_training(text.strip()[len("measured:") :])
    if value.startswith("hf:"):
        states = _states(value[3:])
        if states:
            return Training("hf", states)
    raise PatchcraftError(
        f"--trained-on {text!r}: expected hf:I,J,K (Hugging Face hidden_states indices, 0 = embedding), "
        "specforge, specforge@<SGLang release it captured through>, speculators, speculators@0.4, eagle, "
        + ", ".join(LAYER_OUTPUT)
    )


def measured_training(path: str) -> Training:
    """``measured:REPORT``: the best wiring of ``patchcraft probe --report REPORT`` (docs/probe.md), as ``hf:`` states.

    The probe ran the draft's own weights on its training states; its report
    is read here (JSON, no torch), so check-draft and ``patchcraft run`` take
    the measured wiring as the training states.
    """
    import json

    try:
        document = json.loads(open(path, encoding="utf-8").read())
    except FileNotFoundError:
        raise PatchcraftError(f"--trained-on measured:{path}: no such file (see patchcraft probe --report)") from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise PatchcraftError(f"--trained-on measured:{path}: not a probe report ({exc})") from None
    best = document.get("best") if isinstance(document, dict) and document.get("command") == "probe" else None
    states = best.get("states") if isinstance(best, dict) else None
    if not (isinstance(states, list) and states and all(isinstance(s, int) and s >= 0 for s in states)):
        raise PatchcraftError(f"--trained-on measured:{path}: not a patchcraft probe report (no best.states)")
    top1 = best.get("top1") if isinstance(best, dict) else None
    measured = f", top-1 {top1 * 100:.0f}%" if isinstance(top1, (int, float)) else ""
    return Training("hf", tuple(states), source=f"measured:{path} ({_hs(states)}{measured})")


def _hs(states: Sequence[int]) -> str:
    return ", ".join(f"hs[{s}]" for s in states)


def _states(text: str) -> tuple[int, ...]:
    try:
        states = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        return ()
    return states if all(s >= 0 for s in states) else ()


@dataclass(frozen=True)
class Expected:
    """The states the draft takes, how they were read, and why they cannot be served ("" if they can)."""

    states: tuple[int, ...]
    how: str
    problem: str = ""


def expected_states(
    training: Training | None,
    draft: DraftIds,
    fc_states: int | None,
    num_layers: int,
    setter_modules: Sequence[str] = (),
    is_speculators: bool = False,
) -> Expected | None:
    """The states the draft was trained on (None: not known).

    ``setter_modules`` are the model files whose setters run for this model
    (delegation first): SpecForge's meaning depends on them. Without
    ``--trained-on``, a speculators-format config with ids is read as
    ``speculators``.
    """
    if training is None:
        if not (is_speculators and draft.top_level_ids):
            return None
        training = Training("speculators")
    if training.kind == "hf":
        return _hf(training, num_layers)
    if training.kind == "specforge":
        return _specforge(training, draft.layer_ids, num_layers, setter_modules)
    if training.kind in LAYER_OUTPUT:
        return _layer_output(training.kind, draft, num_layers)
    if training.kind == "eagle":
        n = num_layers
        return Expected(
            (2, n // 2, n - 3), f"eagle: EAGLE's eagle3 training takes the inputs of layers 2, {n // 2}, {n - 3}"
        )
    return _speculators(training.kind, draft.top_level_ids or draft.layer_ids, fc_states, num_layers)


def _hf(training: Training, num_layers: int) -> Expected:
    how = f"--trained-on {training.label}"
    if num_layers in training.states:
        return Expected(
            training.states,
            how,
            (
                f"hs[{num_layers}] of Hugging Face's hidden_states is after the final norm; "
                f"SGLang captures layer outputs before it, so no id feeds it"
            ),
        )
    return Expected(training.states, how)


def _specforge(
    training: Training, ids: tuple[int, ...] | None, num_layers: int, setter_modules: Sequence[str]
) -> Expected:
    label, n = training.label, num_layers
    if not ids:
        ids, source = (1, n // 2 - 1, n - 4), f"{label} defaults [1, n//2-1, n-4] for {n} layers"
    else:
        source = f"{label} ids {list(ids)}"
    current = training.sglang >= SPECFORGE_SGLANG
    negative = [i for i in ids if i < 0]
    if negative and (current or negative != [-1] * len(negative)):
        why = "SpecForge rejects negative ids" if current else "only -1 (the embedding) is a negative id"
        return Expected(tuple(i + 1 for i in ids), source, f"id {negative[0]} has no meaning under {label}: {why}")
    if current and len(ids) != 3:
        return Expected(
            tuple(i + 1 for i in ids),
            source,
            f"{label} captures exactly three layers, not {len(ids)}: SpecForge rejects this list",
        )
    raw = training.sglang >= _HEURISTIC_FROM and ids[0] != 1 and bool(FIRST_ID_RAW & set(setter_modules))
    if raw:
        release = ".".join(map(str, training.sglang))
        return Expected(
            tuple(ids), f"{source}: SGLang {release}'s setter keeps them raw (first id is not 1), id i = hs[i]"
        )
    return Expected(tuple(i + 1 for i in ids), f"{source}: output of layer i = hs[i+1]")


def _speculators(kind: str, ids: tuple[int, ...] | None, fc_states: int | None, num_layers: int) -> Expected:
    n, old = num_layers, kind == "speculators@0.4"
    if not ids:
        ids, source = (2, n // 2, n - 3), f"{kind} defaults [2, n//2, n-3] for {n} layers"
    else:
        source = f"{kind} ids {list(ids)}"
    states = tuple(i + 1 for i in ids) if old else tuple(ids)
    how = source + (": appended after layer j = hs[j+1], no embedding" if old else ": id j = hs[j], 0 = embedding")
    if fc_states is not None and len(states) == fc_states + 1:
        states, how = states[:-1], how + "; the last entry is the verifier's state, not a draft input"
    bad = [i for i in ids if i < 0]
    if bad:
        return Expected(
            states, how, f"id {bad[0]} has no meaning under {kind} ({'no embedding' if old else '0 is the embedding'})"
        )
    return Expected(states, how)


# -- the layer-output pipelines -------------------------------------------------------

EAGLE_CONFIG_IDS = "eagle_config.eagle_aux_hidden_state_layer_ids"  # the only field SGLang reads


@dataclass(frozen=True)
class LayerOutput:
    """A pipeline that hooks one decoder layer per id (docs/layer-ids.md cites the code read)."""

    pipeline: str
    shift: int  # 1: id j is the output of layer j, hs[j+1]; 0: id j is hs[j] (vLLM's capture, unshifted)
    ids_from: str = ""  # the config field its export writes the ids to; "" = it writes none
    layer_order: bool = False  # its hooks fire in layer order, whatever the order of the ids
    writes: str = ""  # what it writes instead, said when the config's ids are not read


#: The presets, each as read in its repository (docs/layer-ids.md names file and commit).
LAYER_OUTPUT: dict[str, LayerOutput] = {
    "modelopt": LayerOutput("Model-Optimizer", 1, EAGLE_CONFIG_IDS, layer_order=True),
    "modelopt@vllm-dump": LayerOutput(
        "Model-Optimizer's vLLM hidden-state dump", 0, EAGLE_CONFIG_IDS, layer_order=True
    ),
    "torchspec": LayerOutput(
        "TorchSpec", 1, writes="its ids are the YAML's inference.aux_hidden_states_layers, never written to the config"
    ),
    "torchspec@vllm-ebf869e": LayerOutput(
        "TorchSpec's vLLM backend",
        0,
        writes="its ids are the YAML's inference.aux_hidden_states_layers, never written to the config",
    ),
    "angelslim": LayerOutput("AngelSlim", 1, "aux_hidden_states_layer_ids"),
    "automodel": LayerOutput(
        "NeMo Automodel", 1, writes="its ids are recipe_args.aux_layer_ids, never written to the config"
    ),
}


def _config_field(draft: DraftIds, path: str) -> tuple[int, ...] | None:
    """The ids at dotted ``path`` of the draft config (None: absent)."""
    if path == EAGLE_CONFIG_IDS:
        return draft.layer_ids  # read_draft checked them
    value: Any = draft.raw
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    raise PatchcraftError(f"{draft.path}: {path}: expected a list of integers, got {value!r}")


def _layer_output(name: str, draft: DraftIds, num_layers: int) -> Expected:
    preset, n = LAYER_OUTPUT[name], num_layers
    meaning = "output of layer j = hs[j+1], no embedding" if preset.shift else "id j = hs[j] (vLLM's capture)"
    defaults = f"{name} defaults [1, n//2-1, n-4] for {n} layers"
    ids = _config_field(draft, preset.ids_from) if preset.ids_from else None
    if ids:
        source = f"{name} ids {list(ids)} from {preset.ids_from}"
        if preset.ids_from != EAGLE_CONFIG_IDS:
            source += " (which neither SGLang nor vLLM reads)"
    else:
        ids = (1, n // 2 - 1, n - 4)
        if preset.ids_from:
            source = f"{defaults} (no {preset.ids_from} in the config)"
        else:
            source = f"{defaults} ({preset.writes})"
            found = draft.layer_ids or draft.top_level_ids
            if found and tuple(found) != ids:
                hf = ",".join(str(i + preset.shift) for i in found)
                source += (
                    f"; the config's ids {list(found)} are not {preset.pipeline}'s"
                    f" (trained on them? say --trained-on hf:{hf})"
                )
    if preset.layer_order:
        ids = tuple(sorted(set(ids)))
    states = tuple(i + preset.shift for i in ids)
    how = f"{source}: {meaning}"
    outside = [i for i in ids if not 0 <= i < n]
    if outside:
        return Expected(
            states, how, f"id {outside[0]} has no meaning under {name}: layers are 0..{n - 1} ({preset.pipeline})"
        )
    return Expected(states, how)
