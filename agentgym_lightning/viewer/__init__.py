"""See a training run: the ``view`` web app and the self-contained HTML ``report``.

:mod:`.run` reads a run folder as it is written, :mod:`.alarms` checks it for collapse,
:mod:`.charts` draws its curves (matplotlib SVG), :mod:`.pages` renders every view's HTML (one
core for both), :mod:`.app` serves them live. See docs/viewer.md.
"""

from pathlib import Path

from agentgym_lightning.viewer.pages import report
from agentgym_lightning.viewer.run import RunFolder

__all__ = ["RunFolder", "report", "write_report"]


def write_report(runs: list[str], output: str) -> int:
    """Write the report of the run folders ``runs`` to ``output``; returns its size in bytes."""
    text = report([RunFolder(r) for r in runs])
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return len(text.encode("utf-8"))
