"""``agentgym-lightning plugins``: what plugins are loaded and which hooks each implements."""

from __future__ import annotations

import argparse
from typing import Any


#: The command's name and its line in ``agentgym-lightning --help`` (read without registering it).
COMMAND = "plugins"
HELP = "list loaded plugins and the hooks they implement"


def register(sub: Any) -> None:
    p = sub.add_parser("plugins", help=HELP)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from agentgym_lightning.credit import credit_strategies
    from agentgym_lightning.plugin_manager import get_plugin_manager

    pm = get_plugin_manager()
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    print("plugins:")
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda kv: kv[0] or ""):
        if plugin is None:
            continue
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        dist = dists.get(id(plugin))
        origin = f"{dist.project_name} {dist.version}" if dist is not None else "bundled"
        print(f"  {name:<24} [{origin}] {', '.join(hooks)}")
    print("credit strategies: " + ", ".join(sorted(credit_strategies())))
    return 0
