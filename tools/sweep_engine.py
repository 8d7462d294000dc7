"""The differential sweep: the real vLLM engine (its CPU build) against explain, class x ids x norm x patched.

    python -m tools.sweep_engine                      # every case on vLLM 0.32.0; print the table
    python -m tools.sweep_engine --write-docs         # and write it into docs/real-engine.md's sweep section
    python -m tools.sweep_engine --models LlamaForCausalLM --releases 0.32.0

Each case is one ``patchcraft engine check --format json`` (docs/real-engine.md): the real engine on a
tiny random target, the states its draft received against explain's prediction for the CPU platform.
A case the engine cannot run, or whose environment cannot be had, is a row saying so: nothing is
skipped silently. Rows that agree are ``agree``; every other row names both sides.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "real-engine.md"
START, END = "<!-- sweep:start -->", "<!-- sweep:end -->"
#: class -> layers of its tiny target (DeepSeek's MLA target is kept small: 4 layers).
MODELS = {
    "LlamaForCausalLM": 6,
    "Qwen2ForCausalLM": 6,
    "Qwen3ForCausalLM": 6,
    "Qwen3MoeForCausalLM": 6,
    "DeepseekV3ForCausalLM": 4,
}


def id_sets(layers: int) -> list[tuple[str, str]]:
    """(what the set exercises, the ids): id 0, a plain list, a repeat, and id 0 with id n (the last layer's output)."""
    return [
        ("id 0", "0,2,3"),
        ("plain", "1,2,3" if layers < 6 else "1,3,5"),
        ("repeat", "2,2,3"),
        ("0 and n", f"0,2,{layers}"),
    ]


def cases(models: list[str], served: str = "both") -> list[dict[str, Any]]:
    """Every case of ``models``: each id set and norm as installed, and those with id 0 through patchcraft run."""
    found = []
    for model in models:
        layers = MODELS[model]
        for kind, ids in id_sets(layers):
            for norm in ("default", "inplace"):
                for patched in (False, True):
                    if patched and not ids.startswith("0,") or served == ("installed" if patched else "patched"):
                        continue
                    found.append(
                        {"model": model, "layers": layers, "kind": kind, "ids": ids, "norm": norm, "patched": patched}
                    )
    return found


def run(case: dict[str, Any], release: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "patchcraft", "engine", "check", "--format", "json", "--release", release]
    argv += [
        "--model",
        case["model"],
        "--num-layers",
        str(case["layers"]),
        "--layer-ids",
        case["ids"],
        "--norm",
        case["norm"],
    ]
    if case["patched"]:
        argv.append("--patched")
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    row = dict(case, release=release, exit=proc.returncode, wall_s=round(time.monotonic() - started))
    try:
        document = json.loads(proc.stdout)
    except ValueError:
        lines = proc.stderr.strip().splitlines() or ["(no output)"]
        return row | {"real": "not run: " + lines[-1][:200], "predicted": "", "agree": False, "why": "not run"}
    real = document["real"]
    error = real.get("error")
    if error:
        said = f"crash: {error['type']} at {Path(error['file']).name}:{error['line']}"
    else:
        said = ", ".join(s.get("state") or f"? (nearest {s.get('nearest')})" for s in real.get("fed", []))
    predicted = document["predicted"]
    return row | {
        "real": said,
        "predicted": predicted["crash"] or ", ".join(predicted["fed"]),
        "agree": document["agree"],
        "why": document["why"],
        "greedy_equal": real.get("greedy_equal"),
        "kernels": (real.get("kernels") or {}).get("fused_add_rms_norm"),
    }


def _key(row: dict[str, Any]) -> tuple:
    return (row["release"], row["model"], row["ids"], row["norm"], row["patched"])


def _order(row: dict[str, Any]) -> tuple:
    kinds = ["id 0", "plain", "repeat", "0 and n"]
    return (row["release"], list(MODELS).index(row["model"]), kinds.index(row["kind"]), row["norm"], row["patched"])


def table(rows: list[dict[str, Any]]) -> str:
    head = "| release | class | ids | norm | served | the real engine's draft received | explain (cpu) | agree | greedy = HF |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        served = "patched (run)" if r["patched"] else "as installed"
        agree = "yes" if r["agree"] else f"**no**: {r['why']}"
        greedy = {True: "yes", False: "no", None: "-"}[r.get("greedy_equal")]
        lines.append(
            f"| {r['release']} | {r['model']} ({r['layers']}) | [{r['ids']}] ({r['kind']}) | {r['norm']} | {served} | "
            f"{r['real']} | {r['predicted']} | {agree} | {greedy} |"
        )
    agreed = sum(1 for r in rows if r["agree"])
    lines.append("")
    lines.append(f"{len(rows)} cases, {agreed} agree, {len(rows) - agreed} do not.")
    return "\n".join(lines)


def write_docs(text: str) -> None:
    doc = DOC.read_text(encoding="utf-8")
    block = f"{START}\n{text}\n{END}"
    if START in doc:
        before, _, rest = doc.partition(START)
        doc = before + block + rest.partition(END)[2]
    else:
        doc = doc.rstrip() + "\n\n## The sweep (generated by tools/sweep_engine.py)\n\n" + block + "\n"
    DOC.write_text(doc, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", nargs="*", default=["0.32.0"])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--served", choices=("installed", "patched", "both"), default="both")
    parser.add_argument("--kinds", nargs="*", help="Only these id sets (id 0, plain, repeat, 0 and n).")
    parser.add_argument("--merge", type=Path, help="Rows of an earlier run (--rows): kept where this run has no row.")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--rows", type=Path, help="Also write the rows as JSON to this file.")
    args = parser.parse_args()
    rows = []
    for release in args.releases:
        for case in cases(args.models, args.served):
            if args.kinds and case["kind"] not in args.kinds:
                continue
            row = run(case, release)
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    if args.merge:
        ran = {_key(r) for r in rows}
        earlier = [r for r in json.loads(args.merge.read_text(encoding="utf-8")) if _key(r) not in ran]
        rows = sorted(earlier + rows, key=_order)
    text = table(rows)
    print(text)
    if args.rows:
        args.rows.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    if args.write_docs:
        write_docs(text)
    return 0 if all(r["agree"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
