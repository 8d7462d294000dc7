"""vLLM's model class graph: :class:`~patchcraft.reading.class_graph.ModelGraph` over ``vllm/model_executor/models/``.

The shared graph resolves a sibling model file imported relatively
(``from .interfaces import EagleModelMixin``) and by SGLang's package
name. vLLM's files also import siblings by their absolute name
(``from vllm.model_executor.models.llama import LlamaForCausalLM`` in
0.34's ``mistral.py``); :class:`VllmGraph` adds those bindings after the
shared reading of each file, so ``MistralForCausalLM``'s MRO reaches
``LlamaForCausalLM`` and the ``SupportsEagle3`` setter. ``ast`` only.
"""

from __future__ import annotations

import ast
import re
from typing import Optional

from patchcraft.base.sources import decode, read_source
from patchcraft.reading.class_graph import ClassNode, ModelGraph, parse_python

PACKAGE = "vllm.model_executor.models"
#: The setter vLLM's runners call with the draft's ids: a class with it in its MRO is an EAGLE-3 target.
SETTER = "set_aux_hidden_state_layers"
#: Draft and speculator classes (they inherit a target's setter but are fed, not feeding): no EAGLE-3 target.
DRAFTS = re.compile(r"^Eagle\d?[A-Z]|Eagle3|DFlash|DSpark|MTP")


class VllmGraph(ModelGraph):
    """The shared class graph, with vLLM's absolute sibling imports resolved too."""

    def load(self, module: str, data: bytes | None = None) -> bool:
        if module in self.loaded:
            return self.loaded[module]
        found = super().load(module, data)
        if found:
            text = (
                decode(self.models_dir / f"{module}.py", data).text
                if data is not None
                else read_source(self.models_dir / f"{module}.py").text
            )
            names, modules = absolute_imports(parse_python(text))
            self.imports[module] = {**names, **self.imports.get(module, {})}
            self.module_imports[module] = {**modules, **self.module_imports.get(module, {})}
        return found


def absolute_imports(tree: ast.Module) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """``from vllm.model_executor.models.X import C as D`` -> ``{D: (X, C)}``; ``from vllm.model_executor.models
    import X`` and ``import vllm.model_executor.models.X as Y`` -> ``{X: X}``, ``{Y: X}``."""
    names: dict[str, tuple[str, str]] = {}
    modules: dict[str, str] = {}
    prefix = f"{PACKAGE}."
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == PACKAGE:
                modules.update({a.asname or a.name: a.name for a in node.names})
            elif node.module.startswith(prefix) and "." not in node.module[len(prefix) :]:
                stem = node.module[len(prefix) :]
                names.update({a.asname or a.name: (stem, a.name) for a in node.names})
        elif isinstance(node, ast.Import):
            for alias in node.names:
                stem = alias.name[len(prefix) :] if alias.name.startswith(prefix) else ""
                if stem and "." not in stem and alias.asname:
                    modules[alias.asname] = stem
    return names, modules


def language_model(graph: ModelGraph, outer: ClassNode) -> Optional[tuple[str, str]]:
    """``self.language_model = init_vllm_registered_model(..., architectures=["X"])`` in an ``__init__`` of
    ``outer``'s MRO: ``("X", "file.py:line")``. SupportsEagle3's setter hands the ids to that language model's
    ``model`` (Kimi-K2.5 names ``DeepseekV2ForCausalLM``); a wrapper that takes its architecture from the
    config names none here."""
    for owner in graph.mro(outer):
        init = owner.methods.get("__init__")
        for node in ast.walk(init) if init is not None else ():
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                continue
            if not any(isinstance(t, ast.Attribute) and t.attr == "language_model" for t in node.targets):
                continue
            for keyword in node.value.keywords:
                value = keyword.value
                if keyword.arg == "architectures" and isinstance(value, ast.List) and len(value.elts) == 1:
                    element = value.elts[0]
                    if isinstance(element, ast.Constant) and isinstance(element.value, str):
                        return element.value, f"{owner.path.name}:{node.lineno}"
    return None
