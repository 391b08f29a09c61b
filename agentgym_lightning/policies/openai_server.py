"""Deprecated alias of :mod:`agentgym_lightning.policies.openai`:
this name goes in the next release."""

from agentgym_lightning.deprecation import moved_module

moved_module("agentgym_lightning.policies.openai_server", "agentgym_lightning.policies.openai")
