"""``patchcraft list``: the transforms, and the places they match in a tree (SGLang's or vLLM's)."""

from __future__ import annotations

import json
import sys
from typing import Optional, Sequence

from patchcraft.base.engines import ServingEngine
from patchcraft.base.target import SglangTree
from patchcraft.planning.selection import plan_tree
from patchcraft.transforms import MODEL_TRANSFORMS, VLLM_TRANSFORMS
from patchcraft.transforms._contract import Transform
from patchcraft.ui import documents
from patchcraft.ui.choices import OutputFormat
from patchcraft.ui.machine_output import OK


def list_command(targets: tuple[str, ...], output_format: OutputFormat, engine: Optional[ServingEngine] = None) -> int:
    """Show the transforms and, for each target tree, the sites each one matches.

    The transforms shown are those of the engines involved: ``engine`` when given, else each TARGET's
    (told from the tree); with neither, SGLang's.
    """
    from patchcraft.pipeline.stages import resolve_targets

    trees = resolve_targets(targets, engine) if targets else []
    engines = {engine} if engine is not None else {_engine_of(t) for t in trees} or {ServingEngine.SGLANG}
    shown: list[tuple[ServingEngine, Transform]] = [
        (e, t)
        for e, transforms in ((ServingEngine.SGLANG, MODEL_TRANSFORMS), (ServingEngine.VLLM, VLLM_TRANSFORMS))
        if e in engines
        for t in transforms
    ]
    matches = _matches(trees, [t for _, t in shown])
    if output_format == OutputFormat.JSON:
        # A list, not an object: written as console.print_json writes its documents.
        document = documents.list_json([t for _, t in shown], matches, [e.value for e, _ in shown])
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return OK
    for e, t in shown:
        suffix = f", {e.value}" if len(engines) > 1 or e is not ServingEngine.SGLANG else ""
        sys.stdout.write(f"{t.NAME} ({t.KIND}{suffix})\n    {t.DESCRIPTION}\n")
        for label in matches[t.NAME]:
            sys.stdout.write(f"    - {label}\n")
    return OK


def _engine_of(tree: SglangTree) -> ServingEngine:
    return ServingEngine.VLLM if tree.engine == ServingEngine.VLLM.value else ServingEngine.SGLANG


def _matches(trees: Sequence[SglangTree], transforms: Sequence[Transform]) -> dict[str, list[str]]:
    """``file:Class.method`` of every site each transform matches, by transform name, in plan order."""
    matches: dict[str, list[str]] = {t.NAME: [] for t in transforms}
    by_kind = {t.KIND: t.NAME for t in transforms}
    for tree in trees:
        seen = set()
        for plan in plan_tree(tree):
            for site in plan.sites:
                label = f"{tree.relative(site.path)}:{site.cls}.{site.method}"
                if label not in seen and site.kind in by_kind:
                    seen.add(label)
                    matches[by_kind[site.kind]].append(label)
    return matches
