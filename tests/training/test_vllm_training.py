"""Training with the vLLM generator: after each update the engine gets the new weights, and its
logprobs for a fixed completion then equal the trained model's.

Runs in ``.venv-vllm`` (``.ci/vllm.sh``, CI's vLLM step); skipped where vllm is not installed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("trl")

from agentgym_lightning import ChatRequest  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def vllm_policy():
    from agentgym_lightning.policies.vllm import VLLMPolicy

    policy = VLLMPolicy("smollm2-135m", default_max_tokens=8, seed=0)
    yield policy
    policy.close()


def _trainer(policy, tmp_path, **overrides):
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    options = dict(
        env="lightning/GuessNumber-v0", env_kwargs={"max_guesses": 2}, backend="vllm", max_steps=1, tasks_per_step=2,
        num_generations=2, max_completion_length=8, output_dir=str(tmp_path), report_to=[], progress=False,
        learning_rate=1e-4,
    )
    config = LightningRLConfig(**{**options, **overrides})
    return LightningRLTrainer(config, policy=policy)


def test_after_a_sync_the_engine_scores_like_the_trained_model(vllm_policy, tmp_path, check_sync_scores):
    check_sync_scores(_trainer(vllm_policy, tmp_path), vllm_policy)


def test_a_training_step_through_the_engine_syncs_and_logs_the_time(vllm_policy, tmp_path):
    trainer = _trainer(vllm_policy, tmp_path, zero_variance_groups="keep")
    version = vllm_policy.weights_version
    result = trainer.train()
    assert result.steps == 1 and not result.interrupted
    step = result.history[0]
    assert step["samples/episodes"] == 4 and step["time/sync_s"] > 0
    assert vllm_policy.weights_version == version + 1
    rows = [s for s in (tmp_path / "trajectories").glob("step-*.jsonl")]
    assert rows  # the episodes went through the engine and were written


def test_lora_per_agent_routes_each_call_of_a_batch_to_its_adapter_in_the_engine(tmp_path):
    """lora_per_agent on vLLM: the trainer loads every adapter into a multi-LoRA engine, and one
    batched generate answers each call with its agent's adapter — the tokens the trained PEFT
    model writes with that adapter (greedy); an agent without one gets the base model. After an
    update, a sync replaces the adapters the engine serves (here: the weights changed by hand)."""
    import torch

    from agentgym_lightning.llm import SamplingParams
    from agentgym_lightning.policies.vllm import VLLMPolicy
    from agentgym_lightning.training.agent_adapters import AdapterRouting

    policy = VLLMPolicy("smollm2-135m", default_max_tokens=8, seed=0, max_loras=2, max_lora_rank=8)
    try:
        from agentgym_lightning.policies.base import schedules_per_step

        assert not schedules_per_step(policy)  # with adapters, calls are batched (base and adapter rows apart)
        trainer = _trainer(policy, tmp_path, lora_per_agent={"writer": "w1", "rewriter": "r1"}, lora_r=4, lora_alpha=8)
        torch.manual_seed(0)
        with torch.no_grad():  # make the two adapters differ from each other and from the base model
            for name, param in trainer.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.2)
        trainer._sync()
        routing = AdapterRouting(policy, trainer.adapters)

        def request(agent):
            return ChatRequest(messages=[{"role": "user", "content": "Tell me about cats."}], metadata={"agent": agent},
                               sampling=SamplingParams(temperature=0.0, max_tokens=8))

        agents = ["writer", "rewriter", "checker"]
        got = routing.generate([request(a) for a in agents])
        prompt = got[0].prompt_token_ids
        expected = []
        for agent in agents:
            ids = torch.tensor([prompt])
            if agent == "checker":
                with trainer.model.disable_adapter():
                    out = trainer.model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
            else:
                trainer.model.set_adapter({"writer": "w1", "rewriter": "r1"}[agent])
                out = trainer.model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
            expected.append(out[0, len(prompt):].tolist())
        assert [c.completion_token_ids[: len(e)] for c, e in zip(got, expected)] == expected
        assert len({tuple(e) for e in expected}) == 3, "the adapters must write differently for this test to mean anything"
    finally:
        policy.close()


def test_k1_trains_on_the_engine_within_the_bound_and_each_update_reaches_it(vllm_policy, tmp_path, trained_logps):
    """max_staleness 1 on the vllm backend: rollouts run on while the trainer updates, every
    call carries the version that answered it (within 1 of the version each step updates), the
    engine is reloaded after each update while episodes run (later answers carry later versions)
    and holds the trained weights at the end."""
    from agentgym_lightning.policies.chat import render_prompt_ids
    from agentgym_lightning.trajectory import load_trajectories

    trainer = _trainer(vllm_policy, tmp_path, max_staleness=1, max_steps=3, zero_variance_groups="keep")
    loaded = vllm_policy.weights_version
    result = trainer.train()
    assert result.steps == 3 and not result.interrupted
    assert vllm_policy.weights_version == loaded + 3  # one reload per update
    answered = []
    for step in (1, 2, 3):
        episodes = list(load_trajectories(tmp_path / "trajectories" / f"step-{step:06d}.jsonl"))
        assert len(episodes) == 4  # the synchronous loop's rows per step
        versions = [s.policy_version for t in episodes for s in t.steps]
        assert versions and None not in versions  # every call is stamped
        assert all(0 <= step - 1 - v <= 1 for v in versions), (step, versions)  # within k of the version updated
        answered += versions
        row = result.history[step - 1]
        assert row["async/staleness_max"] <= 1 and row["async/groups_dropped"] == 0
        assert row["time/sync_s"] > 0
    assert max(answered) >= 1  # answers by weights an update had reached: the engine got them
    # After the last sync the engine's logprobs are the trained model's.
    request = ChatRequest(messages=[{"role": "user", "content": "Is the sky blue? Answer yes or no."}])
    prompt = render_prompt_ids(vllm_policy.tokenizer, request)
    good = vllm_policy.tokenizer.encode("Yes, it is.", add_special_tokens=False)
    assert vllm_policy.score(prompt, good) == pytest.approx(trained_logps(trainer, prompt, good), abs=2e-3)
