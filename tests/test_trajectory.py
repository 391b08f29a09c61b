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
from agentgym_lightning.trajectory import StepTimings, TruncatedLineWarning


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
