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


def _with_config(folder: Path, **config) -> Path:
    state = folder / "checkpoints" / "checkpoint-000001" / "trainer_state.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    base = {"env": "lightning/Spider-v0", "model": "smollm2-135m", "backend": "hf", "use_peft": True, "max_steps": 3,
            "num_generations": 2, "tasks_per_step": 1, "learning_rate": 1e-5, "beta": 0.04}
    state.write_text(json.dumps({"step": 1, "config": {**base, **config}, "history": []}))
    return folder


def test_the_report_and_view_name_each_runs_env_model_backend_and_options(tmp_path):
    from starlette.testclient import TestClient

    from agentgym_lightning.viewer.app import make_app

    run = _with_config(_synthetic().write_run(tmp_path / "run", steps=2, tasks=1, group_size=2, calls=1))
    text = report([RunFolder(run)])
    # Before: the header was "run report · run", and nothing named the env, the model or the options.
    assert "<title>run report · run (lightning/Spider-v0 · smollm2-135m)</title>" in text
    assert "env <b>lightning/Spider-v0</b> · model <b>smollm2-135m</b> (hf, LoRA)" in text
    assert "num_generations=2" in text and "learning_rate=1e-05" in text
    assert "<summary>the whole config</summary>" in text and "&quot;beta&quot;: 0.04" in text  # every option, on demand
    home = TestClient(make_app([RunFolder(run)])).get("/").text
    assert "env <b>lightning/Spider-v0</b>" in home and "the whole config" in home


def test_runs_of_different_experiments_are_not_averaged(tmp_path):
    synthetic = _synthetic()
    a = _with_config(synthetic.write_run(tmp_path / "a", steps=3, tasks=1, group_size=2, calls=1, seed=0))
    b = _with_config(synthetic.write_run(tmp_path / "b", steps=3, tasks=1, group_size=2, calls=1, seed=1), env="lightning/MuSiQue-v0")
    text = report([RunFolder(a), RunFolder(b)])
    # Before: "mean of 2" with a band, and no word that the envs differ.
    assert "mean of 2" not in text
    assert "these runs are not one experiment: they differ in <b>env</b> (a: lightning/Spider-v0; b: lightning/MuSiQue-v0)" in text
    assert "task (train) · a" in text and "task (train) · b" in text
    c = _with_config(synthetic.write_run(tmp_path / "c", steps=3, tasks=1, group_size=2, calls=1, seed=2))
    same = report([RunFolder(a), RunFolder(c)])
    assert "task (train) (mean of 2)" in same and "not one experiment" not in same


def test_a_two_step_runs_charts_have_whole_step_ticks_and_room_around_the_point():
    from agentgym_lightning.viewer.charts import CHARTS, chart_svg

    svg = chart_svg(CHARTS[0], [{"train/reward/mean": [(2, 0.5)]}], ["run"])
    ticks = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    # Before: one dot at the edge of an axis from 1.900 to 2.100.
    assert not any(re.fullmatch(r"\d\.\d+", t.strip()) and t.strip().startswith(("1.9", "2.0", "2.1")) for t in ticks), ticks
    assert {"1", "2", "3"} <= {t.strip() for t in ticks}, ticks


def test_the_zero_variance_chart_draws_the_steps_with_none():
    from agentgym_lightning.viewer.charts import CHARTS, _with_zeros

    chart = next(c for c in CHARTS if c.title == "Zero-variance groups")
    series = {"samples/groups": [(1, 4.0), (2, 4.0), (3, 4.0)], "samples/groups/zero_variance": [(2, 1.0)]}
    # Before: the steps without the (only-when-nonzero) count were left out, a line from 2 alone.
    assert _with_zeros(chart, series)["samples/groups/zero_variance"] == [(1, 0.0), (2, 1.0), (3, 0.0)]


def test_tool_calls_written_as_text_are_counted_and_groups_without_tools_have_no_sequences(tmp_path):
    text_call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    run = tmp_path / "run"
    with TrajectoryWriter(run / "trajectories" / "step-000001.jsonl") as w:
        w.write(_episode([(text_call, "42")], eid="texty", group="tools", final_reward=1.0))
        w.write(_episode([("no tool", "x")], eid="plain", group="tools", final_reward=0.0))
        w.write(_episode([("a", "x")], eid="p1", group="chat", final_reward=1.0))
        w.write(_episode([("b", "x")], eid="p2", group="chat", final_reward=0.0))
    from agentgym_lightning.viewer.pages import episode_list, report_links

    listing = episode_list(0, RunFolder(run), RunFolder(run).episode_files()[0], report_links(set()))
    chat = listing[listing.index("group chat"):]
    tools = listing[listing.index("group tools"):listing.index("group chat")] if listing.index("group tools") < listing.index("group chat") else listing[listing.index("group tools"):]
    assert "<td>calculator</td>" in tools  # before: "–" (only the API's tool_calls counted)
    assert "2 distinct tool-call sequences" in tools
    assert "distinct tool-call sequences" not in chat.split("</table>")[0]  # before: "1 distinct tool-call sequences"


def test_an_untrained_episodes_calls_say_why_in_words(tmp_path):
    t = _episode([("answer", "r")], eid="held")
    t.steps[0].request.wire = "anthropic"
    run = tmp_path / "run"
    with TrajectoryWriter(run / "eval" / "step-000000.jsonl") as w:
        w.write(t)
    text = report([RunFolder(run)])
    assert "not trained: a held-out evaluation" in text
    assert "(above)" not in text  # before: "not trained: the episode is not (above)"


def test_names_from_the_run_are_text_never_markup(tmp_path, run_dir):
    """A reward source named like matplotlib math, or like HTML, is shown as written."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    with open(run / "metrics.jsonl", "a") as fh:
        for step in (1, 2):
            fh.write(json.dumps({"step": step, "train/reward/$\\undefinedmacro$": 0.5, "train/reward/<b>bold</b>": 0.1}) + "\n")
    out = tmp_path / "r.html"
    # Before: exit 1 (matplotlib's mathtext raised on the source's name).
    assert cli.main(["report", str(run), "-o", str(out)]) == 0
    text = out.read_text()
    assert "$\\undefinedmacro$" in text and "<b>bold</b>" not in text and "&lt;b&gt;bold&lt;/b&gt;" in text


def test_malformed_run_files_give_pages_that_skip_the_bad_lines_and_say_so(tmp_path, run_dir):
    import shutil

    from starlette.testclient import TestClient

    from agentgym_lightning.viewer.app import make_app

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    step = run / "trajectories" / "step-000001.jsonl"
    good = step.read_text().splitlines()
    bad = json.loads(good[0])
    bad["episode_id"], bad["final_reward"] = "bad", "x"
    step.write_text("\n".join(good + ["[" * 5000 + "]" * 5000, json.dumps(bad)]) + "\n")
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write("[" * 5000 + "]" * 5000 + "\n")
        fh.write('{"step": 1' + "0" * 400 + ', "train/reward/mean": 1}\n')
    client = TestClient(make_app([RunFolder(run)]), raise_server_exceptions=False)
    home = client.get("/")
    # Before: 500 (RecursionError; OverflowError drawing step 10^400).
    assert home.status_code == 200 and "2 line(s) of run/metrics.jsonl could not be read" in home.text
    assert "nested too deeply" in home.text and "no step (a whole number" in home.text
    listing = client.get("/runs/0/train/1")
    # Before: 500 (the RecursionError escaped on_error="skip"; the string final reward broke the table).
    assert listing.status_code == 200 and "2 line(s) of run/trajectories/step-000001.jsonl could not be read" in listing.text
    assert "final_reward must be a number" in listing.text
    first = json.loads(good[0])["episode_id"]
    assert client.get(f"/runs/0/train/1/{first}").status_code == 200
    assert client.get("/runs/0/train/1/bad").status_code == 404


def test_view_streams_a_file_larger_than_its_cache_and_reads_one_episodes_group(run_dir):
    run = RunFolder(run_dir)
    f = run.episode_files()[0]
    everything = run.episodes(f)
    run.cache_bytes = f.path.stat().st_size - 1  # the file is larger than the cache
    run._cache.clear()
    assert run.episodes(f) == everything and not run._cache  # read, not kept
    target = everything[-1]
    group = run.episode_group(f, target.episode_id)
    assert {t.episode_id for t in group} == {t.episode_id for t in everything if t.group_id == target.group_id}
    assert len(group) < len(everything) and not run._cache
    assert run.episode_group(f, "nobody") == []


def test_each_call_shows_the_policy_version_that_answered_it(tmp_path):
    """Asynchronous training: an episode may span versions, and the viewer says which answered each call."""
    t = _episode([("first", "r"), ("second", "r")], eid="spanning")
    t.steps[0].policy_version, t.steps[1].policy_version = 3, 4
    run = tmp_path / "run"
    with TrajectoryWriter(run / "trajectories" / "step-000005.jsonl") as w:
        w.write(t)
    text = report([RunFolder(run)])
    assert text.index("policy v3") < text.index("policy v4")


def test_charts_dir_writes_each_chart_as_an_svg_file_with_a_held_out_curve(run_dir, tmp_path, capsys):
    out, charts = tmp_path / "r.html", tmp_path / "img"
    assert cli.main(["report", str(run_dir), "-o", str(out), "--charts-dir", str(charts)]) == 0
    # Stable names a doc can link, one file a chart, in the report's order.
    names = ["reward", "heldout", "air", "success", "turns", "loss", "kl", "entropy", "grad_norm", "clip", "zero_variance", "tokens_per_s", "time"]
    assert sorted(p.name for p in charts.iterdir()) == sorted(f"{n}.svg" for n in names)
    assert f"charts: {charts}/ ({', '.join(f'{n}.svg' for n in names)})" in capsys.readouterr().out
    heldout = (charts / "heldout.svg").read_text()
    # A standalone image: the XML declaration and the SVG namespace, no page around it.
    assert heldout.startswith('<?xml version="1.0"') and 'xmlns="http://www.w3.org/2000/svg"' in heldout and "<html" not in heldout
    assert "Held-out evaluation" in heldout and ">reward = success rate<" in heldout  # the synthetic scores are 0 or 1
    # The report shows the same held-out chart (before: the held-out reward was one line among the train curves).
    assert "Held-out evaluation" in out.read_text()


def test_the_held_out_chart_draws_the_eval_scores_not_its_counts_or_times():
    from agentgym_lightning.viewer.charts import held_out, run_charts

    series = _series(eval__reward__mean=[0.1, 0.2], eval__metrics__strict=[0.1, 0.3], eval__success_rate=[0.0, 0.5],
                     eval__episodes=[32, 32], eval__wall_time_s=[500, 400], eval__turns__mean=[2, 2], train__reward__mean=[0, 0])
    chart = held_out([series])
    assert chart.name == "heldout"
    assert chart.lines == (("eval/reward/mean", "reward"), ("eval/success_rate", "success rate"), ("eval/metrics/strict", "strict"))
    # Scores equal everywhere are one line (before: four lines drawn on top of each other, one seen).
    same = _series(eval__reward__mean=[0.1, 0.2], eval__metrics__strict=[0.1, 0.2], eval__metrics__official=[0.1, 0.2])
    assert held_out([same]).lines == (("eval/reward/mean", "reward = official = strict"),)
    assert len(held_out([same, {**same, "eval/metrics/strict": [(1, 0.0), (2, 0.2)]}]).lines) == 2  # equal in one seed only
    assert held_out([_series(train__reward__mean=[0.0])]) is None
    assert [c.name for c in run_charts([series])][:2] == ["reward", "heldout"]
    assert "heldout" not in [c.name for c in run_charts([_series(loss=[1.0])])]


def test_a_run_that_measured_pass_at_k_and_sampled_dynamically_gets_their_charts():
    from agentgym_lightning.viewer.charts import groups_with_signal, pass_at_k, run_charts

    series = _series(eval__success_rate=[0.1, 0.2], eval__pass__1=[0.05, 0.1], eval__pass__8=[0.3, 0.35],
                     sampling__groups_drawn=[12, 9], sampling__groups_kept=[4, 4], sampling__groups_zero_variance=[8, 5], loss=[1.0, 0.9])
    series = {name.replace("pass/", "pass@"): points for name, points in series.items()}
    chart = pass_at_k([series])
    assert chart.lines == (("eval/success_rate", "greedy"), ("eval/pass@1", "pass@1 (sampled)"), ("eval/pass@8", "pass@8 (sampled)"))
    assert groups_with_signal([series]).lines[1] == ("sampling/groups_kept", "kept (signal)")
    names = [c.name for c in run_charts([series])]
    assert names.index("pass_at_k") < names.index("success")
    assert names.index("groups_with_signal") == names.index("zero_variance") + 1
    plain = _series(eval__success_rate=[0.1], loss=[1.0])
    assert pass_at_k([plain]) is None and groups_with_signal([plain]) is None


def test_a_run_whose_generator_counted_its_prefills_gets_their_chart():
    from agentgym_lightning.viewer.charts import prefill, run_charts

    series = _series(generator__prompt_tokens=[900, 1200], generator__prefilled_tokens=[400, 300], loss=[1.0, 0.9])
    assert prefill([series]).lines == (("generator/prompt_tokens", "sent"), ("generator/prefilled_tokens", "prefilled (computed)"))
    assert [c.name for c in run_charts([series])][-1] == "prefill"
    assert prefill([_series(loss=[1.0])]) is None and "prefill" not in [c.name for c in run_charts([_series(loss=[1.0])])]


def test_charts_dir_overlays_several_seeds_on_one_held_out_chart(tmp_path):
    synthetic = _synthetic()
    seeds = [str(synthetic.write_run(tmp_path / f"seed{s}", steps=4, tasks=1, group_size=2, calls=1, seed=s, eval_every=2, eval_episodes=2))
             for s in range(2)]
    assert cli.main(["report", *seeds, "-o", str(tmp_path / "r.html"), "--charts-dir", str(tmp_path / "img")]) == 0
    heldout = (tmp_path / "img" / "heldout.svg").read_text()
    assert "reward = success rate (mean of 2)" in heldout  # each seed faint, their mean bold, their spread a band


def _agent_run(folder: Path) -> Path:
    """One training step of two GRPO groups (tasks q0, q1) of two episodes, each a writer call
    then a checker call, and a step 9 whose answers differ."""
    for step in (1, 9):
        with TrajectoryWriter(folder / "trajectories" / f"step-{step:06d}.jsonl") as w:
            for task in range(2):
                for seed in range(2):
                    steps = []
                    for i, agent in enumerate(("writer", "checker")):
                        messages = [{"role": "system", "content": "SCHEMA " * 50}, {"role": "user", "content": f"question {task}"},
                                    {"role": "assistant", "content": "draft"}, {"role": "user", "content": f"{agent} asks about q{task}"}]
                        request = ChatRequest.from_openai({"model": "m", "messages": messages})
                        completion = Completion(text=f"{agent} answer at step {step}, task {task}, seed {seed}" + " x" * 300)
                        steps.append(Step(index=i, request=request, completion=completion, agent=agent,
                                          rewards=[Reward(0.5, "runs")] if agent == "writer" else [],
                                          outcome={"sql": "SELECT 1", "sql_status": "executes"} if agent == "writer" else {}))
                    w.write(Trajectory(episode_id=f"s{step}-q{task}-{seed}", task={"id": f"q{task}", "question": "?"}, steps=steps,
                                       group_id=f"g{task}", seed=seed, status=Status.SUCCEEDED, final_reward=float(seed)))
    return folder


def test_call_examples_quote_an_agents_calls_by_a_fixed_rule(tmp_path):
    from agentgym_lightning.viewer.calls import call_examples, format_examples

    run = RunFolder(_agent_run(tmp_path / "run"))
    examples = call_examples(run, 9, count=3, agent="checker", limit=60)
    # One episode of each group in turn (different tasks first), its first call of the agent.
    assert [(x.episode_id, x.call, x.agent) for x in examples] == [("s9-q0-0", 1, "checker"), ("s9-q1-0", 1, "checker"), ("s9-q0-1", 1, "checker")]
    first = examples[0]
    assert first.asked == "checker asks about q0"  # the last user message, not the system prompt
    assert first.answer.startswith("checker answer at step 9, task 0, seed 0 x x") and first.answer.endswith("more characters)")
    assert len(first.answer) < 100 and first.task == "q0" and first.rewards == () and first.episode_reward == 0.0
    writer = call_examples(run, 1, count=1)[0]  # no agent given: each episode's first call
    assert (writer.agent, writer.rewards, writer.step) == ("writer", (("runs", 0.5),), 1)
    assert writer.outcome == '{"sql": "SELECT 1", "sql_status": "executes"}' and first.outcome == ""
    text = format_examples(examples[:1])
    assert text.startswith("step 9 · task q0 · episode s9-q0-0 · call 1 (checker) · call rewards: none · episode reward 0.000\n  asked:\n    checker asks about q0\n  answer:\n    checker answer")
    assert "outcome:" not in text
    assert format_examples([writer]).endswith('more characters)\n  outcome:\n    {"sql": "SELECT 1", "sql_status": "executes"}')
    with pytest.raises(KeyError, match="no such episode file"):
        call_examples(run, 5)


def test_the_calls_command_prints_an_early_and_a_late_step(tmp_path, capsys):
    run = _agent_run(tmp_path / "run")
    assert cli.main(["calls", str(run), "--steps", "1", "9", "--agent", "writer", "-n", "2", "--limit", "40"]) == 0
    out = capsys.readouterr().out
    assert out.index("=== step 1: 2 call(s) of writer") < out.index("writer answer at step 1") < out.index("=== step 9: 2 call(s) of writer")
    assert out.count("call rewards: runs +0.500") == 4 and "checker" not in out
    assert cli.main(["calls", str(run), "--steps", "3"]) == 2
    assert "step-000003.jsonl: no such episode file" in capsys.readouterr().err


def test_the_held_out_chart_starts_at_zero_so_one_episode_in_32_does_not_fill_it():
    from agentgym_lightning.viewer.charts import chart_svg, held_out

    series = {"eval/reward/mean": [(0, 0.0625), (10, 0.0625), (20, 0.03125)]}
    ticks = {t.strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", chart_svg(held_out([series]), [series], ["run"]))}
    # Before: the y axis ran from 0.030 to 0.064, drawing 2/32 -> 1/32 as a fall from top to bottom.
    assert "0.00" in ticks or "0.000" in ticks, ticks


def test_the_report_shows_the_last_step_with_episodes_call_by_call_not_an_empty_one(run_dir, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "trajectories" / "step-000005.jsonl").write_text("")  # the run stopped as step 5 began
    text = report([RunFolder(run)])
    # Before: "episodes of step 5, call by call" with nothing under it.
    assert "episodes of step 4, call by call" in text and "episodes of step 5, call by call" not in text
    assert "id='r0-train-4-s4-t0-m0'" in text
def test_an_episode_shows_the_resources_it_ran_with_and_their_texts_from_the_runs_config(tmp_path):
    """Before: ``trajectory.resources`` (which prompt produced the episode) was on no page."""
    from starlette.testclient import TestClient

    from agentgym_lightning.resources import content_version
    from agentgym_lightning.viewer.app import make_app

    prompt = "Use the <calculator> & answer."
    run = _with_config(tmp_path / "run", env_kwargs={"resources": {"system_prompt": {"text": prompt, "version": content_version(prompt)}}})
    given = _episode([("ok", "r")], eid="given", resources={"system_prompt": content_version(prompt), "few_shot": "v3"})
    plain = _episode([("ok", "r")], eid="plain")
    with TrajectoryWriter(run / "trajectories" / "step-000001.jsonl") as w:
        w.write(given)
        w.write(plain)
    client = TestClient(make_app([RunFolder(run)]))
    listing = client.get("/runs/0/train/1").text
    assert "<th>resources</th>" in listing and f"few_shot v3, system_prompt {content_version(prompt)}" in listing
    page = client.get("/runs/0/train/1/given").text
    assert f"<td>system_prompt</td><td>{content_version(prompt)}</td>" in page
    assert "Use the &lt;calculator&gt; &amp; answer." in page  # the text the config gave it, escaped
    assert "<td>few_shot</td><td>v3</td><td><span class=muted>not in the run's config</span>" in page
    assert "<th>resource</th>" not in client.get("/runs/0/train/1/plain").text  # none given: no table
    assert "resources" in report([RunFolder(run)])  # the static report too

    without = tmp_path / "without"
    with TrajectoryWriter(without / "trajectories" / "step-000001.jsonl") as w:
        w.write(plain)
    assert "<th>resources</th>" not in TestClient(make_app([RunFolder(without)])).get("/runs/0/train/1").text


def test_a_judged_run_is_named_as_judged_and_never_averaged_with_an_unjudged_one(tmp_path):
    synthetic = _synthetic()
    judge = {"base_url": "http://127.0.0.1:8000/v1", "model": "qwen-judge", "mode": "relative", "weight": 1.0, "rubric": "r"}
    a = _with_config(synthetic.write_run(tmp_path / "a", steps=3, tasks=1, group_size=2, calls=1, seed=0), judge=judge, max_staleness=1)
    b = _with_config(synthetic.write_run(tmp_path / "b", steps=3, tasks=1, group_size=2, calls=1, seed=1))  # no judge, no max_staleness
    text = report([RunFolder(a), RunFolder(b)])
    # Before: the header named neither the judge nor max_staleness, and the two were "mean of 2".
    assert "rewards: judged by qwen-judge at http://127.0.0.1:8000/v1 (relative, weight 1.0)" in text
    assert "success: status succeeded and the env&#x27;s own reward &gt; 0" in text
    assert "rewards: the env&#x27;s · success: status succeeded and final reward &gt; 0" in text
    assert "max_staleness=1" in text
    assert "mean of 2" not in text
    assert "they differ in <b>judge</b>" in text and "<b>max_staleness</b> (a: 1; b: 0)" in text
    # A run saved before max_staleness existed is the synchronous run it was: one experiment with max_staleness=0.
    c = _with_config(synthetic.write_run(tmp_path / "c", steps=3, tasks=1, group_size=2, calls=1, seed=2), max_staleness=0)
    assert "task (train) (mean of 2)" in report([RunFolder(b), RunFolder(c)])
    # Two seeds of one judged experiment may call their judge differently (concurrency, timeouts).
    d = _with_config(synthetic.write_run(tmp_path / "d", steps=3, tasks=1, group_size=2, calls=1, seed=3),
                     judge={**judge, "concurrency": 8, "timeout_s": 30.0}, max_staleness=1)
    assert "task (train) (mean of 2)" in report([RunFolder(a), RunFolder(d)])


def test_an_asynchronous_runs_report_draws_its_staleness_and_overlap(tmp_path):
    synchronous = _with_config(_synthetic().write_run(tmp_path / "sync", steps=2, tasks=1, group_size=2, calls=1))
    assert "Staleness (policy versions)" not in report([RunFolder(synchronous)])  # nothing logged: nothing drawn
    run = _with_config(_synthetic().write_run(tmp_path / "run", steps=2, tasks=1, group_size=2, calls=1), max_staleness=1)
    with (run / "metrics.jsonl").open("a") as f:
        for step in (1, 2):
            f.write(json.dumps({"step": step, "async/staleness_mean": 0.5, "async/staleness_max": 1.0, "async/overlap_fraction": 0.75}) + "\n")
    text = report([RunFolder(run)])
    # Before: the report drew neither, and its header did not name max_staleness.
    assert "Staleness (policy versions)" in text and "Episode time beside updates" in text and "max_staleness=1" in text
