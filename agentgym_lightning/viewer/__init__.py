"""See a training run: the ``view`` web app and the self-contained HTML ``report``.

:mod:`.run` reads a run folder as it is written, :mod:`.alarms` checks it for collapse,
:mod:`.charts` draws its curves (matplotlib SVG), :mod:`.pages` renders every view's HTML (one
core for both), :mod:`.app` serves them live, :mod:`.calls` quotes an agent's calls of a step
as text (``agentgym-lightning calls``). See docs/viewer.md.
"""

from pathlib import Path

from agentgym_lightning.viewer.pages import curves, report
from agentgym_lightning.viewer.run import RunFolder

__all__ = ["RunFolder", "report", "write_charts", "write_report"]


def write_report(runs: list[str], output: str) -> int:
    """Write the report of the run folders ``runs`` to ``output``; returns its size in bytes."""
    text = report([RunFolder(r) for r in runs])
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return len(text.encode("utf-8"))


def write_charts(runs: list[str], folder: str) -> list[Path]:
    """Write each chart of the report of ``runs`` as a standalone SVG file ``<folder>/<name>.svg``
    (``reward``, ``heldout``, ``air``, ``time``...: :attr:`~.charts.Chart.name`); several runs
    are overlaid as in the report. Returns the files written, in the report's order."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for chart, svg in curves([RunFolder(r) for r in runs]):
        path = out / f"{chart.name}.svg"
        # The XML declaration makes the file an image any viewer (and GitHub's markdown) opens.
        path.write_text('<?xml version="1.0" encoding="utf-8" standalone="no"?>\n' + svg + "\n", encoding="utf-8")
        written.append(path)
    return written
