"""One base model, a LoRA adapter per trained agent (``lora_per_agent``).

An episode may hold several agents (a LangGraph graph's ``writer`` and ``rewriter`` nodes). With
``agent_match`` alone they share one set of weights, pulled in different directions by their own
tasks. With ``lora_per_agent`` each trained agent gets a LoRA adapter of its own on the one base
model (or agents share one, by mapping them to the same adapter name):

* **Routing.** :class:`AgentAdapters` names a call's agent the way ``agent_match`` does (the
  call's ``metadata["agent"]``, else its ``metadata["role"]``) and maps it to its adapter;
  :class:`AdapterRouting` writes that adapter into every request's ``metadata[ADAPTER_KEY]``
  (``"__base__"`` for agents with no adapter: they run on the base model) and the backend
  generates each request with it (``hf``: PEFT's mixed-adapter batches; ``vllm``: a LoRA request
  per call; ``openai``: the adapter sent as the request's ``model``). A request that names no
  agent but names an adapter as its ``model`` keeps it: that is how a request routed on a Ray
  worker reaches the trainer's generator.
* **The update** (:mod:`.update`) runs each adapter's rows with that adapter active
  (:func:`activate`), one optimizer step for all of them; :func:`adapter_parameters` gives each
  adapter's parameters (clipped and reported per adapter).

The agents to give adapters are named, not matched: ``lora_per_agent=True`` takes them from
``agent_match`` written as a list of names (``"writer|rewriter"``), and a mapping
``{"writer": "sql", "rewriter": "sql"}`` names agent and adapter both.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym_lightning.llm import ADAPTER_KEY, BASE_ADAPTER, ChatRequest
from agentgym_lightning.policies.base import RewritingPolicy
from agentgym_lightning.policy_request import routed
from agentgym_lightning.trajectory import Status, Step, Trajectory

__all__ = [
    "AgentAdapters", "AdapterRouting", "agent_routes", "add_agent_adapters", "activate", "adapter_parameters",
    "adapter_rollout_metrics", "lora_config", "warn_if_air_reaches_every_adapter", "BASE_ADAPTER",
]

#: What an adapter may be called: it becomes a folder name (``final/adapters/<name>/``) and a
#: vLLM LoRA name.
_ADAPTER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
#: Names PEFT gives a meaning of its own.
_RESERVED = ("default", BASE_ADAPTER)
#: An agent name written in a pattern: letters, digits, ``_`` and ``-`` (no regex syntax).
_LITERAL = re.compile(r"[A-Za-z0-9_-]+")


def agent_routes(lora_per_agent: bool | Mapping[str, str], agent_match: Any) -> dict[str, str] | None:
    """``{agent name: adapter name}`` from the config's ``lora_per_agent`` and ``agent_match``
    (``None`` when ``lora_per_agent`` is off); raises :class:`ValueError` saying what to write."""
    if lora_per_agent is False or lora_per_agent is None:
        return None
    if lora_per_agent is True:
        pattern = agent_match.get("name", agent_match.get("agent")) if isinstance(agent_match, Mapping) and len(agent_match) == 1 else agent_match
        names = pattern.split("|") if isinstance(pattern, str) else []
        if not names or not all(_LITERAL.fullmatch(n) for n in names):
            raise ValueError(
                "lora_per_agent=True gives an adapter to each agent that agent_match names, so agent_match must list "
                f"agent names, 'writer|rewriter' (letters, digits, _ and -); got {agent_match!r}. Or map agents to "
                "adapters: lora_per_agent={'writer': 'writer', 'rewriter': 'rewriter'}"
            )
        routes = {n: n for n in names}
    elif isinstance(lora_per_agent, Mapping):
        routes = {str(k): v for k, v in lora_per_agent.items()}
        if not routes:
            raise ValueError("lora_per_agent maps no agent to an adapter: give {'agent name': 'adapter name', ...} or True")
    else:
        raise ValueError(f"lora_per_agent must be true, false or a mapping agent -> adapter name; got {lora_per_agent!r}")
    for agent, adapter in routes.items():
        if not isinstance(adapter, str) or not _ADAPTER_NAME.fullmatch(adapter) or adapter in _RESERVED or adapter in "lora_":
            raise ValueError(
                f"lora_per_agent: agent {agent!r} maps to the adapter name {adapter!r}; an adapter name is letters, "
                f"digits, _, . and - (it names a folder), and not {' or '.join(_RESERVED)} nor part of 'lora_' "
                "(PEFT finds an adapter's weights by its name)"
            )
    return routes


@dataclass(frozen=True)
class AgentAdapters:
    """Which adapter each agent's calls are generated with and train (see the module docstring).

    Args:
        routes: agent name (a call's ``metadata["agent"]``, else its ``metadata["role"]``) ->
            adapter name.
    """

    routes: Mapping[str, str]

    @classmethod
    def from_config(cls, config: Any) -> AgentAdapters | None:
        """From a run's config (a :class:`~agentgym_lightning.training.run_config.RunConfig`: its
        ``lora_per_agent`` and ``agent_match``); ``None``: off."""
        routes = agent_routes(config.lora_per_agent, config.agent_match)
        return None if routes is None else cls(routes)

    @property
    def names(self) -> tuple[str, ...]:
        """The adapters, each once, in the order their agents are first named."""
        return tuple(dict.fromkeys(self.routes.values()))

    def _agent(self, agent: str | None, role: str | None) -> str | None:
        if agent is not None and agent in self.routes:
            return agent
        if role is not None and role in self.routes:
            return role
        return None

    def agent_of(self, step: Step) -> str | None:
        """The name under which ``step``'s agent has an adapter, or ``None`` (base model, not trained)."""
        return self._agent(step.agent, step.role)

    def adapter_of(self, step: Step) -> str | None:
        """The adapter ``step`` was generated with and trains, or ``None``."""
        agent = self.agent_of(step)
        return None if agent is None else self.routes[agent]

    def trains(self, step: Step) -> bool:
        """Whether ``step``'s agent has an adapter (the other agents' calls run on the base model
        and are not trained)."""
        return self.agent_of(step) is not None

    def adapter_of_request(self, request: ChatRequest) -> str:
        """The adapter to generate ``request`` with (:data:`BASE_ADAPTER` for an agent without one)."""
        agent = self._agent(request.metadata.get("agent"), request.metadata.get("role"))
        if agent is not None:
            return self.routes[agent]
        named = request.metadata.get(ADAPTER_KEY) or request.model
        return named if named in self.names else BASE_ADAPTER


class AdapterRouting(RewritingPolicy):
    """Answers with ``policy``, each request generated with its agent's adapter (it sets
    ``metadata[ADAPTER_KEY]``; the backend does the rest). The trajectory keeps the agent's own
    request: the routing is the generator's business. Has ``submit`` when ``policy`` has; closing
    it closes ``policy``."""

    def __init__(self, policy: Any, adapters: AgentAdapters) -> None:
        super().__init__(policy)
        self.adapters = adapters

    def rewrite(self, request: ChatRequest) -> ChatRequest:
        """``request`` naming the adapter it is generated with."""
        return routed(request, self.adapters.adapter_of_request(request))

    def close(self) -> None:
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()


def lora_config(config: Any) -> Any:
    """PEFT's ``LoraConfig`` from the run's ``lora_*`` options (one adapter's)."""
    from peft import LoraConfig

    targets = config.lora_target_modules
    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        task_type="CAUSAL_LM",
    )


def with_lora(model: Any, lora: Any, adapter_name: str = "default") -> Any:
    """``model`` as a PEFT model with the LoRA adapter ``lora`` named ``adapter_name`` (PEFT's
    ``get_peft_model``).

    PEFT's constructor (0.21, the newest) reads transformers' ``is_gradient_checkpointing``,
    which transformers 5 deprecated for ``is_activation_checkpointing`` with a FutureWarning on
    every run: no argument or API of PEFT's avoids that read (the property cannot be shadowed on
    the instance either), so that one warning, from that one call, is ignored here. (Activation
    checkpointing itself is enabled through the new API: ``models.enable_activation_checkpointing``.)"""
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, lora, adapter_name=adapter_name)


def add_agent_adapters(model: Any, config: Any, names: Sequence[str]) -> Any:
    """``model`` as a PEFT model holding one LoRA adapter per name (the config's ``lora_*``
    options, the same initialisation for each: every agent starts from the base model), all
    trainable, the first active, in eval mode."""
    lora = lora_config(config)
    peft_model = with_lora(model, lora, adapter_name=names[0])
    for name in names[1:]:
        peft_model.add_adapter(name, lora)
    activate(peft_model, names[0], names)
    peft_model.eval()  # generation mode (PEFT routes mixed-adapter batches only there)
    return peft_model


def activate(model: Any, name: str, names: Sequence[str]) -> None:
    """Make ``name`` the adapter the plain forward runs (the update's rows of one agent); every
    adapter of ``names`` stays trainable (PEFT's ``set_adapter`` would freeze the others)."""
    model.set_adapter(name)
    model.set_requires_grad(list(names), requires_grad=True)


def adapter_parameters(model: Any, names: Sequence[str]) -> dict[str, list[Any]]:
    """Each adapter's trainable parameters, by adapter name."""
    out: dict[str, list[Any]] = {name: [] for name in names}
    for param_name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        owner = next((n for n in names if f".{n}." in param_name or param_name.endswith(f".{n}")), None)
        if owner is None:
            raise ValueError(f"the trainable parameter {param_name} belongs to none of the adapters {list(names)}")
        out[owner].append(param)
    return out


def adapter_rollout_metrics(trajectories: Sequence[Trajectory], adapters: AgentAdapters) -> dict[str, float]:
    """Per adapter, over a step's scored episodes: ``adapters/<name>/calls`` (calls generated with
    it, per episode) and ``adapters/<name>/reward`` (the mean return of the episodes in which its
    agents made a call; NaN when none did)."""
    scored = [t for t in trajectories if t.status is not Status.INFRA_FAILED]
    out: dict[str, float] = {}
    for name in adapters.names:
        calls = [sum(1 for s in t.steps if adapters.adapter_of(s) == name) for t in scored]
        returns = [t.total_reward for t, n in zip(scored, calls) if n]
        out[f"adapters/{name}/calls"] = sum(calls) / max(len(scored), 1)
        out[f"adapters/{name}/reward"] = sum(returns) / len(returns) if returns else float("nan")
    return out


def warn_if_air_reaches_every_adapter(config: Any, adapters: AgentAdapters | None) -> None:
    """Warn when adapters train on ``identical`` credit with AIR: every call of an episode then
    gets the whole return, so each adapter learns from the other agents' AIR too."""
    if adapters is None or config.credit != "identical" or not config.air_weights:
        return
    warnings.warn(
        "lora_per_agent with credit 'identical': every call of an episode gets the episode's whole return, so "
        f"each adapter also learns from the AIR of the other agents' calls ({', '.join(sorted(config.air_weights))}); "
        "a verifier trained this way on a solver's calculator AIR learned to answer one digit (docs/training.md, "
        "'An adapter per agent'). --credit discounted --set 'credit_kwargs={\"gamma\": 1.0}' (return-to-go) "
        "keeps an earlier call's AIR off the later agents' calls.",
        UserWarning,
        stacklevel=3,  # the caller of LightningRLTrainer(...)
    )
