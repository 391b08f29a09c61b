"""Deprecated alias of :mod:`agentgym_lightning.testing.pytest_plugin`:
this name goes in the next release."""

from agentgym_lightning.deprecation import moved_module

moved_module("agentgym_lightning.pytest_plugin", "agentgym_lightning.testing.pytest_plugin")
