"""Bundled environments (installed as ``agentgym_lightning.envs``); registered by
:mod:`agentgym_lightning.registration`."""
