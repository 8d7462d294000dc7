"""The model class explained, its install, and the states it serves for a list of aux layer ids.

- the class is planning's choice (:func:`patchcraft.planning.model_choice.choose_model`),
  its edit sites the engine's plan (:mod:`patchcraft.planning.model_plans`);
- "patched" is the engine's verify verdict on the plan's sites
  (:func:`patchcraft.engine.file_patch.patch_text`); the same call gives the patched
  text, which answers "what would these ids do after ``patchcraft apply``";
- the states served are read by rules (:func:`serve`: the release's setter run on
  stand-ins, :mod:`patchcraft.reading.setter_sandbox`, against what its forward
  captures, :mod:`patchcraft.reading.capture_reading`), or seen by running the
  setter and forward on the CPU harness (:func:`run_served`, the one torch user here).

Hidden states are numbered as Hugging Face does: ``hs[0]`` is the embedding
output and ``hs[k]`` the output of decoder layer ``k-1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.sources import read_source
from patchcraft.base.status import EDIT_IN_PLACE, EditKind
from patchcraft.base.target import SglangTree
from patchcraft.engine.file_patch import patch_text
from patchcraft.planning.model_choice import choose_model
from patchcraft.planning.id_source import IdSource, id_source
from patchcraft.planning.model_plans import plan_model
from patchcraft.planning.records import EditSite, ModelPlan
from patchcraft.reading.capture_reading import reachable, sets_marks, static_unknown
from patchcraft.reading.class_graph import ClassNode, ModelGraph
from patchcraft.reading.setter_sandbox import NotEvaluable, SetterRun, run_setter

if TYPE_CHECKING:
    from patchcraft.harness.outcomes import RunOutcome

#: The source of the served states: the code ran on the CPU harness, or the static reading.
RUN, STATIC = "run", "static"


def hs(index: int) -> str:
    return f"hs[{index}]"


def describe_state(index: int) -> str:
    """``hs[0]`` is the embedding output, ``hs[k]`` the output of layer ``k-1``."""
    return "embedding output" if index == 0 else f"output of layer {index - 1}"


def states_text(states: Iterable[int]) -> str:
    items = [hs(s) for s in states]
    return ", ".join(items) if items else "nothing"


@dataclass
class Model:
    """One model class of one SGLang tree, with what the engine says about it."""

    tree: SglangTree
    graph: ModelGraph
    cls: ClassNode
    plan: ModelPlan
    patched: bool
    patch_detail: str
    patched_texts: dict[Path, str] = field(default_factory=dict)
    _patched_graph: ModelGraph | None = None
    _id_source: IdSource | None = None

    @property
    def label(self) -> str:
        return self.cls.label

    def id_source(self) -> IdSource:
        """Where this tree's model runner reads the ids it passes to the setter (read once)."""
        if self._id_source is None:
            self._id_source = id_source(self.tree)
        return self._id_source

    def patched_graph(self) -> ModelGraph:
        """The graph as it will be after ``patchcraft apply`` (patched text, in memory)."""
        if self.patched or not self.patched_texts:
            return self.graph
        if self._patched_graph is None:
            graph = ModelGraph(models_dir=self.graph.models_dir)
            for path, text in self.patched_texts.items():
                graph.load(path.stem, text.encode("utf-8"))
            self._patched_graph = graph
        return self._patched_graph


def load_model(tree: SglangTree, name: str | None) -> Model:
    """Find model ``name`` (file stem, class, or ``module.Class``) in ``tree``, with its patch state."""
    graph, cls = choose_model(tree, name)
    plan = plan_model(graph, cls)
    patched, detail, texts = _patch_state(plan)
    return Model(tree=tree, graph=graph, cls=cls, plan=plan, patched=patched, patch_detail=detail, patched_texts=texts)


def _patch_state(plan: ModelPlan) -> tuple[bool, str, dict[Path, str]]:
    """The engine's verify verdict for ``plan``, and the text ``apply`` would write."""
    if plan.unsupported and is_draft_head(plan):
        return False, f"not a target: {plan.label} is an EAGLE-3 draft head {DRAFT_HEAD}", {}
    if plan.unsupported:
        return False, f"unsupported: {plan.unsupported}", {}
    by_file: dict[Path, list[EditSite]] = {}
    for site in plan.sites:
        by_file.setdefault(site.path, []).append(site)
    statuses: list[str] = []
    texts: dict[Path, str] = {}
    for path, sites in by_file.items():
        text = read_source(path).text
        patch = patch_text(text, path, sites)
        if patch.errors:
            return (
                False,
                f"not patched for -1, and `patchcraft apply` cannot patch it: {next(iter(patch.errors.values()))}",
                {},
            )
        statuses += [patch.outcomes[s.key].status for s in sites]
        if patch.after != text:
            texts[path] = patch.after
    if all(s in EDIT_IN_PLACE for s in statuses):
        return True, "patched for -1", {}
    kinds = [site.kind for sites in by_file.values() for site in sites]
    missing = sorted({kind for kind, status in zip(kinds, statuses) if status not in EDIT_IN_PLACE})
    for_minus_one = [kind for kind in missing if kind not in FUSION_KINDS]
    if not for_minus_one:  # the layer marks matter only at TP > 1 with all-reduce fusion (docs/fusion.md)
        return True, "patched for -1 (the fusion-mark edit, for TP > 1, is not)", texts
    return False, f"not patched for -1: {', '.join(for_minus_one)} edit missing", texts


#: The edits that keep captured states reduced at TP > 1: not part of being patched for -1.
FUSION_KINDS = (EditKind.FUSION, EditKind.FUSION_MARK)


#: What a draft head is, said where the user named one (``--model LlamaForCausalLMEagle3``).
DRAFT_HEAD = (
    "(the model a draft config describes): it captures no hidden states itself, and patchcraft patches "
    "the target that feeds it, not the draft; name the target model (--model, or --target's architectures)"
)


def is_draft_head(plan: ModelPlan) -> bool:
    """A class with no aux capture of its own whose name says it is a draft or NextN/MTP head."""
    name = plan.cls
    return plan.not_applicable and any(word in name for word in ("Eagle", "NextN", "MTP"))


def apply_helps(model: Model) -> bool:
    """Whether ``patchcraft apply`` would change this model (not unsupported, something to write)."""
    return not model.plan.unsupported and bool(model.patched_texts)


@dataclass(frozen=True)
class Served:
    """What the draft is fed for one id list: the states, in forward order."""

    run: SetterRun
    states: tuple[int, ...]
    reachable: frozenset[int]
    #: Why the static reading cannot tell what is served ("" when it can): the run decides.
    unknown: str = ""

    @property
    def unsafe_embedding(self) -> bool:
        """``hs[0]`` comes from ``layers_to_capture`` 0, not from patchcraft's cloned capture."""
        return 0 in (self.run.layers_to_capture or ()) and 0 in self.reachable


def serve(model: Model, layer_ids: Sequence[int] | None, num_layers: int, after_apply: bool = False) -> Served:
    """The states SGLang feeds the draft for ``layer_ids`` (None: the default call), read by rules."""
    graph = model.patched_graph() if after_apply else model.graph
    cls = graph.classes.get(model.cls.key) if after_apply else model.cls
    if cls is None:  # the class's own module was not patched: load it as it is
        graph.load(model.cls.module)
        cls = graph.classes[model.cls.key]
    try:
        run = run_setter(graph, cls, layer_ids, num_layers)
    except NotEvaluable as exc:
        raise PatchcraftError(f"{model.label}: cannot evaluate the setter statically: {exc}") from None
    reach = reachable(graph, run.holder, num_layers, marks=sets_marks(run))
    if run.error or run.layers_to_capture is None:
        return Served(run, (), reach)
    loop = sorted({v for v in run.layers_to_capture if v in reach})
    return Served(run, ((0,) if run.embedding else ()) + tuple(loop), reach, static_unknown(graph, run, reach))


def run_served(
    model: Model, layer_ids: Sequence[int] | None, num_layers: int, after_apply: bool = False
) -> "RunOutcome | None":
    """Run the setter and forward on the CPU harness (None without torch).

    What runs is what the server would import: the files of ``model``'s
    tree as they are (the install, patched or not, or an overlay's tree),
    or with ``after_apply`` the texts ``patchcraft apply`` would write.
    """
    from patchcraft.harness import run_cache
    from patchcraft.harness.outcomes import outcome_data, outcome_of

    texts = model.patched_texts if after_apply else None
    asked = (model.plan.label, None if layer_ids is None else tuple(layer_ids), num_layers)

    def run() -> "RunOutcome | None":
        from patchcraft.harness import torch_problem

        if torch_problem() is not None:
            return None
        from patchcraft.harness.served import run_ids

        return run_ids(model.tree.package, model.graph, model.plan, layer_ids, num_layers, texts)

    # the same run on the same bytes answers from the cache, before torch is imported
    return run_cache.remembered("served", model.tree.package, texts, asked, run, outcome_data, outcome_of)


def fusion_defect(model: Model) -> str | None:
    """At TP > 1: the partial-sum warning when this model's capture reads a deferred all-reduce sum
    (found through the class graph, the same detection as the allreduce-fusion edit)."""
    from patchcraft.transforms import keep_captured_states_reduced as fusion

    return fusion.defect(model.tree.package, model.graph, model.cls)


@dataclass(frozen=True)
class FusionCost:
    """What keeping captured states reduced at TP > 1 costs: the decoder layers that lose FlashInfer's fused kernel."""

    #: 0-based layers that run a separate all-reduce instead of the fused kernel (all of them under the server flag).
    layers: tuple[int, ...]
    #: The server runs with --enforce-disable-flashinfer-allreduce-fusion: every layer loses it.
    all_layers: bool
    text: str


def fusion_cost(model: Model, served: Sequence[int], num_layers: int, allreduce_fusion: bool = True) -> FusionCost:
    """The fusion cost at TP > 1 for the states ``served`` (docs/fusion.md, "What it costs now").

    ``allreduce_fusion`` False: the server runs with the flag that turns the
    fusion off, so every layer pays. Otherwise patchcraft's guard (``apply``)
    costs only the layers whose output a capture reads (``hs[k]`` is layer
    ``k-1``'s output; none for the embedding), and a model whose capture
    reads the reduced state costs nothing.
    """
    from patchcraft.reading.fusion_reading import read_capture
    from patchcraft.reading.server_args import NO_FUSION_FLAG

    every = tuple(range(num_layers))
    if not allreduce_fusion:
        text = (
            f"the server runs with {NO_FUSION_FLAG}: all {num_layers} layers run a separate all-reduce instead of "
            "FlashInfer's fused kernel"
        )
        return FusionCost(every, True, text)
    capture = read_capture(model.graph, model.cls)
    if capture is None or not capture.affected:
        return FusionCost((), False, "none: the captures read reduced states, so every layer keeps the fused kernel")
    layers = tuple(sorted({k - 1 for k in served if k >= 1}))
    named = ", ".join(map(str, layers)) if layers else "none"
    text = (
        f"with patchcraft's allreduce-fusion edit, layer{'s' if len(layers) != 1 else ''} {named} (whose output a "
        f"capture reads) run a separate all-reduce instead of the fused kernel, every other layer keeps it; "
        f"with {NO_FUSION_FLAG}, all {num_layers} layers lose it"
    )
    return FusionCost(layers, False, text)
