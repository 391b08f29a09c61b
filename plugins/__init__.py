"""Bundled plugins (installed as ``agentgym_lightning.plugins``).

Each module is one small plugin implementing hooks of :mod:`agentgym_lightning.hookspecs`;
the plugin manager registers every module named in ``BUNDLED_PLUGINS``. A bundled environment's
own plugin (its env ids, its AIR) lives beside it, ``envs/<name>/plugin.py``, and is found there.
"""
