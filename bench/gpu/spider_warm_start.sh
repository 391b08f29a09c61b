#!/bin/bash
# Issue 33 on one lent GPU (bench/gpu/pack.sh first): the Spider SFT warm start on SEEDS, side by
# side and training only (RL's step-0 evaluation is the warm start's held-out), then RL from it on
# RL_SEEDS at lr 2e-5 with the penalties and a KL to the warm start (docs/experiments.md), stopped
# with SIGTERM at DEADLINE seconds after the start so each checkpoints. What comes back under $OUT
# (8 files, 16 MB each at most): each seed's trained writer adapter in two pieces (the rewriter's
# is the seed's untrained LoRA init: a one-step `sft` of the same seed at home rebuilds it, the same
# bytes) and results.tar.xz (metrics, evaluations, trajectories, logs).
# On the device: DEVICE=1 bash bench/gpu/spider_warm_start.sh (after a call that put
# the model's first part in /tmp/model.xz.a). The CPU dry run: BIN=.venv/bin/agentgym-lightning
# PY=.venv/bin/python SFT_EXTRA="--set max_steps=1 --set rows_per_step=2" RL_EXTRA="--set max_steps=2
# --set eval_episodes=2 --set tasks_per_step=1 --set num_generations=2".
set -u
export WANDB_MODE=offline PYTHONUNBUFFERED=1
T0=$(date +%s)
OUT=${OUT:-/tmp/gpu5-out}; mkdir -p "$OUT"
LOG=$OUT/run.log
exec > >(tee -a "$LOG") 2>&1
DEADLINE=${DEADLINE:-500}
SEEDS=${SEEDS:-"0 1 2"}
RUNS=${RUNS:-/tmp/gpu5-runs}; mkdir -p "$RUNS"
DATA=${DATA:-/tmp/gpu5-data}
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }

TASK=spider DATASET=spider
source bench/gpu/device_setup.sh
# Convert the embedded GGUF once, before three processes want it.
$PY -c 'from agentgym_lightning.policies.models import resolve_model; print(resolve_model("smollm2-135m"))' || exit 1
el "setup done"

declare -A PID
for s in $SEEDS; do
    $BIN sft $RUNS/spider-gold-s$s.jsonl --config recipes/sft/spider.yaml --env-kwarg data_dir=$DATA/spider \
        --seed $s --set eval_env_kwargs=null --set "report_to=[]" --set num_threads=5 --output-dir $RUNS/sft-s$s ${SFT_EXTRA:-} \
        > $RUNS/sft-s$s.log 2>&1 &
    PID[$s]=$!
done
for s in $SEEDS; do wait ${PID[$s]} || echo "sft-s$s FAILED"; done
el "sft done"
sha256sum $RUNS/sft-s*/final/adapters/*/adapter_model.safetensors

RL_SEEDS=${RL_SEEDS:-2}
for s in $RL_SEEDS; do
    $BIN train --config recipes/spider.yaml --env-kwarg data_dir=$DATA/spider --init-from $RUNS/sft-s$s \
        --set 'air_weights={"spider.no_sql": -0.2, "spider.parse_error": -0.1}' --set learning_rate=2e-5 \
        --set eval_steps=5 --set beta=0.1 --set num_threads=8 --seed $s --output-dir $RUNS/rl-s$s ${RL_EXTRA:-} \
        > $RUNS/rl-s$s.log 2>&1 &
    PID[$s]=$!
done
el "rl started: $RL_SEEDS"

rl_alive() { for s in $RL_SEEDS; do kill -0 ${PID[$s]} 2>/dev/null && return 0; done; return 1; }
while rl_alive && [ $(( $(date +%s) - T0 )) -lt $DEADLINE ]; do sleep 3; done
el "deadline or done; stopping"
for s in $RL_SEEDS; do kill -TERM ${PID[$s]} 2>/dev/null; done
for i in $(seq 60); do rl_alive || break; sleep 1; done
el "stopped$(rl_alive && echo ', one still running')"
for s in $SEEDS; do tail -2 $RUNS/sft-s$s.log; done
for s in $RL_SEEDS; do tail -8 $RUNS/rl-s$s.log; done
# Limits on what comes back: 8 files, 16 MB each, 64 MB in all. The writers' adapters (fp32,
# ~19.6 MB) in two pieces each; the rewriters' are untrained (the seed's LoRA init: rebuilt at home).
for s in $SEEDS; do split -b 10000000 $RUNS/sft-s$s/final/adapters/writer/adapter_model.safetensors $OUT/writer-s$s.; done
tar cf - -C $RUNS --exclude='checkpoints' --exclude='final' --exclude='*.jsonl.xz' $(cd $RUNS && ls -d rl-s* sft-s*) 2>/dev/null | xz -T8 -6 > $OUT/results.tar.xz
ls -la $OUT
el "packed"
