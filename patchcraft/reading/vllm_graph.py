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

from patchcraft.base.sources import read_source
from patchcraft.reading.class_graph import ModelGraph

PACKAGE = "vllm.model_executor.models"


class VllmGraph(ModelGraph):
    """The shared class graph, with vLLM's absolute sibling imports resolved too."""

    def load(self, module: str, data: bytes | None = None) -> bool:
        if module in self.loaded:
            return self.loaded[module]
        found = super().load(module, data)
        if found:
            text = (
                data.decode("utf-8", "replace")
                if data is not None
                else read_source(self.models_dir / f"{module}.py").text
            )
            names, modules = absolute_imports(ast.parse(text))
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
