"""``patchcraft list``: the transforms, and the places they match in a tree."""

from __future__ import annotations

import json
import sys

from patchcraft.planning.selection import plan_tree
from patchcraft.transforms import MODEL_TRANSFORMS
from patchcraft.base.target import resolve_target
from patchcraft.ui import documents
from patchcraft.ui.choices import OutputFormat
from patchcraft.ui.machine_output import OK


def list_command(targets: tuple[str, ...], output_format: OutputFormat) -> int:
    """Show the transforms and, for each target tree, the sites each one matches."""
    trees = [resolve_target(t) for t in targets] if targets else []
    matches: dict[str, list[str]] = {t.NAME: [] for t in MODEL_TRANSFORMS}
    by_kind = {t.KIND: t.NAME for t in MODEL_TRANSFORMS}
    for tree in trees:
        seen = set()
        for plan in plan_tree(tree):
            for site in plan.sites:
                label = f"{tree.relative(site.path)}:{site.cls}.{site.method}"
                if label not in seen:
                    seen.add(label)
                    matches[by_kind[site.kind]].append(label)
    if output_format == OutputFormat.JSON:
        # A list, not an object: written as console.print_json writes its documents.
        sys.stdout.write(json.dumps(documents.list_json(MODEL_TRANSFORMS, matches), indent=2) + "\n")
        return OK
    for t in MODEL_TRANSFORMS:
        sys.stdout.write(f"{t.NAME} ({t.KIND})\n    {t.DESCRIPTION}\n")
        for label in matches[t.NAME]:
            sys.stdout.write(f"    - {label}\n")
    return OK
