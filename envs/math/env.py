"""``lightning/GSM8K-v0``, ``lightning/CalcX-v0`` and ``lightning/Arithmetic-v0``: math with a calculator.

    import gymnasium as gym
    import agentgym_lightning

    env = gym.make("lightning/Arithmetic-v0", difficulty=2)            # endless training problems
    env = gym.make("lightning/Arithmetic-v0", difficulty=2, split="test")  # the fixed held-out set
    env = gym.make("lightning/GSM8K-v0", split="test", limit=200)
    env = gym.make("lightning/CalcX-v0", data_dir="path/to/calcx", split="test")

The same agent (:mod:`.agent`) runs all three (``agent="solver-verifier"`` adds a verifier
after it, :mod:`.verifier`). The episode reward is 1.0 when the final answer
matches the gold (:func:`.answers.answers_match`, exact for GSM8K and Arithmetic, a relative
tolerance of 1e-2 for Calc-X as in the Calc-X paper) and 0.0 otherwise. Each episode records
``trajectory.variables["metrics"]``: ``correct``, ``used_calculator`` (it made at least one
calculator call) and ``answer_parsed`` (its final answer was found and read); ``agentgym-lightning
eval`` prints their means.

AIR (``envs/math/plugin.py``) is on for ``math.no_tool`` with weight 0 (reported on the step,
adds nothing); give ``air_weights`` to shape rewards, e.g. ``{"math.calc_ok": 0.1,
"math.calc_error": -0.1, "math.answer_missing": -0.2}``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from agentgym_lightning.agent import AgentContext
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.envs.tasks import shuffle_tasks, slice_tasks
from agentgym_lightning.llm import Completion, ToolCall
from agentgym_lightning.policies.tool_calls import new_tool_call_id

from .agent import AgentResult, MathAgent, MathAgentConfig
from .autogen_agent import AutoGenMathAgent
from .answers import answers_match
from .arithmetic import ArithmeticTasks, resolve_difficulty
from .data import load_math
from .verifier import SolverVerifierAgent, VerifiedResult, VerifierConfig

__all__ = [
    "GSM8K_ID",
    "CALCX_ID",
    "ARITHMETIC_ID",
    "DEFAULT_AIR_WEIGHTS",
    "AGENTS",
    "MathEpisodeAgent",
    "AutoGenMathEpisodeAgent",
    "MathReward",
    "make_gsm8k_env",
    "make_calcx_env",
    "make_arithmetic_env",
    "calculator_policy",
]

GSM8K_ID = "lightning/GSM8K-v0"
CALCX_ID = "lightning/CalcX-v0"
ARITHMETIC_ID = "lightning/Arithmetic-v0"
#: The agents the envs can run (``agent=...``): the from-scratch solver, the AutoGen solver, the
#: from-scratch solver followed by a verifier (:mod:`.verifier`).
AGENTS = ("scratch", "autogen", "solver-verifier")

#: Reported with every episode unless ``air_weights`` says otherwise.
DEFAULT_AIR_WEIGHTS: dict[str, float] = {"math.no_tool": 0.0}

_AGENT_FIELDS = {f.name for f in dataclasses.fields(MathAgentConfig)}
_VERIFIER_FIELDS = {f.name for f in dataclasses.fields(VerifierConfig)}


class MathEpisodeAgent:
    """The env's agent: the :class:`MathAgent`, then the verdict on its answer.

    Judging in the agent's worker puts the metrics on the trajectory (``metrics``) and lets a
    batch of episodes be judged in parallel. A gold answer that cannot be read is a data problem:
    the result carries the error and :class:`MathReward` raises on it, so the episode ends as an
    infrastructure failure instead of a zero reward.
    """

    def __init__(self, agent: MathAgent | SolverVerifierAgent, rel_tol: float = 0.0) -> None:
        if rel_tol < 0:
            raise ValueError(f"rel_tol must be >= 0, got {rel_tol}")
        self.agent = agent
        self.rel_tol = rel_tol

    def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> dict[str, Any]:
        return self.judge(task, self.agent(task, ctx), ctx)

    def judge(self, task: Mapping[str, Any], result: AgentResult, ctx: AgentContext) -> dict[str, Any]:
        """The verdict on ``result``'s answer, recorded as ``metrics``; the episode's result."""
        try:
            correct = answers_match(result.answer, str(task["answer"]), self.rel_tol)
        except ValueError as exc:  # the gold cannot be read: not the model's fault
            return {"error": str(exc), **dataclasses.asdict(result)}
        metrics = {
            "correct": float(correct),
            "used_calculator": float(result.calculator_calls > 0),
            "answer_parsed": float(result.answer_status == "ok"),
        }
        if isinstance(result, VerifiedResult):  # what the verifier added: correct - solver_correct
            metrics["solver_correct"] = float(answers_match(result.solver_answer, str(task["answer"]), self.rel_tol))
            metrics["verifier_corrected"] = float(result.verdict == "corrected")
        ctx.emit_variable("metrics", metrics)
        return {"correct": correct, **dataclasses.asdict(result)}


class AutoGenMathEpisodeAgent(MathEpisodeAgent):
    """The env's agent with ``agent="autogen"``: the AutoGen solver (:mod:`.autogen_agent`), handed
    its model client by the adapter, run as a task on the shared event loop; judged as always."""

    def __init__(self, agent: AutoGenMathAgent, rel_tol: float = 0.0) -> None:
        from agentgym_lightning.env import adapt_agent
        from agentgym_lightning.plugins.autogen_adapter import AutoGenAgent

        super().__init__(agent, rel_tol)  # type: ignore[arg-type]
        # The client's create arguments: every call asks for what the from-scratch agent's calls ask.
        # No metadata={"agent": ...}: AutoGen's own invoke_agent span names the calls "solver"
        # (agentgym_lightning.tracing; the `tracing` extra).
        options: dict[str, Any] = {}
        if agent.config.temperature is not None:
            options["temperature"] = agent.config.temperature
        if agent.config.max_tokens is not None:
            options["max_tokens"] = agent.config.max_tokens
        self._solve = adapt_agent(AutoGenAgent(agent, name="math-autogen", **options))

    async def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> dict[str, Any]:  # type: ignore[override]
        return self.judge(task, await self._solve(task, ctx), ctx)


class MathReward:
    """``reward_fn(task, result)``: 1.0 when the answer matches ``task["answer"]``, else 0.0.

    ``result`` is what :class:`MathEpisodeAgent` returns, or an answer text (judged here, so
    this reward serves any math agent).
    """

    def __init__(self, rel_tol: float = 0.0) -> None:
        self.rel_tol = rel_tol

    def __call__(self, task: Mapping[str, Any], result: Any) -> float:
        if isinstance(result, Mapping):
            if "error" in result:
                raise ValueError(result["error"])  # the episode ends as infra_failed, not as a zero reward
            if "correct" in result:
                return float(bool(result["correct"]))
            result = result.get("answer")
        if isinstance(result, AgentResult):
            result = result.answer
        return float(answers_match(None if result is None else str(result), str(task["answer"]), self.rel_tol))


def _build(
    tasks: Any,
    *,
    env_id: str,
    rel_tol: float,
    air_weights: Mapping[str, float] | None,
    max_turns: int,
    max_tokens: int | None,
    kwargs: dict[str, Any],
) -> AgentEnv:
    agent_kind = kwargs.pop("agent", "scratch")
    if agent_kind not in AGENTS:
        raise ValueError(f"unknown math agent {agent_kind!r}; choose one of {', '.join(AGENTS)}")
    agent_options = {k: kwargs.pop(k) for k in list(kwargs) if k in _AGENT_FIELDS}
    verifier_options = {
        k.removeprefix("verifier_"): kwargs.pop(k) for k in list(kwargs)
        if k.startswith("verifier_") and k.removeprefix("verifier_") in _VERIFIER_FIELDS
    }
    if verifier_options and agent_kind != "solver-verifier":
        raise ValueError(f"{', '.join('verifier_' + k for k in verifier_options)} need agent='solver-verifier'")
    if agent_kind == "autogen" and agent_options.get("protocol", "tools") != "tools":
        raise ValueError("the autogen agent calls the calculator as a native tool: protocol must be 'tools'")
    config = MathAgentConfig(max_turns=max_turns, max_tokens=max_tokens, **agent_options)
    kwargs.setdefault("env_id", env_id)
    # A guard only: the agent itself never makes more than max_turns calls (the verifier one more).
    kwargs.setdefault("max_turns", max_turns + (agent_kind == "solver-verifier"))
    weights = {**DEFAULT_AIR_WEIGHTS, **dict(air_weights or {})}
    if agent_kind == "autogen":
        agent: MathEpisodeAgent = AutoGenMathEpisodeAgent(AutoGenMathAgent(config), rel_tol)
    elif agent_kind == "solver-verifier":
        agent = MathEpisodeAgent(SolverVerifierAgent(config, VerifierConfig(**verifier_options)), rel_tol)
    else:
        agent = MathEpisodeAgent(MathAgent(config), rel_tol)
    return AgentEnv(agent, tasks, MathReward(rel_tol), air_weights=weights, **kwargs)


def calculation_steps(solution: str) -> int:
    """The calculator annotations (``<<48/2=24>>``) of a GSM8K gold solution: its calculations."""
    return solution.count("<<")


def _dataset_env(
    name: str, split: str, data_dir: str | None, limit: int | None, *, max_calc_steps: int | None = None,
    shuffle_seed: int | None = None, offset: int = 0, **build: Any,
) -> AgentEnv:
    """An env over the tasks of a loaded data set (``env.math_dataset`` says which)."""
    dataset = load_math(name, split, data_dir)
    tasks = dataset.tasks()
    if max_calc_steps is not None:
        if isinstance(max_calc_steps, bool) or not isinstance(max_calc_steps, int) or max_calc_steps < 0:
            raise ValueError(f"max_calc_steps must be an integer >= 0 or None; got {max_calc_steps!r}")
        tasks = [t for t in tasks if calculation_steps(t["solution"]) <= max_calc_steps]
        if not tasks:
            raise ValueError(f"no {name} {split} problem has at most {max_calc_steps} calculations")
    tasks = slice_tasks(shuffle_tasks(tasks, shuffle_seed), split, offset, limit)
    env = _build(tasks, **build)
    env.math_dataset = dataset  # type: ignore[attr-defined]
    return env


def make_gsm8k_env(
    split: str = "test",
    data_dir: str | None = None,
    rel_tol: float = 0.0,
    air_weights: Mapping[str, float] | None = None,
    max_turns: int = 6,
    *,
    limit: int | None = None,
    max_tokens: int | None = 256,
    max_calc_steps: int | None = None,
    shuffle_seed: int | None = None,
    offset: int = 0,
    **kwargs: Any,
) -> AgentEnv:
    """Build ``lightning/GSM8K-v0``.

    Args:
        split: ``"test"`` (1319 problems) or ``"train"`` (7473), or any ``<split>.jsonl`` there.
        data_dir: The GSM8K folder or one ``.jsonl`` file (else ``$AGENTGYM_LIGHTNING_GSM8K_DIR``,
            the imported copy, or the bundled sample; see :mod:`.data`).
        rel_tol: Relative tolerance of the answer check (0: exact, GSM8K's own rule).
        air_weights: AIR weights (sources in ``envs/math/plugin.py``), merged over
            :data:`DEFAULT_AIR_WEIGHTS`.
        max_turns: Most LLM calls per episode.
        limit: Keep only the first ``limit`` problems (after ``max_calc_steps``, ``shuffle_seed``
            and ``offset``).
        max_tokens: ``max_tokens`` of each call.
        max_calc_steps: Keep only problems whose gold solution makes at most this many
            calculations (its ``<<a*b=c>>`` annotations, :func:`calculation_steps`): a rule on the
            data that picks easier problems the same way in every split.
        shuffle_seed: Put the (kept) problems in a fixed order drawn from this seed before
            ``offset`` and ``limit`` (None: file order).
        offset: Skip the first ``offset`` problems of that order: ``offset=k*n, limit=n`` are
            disjoint slices of one split, e.g. pass rates measured a slice at a time.
        **kwargs: ``agent``: ``"scratch"`` (default, :class:`~.agent.MathAgent`) or ``"autogen"``
            (the solver as an AutoGen ``AssistantAgent``, :mod:`.autogen_agent`; needs the
            ``[autogen]`` extra), or ``"solver-verifier"`` (the from-scratch solver, then a verifier
            that accepts or corrects its answer, :mod:`.verifier`; its options as
            ``verifier_<field>`` of :class:`~.verifier.VerifierConfig`). Agent options (any :class:`~.agent.MathAgentConfig` field: ``protocol``,
            ``temperature``, ``system_prompt``...), then :class:`~agentgym_lightning.env.AgentEnv`
            options (``time_limit``, ``transport``, ``model_name``...).
    """
    return _dataset_env("gsm8k", split, data_dir, limit, max_calc_steps=max_calc_steps, shuffle_seed=shuffle_seed,
                        offset=offset, env_id=GSM8K_ID, rel_tol=rel_tol, air_weights=air_weights, max_turns=max_turns,
                        max_tokens=max_tokens, kwargs=kwargs)


def make_calcx_env(
    split: str = "test",
    data_dir: str | None = None,
    rel_tol: float = 1e-2,
    air_weights: Mapping[str, float] | None = None,
    max_turns: int = 6,
    *,
    limit: int | None = None,
    max_tokens: int | None = 256,
    **kwargs: Any,
) -> AgentEnv:
    """Build ``lightning/CalcX-v0``: as :func:`make_gsm8k_env`, on Calc-X (``train``,
    ``validation``, ``test``), with the Calc-X paper's relative tolerance 1e-2 by default.
    Multiple-choice items (AQuA) are answered with the option letter."""
    return _dataset_env("calcx", split, data_dir, limit, env_id=CALCX_ID, rel_tol=rel_tol, air_weights=air_weights,
                        max_turns=max_turns, max_tokens=max_tokens, kwargs=kwargs)


def make_arithmetic_env(
    difficulty: int | dict[str, Any] = 1,
    split: str = "train",
    air_weights: Mapping[str, float] | None = None,
    max_turns: int = 3,
    *,
    digits: int | None = None,
    operators: str | None = None,
    steps: int | None = None,
    allow_negative: bool | None = None,
    heldout_size: int = 200,
    max_tokens: int | None = 64,
    protocol: str | None = None,
    **kwargs: Any,
) -> AgentEnv:
    """Build ``lightning/Arithmetic-v0``: generated problems (see :mod:`.arithmetic`).

    Args:
        difficulty: A level of :data:`~.arithmetic.LEVELS` (1-4) or a dict of
            :class:`~.arithmetic.Difficulty` fields; ``digits``, ``operators``, ``steps`` and
            ``allow_negative`` override its fields.
        split: ``"train"`` — endless problems drawn from the env's RNG (``reset(seed=...)``);
            ``"test"`` — the fixed held-out list (``heldout_size`` problems, never drawn for
            train), in order.
        max_turns: Most LLM calls per episode (a calculator call, the answer, one retry).
        max_tokens: ``max_tokens`` of each call: a calculator call and an answer are short.
        protocol: ``"text"`` by default here (``"tools"`` for GSM8K and Calc-X, and for
            ``agent="autogen"``, which calls tools natively only): with the
            embedded SmolLM2-135M it calls the calculator and answers correctly far more often
            from the shorter prompt, and every prompt extends the last verbatim (see README).
        **kwargs: As for :func:`make_gsm8k_env`.
    """
    level = resolve_difficulty(
        difficulty, digits=digits, operators=operators, steps=steps, allow_negative=allow_negative
    )
    problems = ArithmeticTasks(level, heldout_size=heldout_size)
    if split == "train":
        tasks: Any = problems.sample
    elif split == "test":
        tasks = problems.heldout
    else:
        raise ValueError(f"Arithmetic-v0 split must be 'train' or 'test', got {split!r}")
    if protocol is None:
        protocol = "tools" if kwargs.get("agent") == "autogen" else "text"
    env = _build(tasks, env_id=ARITHMETIC_ID, rel_tol=0.0, air_weights=air_weights,
                 max_turns=max_turns, max_tokens=max_tokens, kwargs={"protocol": protocol, **kwargs})
    env.arithmetic = problems  # type: ignore[attr-defined]
    return env


def calculator_policy(observation: Any, task: Mapping[str, Any] | None = None) -> Completion | str:
    """A scripted policy that solves any task with the calculator (tests, examples).

    First call: it asks the calculator for ``task["expression"]`` (Arithmetic) or, lacking one,
    the gold answer itself; next call: ``Answer: <the last tool result>``. Works with both
    protocols (it answers the ``text`` protocol in ``<tool_call>`` text). The verifier's call
    (``agent="solver-verifier"``) it answers with the gold answer.
    """
    if observation.request.metadata.get("role") == "verifier":
        return f"Answer: {(task or {}).get('answer', '0')}"
    messages = observation.request.messages
    last = messages[-1]
    if last.get("role") == "tool" or "<tool_response>" in str(last.get("content") or ""):
        result = str(last.get("content") or "").replace("<tool_response>", "").replace("</tool_response>", "").strip()
        return f"Answer: {result.split(' ')[0]}"
    expression = (task or {}).get("expression") or (task or {}).get("answer") or "0"
    if observation.request.tools:
        call = ToolCall(id=new_tool_call_id(), name="calculator", arguments=json.dumps({"expression": expression}))
        return Completion(text="", tool_calls=[call], finish_reason="tool_calls")
    return '<tool_call>{"name": "calculator", "arguments": {"expression": "' + str(expression) + '"}}</tool_call>'
