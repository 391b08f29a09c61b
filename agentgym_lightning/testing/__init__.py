"""Test doubles and checks for people who build on agentgym-lightning; nothing here runs in training.

- :mod:`.conformance`: the conformance kit (``check_agent``): one scripted episode through an
  agent or adapter, checked against the gateway's contract.
- :mod:`.pytest_plugin`: its ``agent_conformance`` fixture (``pytest_plugins =
  ["agentgym_lightning.testing.pytest_plugin"]``).
- :mod:`.mock_openai_server`: an instant OpenAI-compatible server for tests and benchmarks.
- :mod:`.vllm_serve`: a ``vllm serve`` started and stopped from Python, set up as the
  ``vllm-server`` backend's generator (tests and benchmarks in ``.venv-vllm``).
"""
