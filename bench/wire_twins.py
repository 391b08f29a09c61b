"""The same agent on two wires, the same tasks, greedy: a Responses-API agent and its Chat
Completions twin on ``lightning/Arithmetic-v0`` with the embedded model.

    python bench/wire_twins.py                 # 16 held-out problems (difficulty 3, one example)

The twin is the env's own math agent with one method changed: its call goes through
``client.responses.create`` (``input`` = the same messages, ``max_output_tokens``, ``metadata``)
instead of ``client.chat.completions.create``. Every wire is read into the same internal request,
so the policy sees the same prompt: the script prints each wire's zero-shot reward, and checks
call by call that both runs fed the model the same prompt token ids and got the same tokens back.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentgym_lightning.envs.math.agent import MathAgent  # noqa: E402
from agentgym_lightning.envs.math.env import make_arithmetic_env  # noqa: E402
from agentgym_lightning.llm import new_tool_call_id  # noqa: E402
from agentgym_lightning.policies import make_policy  # noqa: E402
from agentgym_lightning.policies.tool_calls import parse_tool_calls  # noqa: E402
from agentgym_lightning.rollouts.in_process import rollout  # noqa: E402

ENV_KWARGS = {"split": "test", "difficulty": 3, "examples": 1}  # the main job's held-out eval


class ResponsesMathAgent(MathAgent):
    """The math agent (text protocol) calling the Responses API instead of Chat Completions."""

    def _chat(
        self, client: Any, model: str, messages: list[dict[str, Any]]
    ) -> tuple[str, list[dict[str, str]], list[str], dict[str, Any]]:
        cfg = self.config
        assert cfg.protocol == "text", "this twin speaks the text protocol (Arithmetic's default)"
        kwargs: dict[str, Any] = {"metadata": {"role": "solver", "trainable": "true"}}
        if cfg.max_tokens is not None:
            kwargs["max_output_tokens"] = cfg.max_tokens
        if cfg.temperature is not None:
            kwargs["temperature"] = cfg.temperature
        response = client.responses.create(model=model, input=messages, **kwargs)
        content = response.output_text
        parsed = parse_tool_calls(content, make_id=new_tool_call_id)
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in parsed.tool_calls]
        return content, calls, parsed.errors, {"role": "assistant", "content": content}


def make_env(wire: str) -> Any:
    env = make_arithmetic_env(**ENV_KWARGS)
    if wire == "responses":
        env.agent.agent = ResponsesMathAgent(env.agent.agent.config)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=16)
    args = parser.parse_args()
    policy = make_policy("hf", default_temperature=0.0)  # greedy
    runs = {}
    for wire in ("chat", "responses"):
        start = time.perf_counter()
        trajectories = rollout(
            lambda w=wire: make_env(w), policy, episodes=args.episodes, concurrency=args.episodes, progress=False
        )
        runs[wire] = sorted(trajectories, key=lambda t: str(t.task))
        wires = {s.request.wire for t in trajectories for s in t.steps}
        reward = sum(t.final_reward or 0.0 for t in trajectories) / len(trajectories)
        print(
            f"{wire:<10} wires seen {sorted(wires)}  mean final reward {reward:.3f}  ({time.perf_counter() - start:.1f} s)"
        )
    chat, responses = runs["chat"], runs["responses"]
    assert [t.task for t in chat] == [t.task for t in responses], "the two runs drew different tasks"
    same_prompts = same_tokens = calls = 0
    for a, b in zip(chat, responses):
        for x, y in zip(a.steps, b.steps):
            calls += 1
            same_prompts += x.completion.prompt_token_ids == y.completion.prompt_token_ids
            same_tokens += x.completion.completion_token_ids == y.completion.completion_token_ids
    per_task = sum((a.final_reward or 0.0) == (b.final_reward or 0.0) for a, b in zip(chat, responses))
    print(
        f"tasks with the same reward: {per_task}/{len(chat)}; calls compared: {calls}, same prompt ids: {same_prompts}, "
        f"same completion ids: {same_tokens}; steps per run: {sum(len(t.steps) for t in chat)} vs {sum(len(t.steps) for t in responses)}"
    )
    policy.close()


if __name__ == "__main__":
    main()
