"""BatchingPolicy: a generate-only policy given a submit; calls answered in batches on its thread."""

from __future__ import annotations

import threading
import time

import pytest

from agentgym_lightning import Completion
from agentgym_lightning.llm import ChatRequest, GatewayError
from agentgym_lightning.policies.batching import BatchingPolicy
from agentgym_lightning.policies.isolation import PolicyDown


def request(content: str) -> ChatRequest:
    return ChatRequest.from_openai({"model": "m", "messages": [{"role": "user", "content": content}]})


class Scripted:
    """Generate-only: echoes each request, records its batches; ``poison`` fails any batch holding
    it; ``gate`` (when set) holds each generate until released."""

    backend = "scripted"

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.batches: list[list[str]] = []
        self.gate = gate
        self.down = False

    def generate(self, requests):
        contents = [r.messages[0]["content"] for r in requests]
        self.batches.append(contents)
        if self.gate is not None:
            self.gate.wait(10)
        if self.down:
            raise ConnectionError("connection refused")
        if "poison" in contents:
            raise ValueError("top_p must be a finite number")
        return [Completion(text=c) for c in contents]


def test_submitted_calls_are_answered_in_batches_and_a_flush_sends_them_at_once():
    policy = Scripted()
    batching = BatchingPolicy(policy, max_batch_wait=None)  # waits for a flush (lock-step)
    try:
        futures = [batching.submit(request(str(i))) for i in range(5)]
        time.sleep(0.1)
        assert policy.batches == [] and not any(f.done() for f in futures)  # waiting for company
        batching.flush(futures)
        assert [f.result(5).text for f in futures] == [str(i) for i in range(5)]
        assert policy.batches == [[str(i) for i in range(5)]]
        assert (batching.batches, batching.requests) == (1, 5)
    finally:
        batching.close()


def test_max_batch_size_is_respected():
    policy = Scripted()
    batching = BatchingPolicy(policy, max_batch_size=2, max_batch_wait=None)
    try:
        futures = [batching.submit(request(str(i))) for i in range(5)]
        for f in futures[:4]:  # full batches go without a flush
            assert f.result(5).text
        batching.flush(futures[4:])
        assert futures[4].result(5).text == "4"
        assert policy.batches == [["0", "1"], ["2", "3"], ["4"]]
    finally:
        batching.close()


def test_calls_that_come_while_a_batch_generates_wait_at_most_max_batch_wait_after_it():
    gate = threading.Event()
    policy = Scripted(gate)
    batching = BatchingPolicy(policy, max_batch_wait=0.2, wait_fraction=None)
    try:
        first = batching.submit(request("a"))
        deadline = time.monotonic() + 5
        while not policy.batches and time.monotonic() < deadline:  # "a" alone, after its wait
            time.sleep(0.01)
        queued = [batching.submit(request(c)) for c in "bc"]  # they queue behind the batch
        gate.set()
        assert first.result(5).text == "a"
        assert [f.result(5).text for f in queued] == ["b", "c"]
        assert policy.batches == [["a"], ["b", "c"]]
    finally:
        batching.close()


def test_a_failing_request_fails_only_its_own_future():
    policy = Scripted()
    batching = BatchingPolicy(policy, max_batch_wait=None)
    try:
        futures = [batching.submit(request(c)) for c in ("ok0", "poison", "ok1", "ok2")]
        batching.flush(futures)
        assert [futures[i].result(5).text for i in (0, 2, 3)] == ["ok0", "ok1", "ok2"]
        error = futures[1].exception(5)
        assert isinstance(error, GatewayError) and error.status == 400 and "top_p" in error.message
    finally:
        batching.close()


def test_a_backend_that_is_down_fails_every_call_of_the_batch_with_one_policy_down():
    policy = Scripted()
    batching = BatchingPolicy(policy, max_batch_wait=None)
    try:
        answered = batching.submit(request("ok"))
        batching.flush([answered])
        assert answered.result(5).text == "ok"
        policy.down = True
        futures = [batching.submit(request(str(i))) for i in range(3)]
        batching.flush(futures)
        errors = [f.exception(5) for f in futures]
        assert all(isinstance(e, PolicyDown) for e in errors) and len({id(e) for e in errors}) == 1
        assert (errors[0].calls, errors[0].failures) == (3, 1)
        assert isinstance(errors[0].__cause__, ConnectionError)
    finally:
        batching.close()


def test_a_flush_is_ignored_when_one_of_the_callers_calls_was_answered_already():
    policy = Scripted()
    batching = BatchingPolicy(policy, max_batch_wait=None)
    try:
        answered = batching.submit(request("a"))
        batching.flush([answered])
        answered.result(5)
        later = batching.submit(request("b"))
        batching.flush([answered, later])  # the caller has not seen "a"'s answer: stale
        time.sleep(0.1)
        assert not later.done()
        batching.flush([later])
        assert later.result(5).text == "b"
    finally:
        batching.close()


def test_a_cancelled_call_is_never_generated_and_close_refuses_new_calls():
    policy = Scripted()
    batching = BatchingPolicy(policy, max_batch_wait=None)
    dropped = batching.submit(request("dropped"))
    kept = batching.submit(request("kept"))
    assert dropped.cancel()
    batching.flush([kept])
    assert kept.result(5).text == "kept" and policy.batches == [["kept"]]
    batching.close()
    with pytest.raises(RuntimeError, match="closed"):
        batching.submit(request("late"))


def test_generate_goes_through_the_batches():
    policy = Scripted()
    with BatchingPolicy(policy, max_batch_wait=None) as batching:
        assert [c.text for c in batching.generate([request("x"), request("y")])] == ["x", "y"]
    assert policy.batches == [["x", "y"]]


@pytest.mark.parametrize("bad", [{"max_batch_size": 0}, {"max_batch_wait": -1}, {"wait_fraction": 0}])
def test_bad_knobs_are_refused_naming_the_knob(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        BatchingPolicy(Scripted(), **bad)


def test_calls_submitted_together_are_never_split_by_a_batch_taken_meanwhile():
    policy = Scripted()
    batching = BatchingPolicy(policy, max_batch_wait=0.0)  # any call is due at once
    try:
        futures = batching.submit_all([request(c) for c in "abc"])
        assert [f.result(5).text for f in futures] == ["a", "b", "c"]
        assert policy.batches == [["a", "b", "c"]]
    finally:
        batching.close()
