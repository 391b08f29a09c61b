"""``lightning/GuessNumber-v0``: a small multi-turn game with a plain-Python agent.

The agent asks the model to guess a secret integer and answers "higher"/"lower" until it is
found or the guesses run out. It exists for tests and examples: every turn is one LLM call, the
agent exposes semantic variables (``low``, ``high``), and an unparseable guess is an outcome
signal (``invalid_guess``) that AIR can weigh. A binary-search policy solves it in log2(range)
turns.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from agentgym_lightning.agent import AgentContext
from agentgym_lightning.env import AgentEnv

SYSTEM_PROMPT = "You are playing a number-guessing game. Answer with a single integer and nothing else."


def make_tasks(count: int = 64, low: int = 1, high: int = 100, seed: int = 1234) -> list[dict[str, Any]]:
    """A fixed list of games: the same ``seed`` always gives the same secrets."""
    rng = np.random.default_rng(seed)
    return [
        {"id": f"guess-{i}", "secret": int(rng.integers(low, high + 1)), "low": low, "high": high}
        for i in range(count)
    ]


def guess_number_agent(task: dict[str, Any], ctx: AgentContext) -> int | None:
    """Play one game; returns the last valid guess (or None)."""
    client = ctx.openai_client()
    low, high, secret = int(task["low"]), int(task["high"]), int(task["secret"])
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"I picked an integer between {low} and {high}. What is your guess?"},
    ]
    guess: int | None = None
    for _ in range(int(task.get("max_guesses", 10))):
        ctx.emit_variable("low", low)
        ctx.emit_variable("high", high)
        reply = client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=16, temperature=0.0)
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        match = re.search(r"-?\d+", text)
        ctx.emit_variable("invalid_guess", match is None)
        if match is None:
            messages.append({"role": "user", "content": "That is not an integer. Answer with a single integer."})
            continue
        guess = int(match.group())
        if guess == secret:
            return guess
        if guess < secret:
            low = max(low, guess + 1)
            hint = "Higher."
        else:
            high = min(high, guess - 1)
            hint = "Lower."
        messages.append({"role": "user", "content": f"{hint} Guess again."})
    return guess


def guess_reward(task: dict[str, Any], result: int | None) -> float:
    """1.0 for finding the secret, else 0.0."""
    return 1.0 if result == task["secret"] else 0.0


def make_env(num_tasks: int = 64, low: int = 1, high: int = 100, max_guesses: int = 10, **kwargs: Any) -> AgentEnv:
    """Build the env; extra keyword arguments go to :class:`~agentgym_lightning.env.AgentEnv`."""
    tasks = [dict(t, max_guesses=max_guesses) for t in make_tasks(num_tasks, low, high)]
    kwargs.setdefault("env_id", "lightning/GuessNumber-v0")
    return AgentEnv(guess_number_agent, tasks, guess_reward, **kwargs)


def binary_search_policy(observation: Any) -> str:
    """A scripted policy that solves the game: guess the middle of the agent's ``low``/``high``."""
    low, high = observation.variables.get("low", 1), observation.variables.get("high", 100)
    return str((int(low) + int(high)) // 2)
