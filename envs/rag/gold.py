"""Gold-search episodes of HotpotQA's train questions: SFT data to warm-start a searcher before RL.

From the base SmolLM2-135M, RL on RAG raised held-out F1 but the agent stopped searching
(docs/experiments.md, issue 33): searching paid only through the 0.2 AIR per supporting passage,
and answering without it was cheaper. HotpotQA names each question's supporting passages (its
``supporting_facts`` titles), so episodes that search for them and then answer come for free: this
module plays :class:`GoldPolicy` through the env's real agent (the recipe's OpenAI Agents SDK
searcher: one ``search`` tool call per supporting passage, one call a turn, then
``Answer: <gold>``) on train questions, and writes those that scored 1 (all should) as trajectory
JSONL::

    python -m agentgym_lightning.envs.rag.gold --config recipes/rag.yaml --episodes 256 --output runs/rag-gold.jsonl
    agentgym-lightning sft runs/rag-gold.jsonl --config recipes/sft/rag.yaml     # make sft-rag

(HotpotQA's train file has 100 questions: ``--episodes 256`` plays all of them.)

**The queries** are the supporting passages' titles, the passages the question names first (then
the data's order): a title is the entity a passage is about (HotpotQA's passages are Wikipedia
introductions), the short query a searcher should learn to write, and on the real index it finds
its passage: over the 100 train questions' 200 supporting passages (994-passage corpus,
all-MiniLM-L6-v2, the agent's top 3) the title retrieves 198, the title followed by the question
193, the question alone 141. A question's text, a passage's opening words or anything else the
model could not know when it searches is never a query. The title the question names goes first
because that is the first hop a searcher can take (in 20 of the 100 questions the data lists the
bridge entity first). At most ``max_turns - 1`` searches (the last call answers).

The calls are recorded as text and tool calls (a scripted policy has no tokens), so ``sft``
tokenizes them once with the student's chat template and its ``tool_prompt`` (``retokenize: auto``).
Only the env options of ``--config`` are read (``env_kwargs``: the train split, the agent, its
worked examples and turns), so the gold episodes are of the questions RL trains on, over the
train corpus, never the held-out dev questions or passages.
"""

from __future__ import annotations

import html
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agentgym_lightning.envs.gold import check_train_split, gold_command, scripted_episodes, scripted_tool_turn
from agentgym_lightning.llm import Completion
from agentgym_lightning.trajectory import Trajectory

from .env import make_env

__all__ = ["gold_queries", "GoldPolicy", "gold_episodes", "main"]

# "Lilu (mythology)": Wikipedia's disambiguation, not a name a question says.
_DISAMBIGUATION = re.compile(r"\s*\([^()]*\)$")


def _named_in(question: str, title: str) -> bool:
    return _DISAMBIGUATION.sub("", title).strip().lower() in question.lower()


def gold_queries(task: Mapping[str, Any], titles: Mapping[str, str]) -> list[str]:
    """The searches of ``task``'s gold episode: the titles (``titles``: passage id -> title) of its
    supporting passages, those the question names first, otherwise in the data's order. HTML
    entities are written out (HotpotQA's titles keep Wikipedia's ``Simon &amp; Simon``): a query
    is what a searcher types."""
    supporting = [html.unescape(titles[pid]) for pid in dict.fromkeys(task.get("supporting_ids") or []) if pid in titles]
    return sorted(supporting, key=lambda title: not _named_in(str(task["question"]), title))


@dataclass(frozen=True)
class GoldPolicy:
    """``policy(observation, task) -> action``, scripted for the ``search`` tool: while the task's
    :func:`gold_queries` has searches left (the tool results since the question say how many were
    made, at most ``max_turns - 1``), one ``search`` tool call for the next; then
    ``Answer: <the first accepted answer>``. A call offered no tools answers."""

    #: Passage id -> title, over the env's corpus.
    titles: Mapping[str, str]
    #: The agent's most LLM calls per episode (the last one answers).
    max_turns: int

    def __call__(self, observation: Any, task: Mapping[str, Any]) -> Completion | str:
        queries = gold_queries(task, self.titles)[: max(self.max_turns - 1, 0)]
        return scripted_tool_turn(observation, "search", [{"query": q} for q in queries], f"Answer: {task['answers'][0]}")


def gold_episodes(env_kwargs: Mapping[str, Any], episodes: int | None = None, seed: int = 0) -> Iterator[Trajectory]:
    """Episodes of ``episodes`` questions (all when ``None``) of ``make_env("hotpotqa", **env_kwargs)``
    (``split`` must be ``train``; the ``tools`` mode), in a seeded order, each played by
    :class:`GoldPolicy`."""
    check_train_split(env_kwargs, "dev", "HotpotQA's dev questions and passages are held out")
    if env_kwargs.get("tool_mode", "tools") != "tools":
        raise ValueError(f"the gold policy searches with the search tool: use tool_mode 'tools' (got {env_kwargs['tool_mode']!r})")
    env = make_env("hotpotqa", **dict(env_kwargs))
    titles = {passage.id: passage.title for passage in env.rag_dataset.corpus}  # type: ignore[attr-defined]
    return scripted_episodes(env, GoldPolicy(titles, int(env.max_turns)), episodes, seed)


#: ``main(argv) -> exit status``: the command line of the module docstring.
main = gold_command("rag", __doc__, gold_episodes)

if __name__ == "__main__":
    sys.exit(main())
