#!/usr/bin/env bash
# Prepared GPU smoke run of patchcraft against a real SGLang install.
#
#   scripts/gpu_smoke.sh [extra smoke args, e.g. --model-path DIR --draft-path DIR]
#   MODE=run scripts/gpu_smoke.sh
#
# Steps: install sglang (if missing) and patchcraft[smoke]; then, by MODE:
#   apply (default)  `patchcraft apply` on the installed sglang; `patchcraft verify`;
#                    the smoke's EAGLE-3 engine runs on (a probed copy of) the patched install.
#   run              the install is not written to (it must be unpatched): the smoke
#                    builds an overlay from its probed copy and starts the EAGLE-3 engine
#                    through `patchcraft run --overlay DIR --no-preflight --`, as a server
#                    launched with `patchcraft run` would be (`patchcraft smoke --via-run`).
# then the smoke run under `timeout`. See docs/smoke.md for what it checks and
# how to read the result.
#
# Needs what SGLang itself needs: NVIDIA GPUs and SGLang with its CUDA
# packages (torch with CUDA, flashinfer, sgl-kernel), as on a serving box or in
# the SGLang image; the install step fetches them from the package index (or
# WHEEL_DIR), which takes minutes and is not part of the smoke's time bound.
#
# Environment:
#   MODE            apply | run (default apply; see above)
#   TP              tensor-parallel size (default 1)
#   SGLANG_VERSION  install this sglang release if it is not the installed one (default 0.5.10)
#   WHEEL_DIR       offline machine: pip installs from this folder (--no-index)
#   ENGINE_TIMEOUT  seconds per engine run (default 200; two runs)
#   SMOKE_TIMEOUT   seconds for the whole smoke command (default 540, so with the
#                   60 s kill grace it fits a 10-minute window)
#   SMOKE_OUT       where spec.log, base.log and summary.json go (default: a new temp dir)
#   SMOKE_FORMAT    text | json (default text)
#   PYTHON          interpreter (default python3)
#   SKIP_INSTALL=1  use the environment as it is
#
# Exit code: the smoke's (0 pass, 1 fail, 2 environment error); 124 on timeout.
# Any failure to install sglang or patchcraft is an environment error: 2.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
TP=${TP:-1}
SGLANG_VERSION=${SGLANG_VERSION:-0.5.10}
ENGINE_TIMEOUT=${ENGINE_TIMEOUT:-200}
SMOKE_TIMEOUT=${SMOKE_TIMEOUT:-540}
SMOKE_FORMAT=${SMOKE_FORMAT:-text}
MODE=${MODE:-apply}

say() { printf 'gpu_smoke.sh: %s\n' "$*" >&2; }

case "$MODE" in
    apply) mode_args=() ;;
    run) mode_args=(--via-run) ;;
    *) say "usage error: MODE=$MODE (apply or run)"; exit 2 ;;
esac

pip_install() {
    if [ -n "${WHEEL_DIR:-}" ]; then
        "$PY" -m pip install -q --no-index --find-links "$WHEEL_DIR" "$@"
    else
        "$PY" -m pip install -q "$@"
    fi
}

installed_sglang() {
    "$PY" - <<'EOF' || { say "environment error: $PY cannot run"; exit 2; }
import importlib.metadata as m
try:
    print(m.version("sglang"))
except m.PackageNotFoundError:
    pass
EOF
}

install_or_exit() {  # install failures are the environment's: exit 2, never 1
    if ! pip_install "$@"; then
        say "environment error: pip install $* failed (network, index, WHEEL_DIR or CUDA packages; see above)"
        exit 2
    fi
}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    say "environment error: no NVIDIA GPU visible (nvidia-smi failed)"
    exit 2
fi
nvidia-smi -L >&2

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    have=$(installed_sglang)
    if [ -z "$have" ] || { [ -n "$SGLANG_VERSION" ] && [ "$have" != "$SGLANG_VERSION" ]; }; then
        # sglang first: it brings the CUDA torch and the transformers it pins
        say "installing sglang${SGLANG_VERSION:+==$SGLANG_VERSION}"
        install_or_exit "sglang${SGLANG_VERSION:+==$SGLANG_VERSION}"
    fi
    install_or_exit -e '.[smoke]'
    "$PY" -c 'import safetensors' 2>/dev/null || install_or_exit safetensors
fi

"$PY" - <<'EOF' || { say "environment error: torch/transformers/sglang not usable (see above)"; exit 2; }
import importlib.util, sys
import torch
from transformers import DeepseekV3ForCausalLM  # reference model for the tiny target
assert importlib.util.find_spec("sglang"), "sglang is not installed"
print(f"torch {torch.__version__}, cuda {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)", file=sys.stderr)
EOF
say "sglang $(installed_sglang)"

if [ "$MODE" = apply ]; then
    # Patch the installed sglang (idempotent), then prove the edits are in place.
    patchcraft apply
    patchcraft verify --model deepseek_v2
fi

OUT_DIR=${SMOKE_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/patchcraft-smoke-out.XXXXXX")}
cmd=(patchcraft smoke --device cuda)

rc=0
timeout --signal=TERM --kill-after=60 "$SMOKE_TIMEOUT" \
    "${cmd[@]}" ${mode_args[@]+"${mode_args[@]}"} --tp "$TP" --format "$SMOKE_FORMAT" --timeout "$ENGINE_TIMEOUT" --out "$OUT_DIR" "$@" || rc=$?
if [ "$rc" = 124 ]; then
    say "smoke run exceeded ${SMOKE_TIMEOUT}s and was stopped"
fi
say "logs and summary: $OUT_DIR"
exit "$rc"
