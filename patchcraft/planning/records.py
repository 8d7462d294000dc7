"""What planning returns: the edit sites of a model and its plan, with each model kind's parameters.

An :class:`EditSite` says where one edit goes (a method of a class in a
file) and carries its kind's :class:`~patchcraft.reading.class_graph.SiteParams`;
a :class:`ModelPlan` is one model class's sites, or why it cannot be
patched. :mod:`patchcraft.planning.model_plans` builds them from the class
graph, the transforms and the engine read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from patchcraft.reading.class_graph import SiteParams
from patchcraft.base.status import EditKind


@dataclass(frozen=True)
class SetterParams(SiteParams):
    """``setter``: the setter's names, which the block it gets is written with."""

    #: The inner model whose flag the setter sets.
    target: str = "self.model"
    #: The setter's ids parameter.
    param: str = "layer_ids"
    #: The pipeline group whose ``world_size > 1`` refuses -1, or "" (no check).
    pp: str = ""


@dataclass(frozen=True)
class ForwardParams(SiteParams):
    """``forward``: when the embedding output is captured, and how."""

    #: The first-pipeline-stage test joined to the flag, or "" (none).
    gate: str = ""
    #: The collector's ``append`` copies, so the capture makes no copy of its own.
    copies: bool = False


@dataclass(frozen=True)
class FusionParams(SiteParams):
    """``fusion``: the receiver of the guard's ``.is_eagle()`` (the speculative algorithm)."""

    algo: str


P = TypeVar("P", bound=SiteParams)


@dataclass(frozen=True)
class EditSite:
    """Where one edit goes: a method of a class in a file, plus its kind's parameters."""

    kind: EditKind
    path: Path
    module: str
    cls: str
    method: str
    #: The kind's :class:`SiteParams`, or None (``init`` has none; ``setter`` and ``forward`` then take their defaults).
    params: SiteParams | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (str(self.path), self.cls, self.kind)

    def params_as(self, kind: type[P]) -> P:
        """The parameters, as the ``kind`` they must be (its defaults when the site has none)."""
        if self.params is None:
            return kind()
        if not isinstance(self.params, kind):
            raise TypeError(
                f"{self.kind} site {self.cls}.{self.method} has {type(self.params).__name__}, not {kind.__name__}"
            )
        return self.params


@dataclass(frozen=True)
class ModelPlan:
    """What it takes to make layer id -1 work for one model class."""

    module: str
    cls: str
    path: Path
    sites: tuple[EditSite, ...] = ()
    unsupported: str | None = None
    delegate: str | None = None
    notes: tuple[str, ...] = ()
    #: Why a model not named with ``--model`` is part of the run (the closure of the names).
    included_by: str | None = None
    #: Not an EAGLE-3 target at all (a draft or NextN head whose inner model captures nothing):
    #: listed and counted, never a failure. ``unsupported`` says why.
    not_applicable: bool = False
    #: An entry class that inherits this plan's setter and sites unchanged (a fork's
    #: ``mellum.MellumForCausalLM(LlamaForCausalLM)``): the label of the class it inherits
    #: from. Such a row is planned only when asked for (:func:`patchcraft.planning.model_plans.plan_models`).
    inherits: str | None = None
    #: vLLM: the platforms a ``vllm/models/<family>/`` row's class serves (``("cuda", "cpu")``); () for every
    #: other row (a class of ``model_executor/models``, or SGLang's).
    platforms: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.module}.{self.cls}"

    @property
    def files(self) -> tuple[Path, ...]:
        seen: dict[Path, None] = {}
        for site in self.sites:
            seen.setdefault(site.path, None)
        return tuple(seen)
