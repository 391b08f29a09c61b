"""The pluggy plugin manager: bundled plugins first, then installed third-party ones."""

from __future__ import annotations

import importlib
import os
import threading

import pluggy

from agentgym_lightning import hookspecs

__all__ = ["BUNDLED_PLUGINS", "ENTRY_POINT_GROUP", "get_plugin_manager", "reset_plugin_manager"]

#: Modules under ``agentgym_lightning.plugins`` (the repo's top-level ``plugins/``) loaded always.
BUNDLED_PLUGINS: tuple[str, ...] = (
    "adapters",
    "credit",
    "errors",
    "outcome_air",
    "tool_call_air",
    "spider_air",
    "rag_air",
    "metrics_jsonl",
    "wandb_logger",
    "math_air",
    "langchain_adapter",
    "openai_agents_adapter",
    "autogen_adapter",
)
#: Entry-point group third-party packages use to ship plugins.
ENTRY_POINT_GROUP = "agentgym_lightning"
#: Set to ``1`` to skip third-party entry points (bundled plugins still load).
DISABLE_ENV = "AGENTGYM_LIGHTNING_DISABLE_PLUGIN_AUTOLOAD"

_lock = threading.Lock()
_pm: pluggy.PluginManager | None = None


def _build() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name in BUNDLED_PLUGINS:
        module = importlib.import_module(f"agentgym_lightning.plugins.{name}")
        pm.register(module, name=name)
    if os.environ.get(DISABLE_ENV, "") not in ("1", "true", "yes"):
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    pm.check_pending()
    return pm


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, built on first use."""
    global _pm
    if _pm is None:
        with _lock:
            if _pm is None:
                _pm = _build()
    return _pm


def reset_plugin_manager() -> None:
    """Forget the plugin manager so the next call rebuilds it (tests, newly installed plugins)."""
    global _pm
    with _lock:
        _pm = None
