#!/usr/bin/env bash
# The CPU harness on a GPU: scenarios, CUDA graph replay and torch.compile (docs/harness.md).
# Needs only torch (with CUDA), libcst and click on the GPU machine: no SGLang install.
#
#   scripts/gpu_harness.sh prepare DIR [VERSION ...]   # here: patched copies of cached releases into DIR
#   scripts/gpu_harness.sh run DIR                     # on the GPU machine: one smoke run per release in DIR
#
# prepare copies each release's sglang/ from ~/.cache/patchcraft/test-releases (default: the
# coverage matrix but 0.4.6) and runs `patchcraft apply` on the copy; DIR is never committed.
# run prints one header and one row per model class for each release, then the seconds taken.
# Exit code: 0 all pass, 1 a row failed or errored, 2 no CUDA / usage.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mode=${1:-}; dir=${2:-}
[ -n "$mode" ] && [ -n "$dir" ] || { echo "usage: $0 prepare|run DIR [VERSION ...]" >&2; exit 2; }
shift 2
case "$mode" in
  prepare)
    versions=("$@")
    [ ${#versions[@]} -gt 0 ] || versions=(0.4.10 0.5.2 0.5.6 0.5.10 0.5.15 0.5.20 0.5.23)
    for v in "${versions[@]}"; do
      src="$HOME/.cache/patchcraft/test-releases/$v/sglang"
      [ -d "$src" ] || { echo "gpu_harness.sh: $src missing" >&2; exit 2; }
      mkdir -p "$dir/$v"; rm -rf "$dir/$v/sglang"; cp -r "$src" "$dir/$v/sglang"; chmod -R u+w "$dir/$v"
      "$PY" -m patchcraft apply --no-smoke "$dir/$v/sglang" >/dev/null 2>&1 || true
      echo "prepared $dir/$v/sglang (patched)"
    done ;;
  run)
    "$PY" -c 'import torch, sys; ok = torch.cuda.is_available(); print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if ok else "NO CUDA DEVICE"); sys.exit(0 if ok else 2)'
    code=0
    for tree in "$dir"/*/sglang; do
      start=$(date +%s.%N)
      "$PY" -m patchcraft smoke --device cuda --engine harness --compile "$tree" || code=$?
      echo "$tree: $(echo "$(date +%s.%N) - $start" | bc) s"
    done
    exit $code ;;
  *) echo "usage: $0 prepare|run DIR [VERSION ...]" >&2; exit 2 ;;
esac
