"""A policy's batch answered request by request: the requests its backend rejects are isolated.

When ``generate`` raises, the batch is split in halves and retried until the requests that fail
alone are found: the others are answered as usual, and each culprit gets an OpenAI-style 400
error (:class:`~agentgym_lightning.llm.GatewayError`) to hand its agent. When no request of a batch
succeeds, the last request that did is generated again as a probe: if it succeeds, the backend is
healthy and the failures are the requests' own (400s); if it fails (or there is none yet), the
backend is down and :class:`PolicyDown` is raised.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from agentgym_lightning.llm import ChatRequest, GatewayError
from agentgym_lightning.policies.base import Policy

__all__ = ["FailureIsolator", "PolicyDown"]

log = logging.getLogger(__name__)


class PolicyDown(Exception):
    """The backend failed requests that it answered before: it is the infrastructure.

    Attributes:
        failures: Batches (or lone calls) the backend failed in a row, this one included.
        calls: How many calls this failure ended (the batch's size; 1 for a lone call).
    """

    def __init__(self, message: str, *, failures: int = 1, calls: int = 1) -> None:
        super().__init__(message)
        self.failures = failures
        self.calls = calls


class FailureIsolator:
    """Answers a batch of requests through ``policy``; isolates the requests its backend rejects
    (see the module doc), or settles one call's outcome (:meth:`settle`, for a policy that takes
    calls one at a time). Used by :class:`~agentgym_lightning.policies.batching.BatchingPolicy`
    and by the batched driver for a policy that schedules calls itself.

    Args:
        policy: A :class:`~agentgym_lightning.policies.base.Policy`, or a bare
            ``generate(requests) -> completions`` function.
    """

    def __init__(self, policy: Policy | Callable[[list[ChatRequest]], Sequence[Any]]) -> None:
        self._generate_fn = policy.generate if hasattr(policy, "generate") else policy
        self._probe: ChatRequest | None = None  # a request the backend answered before
        self.failures = 0  # consecutive batches the backend failed

    def _call(self, requests: list[ChatRequest]) -> list[Any]:
        out = list(self._generate_fn(requests))
        if len(out) != len(requests):
            raise RuntimeError(f"the policy returned {len(out)} completions for {len(requests)} requests")
        return out

    def _bisect(self, requests: list[ChatRequest]) -> list[Any]:
        """Completions, with the exception in place of each request that fails on its own."""
        try:
            return self._call(requests)
        except Exception as exc:  # noqa: BLE001 - sorted out below: a request's or the backend's
            if len(requests) == 1:
                return [exc]
            log.warning("policy.generate failed for a batch of %d (%s); retrying in halves", len(requests), exc)
            mid = len(requests) // 2
            return self._bisect(requests[:mid]) + self._bisect(requests[mid:])

    def _backend_healthy(self) -> bool:
        if self._probe is None:
            return False
        probe = dataclasses.replace(self._probe, sampling=dataclasses.replace(self._probe.sampling, max_tokens=1))
        try:
            self._call([probe])
        except Exception as exc:  # noqa: BLE001
            log.error("policy.generate failed a request it answered before: %s", exc)
            return False
        return True

    @property
    def answered_before(self) -> bool:
        """Whether the backend has answered a request (it has a probe to tell a request's own
        failure from its own)."""
        return self._probe is not None

    def settle(self, request: ChatRequest, outcome: Any) -> Any:
        """One call's answer from a policy that takes calls one at a time (``submit``):
        ``outcome`` (its completion, or the exception generating it raised) as the completion,
        or a :class:`GatewayError` (400) when the request failed on its own; raises
        :class:`PolicyDown` when the backend itself failed (the probe fails too)."""
        if not isinstance(outcome, Exception):
            self._probe = request
            self.failures = 0
            return outcome
        if not self._backend_healthy():
            self.failures += 1
            raise PolicyDown(str(outcome), failures=self.failures) from outcome
        self.failures = 0
        return _rejected(outcome)

    def answer(self, requests: list[ChatRequest]) -> list[Any]:
        """One completion or :class:`GatewayError` (400: the backend rejected that request) per
        request; raises :class:`PolicyDown` (with the error as its cause) when the backend
        itself failed."""
        results = self._bisect(requests)
        errors = [r for r in results if isinstance(r, Exception)]
        if len(errors) < len(results):
            self._probe = requests[next(i for i, r in enumerate(results) if not isinstance(r, Exception))]
        elif not self._backend_healthy():
            self.failures += 1
            raise PolicyDown(str(errors[0]), failures=self.failures, calls=len(requests)) from errors[0]
        self.failures = 0
        return [_rejected(r) if isinstance(r, Exception) else r for r in results]


def _rejected(error: Exception) -> GatewayError:
    """The 400 an agent gets for a request the backend rejected."""
    return GatewayError(400, f"the policy backend rejected this request: {error}", code="invalid_request_error")
