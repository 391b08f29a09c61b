"""The data model: requests, completions, steps and trajectories round-trip through JSONL."""

from __future__ import annotations

import json

import pytest

from agentgym_lightning import (
    ChatRequest,
    Completion,
    Reward,
    Status,
    Step,
    ToolCall,
    Trajectory,
    TrajectoryWriter,
    load_trajectories,
    save_trajectories,
)
from agentgym_lightning.llm import as_completion
from agentgym_lightning.trajectory import SkippedLineWarning, StepTimings, TruncatedLineWarning


def sample_trajectory(i: int = 0) -> Trajectory:
    req = ChatRequest.from_openai(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "q"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "temperature": 0.7,
            "stop": "\n",
            "metadata": {"trainable": "false", "role": "checker"},
            "response_format": {"type": "text"},
        }
    )
    comp = Completion(
        text="a",
        tool_calls=[ToolCall("call_1", "f", '{"x": 1}')],
        finish_reason="tool_calls",
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        logprobs=[-0.25],
    )
    step = Step(index=0, request=req, completion=comp, variables={"v": [1, 2]}, outcome={"ok": True},
                rewards=[Reward(0.5, "air", raw=1.0)], trainable=req.trainable, role="checker",
                timings=StepTimings(1.0, 2.0, 3.0))
    return Trajectory(episode_id=f"e{i}", task={"id": i}, env_id="x", steps=[step], final_reward=1.0,
                      status=Status.SUCCEEDED, variables={"v": 1}, result={"answer": 4}, group_id="g", seed=3)


def test_request_parsing_keeps_what_policies_need():
    req = sample_trajectory().steps[0].request
    assert req.sampling.temperature == 0.7 and req.sampling.stop == ["\n"]
    assert not req.trainable and req.metadata["role"] == "checker"
    assert req.extra == {"response_format": {"type": "text"}}
    assert ChatRequest.from_openai(req.to_openai()) == req


def test_jsonl_round_trip_is_lossless(tmp_path):
    trajs = [sample_trajectory(i) for i in range(3)]
    path = tmp_path / "runs" / "t.jsonl"
    assert save_trajectories(path, trajs) == 3
    back = list(load_trajectories(path))
    assert back == trajs
    assert back[0].steps[0].completion.logprobs == [-0.25]
    assert back[0].total_reward == 1.5


def test_an_interrupted_file_keeps_every_complete_line(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(sample_trajectory(0))
        w.write(sample_trajectory(1))
    with open(path, "a") as fh:
        fh.write(sample_trajectory(2).to_json()[:50])  # killed mid-write
    with pytest.warns(TruncatedLineWarning, match=f"{path}:3: skipped a truncated last line"):
        assert [t.episode_id for t in load_trajectories(path)] == ["e0", "e1"]
    path.write_text("garbage\n" + sample_trajectory(0).to_json() + "\n")
    with pytest.raises(ValueError, match=":1: not a JSON trajectory"):
        list(load_trajectories(path))


def test_unserializable_results_still_write_valid_json(tmp_path):
    t = sample_trajectory()
    t.result = object()
    assert json.loads(t.to_json())["result"].startswith("<object")


def test_as_completion_accepts_policy_outputs():
    assert as_completion("hi") == Completion(text="hi")
    msg = {"content": None, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}
    c = as_completion(msg)
    assert c.finish_reason == "tool_calls" and c.tool_calls[0].arguments == '{"a": 1}'
    assert as_completion(c.to_dict()) == c


@pytest.mark.parametrize(
    "body, fragment",
    [
        ([], "JSON object"),
        ({"messages": []}, "non-empty"),
        ({"messages": [{"role": 1}]}, "role"),
        ({"messages": [{"role": "user"}], "tools": {}}, "tools"),
        ({"messages": [{"role": "user"}], "metadata": "x"}, "metadata"),
        ({"messages": [{"role": "user"}], "temperature": -1}, "temperature"),
        ({"messages": [{"role": "user"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user"}], "top_p": 0}, "top_p"),
        ({"messages": [{"role": "user"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user"}], "max_tokens": 1.5}, "max_tokens"),
        ({"messages": [{"role": "user"}], "stop": [1]}, "stop"),
    ],
)
def test_bad_requests_are_rejected_with_a_reason(body, fragment):
    with pytest.raises(ValueError, match=fragment):
        ChatRequest.from_openai(body)


# ---------------------------------------------------------------- files: appends, bad lines, streaming, compact


def conversation(turns: int = 4, episode: str = "c") -> Trajectory:
    """An episode that continues one conversation: each request repeats the history and the tools."""
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    messages: list[dict] = [{"role": "system", "content": "be brief " * 50}, {"role": "user", "content": "2+2?"}]
    prompt_ids = list(range(100))
    steps = []
    for i in range(turns):
        completion = Completion(text=f"answer {i}", prompt_token_ids=list(prompt_ids),
                                completion_token_ids=[1000 + i, 2000 + i], logprobs=[-0.5, -0.25])
        request = ChatRequest.from_openai({"model": "m", "messages": [dict(m) for m in messages], "tools": tools})
        steps.append(Step(index=i, request=request, completion=completion))
        messages += [{"role": "assistant", "content": f"answer {i}"}, {"role": "tool", "content": f"result {i}"}]
        prompt_ids += completion.completion_token_ids + [7, 8, 9]
    # the agent starts a new conversation: only the system message is shared
    request = ChatRequest.from_openai({"model": "m", "messages": [messages[0], {"role": "user", "content": "check"}]})
    steps.append(Step(index=turns, request=request, completion=Completion(text="ok", prompt_token_ids=[5, 6], completion_token_ids=[9])))
    return Trajectory(episode_id=episode, steps=steps, status=Status.SUCCEEDED, final_reward=1.0)


def test_files_store_each_calls_new_messages_once_and_load_back_exactly(tmp_path):
    t = conversation()
    path = tmp_path / "t.jsonl"
    save_trajectories(path, [t])
    (back,) = load_trajectories(path)
    assert back == t
    assert [s.request.messages for s in back.steps] == [s.request.messages for s in t.steps]
    assert [s.completion.prompt_token_ids for s in back.steps] == [s.completion.prompt_token_ids for s in t.steps]
    stored = json.loads(path.read_text())["steps"]
    # step 2 adds the previous answer and tool result to the 4 messages of step 1
    assert stored[2]["from_previous"] == {"messages": 4, "tools": True, "prompt_token_ids": 107}
    assert stored[2]["request"]["messages"] == t.steps[2].request.messages[4:] and "tools" not in stored[2]["request"]
    assert stored[2]["completion"]["prompt_token_ids"] == [7, 8, 9]
    assert "from_previous" not in stored[0]
    assert stored[4]["from_previous"] == {"messages": 1}  # a rebuilt prompt shares its system message only
    # the whole-steps form (what to_json() gives, and files before this format) is the larger one
    assert len(path.read_text()) < 0.6 * len(t.to_json())


def test_files_written_before_the_compact_format_still_load(tmp_path):
    t = conversation()
    path = tmp_path / "old.jsonl"
    path.write_text(t.to_json() + "\n" + sample_trajectory().to_json() + "\n")  # every step whole
    assert list(load_trajectories(path)) == [t, sample_trajectory()]


def test_a_step_that_needs_its_previous_step_says_so():
    data = json.loads(conversation().to_json(compact=True))
    with pytest.raises(ValueError, match="stores only what it adds to the previous step"):
        Step.from_dict(data["steps"][1])


def test_appending_after_a_killed_writer_starts_on_a_line_boundary(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(sample_trajectory(0))
    with open(path, "a") as fh:
        fh.write(sample_trajectory(1).to_json()[:70])  # killed mid-line
    with pytest.warns(TruncatedLineWarning, match="cut a half-written last line"):
        writer = TrajectoryWriter(path, append=True)
    with writer:
        writer.write(sample_trajectory(2))
        writer.write(sample_trajectory(3))
    assert [t.episode_id for t in load_trajectories(path)] == ["e0", "e2", "e3"]
    # a whole last line that only lacks its newline is kept
    path.write_text(sample_trajectory(0).to_json())
    with TrajectoryWriter(path, append=True) as w:
        w.write(sample_trajectory(1))
    assert [t.episode_id for t in load_trajectories(path)] == ["e0", "e1"]


def test_bad_bytes_name_file_and_line_and_can_be_skipped(tmp_path):
    path = tmp_path / "t.jsonl"
    good = sample_trajectory(0).to_json().encode()
    path.write_bytes(good + b"\n" + good.replace(b'"q"', b'"\xff"') + b"\n" + b"{oops\n" + sample_trajectory(3).to_json().encode() + b"\n")
    with pytest.raises(ValueError, match=f"{path}:2: not UTF-8 \\(byte 0xff"):
        list(load_trajectories(path))
    with pytest.warns(SkippedLineWarning) as caught:
        assert [t.episode_id for t in load_trajectories(path, on_error="skip")] == ["e0", "e3"]
    assert [str(w.message).split(" ")[0] for w in caught] == [f"{path}:2:", f"{path}:3:"]
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip'"):
        load_trajectories(path, on_error="ignore")


def test_loading_streams_line_by_line(tmp_path):
    # A reader that read the whole file first would never see lines written after it started
    # (a live run's file, as the viewer reads it).
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write(sample_trajectory(0))
        stream = load_trajectories(path)
        assert next(stream).episode_id == "e0"
        writer.write(sample_trajectory(1))
        assert [t.episode_id for t in stream] == ["e1"]
def test_a_big_variable_is_written_once_not_once_per_step_and_reads_back_whole(tmp_path):
    from agentgym_lightning import ChatRequest, Step, Trajectory, load_trajectories, save_trajectories

    big = "x" * 500_000
    steps = []
    for i in range(20):
        variables = {"big": big, "turn": i} if i else {"turn": i}
        steps.append(Step(index=i, request=ChatRequest(messages=[{"role": "user", "content": "q"}]), variables=variables))
    steps[-1].variables = {"turn": 19}  # a name that went away is recorded too
    t = Trajectory(episode_id="e", steps=steps)
    path = tmp_path / "t.jsonl"
    save_trajectories(path, [t])
    # Before: every step repeated "big": a 9.5 MB line for 0.5 MB of data.
    assert path.stat().st_size < 2 * len(big)
    (back,) = load_trajectories(path)
    assert back == t and [s.variables for s in back.steps] == [s.variables for s in steps]


def test_files_whose_steps_hold_whole_variables_still_load(tmp_path):
    import json

    from agentgym_lightning import load_trajectories

    old = {"episode_id": "e", "status": "succeeded", "steps": [
        {"index": i, "request": {"messages": [{"role": "user", "content": "q"}]}, "variables": {"a": 1, "turn": i}}
        for i in range(2)
    ]}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    (t,) = load_trajectories(path)
    assert [s.variables for s in t.steps] == [{"a": 1, "turn": 0}, {"a": 1, "turn": 1}]


def test_a_line_nested_too_deeply_is_skipped_like_any_bad_line(tmp_path):
    import warnings

    from agentgym_lightning.trajectory import SkippedLineWarning

    path = tmp_path / "t.jsonl"
    good = Trajectory(episode_id="ok", final_reward=1.0)
    bad_reward = json.loads(good.to_json())
    bad_reward["final_reward"] = "x"
    path.write_text(good.to_json() + "\n" + "[" * 5000 + "]" * 5000 + "\n" + json.dumps(bad_reward) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Before: the RecursionError escaped on_error="skip", and final_reward "x" was accepted.
        assert [t.episode_id for t in load_trajectories(path, on_error="skip")] == ["ok"]
    messages = [str(w.message) for w in caught if issubclass(w.category, SkippedLineWarning)]
    assert len(messages) == 2 and "nested too deeply" in messages[0] and "final_reward must be a number" in messages[1]
    with pytest.raises(ValueError, match=r"t.jsonl:2: not a JSON trajectory \(nested too deeply"):
        list(load_trajectories(path))


def test_a_calls_policy_version_is_kept_in_the_jsonl_and_absent_when_not_stamped(tmp_path):
    from agentgym_lightning.episode import Episode

    request = ChatRequest(messages=[{"role": "user", "content": "q"}])
    episode = Episode(task=None)
    for version in (2, 3):  # an episode spanning an update: each call says which version answered it
        call = episode.submit(request)
        episode.answer(call, Completion(text="a", policy_version=version))
    assert [s.policy_version for s in episode.trajectory.steps] == [2, 3]
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write(episode.trajectory)
    (back,) = load_trajectories(path)
    assert [s.policy_version for s in back.steps] == [2, 3]
    assert "policy_version" not in Step(index=0, request=request, completion=Completion(text="a")).to_dict()
