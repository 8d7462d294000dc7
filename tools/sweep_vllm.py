"""Run ``explain --engine vllm`` on every EAGLE-3 class of vLLM releases: a markdown table (issue 34, coverage).

    python -m tools.sweep_vllm 0.11.2 0.18.0 0.34.0 [--num-layers 8] [--ids 0,2,4]

For each release (fetched slim into the cache, docs/vllm.md) and each class
with ``set_aux_hidden_state_layers`` in its MRO, one row: the gate's answer,
what the draft is fed for the defaults and for ``--ids``, and the kinds of
the findings. Every answer is the release's code run on the CPU harness.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from patchcraft.analysis.vllm_explain import explain_vllm  # noqa: E402
from patchcraft.base.layer_ids import parse_layer_ids  # noqa: E402
from patchcraft.base.vllm_fetch import fetch_vllm  # noqa: E402
from patchcraft.base.vllm_tree import resolve_vllm_target  # noqa: E402


def rows(version: str, num_layers: int, ids: tuple[int, ...]) -> list[str]:
    from patchcraft.harness.vllm_served import eagle3_classes

    tree = resolve_vllm_target(str(fetch_vllm(version)))
    found = []
    for cls in eagle3_classes(tree.package):
        chosen = explain_vllm(tree, cls, ids, num_layers)
        defaults = explain_vllm(tree, cls, None, num_layers)
        gate = "admitted" if chosen.gate.admits(chosen.model_type) else "refused"
        kinds = ", ".join(sorted({str(f.kind) for f in chosen.findings})) or "-"
        found.append(f"| {version} | {cls} | {gate} | {_cell(defaults.fed)} | {_cell(chosen.fed)} | {kinds} |")
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace(" (not a copy: layer 0 overwrites it in place)", " (alias)")[:120]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="+", metavar="VERSION", help="vLLM releases, e.g. 0.18.0")
    parser.add_argument("--num-layers", type=int, default=8, help="stand-in decoder layers (default 8)")
    parser.add_argument("--ids", default="0,2,4", help="the ids besides the defaults (vLLM's: id X is hs[X])")
    options = parser.parse_args(argv)
    ids = parse_layer_ids(options.ids) or ()
    print(f"| release | class | gate | defaults | {list(ids)} | findings |")
    print("|---|---|---|---|---|---|")
    for version in options.versions:
        for row in rows(version, options.num_layers, tuple(ids)):
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
