"""A verifiers environment's own rollout as the episode's agent.

The environment runs its rollout as it always does (``Environment.run_rollout``: its prompt, its
turns, its tools and ``env_response``, its stop conditions, then its rubric's scoring), with the
OpenAI client it is handed pointed at the episode: every model call it makes is a step, with token
ids. What the rubric said comes back as the episode's result (:class:`RubricScore`): the reward
(the rubric's weighted sum, the episode's final reward) and each reward function's score and
weight, recorded as the episode's ``metrics`` variable (``metrics/<function>`` in ``eval`` and the
trainer's metrics) and its ``rubric`` variable (score and weight per function, for the viewer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .errors import VerifiersRolloutError

if TYPE_CHECKING:
    from agentgym_lightning.agent import AgentContext

__all__ = ["RubricScore", "VerifiersAgent", "rubric_weights"]


@dataclass(frozen=True)
class RubricScore:
    """What the rubric gave an episode: ``reward`` (its weighted sum), ``scores`` (each reward
    function's, by name), ``weights`` (each one's weight), and how the rollout stopped."""

    reward: float
    scores: dict[str, float]
    weights: dict[str, float]
    stop_condition: str | None = None
    is_truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rubric_weights(rubric: Any) -> dict[str, float]:
    """Each reward function's weight, by name, as the rubric (or a ``vf.RubricGroup``) sums them."""
    return {str(n): float(w) for n, w in zip(rubric._get_reward_func_names(), rubric._get_reward_weights(), strict=True)}


class VerifiersAgent:
    """``agent(task, ctx)``: one rollout of ``environment`` on ``task`` (a row of its dataset),
    scored by its rubric. ``name`` is how errors name it (``verifiers:MODULE``)."""

    def __init__(self, environment: Any, name: str) -> None:
        self.environment = environment
        self.name = name
        self.weights = rubric_weights(environment.rubric)

    async def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> dict[str, Any]:
        from verifiers import OpenAIChatCompletionsClient

        client = OpenAIChatCompletionsClient(ctx.async_openai_client())
        try:
            output = await self.environment.run_rollout(dict(task), client, ctx.model, dict(self.environment.sampling_args or {}))
        except Exception as exc:  # noqa: BLE001 - the environment's code failing is not the model's doing
            raise VerifiersRolloutError(
                f"{self.name}: its rollout raised {type(exc).__name__}: {exc}; fix the environment "
                "(it raises the same outside training: `vf-eval` runs it alone)"
            ) from exc
        error = output.get("error")
        if error:
            raise VerifiersRolloutError(f"{self.name}: its rollout stopped with an error: {_error_text(error)}")
        scores = {str(k): float(v) for k, v in (output.get("metrics") or {}).items()}
        score = RubricScore(float(output.get("reward") or 0.0), scores, self.weights,
                            output.get("stop_condition"), bool(output.get("is_truncated")))
        ctx.emit_variable("metrics", scores)
        ctx.emit_variable("rubric", {n: {"score": s, "weight": self.weights.get(n, 0.0)} for n, s in scores.items()})
        return score.to_dict()


def _error_text(error: Any) -> str:
    if isinstance(error, Mapping):  # verifiers' ErrorData: the error's type, message and chain
        return f"{error.get('error', 'error')}: {error.get('error_chain_str') or error.get('message', '')}"
    return str(error)
