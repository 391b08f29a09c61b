"""AgentEnv: the Gymnasium contract, token exactness, reward landing, failures and teardown."""

from __future__ import annotations

import asyncio
import threading
import time

import gymnasium as gym
import openai
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym_lightning  # noqa: F401 - registers ids
from agentgym_lightning import Completion, Status, ToolCall, emit_reward, emit_variable
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.envs.guess_number import binary_search_policy
from agentgym_lightning.spaces import Observation


def echo_agent(task, ctx):
    """Asks ``task["turns"]`` questions; the answer to each is fed into the next."""
    client = ctx.openai_client()
    messages = [{"role": "user", "content": task["prompt"]}]
    for turn in range(task["turns"]):
        emit_variable("turn", turn)
        reply = client.chat.completions.create(model=ctx.model, messages=messages)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "more"}]
        emit_reward(0.1 * (turn + 1), source=f"turn{turn}")
    return reply.choices[0].message.content


def exact(task, result):
    return 1.0 if result == task.get("expect") else 0.0


def run_episode(env, policy, **reset_kwargs):
    obs, info = env.reset(**reset_kwargs)
    rewards = []
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(obs))
        rewards.append(reward)
        if terminated or truncated:
            return rewards, terminated, truncated, info


def test_multi_turn_episode_records_every_call_and_rewards_on_the_right_step():
    env = AgentEnv(echo_agent, [{"prompt": "hi", "turns": 3, "expect": "c"}], exact)
    answers = iter(["a", "b", "c"])
    obs, info = env.reset(seed=1)
    assert isinstance(obs, Observation)
    assert obs.request.messages == [{"role": "user", "content": "hi"}]
    assert obs.variables == {"turn": 0}
    assert info["turn"] == 0 and info["task"]["prompt"] == "hi"
    step_rewards = []
    for expected_turn in (1, 2):
        obs, r, term, trunc, info = env.step(next(answers))
        assert not term and not trunc
        assert obs.variables["turn"] == expected_turn
        # the previous answer is in the agent's next request
        assert obs.request.messages[-2]["role"] == "assistant"
        step_rewards.append(r)
    obs, r, term, trunc, info = env.step(next(answers))
    step_rewards.append(r)
    assert term and not trunc
    traj = info["trajectory"]
    assert traj.status is Status.SUCCEEDED and traj.result == "c" and traj.final_reward == 1.0
    assert [s.completion.text for s in traj.steps] == ["a", "b", "c"]
    # emitted rewards land on the call they followed
    assert [[(rw.source, rw.value) for rw in s.rewards] for s in traj.steps] == [
        [("turn0", 0.1)],
        [("turn1", 0.2)],
        [("turn2", pytest.approx(0.3))],
    ]
    assert step_rewards == pytest.approx([0.1, 0.2, 0.3 + 1.0])
    assert sum(step_rewards) == pytest.approx(traj.total_reward)
    assert [s.variables for s in traj.steps] == [{"turn": 0}, {"turn": 1}, {"turn": 2}]
    assert all(s.timings.requested_at <= s.timings.answered_at <= s.timings.ended_at for s in traj.steps)
    env.close()


def test_token_ids_and_logprobs_pass_through_unchanged_and_reach_the_agent():
    seen = {}

    def agent(task, ctx):
        client = ctx.openai_client()
        reply = client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "x"}], logprobs=True)
        seen["token_ids"] = reply.choices[0].model_extra.get("token_ids")
        seen["logprobs"] = [c.logprob for c in reply.choices[0].logprobs.content]
        seen["prompt_ids"] = reply.model_extra.get("prompt_token_ids")
        return None

    env = AgentEnv(agent, [{}])
    env.reset(seed=0)
    action = Completion(
        text="hello", prompt_token_ids=[1, 2, 3], completion_token_ids=[7, 8, 2**31 + 5], logprobs=[-0.5, -1e-9, -3.25]
    )
    *_, info = env.step(action)
    step = info["trajectory"].steps[0]
    assert step.completion.completion_token_ids == [7, 8, 2**31 + 5]
    assert step.completion.prompt_token_ids == [1, 2, 3]
    assert step.completion.logprobs == [-0.5, -1e-9, -3.25]
    assert seen == {"token_ids": [7, 8, 2**31 + 5], "logprobs": [-0.5, -1e-9, -3.25], "prompt_ids": [1, 2, 3]}


def test_prompt_continuity_is_recorded_per_step():
    env = AgentEnv(echo_agent, [{"prompt": "p", "turns": 3}])
    env.reset(seed=0)
    env.step(Completion(text="a", prompt_token_ids=[1, 2], completion_token_ids=[3]))
    env.step(Completion(text="b", prompt_token_ids=[1, 2, 3, 4], completion_token_ids=[5]))  # extends
    *_, info = env.step(Completion(text="c", prompt_token_ids=[9, 9], completion_token_ids=[1]))  # does not
    steps = info["trajectory"].steps
    assert [s.prompt_extends_previous for s in steps] == [None, True, False]
    assert info["trajectory"].template_mismatches == 1


def test_tool_calls_reach_an_openai_agent_and_streaming_works():
    def agent(task, ctx):
        client = ctx.openai_client()
        tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
        r = client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "2+2"}], tools=tools)
        call = r.choices[0].message.tool_calls[0]
        stream = client.chat.completions.create(
            model=ctx.model, messages=[{"role": "user", "content": "again"}], stream=True
        )
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        return call.function.name, call.function.arguments, r.choices[0].finish_reason, streamed

    env = AgentEnv(agent, [{}])
    obs, _ = env.reset(seed=0)
    assert obs.request.tools[0]["function"]["name"] == "add"
    tc = ToolCall(id="call_1", name="add", arguments='{"a": 2, "b": 2}')
    obs, *_ = env.step(Completion(text="", tool_calls=[tc], finish_reason="tool_calls"))
    assert obs.request.stream is True
    *_, term, _, info = env.step("streamed answer")
    assert term
    assert info["trajectory"].result == ("add", '{"a": 2, "b": 2}', "tool_calls", "streamed answer")


def test_air_rewards_are_weighted_and_only_applied_when_weighted():
    def agent(task, ctx):
        for _ in range(2):
            text = ctx.chat_completion([{"role": "user", "content": "guess"}]).text
            ctx.emit_variable("invalid_guess", not text.isdigit())
        return None

    weighted = AgentEnv(agent, [{}], air_weights={"invalid_guess": -0.5})
    weighted.reset(seed=0)
    _, r1, *_ = weighted.step("nope")
    _, r2, *_, info = weighted.step("42")
    assert (r1, r2) == (-0.5, 0.0)
    rewards = [s.rewards for s in info["trajectory"].steps]
    assert rewards[0][0].source == "invalid_guess" and rewards[0][0].raw == 1.0 and rewards[0][0].value == -0.5
    assert rewards[1][0].value == 0.0  # raw 0.0 (valid guess), logged as its own component

    unweighted = AgentEnv(agent, [{}])
    unweighted.reset(seed=0)
    unweighted.step("nope")
    *_, info = unweighted.step("42")
    assert all(not s.rewards for s in info["trajectory"].steps)


def test_agent_crash_is_a_task_failure_with_the_error():
    def agent(task, ctx):
        ctx.chat_completion([{"role": "user", "content": "x"}])
        raise ValueError("the agent broke")

    env = AgentEnv(agent, [{}], lambda t, r: 1.0)
    env.reset(seed=0)
    _, reward, term, trunc, info = env.step("y")
    assert term and not trunc
    assert info["status"] == "task_failed" and "the agent broke" in info["error"]
    assert reward == 0.0 and info["trajectory"].final_reward == 0.0


def test_backend_connection_error_is_an_infra_failure_not_a_zero_reward():
    def agent(task, ctx):
        ctx.chat_completion([{"role": "user", "content": "x"}])
        raise openai.APIConnectionError(request=None)  # type: ignore[arg-type]

    env = AgentEnv(agent, [{}], lambda t, r: 1.0)
    env.reset(seed=0)
    _, _, term, trunc, info = env.step("y")
    assert trunc and not term
    assert info["status"] == "infra_failed" and info["trajectory"].final_reward is None
    assert not info["trajectory"].trainable


def test_reward_function_crash_is_an_infra_failure():
    env = AgentEnv(echo_agent, [{"prompt": "p", "turns": 1}], lambda t, r: 1 / 0)
    env.reset(seed=0)
    *_, info = env.step("a")
    assert info["status"] == "infra_failed" and "reward function failed" in info["error"]


def test_hung_agent_is_truncated_by_the_time_limit_and_stopped():
    def agent(task, ctx):
        ctx.chat_completion([{"role": "user", "content": "x"}])
        while True:  # hangs without ever calling the LLM again
            time.sleep(0.01)

    env = AgentEnv(agent, [{}], time_limit=0.5, stop_grace=0.2)
    env.reset(seed=0)
    t0 = time.monotonic()
    _, _, term, trunc, info = env.step("y")
    assert trunc and not term and info["status"] == "truncated"
    assert "time limit" in info["error"]
    assert time.monotonic() - t0 < 3.0


def test_agent_that_swallows_errors_is_still_stopped():
    def agent(task, ctx):
        client = ctx.openai_client()
        while True:
            try:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            except Exception:  # noqa: BLE001 - a badly behaved agent
                time.sleep(0.001)

    env = AgentEnv(agent, [{}], max_turns=2, stop_grace=0.2)
    env.reset(seed=0)
    env.step("a")
    _, _, term, trunc, info = env.step("b")
    assert trunc and info["error"] == "max_turns=2 reached"
    assert len(info["trajectory"].steps) == 2  # the refused third call is not a step


def test_close_mid_episode_stops_the_agent_and_leaves_no_thread():
    started = threading.Event()

    def agent(task, ctx):
        started.set()
        for _ in range(100):
            ctx.chat_completion([{"role": "user", "content": "x"}])

    env = AgentEnv(agent, [{}])
    env.reset(seed=0)
    env.step("a")
    traj = env.trajectory
    env.close()
    assert traj.status is Status.TRUNCATED and "closed" in traj.error
    env.close()  # closing twice is fine
    with pytest.raises(gym.error.ResetNeeded):
        env.step("after close")


def test_async_agent_runs_on_the_background_loop():
    async def agent(task, ctx):
        client = ctx.async_openai_client()
        a = await client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "1"}])
        b = await ctx.achat_completion([{"role": "user", "content": a.choices[0].message.content}])
        await asyncio.sleep(0)
        return b.text

    env = AgentEnv(agent, [{}], lambda t, r: float(r == "two"))
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step("one")
    assert obs.request.messages[0]["content"] == "one"
    _, reward, term, _, info = env.step("two")
    assert term and reward == 1.0 and info["status"] == "succeeded"


def test_agent_ending_before_any_call_is_reported_at_reset_and_ended_by_step():
    def agent(task, ctx):
        raise RuntimeError("no model needed")

    env = AgentEnv(agent, [{}])
    obs, info = env.reset(seed=0)
    assert info["episode_over"] and info["status"] == "task_failed"
    assert obs in env.observation_space
    _, _, term, _, info = env.step("ignored")
    assert term and info["status"] == "task_failed"


def test_bad_actions_and_bad_arguments_have_clear_errors():
    env = AgentEnv(echo_agent, [{"prompt": "p", "turns": 1}])
    with pytest.raises(gym.error.ResetNeeded, match="reset"):
        env.step("too early")
    env.reset(seed=0)
    with pytest.raises(TypeError, match="Completion, a str or a dict"):
        env.step(42)
    *_, info = env.step("fine after a bad action")
    assert info["status"] == "succeeded"
    with pytest.raises(ValueError, match="transport"):
        AgentEnv(echo_agent, [{}], transport="carrier-pigeon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tasks is empty"):
        AgentEnv(echo_agent, [])
    with pytest.raises(TypeError, match=r"\(task, ctx\)"):
        AgentEnv(lambda task: None, [{}])
    with pytest.raises(IndexError):
        env.reset(options={"task_index": 5})
    with pytest.raises(ValueError, match="logprobs"):
        Completion(text="x", completion_token_ids=[1, 2], logprobs=[0.0])


def test_reset_mid_episode_truncates_the_old_one_and_options_pick_tasks():
    tasks = [{"prompt": f"p{i}", "turns": 2} for i in range(5)]
    env = AgentEnv(echo_agent, tasks)
    env.reset(seed=0, options={"task_index": 3})
    old = env.trajectory
    obs, info = env.reset(options={"task": {"prompt": "mine", "turns": 1}, "group_id": "g1"})
    assert old.status is Status.TRUNCATED
    assert obs.request.messages[0]["content"] == "mine" and env.trajectory.group_id == "g1"
    env.close()


def test_check_env_passes_on_the_registered_env():
    env = gym.make("lightning/GuessNumber-v0")
    check_env(env.unwrapped)
    env.close()


def test_gym_make_guess_number_solves_with_binary_search():
    env = gym.make("lightning/GuessNumber-v0", max_guesses=10)
    rewards, term, trunc, info = run_episode(env, binary_search_policy, seed=3)
    assert term and info["trajectory"].final_reward == 1.0 and len(rewards) <= 7
    env.close()


def test_same_seed_gives_the_same_first_observation():
    env = gym.make("lightning/GuessNumber-v0")
    a, _ = env.reset(seed=7)
    task_a = env.unwrapped.trajectory.task
    b, _ = env.reset(seed=8)
    c, _ = env.reset(seed=7)
    assert a == c and env.unwrapped.trajectory.task == task_a
    assert b in env.observation_space
    env.close()


def test_malformed_tool_calls_are_an_air_signal_and_bad_sampling_a_400_for_that_agent():
    def agent(task, ctx):
        client = ctx.openai_client()
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], temperature=-3)
        except openai.BadRequestError as exc:
            status = exc.status_code
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "y"}])
        return status

    env = AgentEnv(agent, [{}], air_weights={"tool_call.malformed": -1.0})
    obs, _ = env.reset(seed=0)
    assert obs.request.messages[0]["content"] == "y"  # the bad request never became a step
    bad = Completion(text='<tool_call>{"name": </tool_call>', tool_call_errors=["invalid JSON"])
    _, reward, term, _, info = env.step(bad)
    assert term and info["trajectory"].result == 400
    assert reward == -1.0
    assert [(r.source, r.raw) for r in info["trajectory"].steps[0].rewards] == [("tool_call.malformed", 1.0)]


def _call_seeds(env, reset_seed):
    obs, _ = env.reset(seed=reset_seed)
    seeds = []
    while True:
        seeds.append(obs.request.sampling.seed)
        obs, _, terminated, truncated, info = env.step("x")
        if terminated or truncated:
            return seeds, info["trajectory"]


def test_seed_calls_gives_each_call_a_reproducible_seed_and_keeps_the_record_as_sent():
    env = AgentEnv(echo_agent, [{"prompt": "hi", "turns": 3}], exact, seed_calls=True)
    first, trajectory = _call_seeds(env, 5)
    again, _ = _call_seeds(env, 5)
    other, _ = _call_seeds(env, 6)
    env.close()
    assert all(isinstance(s, int) for s in first) and len(set(first)) == 3  # one per call, distinct
    assert first == again  # same episode seed: same call seeds
    assert set(first).isdisjoint(other)
    assert all(step.request.sampling.seed is None for step in trajectory.steps)  # the agent's request, untouched


def test_seed_calls_keeps_a_seed_the_agent_chose():
    def seeded(task, ctx):
        return ctx.openai_client().chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "q"}], seed=42)

    env = AgentEnv(seeded, [{}], seed_calls=True)
    obs, _ = env.reset(seed=0)
    assert obs.request.sampling.seed == 42
    env.step("a")
    env.close()
    plain = AgentEnv(echo_agent, [{"prompt": "hi", "turns": 1}], exact)
    obs, _ = plain.reset(seed=0)
    assert obs.request.sampling.seed is None  # off by default
    plain.step("a")
    plain.close()


def test_time_waiting_for_the_policy_does_not_count_against_the_time_limit():
    env = AgentEnv(echo_agent, [{"prompt": "hi", "turns": 2, "expect": "b"}], exact, time_limit=0.5)
    env.reset(seed=0)
    time.sleep(0.8)  # a slow policy: longer than the whole limit
    obs, _, terminated, truncated, _ = env.step("a")
    assert not terminated and not truncated
    time.sleep(0.8)
    _, _, terminated, truncated, info = env.step("b")
    assert terminated and not truncated and info["status"] == "succeeded"


def test_the_agents_own_time_still_counts():
    def slow(task, ctx):
        ctx.chat_completion([{"role": "user", "content": "q"}])
        time.sleep(2.0)  # the agent's own work, after its answer
        return "done"

    env = AgentEnv(slow, [{}], time_limit=0.5)
    env.reset(seed=0)
    time.sleep(0.6)  # the policy's time: not counted
    _, _, terminated, truncated, info = env.step("a")  # the agent's 2 s of its own work: counted
    assert truncated and info["status"] == "truncated" and "time limit of 0.5 s" in info["error"]
    env.close()


def test_a_recorded_request_is_a_snapshot_not_the_agents_list():
    # ctx.chat_completion hands the gateway the agent's own list; the agent then edits it in place.
    def agent(task, ctx):
        messages = [{"role": "user", "content": "a"}]
        reply = ctx.chat_completion(messages)
        messages[0]["content"] = "CHANGED"
        messages += [{"role": "assistant", "content": reply.text}, {"role": "user", "content": "b"}]
        ctx.chat_completion(messages)
        return "x"

    env = AgentEnv(agent, [{"q": 1}], lambda task, result: 1.0)
    try:
        obs, _ = env.reset(seed=0)
        first = obs.request
        env.step("ok")
        assert [m["content"] for m in first.messages] == ["a"]
        *_, info = env.step("ok")
        steps = info["trajectory"].steps
        assert [m["content"] for m in steps[0].request.messages] == ["a"]
        assert [m["content"] for m in steps[1].request.messages] == ["CHANGED", "ok", "b"]
    finally:
        env.close()


def test_a_bare_tool_call_as_an_action_is_a_value_error_that_says_how_to_send_it():
    env = AgentEnv(echo_agent, [{"prompt": "p", "turns": 1}], exact)
    env.reset(seed=0)
    # Before: TypeError (Completion.__init__() got an unexpected keyword argument 'id'); the README promises ValueError.
    with pytest.raises(ValueError, match=r"that is one tool call; answer with \{'content': None, 'tool_calls': \[it\]\}"):
        env.step({"id": "call_1", "name": "lookup", "arguments": "{}"})
    *_, info = env.step({"content": None, "tool_calls": [{"id": "call_1", "name": "lookup", "arguments": "{}"}]})
    assert info["trajectory"].steps[0].completion.tool_calls[0].name == "lookup"
    env.close()


def test_semantic_variables_have_a_size_and_a_count_limit():
    from agentgym_lightning.gateway.gateway import Gateway
    from agentgym_lightning.gateway.limits import GatewayLimits
    from agentgym_lightning.gateway.openai_wire import GatewayError

    errors = []

    def agent(task, ctx):
        ctx.chat_completion([{"role": "user", "content": "q"}])
        for name, value in (("huge", "x" * 7_000_000), ("a", 1), ("b", 2), ("c", 3)):
            try:
                ctx.emit_variable(name, value)
            except ValueError as exc:
                errors.append(str(exc))
        try:  # the HTTP route (POST /episodes/{id}/variables) answers a 400
            gateway.post_variables(ctx.episode_id, {"huge": "x" * 5_000_000})
        except GatewayError as exc:
            errors.append(exc.status)
        return None

    gateway = Gateway(limits=GatewayLimits(max_variables=2))
    env = AgentEnv(agent, [{}], lambda t, r: 1.0, gateway=gateway)
    env.reset(seed=0)
    *_, info = env.step("a")
    # Before: a 7 MB variable was taken and repeated on every later step (147 MB over 20 calls).
    assert "'huge' is 7000000 bytes of JSON, over the limit of 4194304" in errors[0]
    assert "'c' would be one more than this episode's limit of 2" in errors[1] and errors[2:] == [400]
    assert info["trajectory"].variables == {"a": 1, "b": 2}
    gateway.close()


def test_trajectory_reward_gives_the_final_reward_and_on_end_runs_however_an_episode_ends():
    # The HTTP driver's seams: a final reward read from the trajectory (not the agent's result),
    # and a call when an episode ends, before its agent is stopped, to release an agent that waits.
    ended: list[str] = []
    env = AgentEnv(echo_agent, [{"prompt": "hi", "turns": 1}], lambda task, result: 9.0,
                   trajectory_reward=lambda t: 0.75 if t.result == "a" else 0.0, on_end=ended.append)
    _, terminated, _, info = run_episode(env, lambda obs: "a", seed=0)
    assert terminated and info["final_reward"] == 0.75 and info["trajectory"].final_reward == 0.75  # not reward_fn's 9.0
    assert ended == [info["trajectory"].episode_id]
    env.reset(seed=1)
    env.close()  # mid-episode: truncated, and on_end is told first
    assert len(ended) == 2 and ended[1] == env.trajectory.episode_id and env.trajectory.status is Status.TRUNCATED
    none = AgentEnv(echo_agent, [{"prompt": "hi", "turns": 1}], trajectory_reward=lambda t: None)
    assert run_episode(none, lambda obs: "b", seed=0)[3]["final_reward"] is None  # None: only emitted rewards count
    none.close()


def test_agents_that_start_at_once_build_one_ssl_context_for_every_gateway(monkeypatch):
    # Before: one per gateway, and one per agent that asked before the first was built (the CA
    # store's load, ~30 ms of CPU each, for every episode of a step that starts at once).
    import ssl

    from agentgym_lightning.gateway import gateway as gateway_module
    from agentgym_lightning.gateway.gateway import Gateway

    built = []
    real = ssl.create_default_context

    def slow_to_build(*args, **kwargs):
        built.append(threading.get_ident())
        time.sleep(0.05)  # long enough for every thread to ask before it is built
        return real(*args, **kwargs)

    monkeypatch.setattr(gateway_module, "_ssl_context", None)
    monkeypatch.setattr(gateway_module.ssl, "create_default_context", slow_to_build)
    gateways = [Gateway(), Gateway()]
    contexts = []
    try:
        threads = [threading.Thread(target=lambda g=g: contexts.append(g.ssl_context)) for g in gateways for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        gateways[0].http_client("http").close()
    finally:
        for gateway in gateways:
            gateway.close()
    assert len(built) == 1 and len(contexts) == 16 and all(c is contexts[0] for c in contexts)
