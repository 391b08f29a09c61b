"""The RAG SFT warm start's gold episodes (``envs/rag/gold.py``, issue 33): HotpotQA train questions
played through the recipe's OpenAI Agents SDK searcher with one ``search`` call per supporting
passage's title and the gold answer, written only when they score 1. On the bundled sample written
as a HotpotQA train file (24 passages, the real embedding model)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

pytest.importorskip("chromadb", reason="needs the [rag] extra")
pytest.importorskip("agents", reason="needs the [openai-agents] extra")

from agentgym_lightning import Status  # noqa: E402
from agentgym_lightning.envs.gold import GoldCounts, recipe_env_kwargs, write_solved_episodes  # noqa: E402
from agentgym_lightning.envs.rag.agent import EXAMPLES, LAST_CALL  # noqa: E402
from agentgym_lightning.envs.rag.data import load_hotpotqa  # noqa: E402
from agentgym_lightning.envs.rag.gold import gold_episodes, gold_queries, main  # noqa: E402
from agentgym_lightning.envs.rag.sample import hotpotqa_records  # noqa: E402
from agentgym_lightning.trajectory import load_trajectories  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sample_train(tmp_path: Path) -> Path:
    """The bundled sample's 12 questions as a HotpotQA *train* file (the sample itself is dev only)."""
    folder = tmp_path / "hotpotqa"
    folder.mkdir()
    (folder / "rag_sample_train.json").write_text(json.dumps(hotpotqa_records()), encoding="utf-8")
    return folder


def _recipe_kwargs(data_dir: Path, real_embedder, **overrides) -> dict:
    kwargs = recipe_env_kwargs(REPO / "recipes" / "rag.yaml")
    assert kwargs["split"] == "train" and kwargs["agent"] == "openai-agents" and kwargs["examples"] == 1 and kwargs["max_turns"] == 4
    return {**kwargs, "data_dir": str(data_dir), "embedding_model": real_embedder, **overrides}


def test_the_queries_are_the_supporting_titles_those_the_question_names_first():
    titles = {"a": "Scott Buchholz", "b": "Barnaby Joyce", "c": "Lilu (mythology)", "d": "Alû"}
    bridge = {"question": "Scott Buchholz was chief of staff to which senator?", "supporting_ids": ["b", "a"]}
    assert gold_queries(bridge, titles) == ["Scott Buchholz", "Barnaby Joyce"]  # the named one first
    named = {"question": "If Gallu is a demon Lilu is what?", "supporting_ids": ["d", "c"]}
    assert gold_queries(named, titles) == ["Lilu (mythology)", "Alû"]  # named without its disambiguation
    both = {"question": "Are Barnaby Joyce and Scott Buchholz senators?", "supporting_ids": ["b", "a", "x"]}
    assert gold_queries(both, titles) == ["Barnaby Joyce", "Scott Buchholz"]  # the data's order; no title: no search
    assert gold_queries({"question": "Who?", "supporting_ids": []}, titles) == []
    escaped = {"question": "Simon & Simon starred which actor?", "supporting_ids": ["g", "s"]}
    assert gold_queries(escaped, {"g": "Gerald McRaney", "s": "Simon &amp; Simon"}) == ["Simon & Simon", "Gerald McRaney"]


def test_gold_episodes_search_each_supporting_title_retrieve_it_answer_the_gold_and_score_1(sample_train, real_embedder, tmp_path):
    output = tmp_path / "gold.jsonl"
    counts = write_solved_episodes(output, gold_episodes(_recipe_kwargs(sample_train, real_embedder)))
    assert counts == GoldCounts(written=12, skipped=0)
    episodes = list(load_trajectories(output))
    data = load_hotpotqa("train", sample_train)
    titles = {p.id: p.title for p in data.corpus}
    assert sorted(t.task["id"] for t in episodes) == sorted(e.id for e in data.examples)  # every train question once
    for trajectory in episodes:
        task = trajectory.task
        assert task["split"] == "train"
        queries = gold_queries(task, titles)
        assert len(queries) == len(task["supporting_ids"]) in (2, 3)  # one search per supporting passage
        assert trajectory.status is Status.SUCCEEDED and trajectory.final_reward == 1.0
        assert trajectory.variables["metrics"] == {"f1": 1.0, "em": 1.0, "support_recall": 1.0}
        calls = [call for step in trajectory.steps for call in step.completion.tool_calls]
        assert [c.name for c in calls] == ["search"] * len(queries)
        assert [json.loads(c.arguments) for c in calls] == [{"query": q} for q in queries]
        assert [len(s.completion.tool_calls) for s in trajectory.steps] == [1] * len(queries) + [0]  # one call a turn
        # Each search finds its own passage by the time it returns (a search may bring both: the
        # sample is small), and the searches find them all (the env's rag.supporting signal).
        ids = {title: pid for pid, title in titles.items()}
        assert all(ids[q] in s.outcome["retrieved"] for q, s in zip(queries, trajectory.steps, strict=False))
        assert sum(s.outcome["new_supporting"] for s in trajectory.steps[:-1]) == len(queries)
        assert [s.outcome.get("repeated_queries") for s in trajectory.steps[:-1]] == [0] * len(queries)
        assert trajectory.steps[-1].completion.text == f"Answer: {task['answers'][0]}"
        assert trajectory.result["answer_status"] == "ok"
        # Played through the recipe's agent: its worked example comes before the question.
        first = trajectory.steps[0].request.messages
        assert [m["content"] for m in first if m["role"] == "user"] == [f"Question: {EXAMPLES[0][0]}", f"Question: {task['question']}"]


def test_searches_stop_one_call_before_the_last(sample_train, real_embedder, tmp_path):
    # With max_turns=3 a three-hop question gets two searches (the second's results say none are
    # left), then the answer: still F1 1, so it is written, with two of its three passages.
    output = tmp_path / "gold.jsonl"
    kwargs = _recipe_kwargs(sample_train, real_embedder, max_turns=3, limit=5)  # the fifth is three-hop
    assert write_solved_episodes(output, gold_episodes(kwargs)) == GoldCounts(written=5, skipped=0)
    three_hops = [t for t in load_trajectories(output) if len(t.task["supporting_ids"]) == 3]
    assert three_hops
    for trajectory in three_hops:
        assert [len(s.completion.tool_calls) for s in trajectory.steps] == [1, 1, 0]
        assert trajectory.steps[-1].request.messages[-1]["content"].endswith(LAST_CALL)
        assert trajectory.variables["metrics"]["support_recall"] == pytest.approx(2 / 3)


def test_only_train_questions_and_the_search_tool_are_played():
    with pytest.raises(ValueError, match="use split 'train'"):
        gold_episodes({"split": "dev"}, 1)
    with pytest.raises(ValueError, match="use split 'train'"):
        gold_episodes({}, 1)  # the env's default split is dev, the held-out one
    with pytest.raises(ValueError, match="tool_mode 'tools'"):
        gold_episodes({"split": "train", "tool_mode": "text"}, 1)


def test_the_command_writes_the_recipes_episodes_and_refuses_the_held_out_split(sample_train, real_embedder, tmp_path, capsys):
    output = tmp_path / "gold.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["--config", str(REPO / "recipes" / "rag.yaml"), "--env-kwarg", f"data_dir={sample_train}",
                     "--episodes", "2", "--seed", "3", "--output", str(output)]) == 0
    assert "2 gold episodes scored 1 and were written; 0 did not" in capsys.readouterr().out
    assert [len(t.steps) for t in load_trajectories(output)] == [3, 3]  # both seed-3 picks are two-hop: 2 searches + the answer
    assert main(["--config", str(REPO / "recipes" / "rag.yaml"), "--env-kwarg", "split=dev", "--output", str(tmp_path / "x.jsonl")]) == 2
    assert "rag gold: gold episodes are for training" in capsys.readouterr().err


def test_the_gold_calls_are_sft_rows_in_the_students_tokens_with_the_compact_tool_prompt(sample_train, real_embedder, smol_tokenizer, tmp_path):
    """What `sft --config recipes/sft/rag.yaml` trains on: every call re-tokenized (a scripted
    policy records no ids) in SmolLM2's template, the search tool described as RL describes it."""
    from agentgym_lightning.policies.tool_calls import format_tool_call
    from agentgym_lightning.training.sft.episodes import load_sources
    from agentgym_lightning.training.sft.rows import sft_rows

    output = tmp_path / "gold.jsonl"
    assert write_solved_episodes(output, gold_episodes(_recipe_kwargs(sample_train, real_embedder), episodes=2)).written == 2
    episodes = load_sources([output])
    rows = sft_rows(episodes, tokenizer=smol_tokenizer, tool_prompt="compact")
    assert rows.counts["calls/retokenized"] == rows.counts["rows"] == sum(len(t.steps) for t in episodes)
    titles = {p.id: p.title for p in load_hotpotqa("train", sample_train).corpus}
    expected = []
    for t in episodes:
        expected += [format_tool_call("search", {"query": q}) for q in gold_queries(t.task, titles)]
        expected.append(f"Answer: {t.task['answers'][0]}")
    assert [smol_tokenizer.decode(s.completion_ids, skip_special_tokens=True).strip() for s in rows.samples] == expected
    prompt = smol_tokenizer.decode(rows.samples[0].prompt_ids)
    assert "search" in prompt and EXAMPLES[0][0] in prompt and episodes[0].task["question"] in prompt
