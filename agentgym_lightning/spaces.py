"""Gymnasium spaces for LLM calls: observations are intercepted requests, actions completions.

Neither is a fixed-size array, so both are :class:`gymnasium.Space` subclasses of their own
(not flattenable), as Gymnasium allows for structured data.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from agentgym_lightning.llm import ChatRequest, Completion

__all__ = ["Observation", "ObservationSpace", "CompletionSpace"]

# Printable text, not Gymnasium's default 62 alphanumerics: completions contain spaces and code.
_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n"


@dataclass
class Observation:
    """What the policy sees at a step: the agent's request and its semantic variables."""

    request: ChatRequest
    variables: dict[str, Any] = field(default_factory=dict)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.request.messages


class ObservationSpace(spaces.Space[Observation]):
    """Every :class:`Observation`; ``sample()`` gives a short random chat request."""

    def __init__(self, max_sample_length: int = 32, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_sample_length = max_sample_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> Observation:
        n = int(self.np_random.integers(1, self.max_sample_length + 1))
        text = "".join(self.np_random.choice(list(_CHARSET), size=n))
        return Observation(request=ChatRequest(messages=[{"role": "user", "content": text}]))

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, Observation)
            and isinstance(x.request, ChatRequest)
            and isinstance(x.request.messages, list)
            and isinstance(x.variables, dict)
        )

    def __repr__(self) -> str:
        return "ObservationSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObservationSpace)


class CompletionSpace(spaces.Space[Completion]):
    """Every completion. ``contains`` also accepts what :func:`~agentgym_lightning.llm.as_completion`
    accepts (a string, a dict); ``sample()`` gives random printable text."""

    def __init__(self, max_sample_length: int = 64, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_sample_length = max_sample_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> Completion:
        n = int(self.np_random.integers(0, self.max_sample_length + 1))
        return Completion(text="".join(self.np_random.choice(list(_CHARSET), size=n)))

    def contains(self, x: Any) -> bool:
        if isinstance(x, (Completion, str)):
            return True
        return isinstance(x, dict) and ("text" in x or "content" in x)

    def __repr__(self) -> str:
        return "CompletionSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CompletionSpace)
