"""What the policy is sent: the recorded call rewritten on a copy (agentgym_lightning.policy_request)."""

from __future__ import annotations

from agentgym_lightning.llm import ADAPTER_KEY, EPISODE_KEY, ChatRequest, SamplingParams
from agentgym_lightning.policy_request import call_seed, resampled, routed, seeded, tagged


def _request(**sampling) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling=SamplingParams(**sampling), metadata={"agent": "w"})


def test_each_rewrite_is_a_copy_and_the_recorded_request_stays_as_sent():
    request = _request(temperature=0.0, max_tokens=500)
    as_sent = ChatRequest.from_dict(request.to_dict())
    out = routed(tagged(resampled(seeded(request, 7, 2), temperature=1.0, top_p=0.9, max_tokens=64), "ep1"), "w1")
    assert request == as_sent
    assert (out.sampling.seed, out.sampling.temperature, out.sampling.top_p, out.sampling.max_tokens) == (call_seed(7, 2), 1.0, 0.9, 64)
    assert out.metadata == {"agent": "w", EPISODE_KEY: "ep1", ADAPTER_KEY: "w1"} and out.messages == request.messages


def test_a_seed_the_agent_chose_and_a_tag_already_there_are_kept():
    chosen = _request(seed=3)
    assert seeded(chosen, 7, 0) is chosen
    assert call_seed(7, 0) == call_seed(7, 0) != call_seed(7, 1) and 0 <= call_seed(None, 0) < 2**31
    once = tagged(_request(), "ep")
    assert tagged(once, "ep") is once and tagged(once, None) is once


def test_resampling_caps_max_tokens_and_drops_a_top_p_of_one():
    assert resampled(_request(max_tokens=10), temperature=1.0, max_tokens=64).sampling.max_tokens == 10
    assert resampled(_request(), temperature=1.0, max_tokens=64).sampling.max_tokens == 64
    assert resampled(_request(max_tokens=10), temperature=0.5).sampling.max_tokens == 10
    assert resampled(_request(top_p=0.5), temperature=1.0).sampling.top_p is None
    assert resampled(_request(seed=4), temperature=1.0).sampling.seed == 4
