"""The pluggy plugin manager: bundled plugins first, then the bundled env packages' own plugins,
then installed third-party ones."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import threading

import pluggy

from agentgym_lightning import hookspecs

__all__ = ["BUNDLED_PLUGINS", "ENTRY_POINT_GROUP", "env_plugins", "get_plugin_manager", "reset_plugin_manager"]

#: Modules under ``agentgym_lightning.plugins`` (the repo's top-level ``plugins/``) loaded always.
BUNDLED_PLUGINS: tuple[str, ...] = (
    "adapters",
    "credit",
    "errors",
    "outcome_air",
    "tool_call_air",
    "metrics_jsonl",
    "wandb_logger",
    "langchain_adapter",
    "openai_agents_adapter",
    "autogen_adapter",
    "otel_exporter",
)
#: Entry-point group third-party packages use to ship plugins.
ENTRY_POINT_GROUP = "agentgym_lightning"
#: Set to ``1`` to skip third-party entry points (bundled plugins still load).
DISABLE_ENV = "AGENTGYM_LIGHTNING_DISABLE_PLUGIN_AUTOLOAD"

#: The package whose subpackages are the bundled environments.
ENVS_PACKAGE = "agentgym_lightning.envs"

_lock = threading.Lock()


def env_plugins() -> list[str]:
    """The plugin module of each bundled env package (``envs/<name>/plugin.py``: its env ids
    through ``agentgym_register_envs``, its AIR), found rather than listed: an env package brings
    its own."""
    envs = importlib.import_module(ENVS_PACKAGE)
    packages = sorted(m.name for m in pkgutil.iter_modules(envs.__path__) if m.ispkg)
    return [f"{ENVS_PACKAGE}.{p}.plugin" for p in packages if importlib.util.find_spec(f"{ENVS_PACKAGE}.{p}.plugin")]
_pm: pluggy.PluginManager | None = None


def _build() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name in BUNDLED_PLUGINS:
        module = importlib.import_module(f"agentgym_lightning.plugins.{name}")
        pm.register(module, name=name)
    for name in env_plugins():
        pm.register(importlib.import_module(name), name=name.removeprefix("agentgym_lightning."))
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
