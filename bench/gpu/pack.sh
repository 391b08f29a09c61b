#!/bin/bash
# Build what a lent GPU machine needs for the recipes' runs, in two ignored folders, because that
# machine (this workplace's `device` tool) has torch, transformers and peft but no package index,
# no ../shared, and each call carries at most 64 MiB:
#   .gpu-a/  the first part of the embedded model (xz), carried by a first call that copies it to /tmp
#   .gpu/    wheels missing there (cp312, the versions installed here), this package's wheel, the
#            model's second part, TASK's data (tar.xz) and its gold episodes (make sft-<TASK>'s)
# TASK=spider (default): then the first call `cp .gpu-a/model.xz.a /tmp/` (carry .gpu-a), at once the
# second `bash bench/gpu/spider_warm_start.sh` with DEVICE=1 (carry .gpu; docs/experiments.md has the flow).
# TASK=math: the same two calls, the second `bash bench/gpu/math_rl.sh` with DEVICE=1.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
for d in /.gpu/ /.gpu-a/; do grep -qxF "$d" .git/info/exclude || echo "$d" >> .git/info/exclude; done
PIP=.venv/bin/pip PY=.venv/bin/python
SEEDS=${SEEDS:-"0 1 2"}
TASK=${TASK:-spider}
case $TASK in spider) DATASET=spider ;; math) DATASET=gsm8k ;; *) echo "TASK is spider or math, not $TASK" >&2; exit 2 ;; esac
# Missing from the device image (its package list: the device tool's KINDS.md).
PACKAGES="annotated-types datasets dill multiprocess distro farama-notifications gguf gymnasium httpcore2
  httpx2 httptools jiter jsonpatch jsonpointer langchain-core langchain-openai langchain-protocol langgraph
  langgraph-checkpoint langgraph-prebuilt langgraph-sdk langsmith openai orjson ormsgpack pydantic
  pydantic-core requests-toolbelt sniffio sqlglot starlette tenacity truststore typing-inspection
  uuid-utils uvicorn trl"
# The math agent is AutoGen's AssistantAgent.
[ "$TASK" = math ] && PACKAGES="$PACKAGES autogen-agentchat autogen-core autogen-ext jsonref opentelemetry-api"
rm -rf .gpu .gpu-a && mkdir -p .gpu/whl .gpu/gold .gpu-a
pins=$(for p in $PACKAGES; do echo "$p==$($PIP show "$p" | awk '/^Version/{print $2}')"; done)
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .gpu/whl $pins
$PIP wheel -q --no-deps -w .gpu/whl .
tar cf - -C ../shared/data $DATASET | xz -T0 -6 > .gpu/$DATASET.tar.xz
for s in $SEEDS; do
    $PY -m agentgym_lightning.envs.$TASK.gold --config recipes/$TASK.yaml --episodes 256 --seed "$s" \
        --output .gpu/gold/$TASK-gold-s$s.jsonl
    xz -T0 -6 .gpu/gold/$TASK-gold-s$s.jsonl
done
gguf=$($PY -c 'import importlib.util, pathlib; from agentgym_lightning.policies.models import EMBEDDED_MODELS
m = EMBEDDED_MODELS["smollm2-135m"]; print(pathlib.Path(importlib.util.find_spec(m.package).submodule_search_locations[0], m.gguf_file))')
sha256sum "$gguf" | awk '{print $1}' > .gpu/model.sha256
xz -T0 -6 -c "$gguf" > /tmp/model.gguf.xz
# The second call carries the tree, .gpu and the model's tail: give the first call all it can hold.
tree=$(git ls-files -z | xargs -0 stat -c %s | awk '{s+=$1} END {print s}')
first=$(( 64 * 1024 * 1024 - tree - 2000000 ))
head -c "$first" /tmp/model.gguf.xz > .gpu-a/model.xz.a
tail -c +$(( first + 1 )) /tmp/model.gguf.xz > .gpu/model.xz.b
rm /tmp/model.gguf.xz
a=$(du -sb .gpu-a | cut -f1) b=$(du -sb .gpu | cut -f1)
echo "first call carries $(( (tree + a) / 1048576 )) MiB, the second $(( (tree + b) / 1048576 )) MiB (limit 64)"
[ $(( tree + b )) -lt $(( 64 * 1024 * 1024 )) ] || { echo "the second call is over 64 MiB" >&2; exit 1; }
