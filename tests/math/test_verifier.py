"""The solver/verifier math agent (``agent="solver-verifier"``): named calls routed to their
adapters, the verifier's answer as the final one, and what happens when it says nothing readable."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest

import agentgym_lightning  # noqa: F401  (registers the envs)
from agentgym_lightning.envs.math.env import calculator_policy, make_arithmetic_env
from agentgym_lightning.envs.math.verifier import VERIFIER_EXAMPLES, SolverVerifierAgent
from agentgym_lightning.llm import ADAPTER_KEY
from agentgym_lightning.training.agent_adapters import AdapterRouting, AgentAdapters, agent_routes

from .conftest import play


def scripted(verifier_reply: str, solver_answer: str | None = None):
    """The calculator solver (answering ``solver_answer`` instead of the result when given),
    and a verifier replying ``verifier_reply`` (``{gold}`` is the task's answer)."""

    def policy(obs: Any, task: dict[str, Any]) -> Any:
        request = obs.request
        if request.metadata.get("role") == "verifier":
            return verifier_reply.format(gold=task["answer"])
        if solver_answer is not None and "<tool_response>" in str(request.messages[-1]["content"]):
            return f"Answer: {solver_answer}"
        return calculator_policy(obs, task)

    return policy


def test_the_solvers_and_the_verifiers_calls_are_named_and_routed_to_their_adapters():
    env = make_arithmetic_env(agent="solver-verifier")
    adapters = AgentAdapters(agent_routes(True, "solver|verifier"))
    routed: list[str] = []

    def generator(requests):
        routed.extend(r.metadata[ADAPTER_KEY] for r in requests)
        return [scripted("Answer: {gold}")(obs, task) for _ in requests]

    routing = AdapterRouting(generator, adapters)
    try:
        obs, info = env.reset(seed=0)
        task, done = info["task"], False
        while not done:
            (action,) = routing.generate([obs.request])
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
    finally:
        env.close()
    trajectory = info["trajectory"]
    assert [(s.agent, s.role) for s in trajectory.steps] == [("solver", "solver"), ("solver", "solver"), ("verifier", "verifier")]
    assert routed == ["solver", "solver", "verifier"]
    assert [adapters.adapter_of(s) for s in trajectory.steps] == ["solver", "solver", "verifier"]
    assert all(s.trainable for s in trajectory.steps)
    # the verifier starts a conversation of its own: the question, the solver's work and answer
    verifier = trajectory.steps[2].request.messages
    assert verifier[0]["role"] == "system" and len(verifier) == 2 + 2 * len(VERIFIER_EXAMPLES)
    assert verifier[-1]["content"] == (
        f"Question: {task['question']}\nSolver's work: {task['expression']} = {task['answer']}\nSolver's answer: {task['answer']}"
    )


def test_agent_match_trains_only_the_agent_it_names():
    env = make_arithmetic_env(agent="solver-verifier", agent_match="verifier")
    try:
        trajectory, _, _ = play(env, scripted("Answer: {gold}"))
    finally:
        env.close()
    assert [s.trainable for s in trajectory.steps] == [False, False, True]


def test_the_verifiers_answer_is_the_final_answer():
    env = make_arithmetic_env(agent="solver-verifier")
    try:
        fixed, _, fixed_return = play(env, scripted("Answer: {gold}", solver_answer="1"))
        broken, _, broken_return = play(env, scripted("Answer: 1"))
    finally:
        env.close()
    assert fixed_return == 1.0 and fixed.result["answer"] == fixed.task["answer"] and fixed.result["solver_answer"] == "1"
    assert fixed.result["verdict"] == "corrected" and fixed.steps[-1].outcome["verdict"] == "corrected"
    assert fixed.variables["metrics"] == {
        "correct": 1.0, "used_calculator": 1.0, "answer_parsed": 1.0, "solver_correct": 0.0, "verifier_corrected": 1.0,
    }
    assert broken_return == 0.0 and broken.result["answer"] == "1" and broken.variables["metrics"]["solver_correct"] == 1.0
    # the solver's signals stay on the solver's call
    assert fixed.steps[1].outcome["answer"] == "1" and "answer" not in fixed.steps[2].outcome


def test_an_accepted_answer_is_the_solvers():
    env = make_arithmetic_env(agent="solver-verifier")
    try:
        trajectory, _, total = play(env, scripted("The solver is right. Answer: {gold}"))
    finally:
        env.close()
    assert total == 1.0 and trajectory.result["verdict"] == "accepted" and trajectory.variables["metrics"]["verifier_corrected"] == 0.0


@pytest.mark.parametrize("reply", ["", "I agree with the solver.", "Answer: maybe"])
def test_a_verifier_that_says_nothing_readable_leaves_the_solvers_answer_standing(reply):
    env = make_arithmetic_env(agent="solver-verifier")
    try:
        right, _, right_return = play(env, scripted(reply))
        wrong, _, wrong_return = play(env, scripted(reply, solver_answer="1"))
    finally:
        env.close()
    assert right_return == 1.0 and right.result["verdict"] == "none" and right.result["answer"] == right.task["answer"]
    assert wrong_return == 0.0 and wrong.result["answer"] == "1" and wrong.result["answer_status"] == "ok"
    assert wrong.steps[-1].outcome["verdict"] == "none"


def test_the_verifier_answers_when_the_solver_ran_out_of_turns():
    # the solver asks for the calculator on every call, so it ends with no answer
    env = make_arithmetic_env(agent="solver-verifier", max_turns=2)

    def policy(obs, task):
        if obs.request.metadata.get("role") == "verifier":
            return f"Answer: {task['answer']}"
        return '<tool_call>{"name": "calculator", "arguments": {"expression": "1 + 1"}}</tool_call>'

    try:
        trajectory, _, total = play(env, policy)
    finally:
        env.close()
    assert [s.agent for s in trajectory.steps] == ["solver", "solver", "verifier"]  # the env's guard leaves room for it
    assert trajectory.result["solver_answer_status"] == "missing" and trajectory.result["verdict"] == "corrected"
    assert total == 1.0
    assert "Solver's work: 1 + 1 = 2\n1 + 1 = 2\nSolver's answer: none" in trajectory.steps[-1].request.messages[-1]["content"]


def test_verifier_options_reach_it_and_are_checked():
    env = make_arithmetic_env(agent="solver-verifier", verifier_examples=0, verifier_max_tokens=8)
    try:
        trajectory, _, _ = play(env, scripted("Answer: {gold}"))
    finally:
        env.close()
    request = trajectory.steps[-1].request
    assert len(request.messages) == 2 and request.sampling.max_tokens == 8
    with pytest.raises(ValueError, match="verifier examples must be 0 to 2"):
        make_arithmetic_env(agent="solver-verifier", verifier_examples=3)
    with pytest.raises(ValueError, match="verifier_examples need agent='solver-verifier'"):
        make_arithmetic_env(verifier_examples=1)


def test_the_lone_solver_still_names_only_its_role():
    env = make_arithmetic_env()
    try:
        trajectory, _, _ = play(env, calculator_policy)
    finally:
        env.close()
    assert [(s.agent, s.role) for s in trajectory.steps] == [(None, "solver"), (None, "solver")]


@pytest.mark.filterwarnings("ignore::agentgym_lightning.envs.math.data.MathDataWarning")  # the bundled sample serves
def test_gsm8k_runs_the_same_pair():
    env = gym.make("lightning/GSM8K-v0", agent="solver-verifier", limit=2)
    try:
        trajectory, _, total = play(env.unwrapped, scripted("Answer: {gold}"))
    finally:
        env.close()
    assert total == 1.0 and [s.agent for s in trajectory.steps][-1] == "verifier"
    assert isinstance(env.unwrapped.agent.agent, SolverVerifierAgent)
