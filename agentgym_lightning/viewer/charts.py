"""The run's curves as inline SVG, drawn by matplotlib.

Why matplotlib's SVG: it is a kept Python library installed like our other dependencies (no
JavaScript to vendor or fetch from a CDN), it renders offline on the server, and the output is
plain ``<svg>`` that any browser shows with scripts off, so the report is one small static file
(text kept as text, ``svg.fonttype = "none"``: about 10-20 KB a chart). Each chart overlays every
run given; with several runs of one experiment (seeds) it adds their mean (bold) and spread
(min-max band); runs that differ (``overlay=False``) are drawn one line each, never averaged.
Steps are whole numbers on the axis, and a run of one or two points shows them as dots. Each
chart has a stable file ``name`` (``report --charts-dir`` writes ``<name>.svg``).

Names in a chart (reward sources, run names) come from agents and run folders: they are drawn
as plain text, never parsed as matplotlib's ``$...$`` math (``text.parse_math`` off), which a
source named ``$\\undefinedmacro$`` would break.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Chart", "CHARTS", "chart_svg", "air_sources", "held_out", "pass_at_k", "groups_with_signal", "prefill", "run_charts"]

Series = Mapping[str, Sequence[tuple[int, float]]]


@dataclass(frozen=True)
class Chart:
    """One chart: its title and the metrics it draws, as ``(metric, label)``; ``stacked`` draws
    them as a stacked area (parts of a whole, as a step's time)."""

    title: str
    lines: tuple[tuple[str, str], ...]
    stacked: bool = False
    #: Counts logged only when not zero (``samples/groups/zero_variance``): a step that logged the
    #: chart's other lines but not this one had zero of it.
    zero_when_absent: tuple[str, ...] = ()
    #: The chart's file name without ``.svg`` (stable, so docs can link a chart of a run).
    name: str = "chart"
    #: Scores and rates: the y axis starts at 0 (when no value is below it), so a change of one
    #: episode in 32 does not fill the chart's height.
    from_zero: bool = False


#: The charts of every run view, in order (metric names: docs/metrics.md).
CHARTS: tuple[Chart, ...] = (
    Chart("Reward", (("train/reward/mean", "task (train)"), ("train/reward/total", "with AIR (train)"), ("eval/reward/mean", "held-out")),
          name="reward"),
    Chart("Success rate", (("train/success_rate", "train"), ("eval/success_rate", "held-out")), name="success", from_zero=True),
    Chart("Turns per episode", (("train/turns/mean", "train"), ("eval/turns/mean", "held-out")), name="turns"),
    Chart("Loss", (("loss", "loss"),), name="loss"),
    Chart("KL to reference", (("kl", "kl"),), name="kl"),
    Chart("Entropy", (("entropy", "token entropy"),), name="entropy"),
    Chart("Grad norm", (("grad_norm", "before clipping"),), name="grad_norm"),
    Chart("Clip ratios", (("clip_ratio/low", "low"), ("clip_ratio/high", "high"), ("clip_ratio/region", "region")), name="clip"),
    Chart("Zero-variance groups", (("samples/groups/zero_variance", "zero variance"), ("samples/groups", "groups")),
          zero_when_absent=("samples/groups/zero_variance",), name="zero_variance"),
    Chart("Tokens/s (rollout)", (("train/tokens_per_s", "train"), ("eval/tokens_per_s", "held-out")), name="tokens_per_s"),
    # max_staleness >= 1 only: how old the trained calls were, and how much rollout hid behind updates
    Chart("Staleness (policy versions)", (("async/staleness_mean", "mean"), ("async/staleness_max", "max")), name="staleness", from_zero=True),
    Chart("Episode time beside updates", (("async/overlap_fraction", "share overlapped"),), name="overlap", from_zero=True),
    Chart("Step time (s)", (("time/rollout_s", "rollout"), ("time/update_s", "update"), ("time/sync_s", "sync")), stacked=True, name="time"),
)


def air_sources(series_by_run: Sequence[Series]) -> Chart | None:
    """A chart of each AIR source's mean reward per episode (``train/reward/<source>``), if any."""
    fixed = {"train/reward/mean", "train/reward/total", "train/reward/unscored", "train/reward/final"}
    names = sorted({n for s in series_by_run for n in s if n.startswith("train/reward/") and n not in fixed})
    if not names:
        return None
    return Chart("AIR sources (mean per episode)", tuple((n, n.removeprefix("train/reward/")) for n in names), name="air")


def held_out(series_by_run: Sequence[Series]) -> Chart | None:
    """The held-out curve: one line per score of the evaluations (``eval/reward/mean``,
    ``eval/success_rate`` and each env metric ``eval/metrics/<name>``; counts, tokens and times
    are not scores), if any run evaluated. Scores equal at every point of every run are one line
    named ``a = b`` (else the last drawn hides the others)."""
    logged = {n for s in series_by_run for n in s if s.get(n)}
    scores = [(n, label) for n, label in (("eval/reward/mean", "reward"), ("eval/success_rate", "success rate")) if n in logged]
    scores += [(n, n.removeprefix("eval/metrics/")) for n in sorted(logged) if n.startswith("eval/metrics/")]
    if not scores:
        return None
    lines: dict[tuple[tuple[tuple[int, float], ...], ...], tuple[str, list[str]]] = {}
    for metric, label in scores:
        points = tuple(tuple(s.get(metric) or ()) for s in series_by_run)
        lines.setdefault(points, (metric, []))[1].append(label)
    return Chart("Held-out evaluation", tuple((metric, " = ".join(labels)) for metric, labels in lines.values()), name="heldout", from_zero=True)


def pass_at_k(series_by_run: Sequence[Series]) -> Chart | None:
    """Greedy held-out success against sampled pass@1 and pass@k (``eval_samples``): how far greedy
    accuracy is from what the policy reaches when sampling, if any run measured it."""
    logged = {n for s in series_by_run for n in s if s.get(n)}
    ks = sorted((n for n in logged if n.startswith("eval/pass@") and n != "eval/pass@1"), key=lambda n: int(n.rsplit("@", 1)[1]))
    if "eval/pass@1" not in logged:
        return None
    lines = (("eval/success_rate", "greedy"), ("eval/pass@1", "pass@1 (sampled)"), *((n, n.removeprefix("eval/") + " (sampled)") for n in ks))
    return Chart("Held-out: greedy and pass@k", lines, name="pass_at_k", from_zero=True)


def groups_with_signal(series_by_run: Sequence[Series]) -> Chart | None:
    """Dynamic sampling's draws (``sampling/...``), if any run sampled dynamically."""
    if not any(s.get("sampling/groups_drawn") for s in series_by_run):
        return None
    lines = (("sampling/groups_drawn", "drawn"), ("sampling/groups_kept", "kept (signal)"), ("sampling/groups_zero_variance", "without signal"))
    return Chart("Groups drawn a step", lines, name="groups_with_signal", from_zero=True)


def prefill(series_by_run: Sequence[Series]) -> Chart | None:
    """The prompt tokens the generator was sent a step against those it computed (the rest came
    from keys and values it kept: ``generator/...``), if any run's generator counted them."""
    if not any(s.get("generator/prompt_tokens") for s in series_by_run):
        return None
    lines = (("generator/prompt_tokens", "sent"), ("generator/prefilled_tokens", "prefilled (computed)"))
    return Chart("Prompt tokens a step", lines, name="prefill", from_zero=True)


def run_charts(series_by_run: Sequence[Series]) -> list[Chart]:
    """The charts of a run view, in order: :data:`CHARTS` with the held-out curves (scores, then
    greedy against pass@k) and the AIR sources after the reward, dynamic sampling's groups after
    the zero-variance chart, and the prompt tokens prefilled last, where the runs logged them."""
    charts = list(CHARTS)
    extra = [c for c in (held_out(series_by_run), pass_at_k(series_by_run), air_sources(series_by_run)) if c is not None]
    signal = [c for c in (groups_with_signal(series_by_run),) if c is not None]
    costs = [c for c in (prefill(series_by_run),) if c is not None]
    at = next(i for i, c in enumerate(charts) if c.name == "zero_variance") + 1
    return charts[:1] + extra + charts[1:at] + signal + charts[at:] + costs


def _figure():  # type: ignore[no-untyped-def]
    from matplotlib.figure import Figure  # the object API: no pyplot state, safe in a server's threads

    fig = Figure(figsize=(4.6, 2.7), dpi=100)
    ax = fig.add_subplot()
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    ax.set_xlabel("step", fontsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig, ax


def _with_zeros(chart: Chart, series: Series) -> dict[str, Sequence[tuple[int, float]]]:
    """``series`` with ``chart.zero_when_absent`` metrics at 0 on the steps the chart's other
    lines have and they lack."""
    out = {metric: series.get(metric) or () for metric, _ in chart.lines}
    for metric in chart.zero_when_absent:
        steps = {x for other, _ in chart.lines if other != metric for x, _ in out[other]}
        have = dict(out[metric])
        out[metric] = sorted({**{x: 0.0 for x in steps}, **have}.items())
    return out


def chart_svg(chart: Chart, series_by_run: Sequence[Series], run_names: Sequence[str], *, overlay: bool = True) -> str | None:
    """``chart`` of the runs as an ``<svg>`` element, or ``None`` when no run logged any of it.
    ``overlay``: the runs are one experiment (their mean and spread are drawn); otherwise each
    run is a line of its own. The same points give the same drawing without drawing again (a
    live page reloads often)."""
    if not any(s.get(metric) for s in series_by_run for metric, _ in chart.lines):
        return None
    points = tuple(tuple((metric, tuple(pts)) for metric, pts in _with_zeros(chart, s).items()) for s in series_by_run)
    return _draw(chart, points, tuple(run_names), overlay)


@functools.lru_cache(maxsize=128)
def _draw(
    chart: Chart, points: tuple[tuple[tuple[str, tuple[tuple[int, float], ...]], ...], ...], run_names: tuple[str, ...], overlay: bool = True
) -> str:
    series_by_run = [dict(p) for p in points]
    import matplotlib
    from matplotlib.ticker import MaxNLocator

    matplotlib.rcParams["svg.fonttype"] = "none"
    matplotlib.rcParams["svg.hashsalt"] = "agentgym"  # the same run gives the same file
    matplotlib.rcParams["text.parse_math"] = False  # names are data, never $...$ markup
    fig, ax = _figure()
    ax.set_title(chart.title, fontsize=10)
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    if chart.stacked:
        _stacked(ax, chart, series_by_run, colors)
    elif overlay or len(series_by_run) == 1:
        for i, (metric, label) in enumerate(chart.lines):
            _lines(ax, metric, label, series_by_run, run_names, colors[i % len(colors)])
    else:
        for i, (metric, label) in enumerate(chart.lines):
            for j, (name, s) in enumerate(zip(run_names, series_by_run)):
                _lines(ax, metric, f"{label} · {name}", [s], [name], colors[(i * len(run_names) + j) % len(colors)])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    steps = [x for s in series_by_run for pts in s.values() for x, _ in pts]
    if steps and max(steps) - min(steps) < 2:  # one or two steps: room around them, not 1.900-2.100
        ax.set_xlim(min(steps) - 1, max(steps) + 1)
    if chart.from_zero and ax.has_data() and ax.get_ylim()[0] > 0:
        ax.set_ylim(bottom=0)
    if ax.has_data():
        ax.legend(fontsize=7, frameon=False)
    fig.subplots_adjust(left=0.12, right=0.98, top=0.9, bottom=0.17)  # fixed: tight_layout doubles the drawing time
    out = io.StringIO()
    fig.savefig(out, format="svg")
    svg = out.getvalue()
    svg = svg[svg.index("<svg"):]
    return re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)


def _lines(ax, metric: str, label: str, series_by_run: Sequence[Series], run_names: Sequence[str], color: str) -> None:  # type: ignore[no-untyped-def]
    runs = [(name, s.get(metric) or []) for name, s in zip(run_names, series_by_run)]
    runs = [(name, pts) for name, pts in runs if pts]
    if not runs:
        return
    marker = "o" if max(len(pts) for _, pts in runs) <= 12 else None
    size = 5 if max(len(pts) for _, pts in runs) <= 2 else 3  # a lone point must be seen
    label = _plain(label)
    if len(runs) == 1:
        xs, ys = zip(*runs[0][1])
        ax.plot(xs, ys, color=color, label=label, marker=marker, markersize=size, linewidth=1.5)
        return
    for _, pts in runs:
        xs, ys = zip(*pts)
        ax.plot(xs, ys, color=color, alpha=0.35, linewidth=0.8)
    by_step: dict[int, list[float]] = {}
    for _, pts in runs:
        for x, y in pts:
            by_step.setdefault(x, []).append(y)
    steps = sorted(by_step)
    mean = [sum(by_step[x]) / len(by_step[x]) for x in steps]
    ax.fill_between(steps, [min(by_step[x]) for x in steps], [max(by_step[x]) for x in steps], color=color, alpha=0.15, linewidth=0)
    ax.plot(steps, mean, color=color, linewidth=2, marker=marker, markersize=size, label=f"{label} (mean of {len(runs)})")


def _plain(label: str) -> str:
    """A label matplotlib shows as written (it hides legend labels starting with ``_``)."""
    return "\u200b" + label if label.startswith("_") else label


def _stacked(ax, chart: Chart, series_by_run: Sequence[Series], colors: list[str]) -> None:  # type: ignore[no-untyped-def]
    # Several runs: the mean of each part per step.
    parts = []
    for metric, label in chart.lines:
        by_step: dict[int, list[float]] = {}
        for s in series_by_run:
            for x, y in s.get(metric) or []:
                by_step.setdefault(x, []).append(y)
        parts.append((label, {x: sum(v) / len(v) for x, v in by_step.items()}))
    steps = sorted({x for _, p in parts for x in p})
    ax.stackplot(steps, *[[p.get(x, 0.0) for x in steps] for _, p in parts], labels=[_plain(label) for label, _ in parts],
                 colors=colors[: len(parts)], alpha=0.8)
