"""Record every command's output on real releases, to prove a refactor changed no byte of it.

    python scripts/output_snapshot.py OUT_DIR [VERSION ...]     # default: 0.4.9 0.5.10 0.5.23
    diff -r BEFORE_DIR AFTER_DIR

For each release (copied from the cache to the same fixed path every time,
so that paths in the output compare equal), in text and in JSON: list,
verify, diff, apply --check, apply, verify (patched), diff (patched),
revert, explain (embedding and layer ids, a patched and an unpatched
tree) and check-draft (a Kimi-shaped target and two drafts). Each file
holds the exit code, stdout and stderr. The result cache is off
(``PATCHCRAFT_NO_CACHE=1``), so every run is a real one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

VERSIONS = ("0.4.9", "0.5.10", "0.5.23")
WORK = Path("/tmp/patchcraft-output-snapshot")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out = Path(argv[0])
    versions = argv[1:] or list(VERSIONS)
    from conftest import copy_release
    from drafts import kimi_target, sglang_draft

    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(WORK, ignore_errors=True)
    kimi = kimi_target(WORK / "kimi")
    drafts = {
        "minus1": sglang_draft(WORK / "draft-minus1", [-1, 2, 30]),
        "native": sglang_draft(WORK / "draft-native", [2, 30, 58]),
    }
    env = dict(os.environ, PATCHCRAFT_NO_CACHE="1", NO_COLOR="1", COLUMNS="120", TERM="dumb")
    for version in versions:
        tree = copy_release(version, WORK / version)
        steps: list[tuple[str, list[str]]] = [
            ("list", ["list", str(tree)]),
            ("verify-unpatched", ["verify", str(tree)]),
            ("diff-unpatched", ["diff", str(tree)]),
            ("check", ["apply", "--check", str(tree)]),
            (
                "explain-unpatched",
                ["explain", str(tree), "--layer-ids", "-1,2,30", "--num-layers", "61", "--model", "deepseek_v2"],
            ),
            ("check-draft-unpatched", ["check-draft", str(drafts["native"]), str(tree), "--target", str(kimi)]),
            ("apply", ["apply", "--no-smoke", str(tree)]),
            ("verify-patched", ["verify", str(tree)]),
            ("diff-patched", ["diff", str(tree)]),
            (
                "explain-patched",
                ["explain", str(tree), "--layer-ids", "-1,2,30", "--num-layers", "61", "--model", "deepseek_v2"],
            ),
            (
                "check-draft-patched",
                ["check-draft", str(drafts["minus1"]), str(tree), "--target", str(kimi), "--trained-on", "hf:0,3,31"],
            ),
            ("revert", ["revert", str(tree)]),
        ]
        for fmt in ("text", "json"):
            shutil.rmtree(WORK / version)
            tree = copy_release(version, WORK / version)
            for name, args in steps:
                command = [sys.executable, "-m", "patchcraft", *args]
                if fmt == "json":
                    command.append("--format=json")
                proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
                text = f"$ patchcraft {' '.join(args)} [{fmt}]\nexit {proc.returncode}\n--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}"
                (out / f"{version}-{fmt}-{name}.txt").write_text(text, encoding="utf-8")
        print(f"{version}: {len(steps) * 2} outputs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
