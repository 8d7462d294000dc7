"""The rows of what vLLM serves from ``vllm/models/<family>/`` (0.22+), per platform (docs/vllm.md).

Each family's ``__init__.py`` picks, per platform, the class it serves for
an architecture (:mod:`patchcraft.reading.vllm_families`, its code run on
a stand-in ``current_platform``). That gives:

- **a row per served family class** (``kimi_k3.nvidia.KimiLinearForCausalLM``:
  the family, its platform subpackage, the class), planned as a class of
  ``model_executor/models`` is (its ``self.model``, or the language model
  it builds, resolved for the same platforms), its notes saying which
  architectures it serves on which platforms, from which ``__init__.py``
  line, and which platforms the family refuses. A forward that captures
  through ``EagleModelMixin._maybe_add_hidden_state`` gets the mixin's
  one edit (``interfaces.py``); a layer loop capturing at the top of each
  layer (0.33's ``DeepseekV32Model.forward``, ``nvidia/`` and ``amd/``) the
  ``vllm-forward`` edit in the platform's own file, proven on the harness
  running that module; one appending the embedding tensor itself before the
  loop (Kimi-Linear's ``nvidia/model.py``) the ``vllm-before-loop`` edit, a
  copy of that entry; any other capture is read by what it does
  (:mod:`patchcraft.reading.vllm_captures`) and said, with no edit yet;
- **notes on the rows of ``model_executor/models``** classes a family falls
  back to (0.32's ``deepseek_v2.DeepseekV3ForCausalLM`` serves
  ``DeepseekV32ForCausalLM`` on XPU and CPU), and whether a class named as a
  family's architecture is served on any platform at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Optional

from patchcraft.planning.records import ModelPlan
from patchcraft.reading.class_graph import ClassNode
from patchcraft.reading.vllm_families import PLATFORMS, Served
from patchcraft.reading.vllm_graph import DRAFTS, SETTER, VllmGraph, family_module

#: ``_plan(graph, outer, resolve)``: vllm_plans' planner, handed the language-model resolver of the platforms.
Planner = Callable[[VllmGraph, ClassNode, Callable[[str], Optional[ClassNode]]], ModelPlan]


@dataclass(frozen=True)
class Dispatch:
    """The family dispatch of one tree, by architecture."""

    served: tuple[Served, ...]

    def of(self, architecture: str) -> list[Served]:
        return [s for s in self.served if s.architecture == architecture]

    def platforms_serving(self, stem: str, cls: str) -> dict[str, list[Served]]:
        """``{architecture: [served]}`` for the platforms on which a family serves ``model_executor``'s ``stem.cls``."""
        found: dict[str, list[Served]] = {}
        for s in self.served:
            if s.in_models and s.stem == stem and s.cls == cls:
                found.setdefault(s.architecture, []).append(s)
        return found


def platforms_said(served: Sequence[Served]) -> str:
    """``xpu, cpu (models/deepseek_v32/__init__.py:30)``: the platforms, and the lines that chose them."""
    lines = sorted({s.where for s in served})
    return f"{', '.join(s.platform for s in served)} ({', '.join(lines)})"


def fallback_notes(dispatch: Dispatch, plan: ModelPlan, engine: str) -> ModelPlan:
    """A ``model_executor/models`` row a family falls back to: which architectures it serves where."""
    serving = dispatch.platforms_serving(plan.module, plan.cls)
    notes = tuple(
        f"{engine} serves {architecture} with this class on {platforms_said(found)}"
        for architecture, found in sorted(serving.items())
    )
    return replace(plan, notes=plan.notes + notes) if notes else plan


def named_architecture(dispatch: Dispatch, plan: ModelPlan, engine: str) -> Optional[ModelPlan]:
    """A target of ``model_executor/models`` whose class name is an architecture a family serves: None when some
    platform serves it with this class (the row stands, with its notes), else the row saying where it is served."""
    found = dispatch.of(plan.cls)
    if not found or any(s.in_models and s.stem == plan.module and s.cls == plan.cls for s in found):
        return None
    where = "; ".join(f"{s.platform}: {s.refused}" if s.refused else f"{s.platform}: {_file(s)}.{s.cls}" for s in found)
    return replace(
        plan,
        sites=(),
        not_applicable=False,
        unsupported=f"{engine} never serves {plan.cls} with this class: its registry maps it to a family "
        f"package, which serves on each platform ({where})",
    )


def family_rows(
    graph: VllmGraph, dispatch: Dispatch, engine: str, planner: Planner, taken: set[str]
) -> list[ModelPlan]:
    """One row per class a family serves on some platform (platforms with the same plan merged)."""
    by_class: dict[tuple[str, str], list[Served]] = {}
    for s in dispatch.served:
        if s.module and not s.in_models and not DRAFTS.search(s.architecture) and not DRAFTS.search(s.cls):
            by_class.setdefault((family_module(s.module), s.cls), []).append(s)
    refused = {s.architecture: s for s in dispatch.served if s.refused}
    rows: list[ModelPlan] = []
    for (module, cls), served in sorted(by_class.items()):
        try:
            loaded = graph.load(module)
        except Exception:  # a file that does not parse serves nothing patchcraft can read  # noqa: BLE001
            loaded = False
        outer = graph.classes.get((module, cls)) if loaded else None
        if outer is None:
            continue
        if graph.find_method(outer, SETTER) is None:
            row = _no_setter(graph, dispatch, outer, served, family_of(module), engine)
            if row is not None and row.label not in taken:
                taken.add(row.label)
                rows.append(row)
            continue  # no EAGLE-3 target on these platforms (a stub, a model without the setter)
        groups: dict[tuple, list[str]] = {}
        plans: dict[tuple, ModelPlan] = {}
        for platform in [p for p in PLATFORMS if any(s.platform == p for s in served)]:
            plan = planner(graph, outer, functools.partial(_resolve_on, graph, dispatch, platform))
            key = (plan.sites, plan.unsupported, plan.not_applicable, plan.notes)
            groups.setdefault(key, []).append(platform)
            plans[key] = plan
        for key, platforms in groups.items():
            label_module = _label_module(module, platforms, len(groups) > 1)
            plan = plans[key]
            on = [s for s in served if s.platform in platforms]
            notes = [
                f"{engine} serves {architecture} with this class on "
                f"{platforms_said([s for s in on if s.architecture == architecture])}"
                for architecture in sorted({s.architecture for s in on})
            ]
            notes += [
                f"not served on {r.platform}: {r.refused} ({r.where})"
                for architecture in sorted({s.architecture for s in on})
                for r in dispatch.of(architecture)
                if r.refused and architecture in refused
            ]
            row = replace(
                plan,
                module=label_module,
                cls=cls,
                path=outer.path,
                notes=tuple(dict.fromkeys((*plan.notes, *notes))),
                platforms=tuple(platforms),
            )
            if row.label in taken:
                row = replace(row, module=f"{label_module}.{module.rpartition('.')[2]}")
            taken.add(row.label)
            rows.append(row)
    return rows


def _no_setter(
    graph: VllmGraph, dispatch: Dispatch, outer: ClassNode, served: list[Served], label: str, engine: str
) -> Optional[ModelPlan]:
    """A class a family serves for an architecture that is an EAGLE-3 target on another platform (0.33's ROCm and
    XPU ``KimiLinearForCausalLM``, ``amd/linear.py``): said, as vLLM's own check refuses EAGLE-3 there."""
    others = [
        s
        for a in {s.architecture for s in served}
        for s in dispatch.of(a)
        if s.module and (s.module, s.cls) != (served[0].module, served[0].cls) and _is_target(graph, s)
    ]
    if not others:
        return None
    return ModelPlan(
        module=label,
        cls=outer.name,
        path=outer.path,
        not_applicable=True,
        unsupported=f"not an EAGLE-3 target on {platforms_said(served)}: {engine}'s {outer.label} has no "
        f"{SETTER} in its MRO (the target of {', '.join(sorted({s.platform for s in others}))} is "
        f"{others[0].file or others[0].module}'s)",
    )


def _is_target(graph: VllmGraph, s: Served) -> bool:
    module = family_module(s.module)
    node = graph.classes.get((module, s.cls)) if graph.load(module) else None
    return node is not None and graph.find_method(node, SETTER) is not None


def _resolve_on(graph: VllmGraph, dispatch: Dispatch, platform: str, architecture: str) -> Optional[ClassNode]:
    return language_model_class(graph, dispatch, architecture, platform)


def language_model_class(graph: VllmGraph, dispatch: Dispatch, architecture: str, platform: str) -> Optional[ClassNode]:
    """The class vLLM builds for ``architecture`` on ``platform`` when the family dispatches it; None otherwise."""
    for s in dispatch.of(architecture):
        if s.platform == platform and s.module:
            module = family_module(s.module)
            return graph.classes.get((module, s.cls)) if graph.load(module) else None
    return None


def family_of(module: str) -> str:
    """``models.kimi_k3.nvidia.model`` -> ``kimi_k3.nvidia`` (the family and its platform subpackage)."""
    parts = module.split(".")[1:-1]
    return ".".join(parts) if parts else module


def _label_module(module: str, platforms: list[str], split: bool) -> str:
    base = family_of(module)
    return f"{base}.{'-'.join(platforms)}" if split else base


def _file(s: Served) -> str:
    return s.file.removesuffix(".py") if s.file else s.module
