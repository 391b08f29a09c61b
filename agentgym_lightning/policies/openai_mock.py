"""Deprecated alias of :mod:`agentgym_lightning.testing.mock_openai_server`:
this name goes in the next release."""

from agentgym_lightning.deprecation import moved_module

moved_module("agentgym_lightning.policies.openai_mock", "agentgym_lightning.testing.mock_openai_server")

if __name__ == "__main__":  # `python -m agentgym_lightning.policies.openai_mock` runs as it did
    import sys

    sys.modules["agentgym_lightning.policies.openai_mock"].main()
