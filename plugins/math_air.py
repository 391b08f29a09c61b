"""Deprecated alias of :mod:`agentgym_lightning.envs.math.plugin` (the math env's plugin, beside
its env): this name goes in the next release."""

from agentgym_lightning.deprecation import moved_module

moved_module("agentgym_lightning.plugins.math_air", "agentgym_lightning.envs.math.plugin")
