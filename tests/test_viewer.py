"""The run viewer: the report file, the live app's pages and the collapse alarms."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from agentgym_lightning import ChatRequest, Completion, Reward, Status, Step, ToolCall, Trajectory, TrajectoryWriter

pytest.importorskip("matplotlib", reason="the viewer's charts need matplotlib (the `view` extra)")

from agentgym_lightning import cli  # noqa: E402
from agentgym_lightning.viewer.alarms import group_diversity, run_alarms  # noqa: E402
from agentgym_lightning.viewer.pages import report  # noqa: E402
from agentgym_lightning.viewer.run import RunFolder  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _synthetic():
    spec = importlib.util.spec_from_file_location("synthetic_run", REPO / "bench" / "synthetic_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return _synthetic().write_run(tmp_path_factory.mktemp("runs") / "run", steps=4, tasks=2, group_size=3, calls=3, eval_every=2, eval_episodes=2)


def test_the_report_is_one_self_contained_file(run_dir, tmp_path):
    out = tmp_path / "r.html"
    assert cli.main(["report", str(run_dir), "-o", str(out)]) == 0
    text = out.read_text()
    # nothing fetched: no external scripts, styles, images or fonts
    assert not re.search(r"<(script|img|link|iframe)[^>]*\s(src|href)=", text)
    assert "@import" not in text and not re.search(r"url\((?!#)", text)  # url(#id): the SVG's own clip paths
    namespaces = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}  # named, never fetched
    assert set(re.findall(r"https?://[^\s\"'<>]+", text)) <= namespaces
    assert text.count("<svg") >= 8  # reward, AIR, success, turns, loss, kl, entropy, grad norm...
    # every step's and evaluation's episodes, and the last step's episodes call by call
    for anchor in ("r0-train-1", "r0-train-4", "r0-eval-0", "r0-eval-4"):
        assert f"id='{anchor}'" in text
    assert "id='r0-train-4-s4-t0-m0'" in text and "id='r0-eval-4-s4-t100-m0'" in text
    # every link to an episode lands on an element of the page
    for target in re.findall(r"href='#([^']+)'", text):
        assert f"id='{target}'" in text, target


def test_a_missing_run_folder_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "nowhere"), "-o", str(tmp_path / "r.html")]) == 2
    assert "no such run folder" in capsys.readouterr().err


def _episode(calls: list[tuple[str, str]], group="g", eid="e", **kw) -> Trajectory:
    """An episode continuing one conversation; ``calls`` are (answer, tool result) pairs."""
    messages = [{"role": "system", "content": "SYSTEM PROMPT"}, {"role": "user", "content": "question"}]
    steps = []
    for i, (answer, result) in enumerate(calls):
        request = ChatRequest.from_openai({"model": "m", "messages": [dict(m) for m in messages]})
        steps.append(Step(index=i, request=request, completion=Completion(text=answer, prompt_token_ids=[1, 2], completion_token_ids=[3, 4], logprobs=[-0.1, -2.0])))
        messages += [{"role": "assistant", "content": answer}, {"role": "tool", "content": result}]
    return Trajectory(episode_id=eid, steps=steps, group_id=group, status=kw.pop("status", Status.SUCCEEDED), final_reward=kw.pop("final_reward", 1.0), **kw)


def test_an_episode_shows_each_call_once_with_its_credit_and_why_it_is_not_trained(tmp_path):
    from starlette.testclient import TestClient

    from agentgym_lightning.viewer.app import make_app

    run = tmp_path / "run"
    good = _episode([("thinking", "RESULT-ONE"), ("done", "RESULT-TWO")], eid="good", final_reward=1.0)
    good.steps[1].trainable = False
    good.steps[0].rewards = [Reward(0.5, "math.calc_ok", raw=1.0)]
    good.steps[1].request.wire = "responses"  # a call the agent made on the Responses API
    bad = _episode([("other", "x")], eid="bad", final_reward=0.0)
    with TrajectoryWriter(run / "trajectories" / "step-000001.jsonl") as w:
        w.write(good)
        w.write(bad)
    client = TestClient(make_app([RunFolder(run)]))
    listing = client.get("/runs/0/train/1").text
    assert "group g" in listing and "/runs/0/train/1/good" in listing
    page = client.get("/runs/0/train/1/good").text
    assert page.count("SYSTEM PROMPT") == 1 and page.count("RESULT-ONE") == 1  # not the whole history again
    assert "math.calc_ok +0.500 (raw 1)" in page
    assert "advantage +0.707" in page  # (1.5 - 0.75) / std([1.5, 0]) of the group
    assert "not trained: the agent or env marked the call not trainable" in page
    assert "logprob -2.000" in page
    assert page.count("responses API") == 1  # the wire, shown for calls not on Chat Completions
    assert client.get("/runs/0/train/1/nobody").status_code == 404
    assert client.get("/runs/0/train/9").status_code == 404
    assert client.get("/runs/3/train/1").status_code == 404


def test_a_credit_strategy_not_installed_here_is_named_instead_of_the_advantages(tmp_path):
    from starlette.testclient import TestClient

    from agentgym_lightning.viewer.app import make_app

    run = tmp_path / "run"
    with TrajectoryWriter(run / "trajectories" / "step-000001.jsonl") as w:
        w.write(_episode([("a", "b")], eid="one", final_reward=1.0))
        w.write(_episode([("c", "d")], eid="two", final_reward=0.0))
    state = run / "checkpoints" / "checkpoint-1" / "trainer_state.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"step": 1, "config": {"credit": "someone-elses-plugin"}}))
    client = TestClient(make_app([RunFolder(run)]))
    listing = client.get("/runs/0/train/1").text
    assert "advantages not shown: unknown credit strategy &#x27;someone-elses-plugin&#x27;" in listing
    assert "advantage" not in client.get("/runs/0/train/1/one").text.replace("advantages not shown", "")


def test_the_live_app_sees_what_the_run_writes(tmp_path):
    from starlette.testclient import TestClient

    from agentgym_lightning.viewer.app import make_app

    run = tmp_path / "run"
    run.mkdir()
    client = TestClient(make_app([RunFolder(run)]))
    assert "no episodes written yet" in client.get("/").text
    before = client.get("/version").json()["version"]
    with TrajectoryWriter(run / "trajectories" / "step-000001.jsonl") as w:
        w.write(_episode([("a", "b")], eid="first"))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/reward/mean": 0.5}) + "\n")
    assert client.get("/version").json()["version"] != before
    home = client.get("/").text
    assert "/runs/0/train/1" in home and "<svg" in home
    assert "first" in client.get("/runs/0/train/1").text


def test_several_runs_are_overlaid_with_their_mean(tmp_path):
    synthetic = _synthetic()
    runs = [RunFolder(synthetic.write_run(tmp_path / f"seed{s}", steps=3, tasks=1, group_size=2, calls=1, seed=s)) for s in range(3)]
    text = report(runs)
    assert "task (train) (mean of 3)" in text and "Alarms · seed2" in text


def _series(**points):
    return {name.replace("__", "/"): list(enumerate(values, 1)) for name, values in points.items()}


def test_alarms_fire_on_collapse_and_say_what_they_checked():
    same = [_episode([("same", "r")], eid=f"e{i}", group="g1") for i in range(4)]
    varied = [_episode([(f"answer {i}", "r")], eid=f"v{i}", group="g2") for i in range(4)]
    assert {(d.group, d.distinct_completions) for d in group_diversity(same + varied)} == {("g1", 1), ("g2", 4)}
    series = _series(entropy=[1.0, 0.9, 0.5, 0.3], train__reward__mean=[0.1, 0.5, 0.6, 0.9], eval__reward__mean=[0.5, 0.2],
                     samples__groups=[4, 4, 4, 4], samples__groups__zero_variance=[0, 1, 3, 4],
                     train__episodes=[8, 8, 8, 8], train__status__infra_failed=[0, 0, 1, 0])
    alarms = {a.name: a for a in run_alarms(series, same)}
    assert all(a.firing for a in alarms.values()), alarms
    assert "1 of 1 groups answered identically" in alarms["diversity"].text
    assert "1 of 32 episodes ended infra_failed" in alarms["infra failures"].text
    healthy = _series(entropy=[1.0, 0.9, 0.9, 0.8], train__reward__mean=[0.1, 0.5], eval__reward__mean=[0.2, 0.5],
                      samples__groups=[4, 4], samples__groups__zero_variance=[1, 0], train__episodes=[8, 8])
    assert not any(a.firing for a in run_alarms(healthy, varied)), run_alarms(healthy, varied)


def test_tool_calls_and_tool_results_appear_in_the_call_view(tmp_path):
    t = _episode([("", "42")], eid="tools")
    t.steps[0].completion = Completion(text="", tool_calls=[ToolCall("c1", "calculator", {"expression": "6*7"})], prompt_token_ids=[1], completion_token_ids=[2], logprobs=[-0.5])
    run = tmp_path / "run"
    with TrajectoryWriter(run / "eval" / "step-000000.jsonl") as w:
        w.write(t)
    text = report([RunFolder(run)])
    assert "→ calculator({&quot;expression&quot;: &quot;6*7&quot;})" in text
    assert "held-out evaluation: not trained" in text


def test_view_refuses_a_missing_run_folder_in_one_line(tmp_path, capsys):
    assert cli.main(["view", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "no such run folder" in err and len(err.strip().splitlines()) == 1


def test_a_long_run_keeps_only_some_episode_files_parsed(run_dir):
    run = RunFolder(run_dir)
    run.cached_files = 2
    files = run.episode_files()
    first = run.episodes(files[0])
    assert run.episodes(files[0]) is first  # unchanged: not parsed again
    for f in files[1:4]:
        run.episodes(f)
    assert run.episodes(files[3]) is run.episodes(files[3])
    assert run.episodes(files[0]) is not first and run.episodes(files[0]) == first  # dropped, parsed again
