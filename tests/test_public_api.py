"""The public API at the package root: every name resolves, lazily, and the docs import from it."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import agentgym_lightning

REPO = Path(__file__).resolve().parents[1]
#: Where a user reads our imports: the README, the contributors' guide, the docs, the envs' READMEs.
DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "envs").rglob("*.md"))]
# A fenced block, indented or not (docs put some inside list items); the closing fence matches its indent.
FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```", re.S | re.M)


def _doc_imports() -> list[tuple[str, int, str, list[str]]]:
    """``(doc, line in its block, module, names)`` for each ``from agentgym_lightning... import`` in python blocks."""
    found = []
    for doc in DOCS:
        for match in FENCE.finditer(doc.read_text(encoding="utf-8")):
            if match.group(2) not in ("python", "py", ""):
                continue
            try:
                tree = ast.parse(textwrap.dedent(match.group(3)))
            except SyntaxError:
                assert match.group(2) == "", f"{doc.name}: a python block that does not parse"
                continue  # an unlabelled block of shell or output
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "agentgym_lightning":
                    found.append((doc.relative_to(REPO).as_posix(), node.lineno, node.module, [a.name for a in node.names]))
    return found


def test_every_public_name_resolves():
    assert len(agentgym_lightning.__all__) == len(set(agentgym_lightning.__all__))
    assert set(agentgym_lightning._LAZY) <= set(agentgym_lightning.__all__)  # every lazy name is public
    for name in ("AgentEnv", "rollout", "evaluate", "make_policy", "LightningRLConfig", "LightningRLTrainer", "SFTConfig", "check_agent", "ConformanceReport"):
        assert name in agentgym_lightning.__all__
    for name in agentgym_lightning.__all__:
        value = getattr(agentgym_lightning, name)
        assert value is not None, name
        if name in agentgym_lightning._LAZY:
            # the very object its module defines, not a copy
            assert value is getattr(importlib.import_module(agentgym_lightning._LAZY[name]), name)
    assert set(agentgym_lightning.__all__) <= set(dir(agentgym_lightning))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        agentgym_lightning.not_a_name  # noqa: B018


def test_importing_the_package_loads_none_of_the_lazy_names_modules():
    code = "import json, sys, agentgym_lightning; print(json.dumps(sorted(sys.modules)))"
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, cwd=REPO).stdout))
    assert "torch" not in loaded and "transformers" not in loaded and "ray" not in loaded
    # The bundled adapters are plugins, which registering the env ids loads anyway (they import no framework).
    heavy = {m for m in agentgym_lightning._LAZY.values() if not m.startswith("agentgym_lightning.plugins.")}
    assert sorted(heavy & loaded) == []


@pytest.mark.parametrize("old", sorted(agentgym_lightning.MOVED_MODULES))
def test_a_moved_module_fails_saying_where_it_lives_now(old):
    new = agentgym_lightning.MOVED_MODULES[old].split(";")[0].split(" ")[0]
    assert importlib.util.find_spec(new) is not None, f"{old} points at {new}, which does not exist"
    with pytest.raises(ModuleNotFoundError, match=re.escape(f"it moved to {new}")) as caught:
        importlib.import_module(old)
    assert caught.value.name == old
    assert old not in sys.modules


def test_the_old_names_work_from_the_root():
    # What `agentgym_lightning.rollout` and `agentgym_lightning.conformance` gave, the root gives.
    from agentgym_lightning import RolloutStream, check_agent, iter_rollout, no_network, rollout, scripted_policy
    from agentgym_lightning.rollouts.in_process import rollout as moved_rollout
    from agentgym_lightning.testing.conformance import check_agent as moved_check_agent

    assert rollout is moved_rollout and check_agent is moved_check_agent
    assert all(callable(x) for x in (RolloutStream, iter_rollout, no_network, scripted_policy))


def test_an_unknown_submodule_still_fails_as_python_says():
    with pytest.raises(ModuleNotFoundError, match=r"^No module named 'agentgym_lightning.no_such_module'$"):
        importlib.import_module("agentgym_lightning.no_such_module")


def test_the_docs_import_agentgym_lightning_names_from_the_root():
    imports = _doc_imports()
    assert any(doc == "README.md" for doc, *_ in imports)  # it read the README's blocks
    deep = [f"{doc}: from {module} import {', '.join(names)}" for doc, _, module, names in imports if module != "agentgym_lightning"]
    assert deep == [], "import these from agentgym_lightning (export the name in its __all__ if it is not there)"
    unknown = [f"{doc}: {name}" for doc, _, _, names in imports for name in names if name not in agentgym_lightning.__all__]
    assert unknown == []
