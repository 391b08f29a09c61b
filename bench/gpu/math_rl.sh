#!/bin/bash
# Issue 46 on one lent GPU (TASK=math SEEDS="0 1" bash bench/gpu/pack.sh first): the math SFT warm
# start on SEEDS side by side (training only), then RL from each with recipes/math.yaml (dynamic
# sampling, the curriculum, outcome first, Dr. GRPO, temperature 0.6) at a larger batch
# (RL_EXTRA's tasks_per_step), stopped with SIGTERM at DEADLINE seconds after the start (each run
# checkpoints; `train --resume DIR --steps <its step>` then writes its final/). The warm start
# (while RL runs) and the RL runs' final/ are evaluated the same way, with `eval` as the trainer's
# held-out evaluation runs it: the recipe's 96 held-out problems greedy (and with SAMPLES=8, 8 samples
# each at temperature 0.6: pass@1, pass@8), every call capped at max_completion_length (192).
# Measured on one H200 (2026-11-28, docs/experiments.md): setup 78 s, the two SFTs 69 s, a greedy
# evaluation 28-45 s, an RL step 127-204 s (its rollout bound by the host, one core); the 768 sampled
# episodes of a warm start took over 5 minutes beside the RL runs and did not finish in the call,
# so SAMPLES is 0 by default (that session's warm starts' pass@8 is in the docs).
# What comes back under $OUT: run.log and results.tar.xz (metrics, evaluations, trajectories, logs).
# On the device: DEVICE=1 bash bench/gpu/math_rl.sh (after a call that put the model's first part
# in /tmp/model.xz.a). The CPU dry run: BIN=.venv/bin/agentgym-lightning PY=.venv/bin/python
# SFT_EXTRA="--set max_steps=1 --set rows_per_step=2" RL_EXTRA="--set tasks_per_step=1 --set num_generations=2
# --set max_sampling_rounds=1" HELD_OUT=2 THREADS=1 DEADLINE=240 bash bench/gpu/math_rl.sh
set -u
export WANDB_MODE=offline PYTHONUNBUFFERED=1
T0=$(date +%s)
OUT=${OUT:-/tmp/gpu6-out}; mkdir -p "$OUT"
LOG=$OUT/run.log
exec > >(tee -a "$LOG") 2>&1
# The call's limit: RL stops early enough for the closing evaluations, which take about what the warm
# start's took (measured as the run goes: STOP = LIMIT - that - 40 s for the final/ writes); DEADLINE
# is the latest stop whatever happens.
LIMIT=${LIMIT:-570}
DEADLINE=${DEADLINE:-450}
SEEDS=${SEEDS:-"0 1"}
THREADS=${THREADS:-7}
RUNS=${RUNS:-/tmp/gpu6-runs}; mkdir -p "$RUNS"
DATA=${DATA:-/tmp/gpu6-data}
# Larger decode batches than the hf default (32) on a GPU: KV caches of 64 (RL) and 128 (evaluation)
# sequences of 4,096 positions are 12 and 24 GB in fp32, four processes well within an H200.
# (Not ${RL_EXTRA:-...}: a default holding "}" would end the expansion early when RL_EXTRA is set.)
[ -n "${RL_EXTRA:-}" ] || RL_EXTRA='--set tasks_per_step=12 --set max_sampling_rounds=2 --set policy_kwargs={"tool_prompt":"compact","max_batch_size":64}'
EVAL_BATCH=${EVAL_BATCH:-128}
HELD_OUT=${HELD_OUT:-96}
SAMPLES=${SAMPLES:-0}
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
# The runs' metrics, evaluations, trajectories and logs (no weights) to $OUT: packed once the RL runs
# stop and again after the closing evaluations, so a call cut short still brings the first back.
pack() {
    tar cf - -C $RUNS --exclude='checkpoints' --exclude='final' --exclude='rows' \
        $(cd $RUNS && ls -d rl-s* sft-s* | grep -v '\.log$') $(cd $RUNS && ls *.log *.json *-greedy.jsonl *-samples.jsonl *-pass-rates.jsonl) 2>/dev/null | xz -T8 -6 > $OUT/results.tar.xz.part \
        && mv $OUT/results.tar.xz.part $OUT/results.tar.xz
}

TASK=math DATASET=gsm8k
source bench/gpu/device_setup.sh
# Convert the embedded GGUF once, and import the math agent's framework, before the runs want them.
$PY -c 'from agentgym_lightning.policies.models import resolve_model; print(resolve_model("smollm2-135m"))
import autogen_agentchat, autogen_ext.models.openai, agentgym_lightning.envs.math' || exit 1
el "setup done"

declare -A PID
for s in $SEEDS; do
    $BIN sft $RUNS/math-gold-s$s.jsonl --config recipes/sft/math.yaml --env-kwarg data_dir=$DATA/gsm8k \
        --seed $s --set eval_env_kwargs=null --set "report_to=[]" --set num_threads=$THREADS --output-dir $RUNS/sft-s$s ${SFT_EXTRA:-} \
        > $RUNS/sft-s$s.log 2>&1 &
    PID[$s]=$!
done
for s in $SEEDS; do wait ${PID[$s]} || echo "sft-s$s FAILED"; done
el "sft done"

# The held-out evaluation of a model folder, as the trainer's (`eval --config recipes/math.yaml`: its eval
# env, its seed offset 7919, max_completion_length 192): greedy, then SAMPLES samples a problem at 0.6.
heldout() {  # heldout MODEL_DIR NAME SEED
    local args="--config recipes/math.yaml --model $1 --env-kwarg data_dir=$DATA/gsm8k --seed $3
        --policy-kwarg num_threads=2 --policy-kwarg max_batch_size=$EVAL_BATCH --no-progress --json"
    $BIN eval $args --episodes $HELD_OUT --output $RUNS/$2-greedy.jsonl > $RUNS/$2-greedy.json 2> $RUNS/$2-greedy.log
    [ "$SAMPLES" -gt 0 ] || return 0
    $BIN eval $args --episodes $((HELD_OUT * SAMPLES)) --group-size $SAMPLES --temperature 0.6 \
        --output $RUNS/$2-samples.jsonl --pass-rates $RUNS/$2-pass-rates.jsonl > $RUNS/$2-samples.json 2> $RUNS/$2-samples.log
}

for s in $SEEDS; do
    $BIN train --config recipes/math.yaml --env-kwarg data_dir=$DATA/gsm8k --init-from $RUNS/sft-s$s \
        --set eval_env_kwargs=null --set max_steps=200 --set save_steps=1 --set num_threads=$THREADS --seed $s \
        --output-dir $RUNS/rl-s$s $RL_EXTRA > $RUNS/rl-s$s.log 2>&1 &
    PID[$s]=$!
done
el "rl started: $SEEDS"
declare -A EVAL
for s in $SEEDS; do heldout $RUNS/sft-s$s/final warm-s$s $s & EVAL[$s]=$!; done

alive() { for s in $SEEDS; do kill -0 ${PID[$s]} 2>/dev/null && return 0; done; return 1; }
evaluating() { for s in $SEEDS; do kill -0 ${EVAL[$s]} 2>/dev/null && return 0; done; return 1; }
RL_AT=$(( $(date +%s) - T0 )); STOP=$DEADLINE
while alive; do
    now=$(( $(date +%s) - T0 ))
    if [ -z "${WARM_S:-}" ] && ! evaluating; then
        WARM_S=$(( now - RL_AT )); STOP=$(( LIMIT - WARM_S - 40 )); [ $STOP -le $DEADLINE ] || STOP=$DEADLINE
        el "warm-start evaluations took ${WARM_S} s: RL stops at ${STOP} s"
    fi
    [ $now -lt $STOP ] || break
    sleep 3
done
el "stop time or done; stopping"
for s in $SEEDS; do kill -TERM ${PID[$s]} 2>/dev/null; done
for i in $(seq 90); do alive || break; sleep 1; done
el "stopped$(alive && echo ', one still running')"
# The warm start's evaluations get until 150 s before the limit (the closing ones need about that);
# one still running then is stopped, and what it wrote (an episode a line) comes back.
while evaluating && [ $(( $(date +%s) - T0 )) -lt $(( LIMIT - 150 )) ]; do sleep 2; done
for s in $SEEDS; do kill -0 ${EVAL[$s]} 2>/dev/null && { el "warm-s$s evaluation still running: stopped"; pkill -TERM -P ${EVAL[$s]}; kill -TERM ${EVAL[$s]}; }; done
for s in $SEEDS; do wait ${EVAL[$s]}; done
el "warm-start evaluations done"
pack

# Each run's final/ at the step it reached (a resumed run with nothing left to train writes it and ends).
for s in $SEEDS; do
    step=$($PY -c 'import json, sys; rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(max([int(r["step"]) for r in rows if any(k.startswith("train/") for k in r)] or [0]))' $RUNS/rl-s$s/metrics.jsonl)
    el "rl-s$s reached step $step"
    ( $BIN train --resume $RUNS/rl-s$s --steps $step > $RUNS/rl-s$s-final.log 2>&1 && heldout $RUNS/rl-s$s/final rl-s$s-step$step $s ) &
    PID[$s]=$!
done
for s in $SEEDS; do wait ${PID[$s]} || echo "the final evaluation of rl-s$s FAILED"; done
el "final evaluations done"
for s in $SEEDS; do tail -3 $RUNS/sft-s$s.log; tail -4 $RUNS/rl-s$s-final.log; done
for f in $RUNS/*-greedy.json $RUNS/*-samples.json; do echo "$(basename $f): $(cut -c1-600 $f)"; done
for s in $SEEDS; do
    $PY - $RUNS/rl-s$s/metrics.jsonl <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    keys = [k for k in ("train/reward/mean", "train/success_rate", "sampling/groups_drawn", "sampling/groups_kept", "sampling/rounds", "kl", "entropy",
                        "time/rollout_s", "time/update_s") if k in r]
    print(sys.argv[1].split("/")[-2], r.get("step"), {k: round(r[k], 4) if isinstance(r[k], float) else r[k] for k in keys})
EOF
done
pack
ls -la $OUT
el "packed"
