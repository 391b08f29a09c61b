"""optimize-prompt: GEPA evolves the math agent's system prompt, with a scripted agent policy and a
scripted reflection model (a mock OpenAI-compatible server), end to end through the env."""

from __future__ import annotations

import json
import re
import socket

import pytest

pytest.importorskip("gepa", reason="prompt optimization needs the `optimize` extra (gepa)")

from agentgym_lightning.cli import main  # noqa: E402
from agentgym_lightning.env import AgentEnv  # noqa: E402
from agentgym_lightning.envs.math.agent import SYSTEM_PROMPT  # noqa: E402
from agentgym_lightning.llm import Completion  # noqa: E402
from agentgym_lightning.policies.openai import OpenAIPolicy  # noqa: E402
from agentgym_lightning.prompt_optimization import ReflectionFailed, ReflectionModel, optimize_prompt  # noqa: E402
from agentgym_lightning.resources import content_version, parse_resource_arg  # noqa: E402
from agentgym_lightning.testing.mock_openai_server import MockOpenAIServer, default_reply  # noqa: E402
from agentgym_lightning.trajectory import load_trajectories  # noqa: E402

ENV = "lightning/Arithmetic-v0"
#: Level 1 problems, no worked example: the agent's first call is [system, question].
ENV_KWARGS = {"difficulty": 1, "examples": 0}
BETTER = "MAGIC: compute the expression exactly, then reply: Answer: <number>"
SMALL = {"train_tasks": 6, "heldout_tasks": 4, "budget": 24, "minibatch_size": 2, "concurrency": 4}


def scripted_answer(messages: list[dict]) -> str:
    """The agent's model: right when its system prompt says MAGIC, else always 0."""
    question = re.search(r"What is (.*)\?", str(messages[-1]["content"]))
    if "MAGIC" in str(messages[0]["content"]) and question:
        return f"Answer: {int(eval(question.group(1)))}"  # noqa: S307 - digits and + - from the generator
    return "Answer: 0"


def agent_policy(requests):
    return [Completion(text=scripted_answer(r.messages)) for r in requests]


def reflector(answer: str, asked: list[str] | None = None):
    """A mock server's responder that answers every reflection question with ``answer``."""

    def respond(body):
        if asked is not None:
            asked.append(body["messages"][-1]["content"])
        return default_reply(body, answer)

    return respond


def reflection_over(server: MockOpenAIServer) -> ReflectionModel:
    return ReflectionModel(OpenAIPolicy("", base_url=server.base_url, return_token_ids=False, logprobs=False, max_retries=0))


def lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_better_prompt_from_the_reflector_is_found_scored_and_written(tmp_path):
    asked: list[str] = []
    with MockOpenAIServer(reflector(f"Here is the new instruction:\n```\n{BETTER}\n```", asked)) as server:
        reflection = reflection_over(server)
        try:
            result = optimize_prompt(ENV, agent_policy, reflection, output_dir=tmp_path, env_kwargs=ENV_KWARGS,
                                     heldout_env_kwargs={"split": "test"}, test_tasks=3, **SMALL)
        finally:
            reflection.policy.close()

    # It started from the agent's own prompt, found the reflector's, and kept it by its held-out score.
    assert result.best_texts == {"system_prompt": BETTER}
    assert result.best_versions == {"system_prompt": content_version(BETTER)}
    assert (result.baseline_heldout, result.best_heldout) == (0.0, 1.0)
    assert result.test == {"tasks": 3, "baseline": 0.0, "best": 1.0}
    assert result.candidates_tried == 1 and result.candidates_kept == 1
    # The reflection model was shown the current prompt and the episodes' feedback.
    assert SYSTEM_PROMPT in asked[0]
    assert "Answer: 0" in asked[0] and "The correct answer is" in asked[0]

    seed, proposal = lines(tmp_path / "candidates.jsonl")
    assert seed["candidate"] == 0 and seed["texts"] == {"system_prompt": SYSTEM_PROMPT}
    assert seed["heldout_score"] == 0.0 and seed["heldout_scores"] == [0.0] * 4
    assert proposal["candidate"] == 1 and proposal["parents"] == [0] and proposal["accepted"]
    assert proposal["texts"] == {"system_prompt": BETTER} and proposal["best"]
    assert proposal["train"] == {"tasks": 2, "parent": 0.0, "candidate": 2.0}
    assert proposal["heldout_score"] == 1.0 and BETTER in proposal["reflection_output"]

    # Every episode says which prompt produced it.
    trajectories = list(load_trajectories(tmp_path / "trajectories.jsonl"))
    assert len(trajectories) == result.episodes
    versions = {t.resources["system_prompt"] for t in trajectories}
    assert versions == {content_version(SYSTEM_PROMPT), content_version(BETTER)}
    assert all(t.total_reward == 1.0 for t in trajectories if t.resources["system_prompt"] == content_version(BETTER))

    # The best prompt is a file that seeds the next run (train --resource system_prompt=@FILE).
    best_file = tmp_path / "system_prompt.txt"
    assert result.files == {"system_prompt": str(best_file)}
    assert parse_resource_arg(f"system_prompt=@{best_file}").text == BETTER
    summary = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert summary["best_heldout"] == 1.0 and summary["files"] == result.files


def test_a_worse_proposal_is_rejected_and_the_starting_prompt_stays_best(tmp_path):
    with MockOpenAIServer(reflector("```\nJust guess.\n```")) as server:
        reflection = reflection_over(server)
        try:
            result = optimize_prompt(ENV, agent_policy, reflection, output_dir=tmp_path, env_kwargs=ENV_KWARGS, **SMALL)
        finally:
            reflection.policy.close()
    assert result.best_texts == {"system_prompt": SYSTEM_PROMPT}
    assert result.best_heldout == result.baseline_heldout == 0.0
    assert result.candidates_kept == 0 and result.candidates_tried >= 1
    rejected = lines(tmp_path / "candidates.jsonl")[1:]
    assert rejected and all(r["candidate"] is None and not r["accepted"] and r["heldout_score"] is None for r in rejected)
    assert all(r["texts"] == {"system_prompt": "Just guess."} and r["train"]["candidate"] == 0.0 for r in rejected)
    assert (tmp_path / "system_prompt.txt").read_text(encoding="utf-8") == SYSTEM_PROMPT + "\n"


def test_the_agents_own_policy_can_reflect_and_a_given_seed_prompt_is_the_start(tmp_path):
    def one_model(requests):  # the agent's model answers the reflection questions too
        return [
            Completion(text=f"```\n{BETTER}\n```") if r.metadata.get("role") == "reflection" else Completion(text=scripted_answer(r.messages))
            for r in requests
        ]

    result = optimize_prompt(ENV, one_model, ReflectionModel(one_model), output_dir=tmp_path, env_kwargs=ENV_KWARGS,
                             seed_texts={"system_prompt": "Reply: Answer: <number>"}, **SMALL)
    assert lines(tmp_path / "candidates.jsonl")[0]["texts"] == {"system_prompt": "Reply: Answer: <number>"}
    assert result.best_texts == {"system_prompt": BETTER} and result.best_heldout == 1.0


def test_bad_arguments_fail_before_any_episode(tmp_path):
    reflection = ReflectionModel(agent_policy)
    with pytest.raises(ValueError, match="tries no candidate"):
        optimize_prompt(ENV, agent_policy, reflection, output_dir=tmp_path / "a", env_kwargs=ENV_KWARGS, heldout_tasks=20, budget=20)
    with pytest.raises(ValueError, match="cannot exceed train_tasks"):
        optimize_prompt(ENV, agent_policy, reflection, output_dir=tmp_path / "a", train_tasks=2, minibatch_size=3)
    with pytest.raises(ValueError, match="not among the resources"):
        optimize_prompt(ENV, agent_policy, reflection, output_dir=tmp_path / "a", env_kwargs=ENV_KWARGS, seed_texts={"rubric": "x"}, **SMALL)
    with pytest.raises(ValueError, match="fewer than the 300 asked for"):
        optimize_prompt(ENV, agent_policy, reflection, output_dir=tmp_path / "a", env_kwargs=ENV_KWARGS,
                        heldout_env_kwargs={"split": "test"}, heldout_tasks=300, budget=400)
    assert not (tmp_path / "a").exists()
    # A resource the agent never reads has no starting text to find.
    with pytest.raises(ValueError, match=r"did not read resource 'rubric'.*it read: system_prompt"):
        optimize_prompt(ENV, agent_policy, reflection, output_dir=tmp_path / "a", env_kwargs=ENV_KWARGS, resources=["rubric"], **SMALL)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        ReflectionModel(agent_policy, temperature=-1)


def test_an_earlier_run_is_not_overwritten_unless_asked(tmp_path):
    (tmp_path / "candidates.jsonl").write_text("{}\n", encoding="utf-8")
    reflection = ReflectionModel(lambda requests: [Completion(text=f"```\n{BETTER}\n```") for _ in requests])
    with pytest.raises(ValueError, match=r"already holds an optimization \(candidates.jsonl\).*--overwrite"):
        optimize_prompt(ENV, agent_policy, reflection, output_dir=tmp_path, env_kwargs=ENV_KWARGS, **SMALL)
    result = optimize_prompt(ENV, agent_policy, reflection, output_dir=tmp_path, env_kwargs=ENV_KWARGS, overwrite=True, **SMALL)
    assert result.best_texts == {"system_prompt": BETTER}
    assert lines(tmp_path / "candidates.jsonl")[0]["candidate"] == 0


@pytest.mark.parametrize("name", ["../../victim", "ABSOLUTE", "..", ".hidden", "a/b", "a\\b", ""])
def test_a_resource_name_that_is_no_file_name_is_refused_and_nothing_outside_is_touched(tmp_path, name):
    victim = tmp_path / "victim.txt"
    name = str(tmp_path / "victim") if name == "ABSOLUTE" else name
    victim.write_text("keep me\n", encoding="utf-8")
    out = tmp_path / "a" / "b"
    reflection = ReflectionModel(agent_policy)
    with pytest.raises(ValueError, match="cannot be a file name|at least one resource"):
        optimize_prompt(ENV, agent_policy, reflection, output_dir=out, env_kwargs=ENV_KWARGS, resources=[name],
                        seed_texts={name: "x"}, overwrite=True, **SMALL)
    assert victim.read_text(encoding="utf-8") == "keep me\n" and not out.exists()


def test_the_command_refuses_a_resource_name_that_escapes_the_output_folder(tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n", encoding="utf-8")
    out = tmp_path / "a" / "b"
    status = main(["optimize-prompt", "--env", ENV, "--output-dir", str(out), "--reflection-base-url", "policy",
                   "--resource", "../../victim=hello", "--overwrite"])
    err = capsys.readouterr().err
    assert status == 2 and "resource name '../../victim' cannot be a file name" in err and len(err.strip().splitlines()) == 1
    assert victim.read_text(encoding="utf-8") == "keep me\n" and not out.exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_reflection_model_that_keeps_failing_stops_the_run_saying_why(tmp_path):
    dead = ReflectionModel(OpenAIPolicy("m", base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=0, return_token_ids=False,
                                        logprobs=False, connect_timeout=2.0))
    try:
        with pytest.raises(ReflectionFailed, match=r"failed \d+ times in a row.*last error: .*Connection refused"):
            optimize_prompt(ENV, agent_policy, dead, output_dir=tmp_path, env_kwargs=ENV_KWARGS, **{**SMALL, "budget": 100})
    finally:
        dead.policy.close()
    assert dead.calls == dead.failures_in_a_row >= 3  # GEPA asks again once per failed question: stopped after its iteration
    assert lines(tmp_path / "candidates.jsonl")[0]["candidate"] == 0  # what it had is on disk
    silent = ReflectionModel(lambda requests: [Completion(text="  ") for _ in requests])
    with pytest.raises(ReflectionFailed, match="no text"):
        optimize_prompt(ENV, agent_policy, silent, output_dir=tmp_path, env_kwargs=ENV_KWARGS, overwrite=True, **{**SMALL, "budget": 100})


def test_episodes_that_all_fail_in_the_infrastructure_stop_the_run(tmp_path):
    def broken(requests):
        raise ConnectionError("the agent's model server is down")

    with pytest.raises(RuntimeError, match="all 4 episodes failed in the infrastructure"):
        optimize_prompt(ENV, broken, ReflectionModel(agent_policy), output_dir=tmp_path, env_kwargs=ENV_KWARGS, **SMALL)


def test_an_agent_reading_a_custom_resource_is_optimized_through_a_factory(tmp_path):
    def agent(task, ctx):
        tone = ctx.resource("tone", default="plain")
        return ctx.chat_completion([{"role": "system", "content": tone}, {"role": "user", "content": task}]).text

    def policy(requests):
        return [Completion(text="yes" if "MAGIC" in r.messages[0]["content"] else "no") for r in requests]

    def factory():
        return AgentEnv(agent, [f"task {i}" for i in range(12)], lambda task, result: float(result == "yes"))

    reflection = ReflectionModel(lambda requests: [Completion(text="```\nMAGIC tone\n```") for _ in requests])
    result = optimize_prompt(factory, policy, reflection, output_dir=tmp_path, resources=["tone"], **SMALL)
    assert result.best_texts == {"tone": "MAGIC tone"} and (tmp_path / "tone.txt").is_file()
    # Held-out and train tasks came from the one list, apart: the held-out ones are its first four
    # (scored first, for the start), the minibatch reflected on next is drawn from the rest.
    episodes = list(load_trajectories(tmp_path / "trajectories.jsonl"))
    heldout = {f"task {i}" for i in range(4)}
    assert {t.task for t in episodes[:4]} == heldout
    assert episodes[4].task not in heldout and episodes[5].task not in heldout


def test_the_command_runs_against_openai_compatible_servers(tmp_path, capsys):
    def agent_server(body):
        return default_reply(body, scripted_answer(body["messages"]))

    with MockOpenAIServer(agent_server) as agent, MockOpenAIServer(reflector(f"```\n{BETTER}\n```")) as reflection:
        status = main([
            "optimize-prompt", "--env", ENV, "--env-kwarg", "difficulty=1", "--env-kwarg", "examples=0",
            "--heldout-env-kwarg", "split=test", "--backend", "openai", "--base-url", agent.base_url,
            "--reflection-base-url", reflection.base_url, "--train-tasks", "6", "--heldout-tasks", "4",
            "--budget", "24", "--minibatch-size", "2", "--output-dir", str(tmp_path), "--json",
        ])
    assert status == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["best_texts"] == {"system_prompt": BETTER} and summary["best_heldout"] == 1.0
    assert (tmp_path / "system_prompt.txt").read_text(encoding="utf-8") == BETTER + "\n"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--reflection-base-url", "127.0.0.1:8000"], "must be an http(s) URL or `policy`"),
        (["--reflection-base-url", "policy", "--reflection-model", "x"], "need a --reflection-base-url server"),
        (["--reflection-base-url", "policy", "--resource", "system_prompt=@/no/such/file.txt"], "no such file"),
        (["--reflection-base-url", "policy", "--env-kwarg", "difficulty=9"], "unknown difficulty level 9"),
        (["--reflection-base-url", "policy", "--base-url", "http://x/v1"], "only apply to --backend openai"),
    ],
)
def test_the_command_refuses_bad_arguments_in_one_line(flags, message, capsys, tmp_path):
    status = main(["optimize-prompt", "--env", ENV, "--output-dir", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err
    assert status == 2
    assert message in err and err.startswith("agentgym-lightning optimize-prompt: ")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--budget", "5"], "a budget of 5 episodes tries no candidate: scoring the starting prompt takes 16 (--heldout-tasks) and each proposal 6 (twice --minibatch-size); raise it"),
        (["--train-tasks", "2", "--minibatch-size", "3"], "--minibatch-size (3) cannot exceed --train-tasks (2)"),
        (["--concurrency", "0"], "--concurrency must be >= 1"),
        (["--resource", "rubric"], "did not read resource 'rubric'"),
        (["EARLIER"], "already holds an optimization (candidates.jsonl)"),
    ],
)
def test_the_command_checks_its_arguments_before_the_model_loads(flags, message, capsys, tmp_path, monkeypatch):
    import agentgym_lightning.policies as policies

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(policies, "make_policy", no_model)
    out = tmp_path / "out"
    if flags == ["EARLIER"]:
        out.mkdir()
        (out / "candidates.jsonl").write_text("{}\n", encoding="utf-8")
        flags = []
    status = main(["optimize-prompt", "--env", ENV, "--output-dir", str(out), "--reflection-base-url", "policy", *flags])
    err = capsys.readouterr().err
    # Before: each of these loaded the model first (75 s for the embedded one), then refused.
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err
