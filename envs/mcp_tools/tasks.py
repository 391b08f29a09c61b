"""The MCP env's tasks: a JSONL file, one task a line.

Each line is a JSON object with a ``prompt`` (a string, or a list of chat messages) and anything
else the reward needs (``answer``, ids, ...), handed to the verifier and the judge as it is::

    {"prompt": "What is 12 times 7?", "answer": "84"}
    {"prompt": [{"role": "user", "content": "Add 2 and 3."}], "answer": "5"}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentgym_lightning.envs.jsonl import jsonl_records

__all__ = ["load_tasks"]


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    """Every task in the JSONL file at ``path`` (blank lines skipped). Raises ``ValueError``
    naming the file and line of what cannot be read, and for a file with no task."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"tasks={path}: no such file (give a JSONL file, one {{\"prompt\": ...}} object a line)")
    tasks = []
    for number, task in jsonl_records(file):
        if not isinstance(task, dict) or not isinstance(task.get("prompt"), (str, list)) or not task["prompt"]:
            raise ValueError(f"{file}:{number}: a task is an object with a \"prompt\" (a string or a list of chat messages)")
        tasks.append(task)
    if not tasks:
        raise ValueError(f"tasks={path} holds no task")
    return tasks
