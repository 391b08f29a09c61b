"""The HTML of every run view: one rendering core for ``report`` (one static file) and ``view``
(the live web app); they differ only in where links point (:class:`Links`).

Views: the **overview** (each run's env, model, backend and key options, its whole config on
demand, alarms, curves, the list of steps and evaluations), a step's or an
evaluation's **episodes** grouped by GRPO group with their rewards and advantages, and one
**episode** (the resources its agent read: their versions, and texts where the run's config
holds them) call by call showing only what each call added (new messages, the answer and its
tool calls, rewards and AIR, credit and advantage, trained or not and why, template flags, the
completion's tokens with their logprobs). Plain HTML and CSS with inline SVG charts: nothing is
fetched, and the pages work with scripts off (the live view adds one small refresh script).

Every text of a run (names, rewards' sources, messages, configs) is data written by agents and
envs: it is escaped wherever it goes, and lines of the run's files that could not be read are
listed on the page that would have shown them.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym_lightning.agent_match import as_agent_match
from agentgym_lightning.metrics import success_meaning
from agentgym_lightning.resources import as_resources
from agentgym_lightning.training.config import LightningRLConfig
from agentgym_lightning.training.samples import SampleBatch, configured_samples, untrained_reason
from agentgym_lightning.trajectory import Status, Step, Trajectory
from agentgym_lightning.viewer.alarms import group_diversity, run_alarms, tool_calls_of
from agentgym_lightning.viewer.charts import Chart, Series, chart_svg, run_charts
from agentgym_lightning.viewer.run import EpisodeFile, RunFolder

__all__ = ["Links", "page", "overview", "curves", "episode_list", "episode_detail", "report", "by_group", "message_text", "shorten"]

_REASONS = {
    "not_trainable": "the agent or env marked the call not trainable",
    "agent_match_excluded": "the trainer's agent_match left this agent/role out",
    "without_token_ids": "no token ids (an API backend)",
    "empty": "empty completion",
    "truncated_masked": "cut by the token limit (mask_truncated_completions)",
}

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 20px}header a{color:#9cc3ff}
main{padding:12px 20px;max-width:1400px}h2{margin:22px 0 8px;font-size:18px}h3{font-size:15px;margin:14px 0 6px}
a{color:#1559c0;text-decoration:none}a:hover{text-decoration:underline}
.charts{display:flex;flex-wrap:wrap;gap:8px}.chart{background:#fff;border:1px solid #dde1e6;border-radius:6px}
.chart svg{display:block;width:430px;height:auto}
table{border-collapse:collapse;background:#fff;margin:4px 0 10px}td,th{border:1px solid #dde1e6;padding:3px 7px;text-align:left;font-size:13px}
th{background:#eef1f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
.alarm{padding:4px 10px;margin:3px 0;border-radius:4px;background:#e7f5ea}.alarm.firing{background:#fde2e1;font-weight:600}
.badge{display:inline-block;padding:0 6px;margin-right:4px;border-radius:8px;font-size:12px;background:#e4e8ee}
.badge.bad{background:#fde2e1}.badge.good{background:#e7f5ea}.badge.warn{background:#fff1cc}
.call{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:8px 12px;margin:10px 0}
.msg{white-space:pre-wrap;font:12px/1.4 ui-monospace,monospace;background:#f3f5f8;border-left:3px solid #b8c2d0;padding:4px 8px;margin:4px 0;overflow-x:auto}
.msg.assistant{border-color:#1559c0;background:#eef4ff}.msg.tool{border-color:#2e9e4f}.msg.system{border-color:#8a8f98}
.role{font-weight:600;font-size:12px;color:#555}.tok{font:11px ui-monospace,monospace;padding:0 1px;border-radius:2px;white-space:pre}
.runhead{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:6px 10px;margin:6px 0}
.tokens{line-height:1.9}.p1{background:#fbe3d9}.p2{background:#f6c3ad}.p3{background:#f0a080}.p4{background:#e87c55}.p5{background:#dc5028}.masked{opacity:.45;text-decoration:line-through}.muted{color:#777}
"""

_LIVE_JS = """
<script>
(function(){var v=%s;setInterval(function(){fetch(%s).then(function(r){return r.json()})
.then(function(d){if(d.version!==v){location.reload()}}).catch(function(){})},%d)})();
</script>
"""


@dataclass
class Links:
    """Where a view's links go: anchors in one report page, or the view app's URLs."""

    episodes: Callable[[int, EpisodeFile], str]
    #: ``None`` where the episode is not shown (a report holds some episodes only).
    episode: Callable[[int, EpisodeFile, str], str | None]
    home: str = "#"


def report_links(detailed: set[tuple[int, EpisodeFile]]) -> Links:
    """Anchors in the report page; ``detailed``: the files whose episodes it shows call by call."""
    return Links(
        episodes=lambda r, f: f"#{_anchor(r, f)}",
        episode=lambda r, f, e: f"#{_anchor(r, f)}-{_slug(e)}" if (r, f) in detailed else None,
    )


def _anchor(run: int, file: EpisodeFile) -> str:
    return f"r{run}-{file.kind}-{file.step}"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}"


def page(title: str, body: str, *, live_version: int | None = None, version_url: str = "/version", refresh_ms: int = 3000, home: str = "#") -> str:
    """A whole HTML document; ``live_version`` adds the live view's refresh: the page reloads
    when what ``version_url`` answers changes (the files it shows were written)."""
    script = _LIVE_JS % (json.dumps(live_version), json.dumps(version_url), refresh_ms) if live_version is not None else ""
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{e(title)}</title>"
        f"<meta name=viewport content='width=device-width'><style>{_CSS}</style></head><body>"
        f"<header><a href='{e(home)}'>agentgym-lightning</a> · {e(title)}</header><main>{body}</main>{script}</body></html>"
    )


# ------------------------------------------------------------------ overview


#: The options a run's header names (the rest are in its whole config, on demand).
KEY_OPTIONS = (
    "max_steps", "tasks_per_step", "num_generations", "learning_rate", "use_peft", "loss_type", "credit", "air_weights",
    "env_kwargs", "eval_env_kwargs", "temperature", "max_completion_length", "max_staleness", "seed",
)
#: Options that make two runs' curves different experiments rather than seeds of one (a judged run's
#: rewards are the judge's: never averaged with an unjudged run's; an asynchronous run trains off-policy).
IDENTITY_OPTIONS = (
    "env", "model", "env_kwargs", "backend", "use_peft", "loss_type", "credit", "air_weights", "num_generations", "tasks_per_step",
    "judge", "max_staleness",
)
#: What an option a run's saved config lacks means (a run from before the option existed).
_ABSENT = {"judge": None, "max_staleness": 0}


#: A judge's options that change how it runs, not what it rewards: two seeds may differ in them.
_JUDGE_RUNNING_OPTIONS = ("api_key_env", "concurrency", "timeout_s", "max_attempts")


def _option(config: dict[str, Any], name: str) -> Any:
    value = config.get(name, _ABSENT.get(name))
    if name == "judge" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in _JUDGE_RUNNING_OPTIONS}
    return value


def judge_line(config: dict[str, Any]) -> str:
    """Who gave the run's rewards, and what its ``success_rate`` counts (a judge's score is a
    reward, not a success: :func:`~agentgym_lightning.metrics.succeeded`)."""
    judge = config.get("judge")
    if not isinstance(judge, dict):
        return f"rewards: the env's · success: {success_meaning(False)}"
    how = [str(judge.get("mode", "relative")), f"weight {judge.get('weight', 1.0)}"]
    how += [name for name in ("transcript", "show_gold", "show_verdict") if judge.get(name)]
    return (
        f"rewards: judged by {judge.get('model', 'judge')} at {judge.get('base_url', '?')} ({', '.join(how)}) · "
        f"success: {success_meaning(True)}"
    )


def run_header(run: RunFolder, config: dict[str, Any]) -> str:
    """What the run is: its env, model, backend and key options, and its whole config on demand."""
    if not config:
        return f"<div class=muted>{e(run.name)}: no config yet (it is read from the first checkpoint)</div>"
    backend = f"{config.get('backend', '?')}{', LoRA' if config.get('use_peft') else ''}"
    options = " · ".join(f"{e(k)}={e(_value(config[k]))}" for k in KEY_OPTIONS if k in config and config[k] not in (None, {}, []))
    whole = shorten(json.dumps(config, indent=1, sort_keys=True, default=str), 50_000)
    return (
        f"<div class=runhead><b>{e(run.name)}</b> · env <b>{e(config.get('env', '?'))}</b> · model <b>{e(config.get('model', '?'))}</b>"
        f" ({e(backend)})<div class=muted>{options}</div><div class=muted>{e(judge_line(config))}</div>"
        f"<details><summary>the whole config</summary><div class=msg>{e(whole)}</div></details></div>"
    )


def _value(value: Any) -> str:
    return shorten(value if isinstance(value, str) else json.dumps(value, default=str), 200)


def differences(configs: Sequence[dict[str, Any]]) -> list[str]:
    """The options in which the runs differ (of :data:`IDENTITY_OPTIONS`; a run with no config
    yet differs in nothing known)."""
    known = [c for c in configs if c]
    return [k for k in IDENTITY_OPTIONS if len({json.dumps(_option(c, k), sort_keys=True, default=str) for c in known}) > 1]


def _problems(where: str, problems: Sequence[str]) -> str:
    if not problems:
        return ""
    items = "".join(f"<li>{e(p)}</li>" for p in problems)
    return f"<div class='alarm firing'>⚠ {len(problems)} line(s) of {e(where)} could not be read and were skipped:<ul>{items}</ul></div>"


def overview(runs: Sequence[RunFolder], links: Links) -> str:
    """Each run's header, alarms, curves (runs of one experiment overlaid with their mean;
    different ones side by side, saying what differs) and each run's steps and evaluations."""
    all_series = [r.series() for r in runs]
    names = [r.name for r in runs]
    configs = [r.config() for r in runs]
    parts = ["<h2>Runs</h2>" if len(runs) > 1 else ""]
    parts += [run_header(run, config) for run, config in zip(runs, configs)]
    differ = differences(configs) if len(runs) > 1 else []
    if differ:
        parts.append(
            "<div class='alarm firing'>⚠ these runs are not one experiment: they differ in "
            + ", ".join(f"<b>{e(k)}</b> (" + "; ".join(f"{e(r.name)}: {e(_value(_option(c, k)))}" for r, c in zip(runs, configs)) + ")" for k in differ)
            + ". Their curves are drawn one by one, not averaged.</div>"
        )
    for i, (run, series) in enumerate(zip(runs, all_series)):
        files = run.episode_files()
        train = [f for f in files if f.kind == "train"]
        latest = run.episodes(train[-1]) if train else []
        alarms = run_alarms(series, latest)
        parts.append(f"<h2>Alarms · {e(run.name)}</h2>")
        parts.append(_problems(f"{run.name}/metrics.jsonl", run.problems()))
        parts.append("".join(
            f"<div class='alarm{' firing' if a.firing else ''}'>{'⚠' if a.firing else '✓'} <b>{e(a.name)}</b>: {e(a.text)}</div>" for a in alarms
        ) or "<p class=muted>nothing logged yet</p>")
    svgs = [svg for _, svg in curves(runs, all_series, differ)]
    parts.append(f"<h2>Curves{' · ' + ', '.join(e(n) for n in names) if len(runs) > 1 else ''}</h2>")
    parts.append("<div class=charts>" + "".join(f"<div class=chart>{s}</div>" for s in svgs if s) + "</div>")
    if not any(svgs):
        parts.append("<p class=muted>no metrics yet (metrics.jsonl is written after the first evaluation or step)</p>")
    for i, run in enumerate(runs):
        parts.append(f"<h2>Steps and evaluations · {e(run.name)}</h2>{_file_table(i, run, all_series[i], links)}")
    return "".join(parts)


def curves(
    runs: Sequence[RunFolder], all_series: Sequence[Series] | None = None, differ: Sequence[str] | None = None
) -> list[tuple[Chart, str]]:
    """Each chart the runs logged something of, with its ``<svg>``: runs of one experiment
    (seeds) overlaid with their mean and spread, runs that :func:`differences` tells apart
    line by line. ``all_series`` / ``differ``: what the caller has read already."""
    if all_series is None:
        all_series = [r.series() for r in runs]
    if differ is None:
        differ = differences([r.config() for r in runs]) if len(runs) > 1 else []
    names = [r.name for r in runs]
    drawn = [(c, chart_svg(c, all_series, names, overlay=not differ)) for c in run_charts(all_series)]
    return [(c, svg) for c, svg in drawn if svg is not None]


def _file_table(index: int, run: RunFolder, series: dict[str, list[tuple[int, float]]], links: Links) -> str:
    rows = []
    for f in run.episode_files():
        prefix = "train" if f.kind == "train" else "eval"
        at = {name: dict(series.get(f"{prefix}/{name}", [])).get(f.step) for name in ("episodes", "reward/mean", "success_rate", "turns/mean")}
        rows.append(
            f"<tr><td><a href='{e(links.episodes(index, f))}'>{e(_what(f))}</a></td><td class=num>{_num(at['episodes'], 0)}</td>"
            f"<td class=num>{_num(at['reward/mean'])}</td><td class=num>{_num(at['success_rate'])}</td><td class=num>{_num(at['turns/mean'], 2)}</td></tr>"
        )
    if not rows:
        return "<p class=muted>no episodes written yet</p>"
    return "<table><tr><th>episodes of</th><th>episodes</th><th>reward</th><th>success</th><th>turns</th></tr>" + "".join(rows) + "</table>"


# ------------------------------------------------------------------ episodes of a step


def _credit(file: EpisodeFile, episodes: Sequence[Trajectory], config: dict[str, Any]) -> tuple[SampleBatch, str | None]:
    """What the trainer made of an episode file's episodes (its values, advantages and
    zero-variance groups), built as the run's config builds its rows, and why not when that
    cannot be done here. Nothing for evaluations."""
    if file.kind != "train":
        return SampleBatch(), None
    try:
        return configured_samples(episodes, LightningRLConfig.from_dict(config)), None
    except (ValueError, RuntimeError) as exc:  # a credit plugin that is not installed here
        return SampleBatch(), str(exc)


def by_group(episodes: Sequence[Trajectory]) -> dict[str, list[Trajectory]]:
    """The episodes by GRPO group (an episode without one is its own), groups and members in a stable order."""
    groups: dict[str, list[Trajectory]] = {}
    for t in sorted(episodes, key=lambda t: (t.group_id or "", t.seed or 0)):
        groups.setdefault(t.group_id or t.episode_id, []).append(t)
    return groups


def _tool_names(t: Trajectory) -> str:
    names = [tc.name for s in t.steps if s.completion is not None for tc in tool_calls_of(s)]
    return " → ".join(names) if names else "–"


def _resource_versions(t: Trajectory) -> str:
    """The resources' versions an episode ran with (``trajectory.resources``), ``–`` for none."""
    return ", ".join(f"{name} {version}" for name, version in sorted(t.resources.items())) or "–"


def _resource_texts(config: dict[str, Any]) -> dict[tuple[str, str], str]:
    """The texts of the resources the run's config gave its envs (``env_kwargs`` and
    ``eval_env_kwargs``' ``resources``: ``train --resource``), by name and version. A spec that
    is not one (an old or hand-edited config) is left out: the page shows the version alone."""
    texts: dict[tuple[str, str], str] = {}
    for key in ("env_kwargs", "eval_env_kwargs"):
        kwargs = config.get(key)
        if not isinstance(kwargs, dict):
            continue
        try:
            given = as_resources(kwargs.get("resources"))
        except (TypeError, ValueError):
            continue
        texts.update({(name, r.version): r.text for name, r in given.items()})
    return texts


def _resources_table(episode: Trajectory, texts: dict[tuple[str, str], str], limit: int) -> str:
    """What the episode's agent read instead of its constants: each resource's name, version, and
    its text where the run's config holds it."""
    if not episode.resources:
        return ""
    rows = []
    for name, version in sorted(episode.resources.items()):
        text = texts.get((name, version))
        shown = (
            f"<details><summary>{len(text)} characters</summary><div class=msg>{e(shorten(text, limit))}</div></details>"
            if text is not None else "<span class=muted>not in the run's config</span>"
        )
        rows.append(f"<tr><td>{e(name)}</td><td>{e(version)}</td><td>{shown}</td></tr>")
    return "<table class=resources><tr><th>resource</th><th>version</th><th>text</th></tr>" + "".join(rows) + "</table>"


def episode_list(index: int, run: RunFolder, file: EpisodeFile, links: Links, config: dict[str, Any] | None = None) -> str:
    """A step's (or an evaluation's) episodes, grouped by GRPO group with rewards and advantages."""
    episodes = run.episodes(file)
    config = run.config() if config is None else config
    credit, error = _credit(file, episodes, config)
    skip_flat = config.get("zero_variance_groups", "skip") == "skip"
    diversity = {g.group: g for g in group_diversity(episodes)}
    with_resources = any(t.resources for t in episodes)  # a column only where an episode was given some
    out: list[str] = []
    if error:
        out.append(f"<p class=muted>advantages not shown: {e(error)}</p>")
    out.append(_problems(f"{run.name}/{file.path.parent.name}/{file.path.name}", run.problems(file)))
    for key, members in by_group(episodes).items():
        d = diversity.get(key)
        flat = credit.zero_variance.get(key)
        badges = f"<span class=badge>{len(members)} episodes</span>"
        if d is not None and d.episodes > 1:
            kind = "bad" if d.distinct_completions == 1 else "good"
            badges += f"<span class='badge {kind}'>{d.distinct_completions} distinct completions</span>"
            if d.tool_calls:  # a group that called no tool has no sequences to tell apart
                badges += f"<span class=badge>{d.distinct_tool_sequences} distinct tool-call sequences</span>"
        if flat:
            badges += f"<span class='badge warn'>zero variance{' (not trained)' if skip_flat else ''}</span>"
        rows = []
        for t in members:
            adv = credit.advantages.get(t.episode_id)
            mean_adv = sum(adv) / len(adv) if adv else None
            href = links.episode(index, file, t.episode_id)
            name = f"<a href='{e(href)}'>{e(t.episode_id)}</a>" if href else e(t.episode_id)
            rows.append(
                f"<tr><td>{name}</td><td class=num>{e(t.seed)}</td>"
                f"<td>{e(t.status.value)}</td><td class=num>{_num(t.final_reward)}</td><td class=num>{_num(t.total_reward)}</td>"
                f"<td class=num>{_num(mean_adv)}</td><td class=num>{len(t.steps)}</td><td>{e(_tool_names(t))}</td>"
                + (f"<td>{e(_resource_versions(t))}</td>" if with_resources else "") + "</tr>"
            )
        task = members[0].task
        out.append(
            f"<h3>group {e(key)} {badges}</h3><div class=muted>task: {e(shorten(json.dumps(task, default=str), 300))}</div>"
            "<table><tr><th>episode</th><th>seed</th><th>status</th><th>final reward</th><th>with AIR</th>"
            "<th>advantage</th><th>calls</th><th>tool calls</th>" + ("<th>resources</th>" if with_resources else "") + "</tr>"
            + "".join(rows) + "</table>"
        )
    return "".join(out) if episodes else "".join(out) + "<p class=muted>no episodes in this file yet</p>"


# ------------------------------------------------------------------ one episode


def shorten(text: str, limit: int) -> str:
    """``text`` cut at ``limit`` characters, saying how many more there were."""
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


def message_text(message: dict[str, Any]) -> str:
    """A chat message as text: its content (parts joined) and its tool calls, one ``→ name(args)`` a line."""
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "\n".join(str(p.get("text", p)) if isinstance(p, dict) else str(p) for p in content)
    text = "" if content is None else str(content)
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, dict) else {}
        text += f"\n→ {fn.get('name')}({fn.get('arguments')})"
    return text.strip()


def _message(message: dict[str, Any], limit: int) -> str:
    role = str(message.get("role", "?"))
    name = f" · {message['name']}" if message.get("name") else ""
    return f"<div class='msg {e(role)}'><span class=role>{e(role)}{e(name)}</span>\n{e(shorten(message_text(message), limit))}</div>"


def _new_messages(step: Step, previous: Step | None) -> tuple[int, list[dict[str, Any]]]:
    """How many leading messages the call shares with the previous call, and the rest."""
    shared = step.shared_messages(previous)
    new = step.request.messages[shared:]
    # The previous answer echoed back by the agent is shown with that call, not again here.
    if new and previous is not None and previous.completion is not None and new[0].get("role") == "assistant" and (new[0].get("content") or "") == previous.completion.text:
        return shared + 1, new[1:]
    return shared, new


def _tokens(step: Step, trained: bool, decode: Callable[[list[int]], list[str]] | None) -> str:
    c = step.completion
    if c is None or not c.completion_token_ids:
        return ""
    ids = c.completion_token_ids
    texts = decode(ids) if decode is not None else [str(i) for i in ids]
    logprobs = c.logprobs or [None] * len(ids)
    spans = []
    for token, text, lp in zip(ids, texts, logprobs):
        # Darker = less likely under the sampling policy: p0 (logprob > -0.5) ... p5 (< -4.5).
        shade = 0 if lp is None else min(5, int(-lp + 0.5))
        title = f"id {token}" + (f", logprob {lp:.3f}" if lp is not None else "")
        spans.append(f"<span class='tok p{shade}' title='{e(title)}'>{e(text)}</span>")
    known = [lp for lp in logprobs if lp is not None]
    mean = f", mean logprob {sum(known) / len(known):.3f}" if known else ", no logprobs"
    prompt = len(c.prompt_token_ids or [])
    return (
        f"<details><summary>{len(ids)} completion tokens, {'trained' if trained else 'masked'}{e(mean)} · prompt {prompt} tokens (context, masked)</summary>"
        f"<div class='tokens{'' if trained else ' masked'}'>{''.join(spans)}</div></details>"
    )


def episode_detail(
    index: int,
    run: RunFolder,
    file: EpisodeFile,
    episode: Trajectory,
    *,
    config: dict[str, Any] | None = None,
    credit: SampleBatch | None = None,
    decode: Callable[[list[int]], list[str]] | None = None,
    limit: int = 20_000,
    among: Sequence[Trajectory] | None = None,
) -> str:
    """One episode call by call (see the module docstring); ``limit`` cuts long messages.
    ``among``: the episodes its credit and advantage are computed with (default: the file's;
    its GRPO group is enough unless rewards are scaled by the batch)."""
    config = run.config() if config is None else config
    if credit is None:
        if among is None or config.get("scale_rewards") == "batch":
            among = run.episodes(file)
        credit, _ = _credit(file, among, config)
    if decode is None:
        decode = run.token_decoder()
    match = as_agent_match(config.get("agent_match")) if config.get("agent_match") else None
    mask_truncated = bool(config.get("mask_truncated_completions", False))
    values = credit.values.get(episode.episode_id)
    advantages = credit.advantages.get(episode.episode_id)
    key = episode.group_id or episode.episode_id
    # Why no call of the episode trains: the episode's note, and each call's badge.
    episode_note, episode_why = "", ""
    if file.kind != "train":
        episode_note, episode_why = "held-out evaluation: not trained", "a held-out evaluation"
    elif episode.status is Status.INFRA_FAILED:
        episode_note, episode_why = "infra_failed: never trained on", "the episode ended infra_failed"
    elif advantages is None:
        episode_note, episode_why = "not trained (unfinished, or alone in its group)", "the episode is unfinished, or alone in its group"
    elif credit.zero_variance.get(key) and config.get("zero_variance_groups", "skip") == "skip":
        episode_note = "its group had no reward variance: not trained (zero_variance_groups=skip)"
        episode_why = "its group had no reward variance (zero_variance_groups=skip)"
    head = (
        f"<table><tr><th>status</th><td>{e(episode.status.value)}</td><th>final reward</th><td>{_num(episode.final_reward)}</td>"
        f"<th>with AIR</th><td>{_num(episode.total_reward)}</td><th>group</th><td>{e(episode.group_id)}</td><th>seed</th><td>{e(episode.seed)}</td></tr></table>"
        f"<div class=muted>task: {e(shorten(json.dumps(episode.task, default=str), 2000))}</div>"
        + _resources_table(episode, _resource_texts(config), limit)
    )
    if episode.error:
        head += f"<details><summary>error</summary><div class=msg>{e(shorten(episode.error, limit))}</div></details>"
    if episode_note:
        head += f"<p><span class='badge warn'>{e(episode_note)}</span></p>"
    calls = []
    previous: Step | None = None
    for i, step in enumerate(episode.steps):
        reason = untrained_reason(step, mask_truncated, match)
        trained = reason is None and not episode_note
        why = _REASONS[reason] if reason else episode_why
        badges = [f"<span class='badge {'good' if trained else ''}'>{'trained' if trained else 'not trained: ' + e(why)}</span>"]
        if step.agent or step.role:
            badges.append(f"<span class=badge>{e(' · '.join(x for x in (step.agent, step.role) if x))}</span>")
        if step.policy_version is not None:  # asynchronous training: which weights answered
            badges.append(f"<span class=badge>policy v{step.policy_version}</span>")
        if step.request.wire != "chat":  # the API the agent called, when it was not Chat Completions
            raw = " (raw prompt, no chat template)" if step.request.prompt is not None else ""
            badges.append(f"<span class=badge>{e(step.request.wire)} API{raw}</span>")
        if step.prompt_rebuilt:
            badges.append("<span class=badge>prompt rebuilt (new conversation)</span>")
        elif step.prompt_extends_previous is False:
            badges.append("<span class='badge bad'>chat-template drift: prompt ids do not extend the previous call's</span>")
        elif step.prompt_extends_previous:
            badges.append("<span class='badge good'>prompt ids extend the previous call's</span>")
        if step.error:
            badges.append(f"<span class='badge bad'>error: {e(shorten(step.error, 200))}</span>")
        shared, new = _new_messages(step, previous)
        body = [f"<div class=muted>{shared} earlier message(s) not repeated</div>" if shared else ""]
        body += [_message(m, limit) for m in new]
        c = step.completion
        if c is not None:
            answer = {"role": "assistant", "content": c.text, "tool_calls": [tc.to_openai() for tc in c.tool_calls]}
            body.append(_message(answer, limit).replace("<span class=role>assistant", "<span class=role>answer (the policy)", 1))
            if c.tool_call_errors:
                body.append(f"<div class='badge bad'>tool-call parse errors: {e('; '.join(c.tool_call_errors))}</div>")
        rewards = ", ".join(f"{e(r.source)} {r.value:+.3f}" + (f" (raw {r.raw:g})" if r.raw is not None else "") for r in step.rewards)
        credit_text = ""
        if values is not None and i < len(values):
            credit_text = f" · credit {values[i]:.3f}"
        if advantages is not None and i < len(advantages):
            credit_text += f" · advantage {advantages[i]:+.3f}"
        if step.outcome:
            body.append(f"<details><summary>outcome (what the agent emitted after the answer)</summary><div class=msg>{e(shorten(json.dumps(step.outcome, default=str, indent=1), limit))}</div></details>")
        body.append(_tokens(step, trained, decode))
        calls.append(
            f"<div class=call id='call-{i}'><b>call {i}</b> {''.join(badges)}<div>rewards: {rewards or '–'}{e(credit_text)}</div>{''.join(body)}</div>"
        )
        previous = step
    if episode.final_reward is not None:
        calls.append(f"<div class=call><b>end</b> · final reward {_num(episode.final_reward)} · result: {e(shorten(json.dumps(episode.result, default=str), 2000))}</div>")
    return head + "".join(calls)


# ------------------------------------------------------------------ the report


def report(runs: Sequence[RunFolder], *, limit: int = 4000) -> str:
    """The whole report as one self-contained HTML page: the overview, every step's and
    evaluation's episode table, and the episodes of the last training step and of the last
    evaluation (the last whose file is not empty) call by call, messages cut at ``limit`` characters (so the report stays small
    enough to attach to an issue; ``view`` shows every episode, whole)."""
    last: list[tuple[int, EpisodeFile]] = []
    for i, run in enumerate(runs):
        files = run.episode_files()
        for kind in ("train", "eval"):
            # A run stopped (or caught) just as a step began leaves that step's file empty: show the last with episodes.
            written = [f for f in files if f.kind == kind and f.path.stat().st_size > 0]
            newest = max(written, key=lambda f: f.step, default=None)
            if newest is not None:
                last.append((i, newest))
    links = report_links(set(last))
    parts = [overview(runs, links)]  # each run's header first: env, model, backend, key options, the config
    configs = [run.config() for run in runs]
    for i, run in enumerate(runs):
        for f in run.episode_files():
            parts.append(
                f"<details id='{_anchor(i, f)}'{' open' if (i, f) in last else ''}><summary><b>{e(run.name)} · episodes of {e(_what(f))}</b></summary>"
                f"{episode_list(i, run, f, links, configs[i])}</details>"
            )
    for i, f in last:
        run = runs[i]
        episodes = run.episodes(f)
        credit, _ = _credit(f, episodes, configs[i])
        parts.append(f"<h2>{e(run.name)} · episodes of {e(_what(f))}, call by call</h2>")
        for t in (t for members in by_group(episodes).values() for t in members):
            parts.append(
                f"<details id='{_anchor(i, f)}-{_slug(t.episode_id)}'><summary>episode {e(t.episode_id)} · group {e(t.group_id)} · "
                f"reward {_num(t.total_reward)} · {len(t.steps)} calls · {e(t.status.value)}</summary>"
                f"{episode_detail(i, run, f, t, config=configs[i], credit=credit, limit=limit)}</details>"
            )
    title = "run report · " + ", ".join(_title(r, c) for r, c in zip(runs, configs))
    # Opening a linked episode's <details> is the only script: the page reads fine without it.
    script = (
        "<script>function o(){var h=location.hash.slice(1);var d=h&&document.getElementById(h);"
        "if(d&&d.tagName==='DETAILS'){d.open=true;d.scrollIntoView()}}window.addEventListener('hashchange',o);o();</script>"
    )
    return page(title, "".join(parts) + script)


def _title(run: RunFolder, config: dict[str, Any]) -> str:
    return f"{run.name} ({config['env']} · {config.get('model', '?')})" if config.get("env") else run.name


def _what(file: EpisodeFile) -> str:
    return f"step {file.step}" if file.kind == "train" else f"held-out eval after step {file.step}"
