"""Deprecated alias of :mod:`agentgym_lightning.testing.conformance`:
this name goes in the next release."""

from agentgym_lightning.deprecation import moved_module

moved_module("agentgym_lightning.conformance", "agentgym_lightning.testing.conformance")
