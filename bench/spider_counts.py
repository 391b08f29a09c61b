"""Spider questions a 135M model can learn, for ``lora_per_agent`` comparisons: the single-table
``SELECT count(*) FROM <table>`` questions ("How many singers do we have?") of a split, run by
the LangGraph SQL agent (writer → checker → rewriter nodes). Train split: 241 questions; dev: 40.

    agentgym-lightning train --env bench/spider_counts.py:make_env --env-kwarg split=train \\
        --eval-env-kwarg split=dev --agent-match 'writer|rewriter' --lora-per-agent ...

Reads Spider from ``data_dir`` (default ``$AGENTGYM_LIGHTNING_SPIDER_DIR``, else the imported copy).
"""

from __future__ import annotations

import re
from typing import Any

from agentgym_lightning.envs.spider.env import make_env as make_spider_env

#: A gold query of this form: one table, no condition.
COUNT_QUERY = re.compile(r"select\s+count\(\*\)\s+from\s+\w+\s*;?", re.IGNORECASE)


def make_env(split: str = "train", limit: int | None = None, **kwargs: Any) -> Any:
    """The LangGraph Spider env on ``split``'s count questions (the first ``limit`` of them)."""
    kwargs.setdefault("agent", "langgraph")
    env = make_spider_env(split, **kwargs)
    env.tasks = [t for t in env.tasks if COUNT_QUERY.fullmatch(t["query"].strip())][:limit]
    return env
