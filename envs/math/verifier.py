"""Two agents on one problem: the calculator solver, then a verifier (``agent="solver-verifier"``).

The solver is :class:`~.agent.MathAgent` as it runs alone (its calls named
``metadata={"agent": "solver", "role": "solver"}``). Then the verifier makes one call of its own
(``metadata={"agent": "verifier", "role": "verifier"}``), a new conversation: its instructions,
``examples`` worked examples, and the question with the solver's work (each calculator
expression and result) and answer. It replies ``Answer: <number>``: the same number accepts the
solver's answer, another one corrects it. Agents are named as the LangGraph Spider agent's nodes
are, so ``--agent-match 'solver|verifier' --lora-per-agent`` gives each its own adapter.

The episode's final answer (the ``verdict`` variable says which case it was):

* the verifier replies the solver's answer: the solver's (``accepted``);
* it replies another answer: the verifier's (``corrected``);
* nothing readable in its reply: the solver's stands (``none``; a verifier that says nothing
  cannot undo the solver's work).

The solver's variables (``calculator``, ``answer``, ``answer_status``, ``calculator_calls``) land
on the solver's calls, as without a verifier, so the math AIR signals reward the solver's own
work; the verifier's call gets ``verifier_answer`` and ``verdict``. The verifier has no AIR
source: its final reward already is its own outcome (its answer is the one judged).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .agent import SYSTEM_PROMPT_RESOURCE, AgentResult, Emit, MathAgent, MathAgentConfig
from .answers import answers_match, extract_answer

if TYPE_CHECKING:
    import openai

    from agentgym_lightning.agent import AgentContext

__all__ = ["VERIFIER_PROMPT", "VERIFIER_EXAMPLES", "VERDICTS", "VerifierConfig", "VerifiedResult", "SolverVerifierAgent", "verifier_message"]

VERIFIER_PROMPT = (
    "You check a solver's answer to a question. If the answer is right, repeat it; if it is wrong, give the "
    "right one. Reply: Answer: <number>"
)

#: Worked examples, as real turns before the question: ``(question, solver's work, solver's
#: answer, right answer)``. One accepts, one corrects (the solver copied the expression wrongly).
VERIFIER_EXAMPLES: tuple[tuple[str, str, str, str], ...] = (
    ("What is 12 * 7?", "12 * 7 = 84", "84", "84"),
    ("What is 9 * (8 - 3)?", "9 * 8 = 72", "72", "45"),
)

#: What the verifier did with the solver's answer (the ``verdict`` variable).
VERDICTS: tuple[str, ...] = ("accepted", "corrected", "none")


@dataclass(frozen=True)
class VerifierConfig:
    """How the verifier behaves; the math envs take each field as ``verifier_<field>=...``."""

    #: The verifier's instructions.
    system_prompt: str = VERIFIER_PROMPT
    #: How many of :data:`VERIFIER_EXAMPLES` to show before the question (0 to 2).
    examples: int = 2
    #: ``max_tokens`` of its call (``None``: the solver's).
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.examples <= len(VERIFIER_EXAMPLES):
            raise ValueError(f"verifier examples must be 0 to {len(VERIFIER_EXAMPLES)}, got {self.examples}")


@dataclass
class VerifiedResult(AgentResult):
    """:class:`~.agent.AgentResult` of the episode (its ``answer`` is the final one), plus what
    the solver answered and what the verifier did with it. ``turns`` counts both agents' calls."""

    #: The solver's own answer and its status.
    solver_answer: str | None = None
    solver_answer_status: str = "missing"
    #: One of :data:`VERDICTS`.
    verdict: str = "none"


def _same_answer(a: str | None, b: str | None) -> bool:
    """Whether two model answers are the same number (text equality when one cannot be read)."""
    if a is None or b is None:
        return False
    try:
        return answers_match(a, b)
    except ValueError:  # b is not a number: compare as written
        return a.strip() == b.strip()


def _work(records: list[Any]) -> str:
    """The solver's calculator calls, one ``expression = result`` per line."""
    lines = []
    for record in records:
        if isinstance(record, Mapping) and "result" in record:
            lines.append(f"{record['expression']} = {record['result']}")
        elif isinstance(record, Mapping):
            lines.append(f"{record.get('expression')} = Error")
    return "\n".join(lines) or "(no calculation)"


def verifier_message(question: str, work: str, answer: str | None) -> str:
    """The verifier's user message: the question, the solver's work and its answer."""
    return f"Question: {question}\nSolver's work: {work}\nSolver's answer: {answer if answer is not None else 'none'}"


class SolverVerifierAgent:
    """``agent(task, ctx) -> VerifiedResult``: the solver (:class:`~.agent.MathAgent` with
    ``solver_config``, its calls named ``"solver"``) solves ``task["question"]``, then the
    verifier accepts or corrects its answer (see the module docstring)."""

    def __init__(self, solver_config: MathAgentConfig | None = None, config: VerifierConfig | None = None) -> None:
        self.solver = MathAgent(solver_config, name="solver")
        self.config = config or VerifierConfig()

    def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> VerifiedResult:
        system_prompt = ctx.resource(SYSTEM_PROMPT_RESOURCE, default=self.solver.config.system_prompt)
        return self.run(task, ctx.openai_client(), ctx.model, emit=ctx.emit_variable, system_prompt=system_prompt)

    def initial_messages(self, question: str, work: str, answer: str | None) -> list[dict[str, Any]]:
        """The verifier's messages: instructions, worked examples, the solver's question and work."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.config.system_prompt}]
        for example, example_work, example_answer, right in VERIFIER_EXAMPLES[: self.config.examples]:
            messages.append({"role": "user", "content": verifier_message(example, example_work, example_answer)})
            messages.append({"role": "assistant", "content": f"Answer: {right}"})
        messages.append({"role": "user", "content": verifier_message(question, work, answer)})
        return messages

    def run(
        self, task: Mapping[str, Any], client: openai.OpenAI, model: str, *, emit: Emit | None = None,
        system_prompt: str | None = None,
    ) -> VerifiedResult:
        """Solve, then verify; the final answer by the module docstring's table. ``system_prompt``
        replaces the solver's instructions (an episode's resource)."""
        emit = emit or (lambda name, value: None)
        records: list[Any] = []

        def solver_emit(name: str, value: Any) -> None:
            if name == "calculator":
                records.extend(value)
            emit(name, value)

        solved = self.solver.run(task, client, model, emit=solver_emit, system_prompt=system_prompt)
        cfg, solver_cfg = self.config, self.solver.config
        kwargs: dict[str, Any] = {"metadata": {"agent": "verifier", "role": "verifier", "trainable": "true"}}
        max_tokens = cfg.max_tokens if cfg.max_tokens is not None else solver_cfg.max_tokens
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        if solver_cfg.temperature is not None:
            kwargs["temperature"] = solver_cfg.temperature
        messages = self.initial_messages(str(task["question"]), _work(records), solved.answer)
        response = client.chat.completions.create(model=model, messages=messages, **kwargs)  # type: ignore[arg-type]
        found = extract_answer(response.choices[0].message.content, require_marker=solver_cfg.require_marker)
        if found.status != "ok":
            verdict, answer, status = "none", solved.answer, solved.answer_status
        else:
            verdict = "accepted" if _same_answer(found.text, solved.answer) else "corrected"
            answer, status = found.text, found.status
        emit("verifier_answer", found.text)
        emit("verdict", verdict)
        return VerifiedResult(
            answer=answer, answer_status=status, calculator_calls=solved.calculator_calls,
            calculator_errors=solved.calculator_errors, turns=solved.turns + 1,
            solver_answer=solved.answer, solver_answer_status=solved.answer_status, verdict=verdict,
        )
