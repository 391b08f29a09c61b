"""Gymnasium spaces for LLM calls: observations are intercepted requests, actions completions.

Neither is a fixed-size array, so both are :class:`gymnasium.Space` subclasses of their own
(not flattenable), as Gymnasium allows for structured data.

Vector envs: ``gym.make_vec(id, num_envs, vectorization_mode="sync")`` works as for any env, and
so does ``"async"`` (one process per env): its default shared memory holds each env's latest
observation pickled in a slot of :attr:`ObservationSpace.shared_memory_bytes` (4 MiB); an
observation larger than that fails the step with a ValueError that says so: pass
``vector_kwargs={"shared_memory": False}`` to send observations through the worker pipes instead.
The batched observation is a tuple of :class:`Observation`.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import string
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

from agentgym_lightning.llm import ChatRequest, Completion

__all__ = ["Observation", "ObservationSpace", "CompletionSpace", "SHARED_MEMORY_BYTES"]

#: Bytes of shared memory per env that an async vector env gives one pickled observation.
SHARED_MEMORY_BYTES = 4 << 20

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

    def __init__(
        self,
        max_sample_length: int = 32,
        seed: int | np.random.Generator | None = None,
        shared_memory_bytes: int = SHARED_MEMORY_BYTES,
    ) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_sample_length = max_sample_length
        #: Shared memory per env in an async vector env (see the module docstring).
        self.shared_memory_bytes = shared_memory_bytes

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


# --------------------------------------------------------------------------- async vector envs
# Gymnasium's AsyncVectorEnv hands observations back through shared memory by default, built by
# these single-dispatch functions per space type; these are ours for ObservationSpace.

_HEADER = struct.Struct("!Q")


@create_shared_memory.register(ObservationSpace)
def _create_observation_memory(space: ObservationSpace, n: int = 1, ctx: ModuleType = mp) -> Any:
    return ctx.Array("B", n * space.shared_memory_bytes, lock=False)  # type: ignore[attr-defined]


@write_to_shared_memory.register(ObservationSpace)
def _write_observation(space: ObservationSpace, index: int, value: Observation, shared_memory: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    slot = space.shared_memory_bytes
    if _HEADER.size + len(data) > slot:
        raise ValueError(
            f"an observation of {len(data)} bytes (pickled) does not fit the {slot}-byte shared memory slot of an "
            'async vector env: pass vector_kwargs={"shared_memory": False} to gym.make_vec'
        )
    view = memoryview(shared_memory).cast("B")
    start = index * slot
    view[start : start + _HEADER.size] = _HEADER.pack(len(data))
    view[start + _HEADER.size : start + _HEADER.size + len(data)] = data


class SharedObservations(Sequence[Observation]):
    """The observations of an async vector env, read from shared memory on access; a deep copy
    (what ``AsyncVectorEnv`` returns by default) is a plain tuple."""

    def __init__(self, space: ObservationSpace, shared_memory: Any, n: int) -> None:
        self._space, self._memory, self._n = space, shared_memory, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(self._n)))
        if not -self._n <= index < self._n:
            raise IndexError(index)
        start = (index % self._n) * self._space.shared_memory_bytes
        view = memoryview(self._memory).cast("B")
        (size,) = _HEADER.unpack(view[start : start + _HEADER.size])
        if size == 0:
            return None  # nothing written yet
        return pickle.loads(view[start + _HEADER.size : start + _HEADER.size + size])

    def __iter__(self) -> Iterator[Observation]:
        return (self[i] for i in range(self._n))

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[Observation, ...]:
        return tuple(self)


@read_from_shared_memory.register(ObservationSpace)
def _read_observations(space: ObservationSpace, shared_memory: Any, n: int = 1) -> SharedObservations:
    return SharedObservations(space, shared_memory, n)
