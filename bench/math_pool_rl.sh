#!/bin/bash
# Issue 46 on a 2-core CPU, one seed: RL from the math warm start that draws only tasks with signal.
# Each stage is skipped when what it writes exists, so a session that ended mid-way is picked up
# by the next one on the same machine (RUNS outside the checkout):
#   1. the warm start: gold episodes, then `sft` (recipes/sft/math.yaml, training only; ~40 min quiet);
#   2. the pool: the warm start's pass rates on POOL_CHUNKS x POOL train problems, POOL_SAMPLES episodes
#      each at the recipe's temperature, a slice of POOL at a time (`eval` with the env's offset and
#      limit; 96 x 4 ~ 30 min quiet; POOL_JOBS slices at once, e.g. 2 on 2 cores with THREADS=1), each
#      kept as a file of task keys and counts (bench/pools/: slices measured before, kept in the
#      repository), the slices merged into one task file (`pass-rates`). Wide rather than deep: seed 0's
#      pool of 16 problems was learned (train success 0.18 -> 0.8) with no held-out gain, so a pool
#      needs many problems; per episode spent, 4 samples a problem find more with signal than 8 (one
#      solved 1 time in 8 shows it in 41 % of 4-sample groups, 66 % of 8-sample ones);
#   3. RL from the warm start with recipes/math.yaml on the pool (`task_file`; the curriculum passes
#      over the problems never or always solved there, judged after POOL_SAMPLES attempts), B 4 x G 8,
#      up to 3 sampling rounds, no in-run evaluation, stopped with SIGTERM at STOP (epoch seconds;
#      default RL_MINUTES from the stage's start);
#   4. `train --resume RUN --steps <the step reached>` writes final/; it, the checkpoints of KEEP_STEPS
#      (kept apart in RUN-kept/ as they come) and the warm start (right after stage 1) are each evaluated
#      greedy on the recipe's 96 held-out problems as `bench/gpu/math_rl.sh` does, and compared task by
#      task with the warm start (`agentgym-lightning compare`: won, lost, the sign test; RUN-compare.txt),
#      as is the mean of the kept checkpoints from AVERAGE_FROM (default 20) on and final/ (RUN-avg:
#      `agentgym-lightning average`, checkpoint averaging).
# UNTIL=N stops after stage N (1: the warm start and its evaluation; 2: the pool).
# Seed 0's run of this recipe, with a pool from an earlier run's episodes (`agentgym-lightning
# pass-rates`), and its figures: docs/experiments.md (issue 46, "RL on a pool of tasks with signal").
#
#   SEED=1 RUNS=/work/runs/pool nice -n 5 bash bench/math_pool_rl.sh          # from the repository root
#   SEED=0 RUNS=/work/runs/pool POOL_CHUNKS=8 POOL_JOBS=2 THREADS=1 bash bench/math_pool_rl.sh   # a pool of 768
#   SEED=1 RUNS=/work/runs/pool POOL_FILE=/work/runs/pool/pool-s0.jsonl bash bench/math_pool_rl.sh  # seed 0's pool
#   SEED=1 RUNS=/work/runs/pool POOL_CHUNKS=4 POOL_JOBS=2 THREADS=1 UNTIL=2 bash bench/math_pool_rl.sh  # the pool only
#
# The CPU dry run (about 10 minutes): SEED=0 RUNS=/tmp/pool-dry GOLD=4 POOL=2 POOL_SAMPLES=2 HELD_OUT=2 RL_MINUTES=5 KEEP_STEPS="1 2" AVERAGE_FROM=1
#   SFT_EXTRA="--set max_steps=1 --set rows_per_step=2" RL_EXTRA="--set tasks_per_step=1 --set num_generations=2 --set save_steps=1" \
#   bash bench/math_pool_rl.sh
set -u
cd "$(dirname "$0")/.."
export WANDB_MODE=offline PYTHONUNBUFFERED=1
SEED=${SEED:?the seed}
RUNS=${RUNS:?a folder for the runs (outside the checkout)}; mkdir -p "$RUNS"
DATA=${DATA:-../shared/data/gsm8k}
BIN=${BIN:-.venv/bin/agentgym-lightning} PY=${PY:-.venv/bin/python}
THREADS=${THREADS:-2}
GOLD=${GOLD:-256} POOL=${POOL:-96} POOL_SAMPLES=${POOL_SAMPLES:-4} POOL_CHUNKS=${POOL_CHUNKS:-1} POOL_JOBS=${POOL_JOBS:-1}
HELD_OUT=${HELD_OUT:-96}
RL_MINUTES=${RL_MINUTES:-90}
SFT=$RUNS/sft-s$SEED RL=$RUNS/rl-pool-s$SEED
# POOL_FILE: a task file measured before (another seed's pool: the problems with signal for a warm
# start of this recipe are mostly the same), which skips stage 2.
POOL_FILE=${POOL_FILE:-$RUNS/pool-s$SEED.jsonl}
el() { echo "[$(date +%T)] $*"; }

# The recipe's held-out evaluation of a model folder (`eval --config`: its eval env, the seed plus 7919,
# calls capped at max_completion_length 192, greedy), its first HELD_OUT problems: NAME.json (the
# summary) and NAME.jsonl (the episodes).
heldout() {  # heldout MODEL_DIR NAME
    [ -s $RUNS/$2.json ] && { el "$2: done before"; return 0; }
    $BIN eval --config recipes/math.yaml --model $1 --env-kwarg data_dir=$DATA --seed $SEED \
        --policy-kwarg num_threads=$THREADS --policy-kwarg max_batch_size=32 --episodes $HELD_OUT --no-progress --json \
        --output $RUNS/$2.jsonl > $RUNS/$2.json.part 2> $RUNS/$2.log && mv $RUNS/$2.json.part $RUNS/$2.json && el "$2: $(cut -c1-300 $RUNS/$2.json)"
}

if [ ! -d $SFT/final ]; then
    el "1. the warm start"
    [ -s $RUNS/math-gold-s$SEED.jsonl ] || $PY -m agentgym_lightning.envs.math.gold --config recipes/math.yaml --env-kwarg data_dir=$DATA \
        --episodes $GOLD --seed $SEED --output $RUNS/math-gold-s$SEED.jsonl || exit 1
    resume=""; [ -d $SFT/checkpoints ] && resume="--resume $SFT"
    if [ -n "$resume" ]; then $BIN sft $resume > $SFT.log 2>&1 || exit 1
    else $BIN sft $RUNS/math-gold-s$SEED.jsonl --config recipes/sft/math.yaml --env-kwarg data_dir=$DATA --seed $SEED \
        --set eval_env_kwargs=null --set num_threads=$THREADS --output-dir $SFT ${SFT_EXTRA:-} > $SFT.log 2>&1 || exit 1
    fi
fi
el "1. warm start: $SFT/final"
heldout $SFT/final warm-s$SEED-greedy  # early: a warm start rebuilt on a new machine is checked before the pool
[ "${UNTIL:-4}" -le 1 ] && { el "UNTIL=$UNTIL: stopped after stage 1"; exit 0; }

# One slice of the pool: train problems C*POOL .. (C+1)*POOL - 1 of the seed's shuffled order (the
# env's offset and limit), POOL_SAMPLES episodes each; its episodes file is written only when whole,
# then its task file of keys and counts (`pass-rates --keys-only`: no GSM8K text). A slice kept in
# the repository (POOLS/math-s<seed>-p<POOL>x<POOL_SAMPLES>-c<C>.jsonl) is not measured again: a
# new machine goes on from the slices an earlier one measured.
POOLS=${POOLS:-bench/pools}
slice_file() {  # slice_file C: the slice's task file, the repository's when it has one
    local kept=$POOLS/math-s$SEED-p${POOL}x$POOL_SAMPLES-c$1.jsonl
    [ -s $kept ] && echo $kept || echo $RUNS/pool-s$SEED-c$1.jsonl
}
pool_slice() {  # pool_slice C
    local part=$RUNS/pool-s$SEED-c$1
    [ -s $(slice_file $1) ] && return 0
    if [ ! -s $part-episodes.jsonl ]; then
        $BIN eval --env lightning/GSM8K-v0 --model $SFT/final --env-kwarg split=train --env-kwarg shuffle_seed=$SEED \
            --env-kwarg offset=$(( $1 * POOL )) --env-kwarg limit=$POOL \
            --env-kwarg data_dir=$DATA --env-kwarg agent=autogen --env-kwarg max_calc_steps=2 --env-kwarg max_turns=4 \
            --env-kwarg time_limit=null --policy-kwarg tool_prompt=compact --policy-kwarg num_threads=$THREADS --policy-kwarg max_batch_size=32 \
            --max-tokens 192 --seed $(( SEED * 1000 + $1 )) --no-progress --json --episodes $((POOL * POOL_SAMPLES)) --group-size $POOL_SAMPLES \
            --concurrency $((POOL * POOL_SAMPLES)) --temperature 0.6 --output $part-episodes.part.jsonl > $part.json 2> $part.log \
            && mv $part-episodes.part.jsonl $part-episodes.jsonl && el "2. slice $1: $(cut -c1-200 $part.json)" || return 1
    fi
    $BIN pass-rates $part-episodes.jsonl --keys-only -o $part.jsonl.part > /dev/null && mv $part.jsonl.part $part.jsonl
}

if [ ! -s $POOL_FILE ]; then
    el "2. the pool: $POOL_CHUNKS slice(s) of $POOL train problems x $POOL_SAMPLES at 0.6, $POOL_JOBS at once"
    for c in $(seq 0 $((POOL_CHUNKS - 1))); do
        pool_slice $c &
        while [ $(jobs -rp | wc -l) -ge $POOL_JOBS ]; do wait -n; done
    done
    wait
    parts=$(for c in $(seq 0 $((POOL_CHUNKS - 1))); do slice_file $c; done)
    for f in $parts; do [ -s $f ] || { el "2. $f is missing: see ${f%.jsonl}.log"; exit 1; }; done
    # pass-rates adds the counts of a problem in several files (disjoint slices: one line a problem, as measured)
    $BIN pass-rates $parts --keys-only -o $POOL_FILE.part > /dev/null && mv $POOL_FILE.part $POOL_FILE || exit 1
fi
el "2. pool: $($PY -c 'import json, sys; r = [json.loads(l) for l in open(sys.argv[1])]
print(len(r), "problems,", sum(0 < x["successes"] < x["attempts"] for x in r), "with signal")' $POOL_FILE)"
[ "${UNTIL:-4}" -le 2 ] && { el "UNTIL=$UNTIL: stopped after stage 2"; exit 0; }

# The run keeps its last 2 checkpoints; those of KEEP_STEPS are kept apart as they come (hard links:
# a checkpoint is renamed into place whole) and evaluated in stage 4 beside final/.
KEEP_STEPS=${KEEP_STEPS:-10 20 30 40 50}
keep_checkpoints() {
    local s src
    for s in $KEEP_STEPS; do
        src=$RL/checkpoints/checkpoint-$(printf %06d $s)
        [ -d $src ] && [ ! -d $RL-kept/step-$s ] && mkdir -p $RL-kept && cp -al $src $RL-kept/step-$s
    done
}

if [ ! -d $RL/final ]; then
    STOP=${STOP:-$(( $(date +%s) + RL_MINUTES * 60 ))}
    el "3. RL until $(date -d @$STOP +%T)"
    if [ -d $RL/checkpoints ]; then
        # A resumed run keeps its saved config but this call's threads (and RL_EXTRA); the log goes on.
        $BIN train --resume $RL --set num_threads=$THREADS ${RL_EXTRA:-} >> $RL.log 2>&1 &
    else
        $BIN train --config recipes/math.yaml --env-kwarg data_dir=$DATA --init-from $SFT --seed $SEED --output-dir $RL \
            --set task_file=$POOL_FILE --set curriculum_min_attempts=$POOL_SAMPLES --set curriculum_min_pass_rate=0.05 \
            --set eval_env_kwargs=null --set max_steps=200 --set save_steps=5 --set save_total_limit=2 --set num_threads=$THREADS \
            --set tasks_per_step=4 --set max_sampling_rounds=3 ${RL_EXTRA:-} > $RL.log 2>&1 &
    fi
    P=$!
    while kill -0 $P 2>/dev/null && [ $(date +%s) -lt $STOP ]; do keep_checkpoints; sleep 5; done
    kill -TERM $P 2>/dev/null; wait $P; el "3. stopped (rc $?)"; keep_checkpoints
    step=$($PY -c 'import json, os, sys; rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()] if os.path.exists(sys.argv[1]) else []
print(max([int(r["step"]) for r in rows if any(k.startswith("train/") for k in r)] or [0]))' $RL/metrics.jsonl)
    [ "$step" -gt 0 ] || { el "3. RL reached no step before $(date -d @$STOP +%T): nothing to evaluate (remove $RL and give it more time)"; exit 1; }
    el "4. final/ at step $step"
    $BIN train --resume $RL --steps $step > $RL-final.log 2>&1 || exit 1
    echo $step > $RL-final.step
fi
step=$(cat $RL-final.step)
heldout $RL/final rl-pool-s$SEED-step$step-greedy
evaluated=""
for s in $KEEP_STEPS; do
    [ -d $RL-kept/step-$s ] && [ $s -lt $step ] && heldout $RL-kept/step-$s rl-pool-s$SEED-step$s-greedy \
        && evaluated="$evaluated $RUNS/rl-pool-s$SEED-step$s-greedy.jsonl"
done
# The mean of the kept checkpoints from AVERAGE_FROM on and final/ (`agentgym-lightning average`): the
# run's trend, chosen without looking at any held-out result (it lagged the last checkpoint of runs
# still improving: docs/experiments.md, issue 46).
AVERAGE_FROM=${AVERAGE_FROM:-20}
averaged=""
for s in $KEEP_STEPS; do
    [ -d $RL-kept/step-$s ] && [ $s -ge $AVERAGE_FROM ] && [ $s -lt $step ] && averaged="$averaged $RL-kept/step-$s"
done
if [ -n "$averaged" ]; then
    [ -d $RL-avg ] || $BIN average $averaged $RL/final --output $RL-avg --no-progress || exit 1
    heldout $RL-avg rl-pool-s$SEED-avg-greedy && evaluated="$evaluated $RUNS/rl-pool-s$SEED-avg-greedy.jsonl"
fi
# Each RL evaluation against the warm start's, task by task: won, lost, the sign test.
$BIN compare $RUNS/warm-s$SEED-greedy.jsonl $evaluated $RUNS/rl-pool-s$SEED-step$step-greedy.jsonl | tee $RUNS/rl-pool-s$SEED-compare.txt
el "done"
