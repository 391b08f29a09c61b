"""The package's layout: no import circle, and the episode's record stands on its own."""

from __future__ import annotations

import ast
import queue
import re
import runpy
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentgym_lightning.episode import CallEvent, DoneEvent, Episode
from agentgym_lightning.llm import ChatRequest, Completion, GatewayError
from agentgym_lightning.trajectory import Status

REPO = Path(__file__).resolve().parents[1]


def _import_graph() -> SimpleNamespace:
    return SimpleNamespace(**runpy.run_path(str(REPO / "bench" / "import_graph.py")))


def test_no_import_circle_in_the_package():
    graph_tools = _import_graph()
    graph = graph_tools.build_graph(REPO)
    assert graph.number_of_nodes() > 50  # it read the package, plugins/ and envs/
    # Every edge counts, TYPE_CHECKING ones too: a circle drawn only for the type checker is
    # still two modules that each need the other to be understood.
    assert graph_tools.circles(graph, graph_tools.KINDS) == []


def test_the_import_graph_sees_a_circle_through_a_package_init(tmp_path):
    # a.x imports b.y; b/__init__ imports b.z, which imports a.x: a circle only through b's __init__.
    pkg = tmp_path / "agentgym_lightning"
    (pkg / "b").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "x.py").write_text("from agentgym_lightning.b.y import Y\n")
    (pkg / "b" / "__init__.py").write_text("from agentgym_lightning.b.z import Z\n")
    (pkg / "b" / "y.py").write_text("Y = 1\n")
    (pkg / "b" / "z.py").write_text("def f():\n    from agentgym_lightning.x import X\n")
    graph_tools = _import_graph()
    graph = graph_tools.build_graph(tmp_path)
    assert graph_tools.circles(graph, ("module",)) == []
    assert graph_tools.circles(graph, ("module", "function")) == [
        ["agentgym_lightning.b", "agentgym_lightning.b.z", "agentgym_lightning.x"]
    ]


def test_the_import_graph_script_runs():
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "import_graph.py")], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert "all (typing too): 0 circle(s)" in out
    assert "modules in no layer: 0" in out and "backward imports (to a later layer): 0" in out


def test_every_module_is_in_a_layer_and_imports_only_earlier_layers():
    graph_tools = _import_graph()
    graph = graph_tools.build_graph(REPO)
    # A new module is placed in bench/import_graph.py's LAYERS, in the order data flows.
    assert graph_tools.unplaced(graph) == []
    # Every edge, function-level and TYPE_CHECKING ones too, goes to an earlier layer or within one.
    assert graph_tools.backward_imports(graph) == []


def test_the_gateway_reaches_no_driver_env_or_rollout():
    import networkx as nx

    graph_tools = _import_graph()
    graph = graph_tools.build_graph(REPO)
    gateway = [m for m in graph if m == "agentgym_lightning.gateway" or m.startswith("agentgym_lightning.gateway.")]
    assert len(gateway) > 10
    forbidden = ("agentgym_lightning.env", "agentgym_lightning.worker", "agentgym_lightning.rollouts", "agentgym_lightning.training")
    for module in gateway:
        reached = nx.descendants(graph, module)  # through any import, of any kind, however indirect
        assert not [m for m in reached if m.startswith(forbidden)], module


def test_the_layer_check_sees_a_backward_import_of_every_kind(tmp_path):
    # gateway/x imports a driver under TYPE_CHECKING and inside a function, env/ at module level
    # through a package __init__; episode imports gateway (a later layer) too.
    pkg = tmp_path / "agentgym_lightning"
    (pkg / "gateway").mkdir(parents=True)
    (pkg / "rollouts").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "env.py").write_text("E = 1\n")
    (pkg / "episode.py").write_text("from agentgym_lightning.gateway import x\n")
    (pkg / "gateway" / "__init__.py").write_text("")
    (pkg / "gateway" / "x.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from agentgym_lightning.rollouts.driver import D\n"
        "def f():\n    from agentgym_lightning.rollouts import driver\n"
        "from agentgym_lightning.env import E\n"
    )
    (pkg / "rollouts" / "__init__.py").write_text("")
    (pkg / "rollouts" / "driver.py").write_text("from agentgym_lightning.env import E\nD = 1\n")
    graph_tools = _import_graph()
    graph = graph_tools.build_graph(tmp_path)
    assert graph_tools.unplaced(graph) == []
    found = {(a.removeprefix("agentgym_lightning."), b.removeprefix("agentgym_lightning."), kind)
             for a, b, kind, _ in graph_tools.backward_imports(graph)}
    assert found == {
        ("gateway.x", "rollouts.driver", "typing"),
        ("gateway.x", "rollouts", "typing"),
        ("gateway.x", "rollouts.driver", "function"),
        ("gateway.x", "rollouts", "function"),
        ("gateway.x", "env", "module"),
        ("episode", "gateway.x", "module"),
        ("episode", "gateway", "module"),
    }
    # A module no layer names is reported, not silently allowed.
    (pkg / "stray.py").write_text("")
    assert graph_tools.unplaced(graph_tools.build_graph(tmp_path)) == ["agentgym_lightning.stray"]


def test_what_the_import_graph_needs_is_in_the_dev_extra():
    """`make setup` installs the `dev` extra, and this file runs bench/import_graph.py: every
    distribution that script imports (outside the standard library) must be declared there."""
    tree = ast.parse((REPO / "bench" / "import_graph.py").read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    third_party = imported - set(sys.stdlib_module_names) - {"__future__"}
    assert "networkx" in third_party  # the check reads the script's imports
    dev = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]["dev"]
    declared = {re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower() for requirement in dev}
    assert third_party <= declared, f"bench/import_graph.py imports {sorted(third_party - declared)}: add them to the dev extra"


def _request(text: str = "hi") -> ChatRequest:
    return ChatRequest.from_openai({"model": "m", "messages": [{"role": "user", "content": text}]})


def test_episode_is_a_record_without_a_gateway_or_worker():
    events: queue.SimpleQueue = queue.SimpleQueue()
    episode = Episode(task={"q": 1}, events=events, seed=3)

    first = episode.submit(_request())
    event = events.get_nowait()
    assert isinstance(event, CallEvent) and event.pending is first and first.step.index == 0
    episode.answer(first, Completion(text="ok"))
    assert first.wait(0) == Completion(text="ok")
    episode.emit_variable("x", 1)
    episode.emit_reward(0.5, "tool")
    assert first.step.outcome == {"x": 1} and [r.value for r in first.step.rewards] == [0.5]

    second = episode.submit(_request("again"))
    episode.refuse(second, GatewayError(400, "bad request", code="invalid_request_error"))
    with pytest.raises(GatewayError, match="bad request"):
        second.wait(0)
    assert second.step.error == "400 invalid_request_error: bad request" and second.step.trainable is False
    assert second.step.timings.answered_at is not None
    with pytest.raises(RuntimeError, match="not pending"):  # a refused call is answered: no longer pending
        episode.answer(second, Completion(text="late"))

    episode.finish("done", None)
    done = [e for e in iter(lambda: None if events.empty() else events.get_nowait(), None) if isinstance(e, DoneEvent)]
    assert [(d.result, d.error) for d in done] == [("done", None)]
    episode.end(Status.SUCCEEDED, None, 1.0)
    episode.note_error("[agentgym] a note")
    trajectory = episode.trajectory
    assert (trajectory.status, trajectory.final_reward, trajectory.error) == (Status.SUCCEEDED, 1.0, "[agentgym] a note")
    assert trajectory.ended_at is not None and len(trajectory.steps) == 2


# What a Step records; a write to one of these through a name that says "step" is a step write.
_STEP_FIELDS = {
    "completion", "variables", "outcome", "rewards", "trainable", "role", "agent", "prompt_extends_previous",
    "prompt_rebuilt", "error", "timings", "index", "request",
}  # fmt: skip
_MUTATORS = {"append", "extend", "insert", "remove", "pop", "update", "clear"}


def _step_writes(path: Path) -> list[str]:
    """Assignments to (and mutating calls on) a step's fields in ``path``, found by their names
    (``step.agent = ...``, ``steps[i].outcome[k] = ...``, ``call.step.rewards.append(...)``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            targets = [node.func.value]
        else:
            continue
        for target in targets:
            chain, base = [], target
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                if isinstance(base, ast.Attribute):
                    chain.append(base.attr)
                base = base.value
            name = base.id if isinstance(base, ast.Name) else ""
            if name in ("self", "cls") or not _STEP_FIELDS.intersection(chain):
                continue
            if "step" in name or any("step" in part for part in chain):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_only_the_episode_writes_its_steps():
    """One module owns a step's record: the env, the tracing join, the drivers ask the episode."""
    writes = {str(p.relative_to(REPO)): _step_writes(p) for p in sorted((REPO / "agentgym_lightning").rglob("*.py"))}
    assert len(writes["agentgym_lightning/episode.py"]) >= 10  # the scan sees the episode's own writes
    elsewhere = [w for path, found in writes.items() if path != "agentgym_lightning/episode.py" for w in found]
    assert elsewhere == []


def test_a_closed_episode_refuses_calls_and_no_longer_announces_its_end():
    events: queue.SimpleQueue = queue.SimpleQueue()
    episode = Episode(task=None, events=events)
    pending = episode.submit(_request())
    events.get_nowait()
    episode.close()
    with pytest.raises(GatewayError, match="is over: stopped"):
        pending.wait(0)
    with pytest.raises(GatewayError, match="is over"):
        episode.submit(_request())
    episode.finish(None, RuntimeError("unwound"))
    assert events.empty() and episode.finished


def test_the_trainer_and_the_eval_command_share_one_evaluate():
    graph = _import_graph().build_graph(REPO)
    trainer = set(graph.successors("agentgym_lightning.training.trainer"))
    assert "agentgym_lightning.commands.eval" not in trainer
    # Both trainers' held-out evals are the run loop's (training/run.py), which runs training/held_out.py's,
    # which runs the one evaluate.
    assert {"agentgym_lightning.metrics", "agentgym_lightning.training.run"} <= trainer
    assert "agentgym_lightning.training.run" in graph.successors("agentgym_lightning.training.sft.trainer")
    assert "agentgym_lightning.training.held_out" in graph.successors("agentgym_lightning.training.run")
    assert "agentgym_lightning.rollouts.evaluation" in graph.successors("agentgym_lightning.training.held_out")
    assert "agentgym_lightning.rollouts.evaluation" in graph.successors("agentgym_lightning.commands.eval")


def test_the_failure_isolator_is_public_and_isolates_a_rejected_request():
    from agentgym_lightning.policies import FailureIsolator, PolicyDown

    def generate(requests):
        if any(r.messages[-1]["content"] == "bad" for r in requests):
            raise ValueError("cannot render this one")
        return [Completion(text="ok") for _ in requests]

    isolator = FailureIsolator(generate)
    answers = isolator.answer([_request("a"), _request("bad"), _request("c")])
    assert answers[0] == answers[2] == Completion(text="ok")
    assert isinstance(answers[1], GatewayError) and answers[1].status == 400
    with pytest.raises(PolicyDown):  # nothing answered and the probe fails too: the backend is down
        FailureIsolator(lambda requests: 1 / 0).answer([_request("a")])


def test_the_env_packages_register_their_own_envs_and_air():
    from agentgym_lightning.plugin_manager import BUNDLED_PLUGINS, env_plugins, get_plugin_manager
    from agentgym_lightning.registration import BUNDLED_ENVS, lightning_env_ids

    assert env_plugins() == [f"agentgym_lightning.envs.{name}.plugin" for name in ("math", "mcp_tools", "openenv_env", "rag", "spider", "verifiers_env")]
    assert not {"spider_air", "rag_air", "math_air"} & set(BUNDLED_PLUGINS)  # the core names none of them
    assert list(BUNDLED_ENVS) == ["lightning/GuessNumber-v0"]
    names = {name for name, _ in get_plugin_manager().list_name_plugin()}
    assert {"envs.math.plugin", "envs.mcp_tools.plugin", "envs.openenv_env.plugin", "envs.rag.plugin", "envs.spider.plugin", "envs.verifiers_env.plugin"} <= names
    assert {"lightning/Spider-v0", "lightning/MuSiQue-v0", "lightning/HotpotQA-v0", "lightning/GSM8K-v0", "lightning/MCP-v0", "lightning/Verifiers-v0", "lightning/OpenEnv-v0"} <= set(
        lightning_env_ids()
    )


#: Issue 48's size rules: a module is read in one sitting, a function as one step of its caller.
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 120


def _package_files() -> list[Path]:
    return sorted((REPO / "agentgym_lightning").rglob("*.py"))


def test_no_module_of_the_package_is_over_800_lines():
    long = {str(p.relative_to(REPO)): n for p in _package_files() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these modules by concept (at most {MAX_MODULE_LINES} lines): {long}"


def test_no_function_of_the_package_is_over_120_lines():
    long = {}
    for path in _package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(REPO)}::{node.name}"] = lines
    assert long == {}, f"make these read as steps (at most {MAX_FUNCTION_LINES} lines): {long}"
