"""Gold-calculator episodes of GSM8K's train problems: SFT data to warm-start a student before RL.

At 135M the math agent never calls the calculator on its own (docs/experiments.md, issue 33), so
the calculator AIR never fires and RL groups carry no reward variance. GSM8K's gold solutions
annotate every calculation (``<<48/2=24>>``), so correct episodes that use the calculator come for
free: this module plays :func:`gold_policy` through the env's real agent (the recipe's AutoGen
``AssistantAgent``: one calculator tool call per annotation, one call a turn, then ``Answer: <gold>``)
on train problems, and writes those that scored 1 (all should) as trajectory JSONL::

    python -m agentgym_lightning.envs.math.gold --config recipes/math.yaml --episodes 256 --output runs/math-gold.jsonl
    agentgym-lightning sft runs/math-gold.jsonl --config recipes/sft/math.yaml     # make sft-math

The calls are recorded as text and tool calls (a scripted policy has no tokens), so ``sft``
tokenizes them once with the student's chat template and its ``tool_prompt`` (``retokenize: auto``).
Only the env options of ``--config`` are read (``env_kwargs``: the train split, the subset, the
agent), so the gold episodes are of the problems RL trains on, never the held-out ones.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from agentgym_lightning.envs.gold import check_train_split, gold_command, scripted_episodes, scripted_tool_turn
from agentgym_lightning.llm import Completion
from agentgym_lightning.trajectory import Trajectory

from .calculator import calculate
from .env import make_gsm8k_env

__all__ = ["gold_calculations", "gold_policy", "gold_episodes", "main"]

_ANNOTATION = re.compile(r"<<([^<>]*)>>")


def gold_calculations(solution: str) -> list[str]:
    """The expressions of a GSM8K solution's calculator annotations (``<<48/2=24>>`` -> ``48/2``)
    that the env's calculator evaluates, in order."""
    expressions = [annotation.rpartition("=")[0].strip() for annotation in _ANNOTATION.findall(solution)]
    return [e for e in expressions if e and calculate(e).ok]


def gold_policy(observation: Any, task: Mapping[str, Any]) -> Completion | str:
    """A scripted policy for the ``tools`` protocol: one calculator tool call a turn for each of
    the gold solution's calculations (:func:`gold_calculations`), then ``Answer: <the gold
    answer>`` (:func:`~agentgym_lightning.envs.gold.scripted_tool_turn`). A call offered no tools
    (AutoGen's reflection after its last tool round) answers."""
    calculations = gold_calculations(str(task.get("solution") or ""))
    return scripted_tool_turn(observation, "calculator", [{"expression": e} for e in calculations], f"Answer: {task['answer']}")


def gold_episodes(env_kwargs: Mapping[str, Any], episodes: int | None = None, seed: int = 0) -> Iterator[Trajectory]:
    """Episodes of ``episodes`` problems (all when ``None``) of ``make_gsm8k_env(**env_kwargs)``
    (``split`` must be ``train``; the ``tools`` protocol), in a seeded order, each played by
    :func:`gold_policy`."""
    check_train_split(env_kwargs, "test", "GSM8K's test problems are held out")
    if env_kwargs.get("protocol", "tools") != "tools":
        raise ValueError(f"the gold policy calls the calculator as a tool: use protocol 'tools' (got {env_kwargs['protocol']!r})")
    return scripted_episodes(make_gsm8k_env(**dict(env_kwargs)), gold_policy, episodes, seed)


#: ``main(argv) -> exit status``: the command line of the module docstring.
main = gold_command("math", __doc__, gold_episodes)

if __name__ == "__main__":
    sys.exit(main())
