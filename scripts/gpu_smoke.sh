#!/usr/bin/env bash
# Prepared GPU smoke run of patchcraft against a real SGLang install.
#
#   scripts/gpu_smoke.sh [extra smoke args, e.g. --model-path DIR --draft-path DIR]
#
# Steps: install sglang (if missing) and patchcraft[smoke]; `patchcraft apply`
# on the installed sglang; `patchcraft verify`; then the smoke run under
# `timeout`. See docs/smoke.md for what it checks and how to read the result.
#
# Environment:
#   TP              tensor-parallel size (default 1)
#   SGLANG_VERSION  install this sglang release if it is not the installed one
#   WHEEL_DIR       offline machine: pip installs from this folder (--no-index)
#   SMOKE_TIMEOUT   seconds for the whole smoke run (default 1800)
#   SMOKE_FORMAT    text | json (default text)
#   PYTHON          interpreter (default python3)
#   SKIP_INSTALL=1  use the environment as it is
#
# Exit code: the smoke's (0 pass, 1 fail, 2 environment error); 124 on timeout.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
TP=${TP:-1}
SMOKE_TIMEOUT=${SMOKE_TIMEOUT:-1800}
SMOKE_FORMAT=${SMOKE_FORMAT:-text}

say() { printf 'gpu_smoke.sh: %s\n' "$*" >&2; }

pip_install() {
    if [ -n "${WHEEL_DIR:-}" ]; then
        "$PY" -m pip install -q --no-index --find-links "$WHEEL_DIR" "$@"
    else
        "$PY" -m pip install -q "$@"
    fi
}

installed_sglang() {
    "$PY" - <<'EOF'
import importlib.metadata as m
try:
    print(m.version("sglang"))
except m.PackageNotFoundError:
    pass
EOF
}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    say "environment error: no NVIDIA GPU visible (nvidia-smi failed)"
    exit 2
fi
nvidia-smi -L >&2

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    have=$(installed_sglang)
    if [ -z "$have" ] || { [ -n "${SGLANG_VERSION:-}" ] && [ "$have" != "$SGLANG_VERSION" ]; }; then
        # sglang first: it brings the CUDA torch and the transformers it pins
        say "installing sglang${SGLANG_VERSION:+==$SGLANG_VERSION}"
        pip_install "sglang${SGLANG_VERSION:+==$SGLANG_VERSION}"
    fi
    pip_install -e '.[smoke]'
    "$PY" -c 'import safetensors' 2>/dev/null || pip_install safetensors
fi

"$PY" - <<'EOF' || { say "environment error: torch/transformers/sglang not usable (see above)"; exit 2; }
import importlib.util, sys
import torch
from transformers import DeepseekV3ForCausalLM  # reference model for the tiny target
assert importlib.util.find_spec("sglang"), "sglang is not installed"
print(f"torch {torch.__version__}, cuda {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)", file=sys.stderr)
EOF
say "sglang $(installed_sglang)"

# Patch the installed sglang (idempotent), then prove the edits are in place.
patchcraft apply
patchcraft verify --model deepseek_v2

if patchcraft smoke --help >/dev/null 2>&1; then
    cmd=(patchcraft smoke --device cuda)
else
    cmd=("$PY" -m patchcraft.gpu_smoke.run)  # same code, before the CLI wires `smoke`
fi

rc=0
timeout --signal=TERM --kill-after=60 "$SMOKE_TIMEOUT" \
    "${cmd[@]}" --tp "$TP" --format "$SMOKE_FORMAT" "$@" || rc=$?
if [ "$rc" = 124 ]; then
    say "smoke run exceeded ${SMOKE_TIMEOUT}s and was stopped"
fi
exit "$rc"
