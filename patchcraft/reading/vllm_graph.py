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
from pathlib import Path
from typing import Optional

from patchcraft.base.sources import decode, read_source
from patchcraft.reading.class_graph import ClassNode, ModelGraph, parse_python
from patchcraft.reading.parsed import statements

PACKAGE = "vllm.model_executor.models"
#: The setter vLLM's runners call with the draft's ids: a class with it in its MRO is an EAGLE-3 target.
SETTER = "set_aux_hidden_state_layers"
#: Draft and speculator classes (they inherit a target's setter but are fed, not feeding): no EAGLE-3 target.
DRAFTS = re.compile(r"^Eagle\d?[A-Z]|Eagle3|DFlash|DSpark|MTP")


class VllmGraph(ModelGraph):
    """The shared class graph, with vLLM's absolute sibling imports resolved too.

    A file of ``vllm/models/<family>/`` (0.22+) is a module of its own, named by its dotted path in the
    package (``models.deepseek_v32.nvidia.model``: :func:`family_module`); its imports, relative or
    absolute, resolve to other such files and to ``model_executor/models/`` stems.
    """

    def path_of(self, module: str) -> Path:
        if module.startswith(FAMILY_ROOT):
            base = self.models_dir.parent.parent.joinpath(*module.split("."))
            return base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        return super().path_of(module)

    def module_of(self, path: Path) -> str:
        """The graph's name of the module in ``path``: a stem of ``model_executor/models``, or ``models.F.x``."""
        package = self.models_dir.parent.parent
        try:
            relative = path.resolve().relative_to(package.resolve() / "models")
        except ValueError:
            return path.stem
        parts = list(relative.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(["models", *parts])

    def load(self, module: str, data: bytes | None = None) -> bool:
        if module in self.loaded:
            return self.loaded[module]
        found = super().load(module, data)
        if found:
            path = self.path_of(module)
            text = decode(path, data).text if data is not None else read_source(path).text
            tree = parse_python(text)
            names, modules = absolute_imports(tree)
            if module.startswith(FAMILY_ROOT):  # the shared reading took its relative imports for siblings
                here = module if path.name == "__init__.py" else module.rpartition(".")[0]
                self.imports[module] = {**names, **family_imports(tree, here)}
                self.module_imports[module] = modules
                return found
            self.imports[module] = {**names, **self.imports.get(module, {})}
            self.module_imports[module] = {**modules, **self.module_imports.get(module, {})}
        return found


#: The graph's module names of ``vllm/models/`` files start with this (``models.kimi_k3.nvidia.model``).
FAMILY_ROOT = "models."


def family_module(dotted: str) -> str:
    """vLLM's module name as the graph names it: ``vllm.models.kimi_k3.nvidia.model`` ->
    ``models.kimi_k3.nvidia.model``; ``vllm.model_executor.models.deepseek_v2`` -> ``deepseek_v2``."""
    if dotted.startswith(f"{PACKAGE}."):
        return dotted[len(PACKAGE) + 1 :]
    return dotted.partition(".")[2]


def family_imports(tree: ast.Module, here: str) -> dict[str, tuple[str, str]]:
    """In a file of package ``here`` (``models.kimi_k3.nvidia``): ``from .x import C`` and ``from
    vllm.models.F.x import C`` -> ``{C: ("models.F.x", C)}`` (relative to ``here``)."""
    found: dict[str, tuple[str, str]] = {}
    for node in statements(tree.body):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            parts = here.split(".")
            base = parts[: len(parts) - (node.level - 1)]
            if len(base) < 2:
                continue
            source = ".".join([*base, node.module]) if node.module else ".".join(base)
        elif node.module and node.module.startswith(f"vllm.{FAMILY_ROOT}"):
            source = node.module.partition(".")[2]
        else:
            continue
        for alias in node.names:
            found[alias.asname or alias.name] = (source, alias.name)
    return found


def absolute_imports(tree: ast.Module) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """``from vllm.model_executor.models.X import C as D`` -> ``{D: (X, C)}``; ``from vllm.model_executor.models
    import X`` and ``import vllm.model_executor.models.X as Y`` -> ``{X: X}``, ``{Y: X}``."""
    names: dict[str, tuple[str, str]] = {}
    modules: dict[str, str] = {}
    prefix = f"{PACKAGE}."
    for node in statements(tree.body):
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
