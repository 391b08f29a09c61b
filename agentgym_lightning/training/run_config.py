"""``RunConfig``: the options every training run has, typed, defaulted and documented once.

The base of :class:`~agentgym_lightning.training.config.LightningRLConfig` (RL) and
:class:`~agentgym_lightning.training.sft.config.SFTConfig` (SFT, rejection sampling, distillation),
as TRL's configs share ``transformers.TrainingArguments``: the model and its backend, the steps,
the sampling of the run's rollouts, the optimizer, micro-batching, LoRA (or an adapter per agent),
the held-out evaluation, checkpoints and logging. A subclass adds its own fields, restates a
shared one where it means something more specific (:func:`restated`), and defines ``validate``
(from the shared checks below) and what the shared update machinery asks of every run
(:attr:`RunConfig.logprob_temperature`, :attr:`RunConfig.loss_options`,
:attr:`RunConfig.update_iterations`, :attr:`RunConfig.asynchronous`): each config answers for itself.

Every field carries its help (``metadata={"help": ...}``): the commands' flags and ``help(...)``
read it. :class:`DataclassConfig` is what such a config can do besides its fields (a dict, YAML).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from agentgym_lightning.training.agent_adapters import agent_routes
from agentgym_lightning.training.loss_options import LossOptions

__all__ = ["DataclassConfig", "RunConfig", "restated", "BACKENDS", "OPTIMIZERS"]

#: The generators a run can use (``backend``).
BACKENDS = ("hf", "vllm", "vllm-server")
#: The optimizers a run can use (``optim``).
OPTIMIZERS = ("adamw", "adafactor")


class DataclassConfig:
    """What a run's config dataclass can do besides its fields (the config idiom shared by
    :class:`RunConfig`'s subclasses, the RL and the SFT config): a plain dict of it, built
    back from one (unknown keys named), from a YAML file, a validated copy with changes, and each
    field's help. A subclass is a ``@dataclass`` with a ``validate()`` that runs on construction."""

    def validate(self) -> None:  # pragma: no cover - every subclass defines its own
        raise NotImplementedError

    #: The order of :meth:`to_dict`'s keys a subclass keeps (the fields it does not name follow, in
    #: declaration order): a saved config, in every checkpoint's ``trainer_state.json``, reads as it did
    #: before the shared fields moved to :class:`RunConfig` (which put them first).
    _saved_order: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)  # type: ignore[call-overload]
        ordered = {name: values[name] for name in self._saved_order if name in values}
        return {**ordered, **{name: value for name, value in values.items() if name not in ordered}}

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Build from a mapping; unknown keys are an error that lists the valid ones."""
        names = set(cls.field_names())
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown config option(s) {', '.join(unknown)}; valid options: {', '.join(sorted(names))}")
        return cls(**dict(data))

    @staticmethod
    def read_yaml(path: str | Path) -> dict[str, Any]:
        """The YAML file's mapping of option: value, unchecked against any config class (``eval
        --config`` reads any run's recipe through it); raises FileNotFoundError or ValueError that
        name the file."""
        import yaml

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except FileNotFoundError:
            raise FileNotFoundError(f"config file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} is not valid YAML: {exc}") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"{path} must hold a mapping of option: value, not {type(data).__name__}")
        return dict(data)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> Self:
        """Load a YAML mapping of options; ``overrides`` win over the file."""
        return cls.from_dict({**cls.read_yaml(path), **overrides})

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied (validated)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    @classmethod
    def help_of(cls, name: str) -> str:
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name == name:
                return str(f.metadata.get("help", ""))
        raise KeyError(name)


@dataclass
class RunConfig(DataclassConfig):
    """The options every training run has (see the module docstring); a subclass adds its own
    and defines :meth:`validate`, which runs on construction."""

    # ------------------------------------------------------------------ what to train
    env: str = field(
        default="lightning/Arithmetic-v0",
        metadata={
            "help": "Environment to train on: a registered id, `module:Id` (a module that registers `Id` on import) "
            "or `path/to/file.py:make_env` (a function returning an AgentEnv)."
        },
    )
    env_kwargs: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "Keyword arguments for the training env (`gym.make(env, **env_kwargs)`)."}
    )
    model: str = field(
        default="smollm2-135m",
        metadata={"help": "Model: an embedded name (`smollm2-135m`), a local folder, or a Hugging Face id in the local cache."},
    )
    backend: str = field(
        default="hf",
        metadata={
            "help": "Generator: `hf` (transformers; shares the trained model, no copy), `vllm` (in-process "
            "engine, receives the new weights after every update) or `vllm-server` (a running `vllm serve` at "
            "`generator_url`, its weights replaced over HTTP after every update; docs/scaling.md)."
        },
    )
    generator_url: str | None = field(
        default=None,
        metadata={"help": "The generator server's URL for backend `vllm-server` (`http://host:8000`)."},
    )
    policy_kwargs: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "Extra keyword arguments for the policy backend (`device`, `max_batch_size`...)."}
    )
    init_from: str | None = field(
        default=None,
        metadata={
            "help": "Start from another run's trained weights (an SFT run's, docs/improve.md): a run folder (its final/, "
            "else its newest checkpoint), a final/ folder or a checkpoint folder. Full weights load into the model before "
            "any LoRA; a LoRA adapter into this run's adapter (each agent's under lora_per_agent). Weights only: the "
            "optimizer and step start afresh. None: the model's own weights."
        },
    )
    output_dir: str = field(
        default="runs/train", metadata={"help": "Where checkpoints, metrics.jsonl, trajectories.jsonl and the final model go."}
    )

    # ------------------------------------------------------------------ steps, and the sampling of the run's rollouts
    max_steps: int = field(default=20, metadata={"help": "Training steps (each: rollouts, one update, a weight sync)."})
    seed: int = field(default=0, metadata={"help": "Seeds task order, episode resets, call sampling and torch."})
    num_generations: int = field(
        default=4, metadata={"help": "G: episodes per task (the GRPO group); advantages are normalised within it."}
    )
    concurrency: int | None = field(
        default=None, metadata={"help": "Episodes running at once (default: all B*G of the step)."}
    )
    temperature: float = field(
        default=1.0,
        metadata={
            "help": "Sampling temperature of every training call, whatever the agent asked for (RL needs "
            "exploration; the logprobs the loss uses are at this temperature)."
        },
    )
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling of training calls (1.0: off)."})
    max_completion_length: int | None = field(
        default=None,
        metadata={
            "help": "Caps `max_tokens` of every training call (the agent's own limit still applies when lower); "
            "also `dr_grpo`'s normaliser. None: the agent's limit."
        },
    )

    # ------------------------------------------------------------------ which calls are trained, and their rewards
    agent_match: str | dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "Selective / multi-agent training (the paper's `agent_match`): only the calls it matches are "
            "trained, on top of what the env marks trainable. A regular expression matched in full against the "
            "call's agent name or role (`writer|rewriter`), or a mapping of `agent`, `role`, `name`, `variables` "
            "(`agentgym_lightning.agent_match.AgentMatch`). The other calls are still answered and recorded. "
            "None: every trainable call."
        },
    )
    air_weights: dict[str, float] = field(
        default_factory=dict,
        metadata={"help": "Automatic Intermediate Reward weights by source (`{'math.tool_ok': 0.2}`); merged into the env's."},
    )

    # ------------------------------------------------------------------ optimisation
    optim: str = field(
        default="adamw",
        metadata={"help": "`adamw` (torch's AdamW: two fp32 moments per trained weight, twice the weights' memory) or "
                          "`adafactor` (transformers' Adafactor at a fixed learning_rate, no first moment: factored "
                          "second moments, almost no state; the adam_* options unused)."},
    )
    learning_rate: float = field(default=2e-5, metadata={"help": "The optimizer's learning rate."})
    lr_scheduler_type: str = field(default="constant", metadata={"help": "transformers scheduler name (`constant`, `linear`, `cosine`...)."})
    warmup_steps: int = field(default=0, metadata={"help": "Linear warm-up steps of the scheduler."})
    weight_decay: float = field(default=0.0, metadata={"help": "Decoupled weight decay (AdamW's and Adafactor's)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (0: none)."})
    per_device_train_batch_size: int = field(
        default=8, metadata={"help": "Rows per forward/backward (micro-batch); gradients accumulate over the step's rows."}
    )
    micro_batch_tokens: int | None = field(
        default=4096,
        metadata={"help": "Token positions per forward at most: token-tree nodes with packed_update, else padded tokens "
                          "(rows x longest row); a longer row goes alone; None: no limit. Memory grows with it: multi-call "
                          "episodes' long rows would otherwise run out of it."},
    )
    packed_update: bool | str = field(
        default="auto",
        metadata={"help": "Run each micro-batch's rows as one token tree (shared prefixes and identical rows computed once, "
                          "the same loss and gradients; micro_batch_tokens then counts tree nodes): True, False (padded rows), "
                          "or `auto` (the tree when the model's attention takes a custom 4D mask — sdpa, eager — else padded "
                          "rows, with one warning)."},
    )
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Trade compute for memory (off: slower on CPU)."})
    dtype: str = field(default="float32", metadata={"help": "Weights dtype: float32 (CPU default), bfloat16, float16, auto."})
    device: str = field(default="auto", metadata={"help": "`auto` (CUDA when available), `cpu`, `cuda`, `cuda:1`..."})
    num_threads: int | None = field(default=None, metadata={"help": "torch CPU threads (None: torch's default)."})
    check_memory: bool = field(
        default=True,
        metadata={"help": "Refuse, before loading the model, a run whose weights, gradients, optimizer state and generator "
                  "cannot fit the device's free memory per rank, and warn when one micro-batch's estimated activations "
                  "at micro_batch_tokens would not fit beside them (the plan is printed either way; docs/scaling.md)."},
    )

    # ------------------------------------------------------------------ LoRA
    use_peft: bool = field(default=False, metadata={"help": "Train a LoRA adapter instead of every weight."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | str = field(default="all-linear", metadata={"help": "Modules LoRA adapts."})
    lora_per_agent: bool | dict[str, str] = field(
        default=False,
        metadata={
            "help": "A LoRA adapter of its own for each trained agent, on the one base model (implies use_peft). True: "
            "one per agent that agent_match lists (`writer|rewriter`); a mapping agent -> adapter name "
            "(`{'writer': 'sql', 'rewriter': 'sql'}`) lets agents share one. Each call is generated with its agent's "
            "adapter, each adapter trains on its own agent's rows (clipped by max_grad_norm on its own; one optimizer "
            "step for all), metrics come per adapter (`adapters/<name>/...`), and final/adapters/<name>/ holds each. "
            "Agents without an adapter run on the base model, untrained. Needs aggregation `transition`."
        },
    )

    # ------------------------------------------------------------------ evaluation
    eval_env_kwargs: dict[str, Any] | None = field(
        default=None,
        metadata={"help": "Keyword arguments of the held-out eval env (e.g. `{'split': 'test'}`); None: no eval."},
    )
    eval_episodes: int = field(default=32, metadata={"help": "Held-out tasks per evaluation (greedy, one episode each)."})
    eval_steps: int | None = field(default=None, metadata={"help": "Also evaluate every K steps (always before and after)."})
    eval_temperature: float = field(default=0.0, metadata={"help": "Sampling temperature of evaluation (0: greedy)."})
    eval_samples: int = field(
        default=0,
        metadata={
            "help": "k: each evaluation also samples k episodes of every held-out task at the training temperature "
            "and logs eval/pass@1 (their mean success) and eval/pass@k (the share of tasks solved at least once); "
            "0: greedy only."
        },
    )

    # ------------------------------------------------------------------ checkpoints and logging
    save_steps: int = field(default=5, metadata={"help": "Checkpoint every N steps (and at the end, and on Ctrl-C)."})
    save_total_limit: int | None = field(
        default=1,
        metadata={
            "help": "Keep at most this many checkpoints (None: all). One is enough to resume: a new checkpoint is "
            "complete before the older one is removed (a full fine-tune's is weights + Adam's two moments: "
            "1.6 GB for a 135M model in fp32)."
        },
    )
    logging_steps: int = field(default=1, metadata={"help": "Log metrics every N steps."})
    report_to: list[str] = field(
        default_factory=lambda: ["wandb"],
        metadata={"help": "Loggers besides the local metrics.jsonl: `wandb` (offline without an API key), or none."},
    )
    run_name: str | None = field(default=None, metadata={"help": "Name of the run in W&B (default: derived from env and time)."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar."})

    def __post_init__(self) -> None:
        self.validate()

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole run (the run loop's stop rule): ``max_steps``, unless a
        subclass runs several passes of them."""
        return self.max_steps

    # ------------------------------------------------------------------ what the shared machinery asks of a run
    # (the models, the memory plan, the micro-batches and the loss read these; each config answers for itself)

    @property
    def logprob_temperature(self) -> float:
        """The temperature the update computes the trained calls' logprobs at."""
        raise NotImplementedError(f"{type(self).__name__} must say its logprob_temperature")

    @property
    def loss_options(self) -> LossOptions:
        """The update's loss options (its normaliser's ``loss_type``, and ``beta`` > 0: a reference model is kept)."""
        raise NotImplementedError(f"{type(self).__name__} must say its loss_options")

    @property
    def update_iterations(self) -> int:
        """Optimizer passes over each step's rows (more than one recomputes the proximal logprobs)."""
        raise NotImplementedError(f"{type(self).__name__} must say its update_iterations")

    @property
    def asynchronous(self) -> bool:
        """Whether rollouts run on while the update changes the weights (the generator then needs weights of its own)."""
        raise NotImplementedError(f"{type(self).__name__} must say whether it is asynchronous")

    # ------------------------------------------------------------------ what validate() is made of

    def _choose(self, name: str, options: tuple[str, ...]) -> None:
        """Raise unless option ``name`` is one of ``options``."""
        if getattr(self, name) not in options:
            raise ValueError(f"{name} must be one of {', '.join(options)}; got {getattr(self, name)!r}")

    def _at_least(self, name: str, low: float, allow_none: bool = False) -> None:
        """Raise unless option ``name`` is a finite number >= ``low`` (or ``None``, with ``allow_none``)."""
        value = getattr(self, name)
        if value is None and allow_none:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
            raise ValueError(f"{name} must be a number >= {low}; got {value!r}")


    def _check_count(self, name: str, value: Any = None) -> None:
        """Raise unless option ``name`` (or ``value`` checked under its name) is an integer >= 1."""
        value = getattr(self, name) if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
            raise ValueError(f"{name} must be a number >= 1; got {value!r}")
        if not isinstance(value, int):
            raise ValueError(f"{name} must be an integer; got {value!r}")

    def _check_backend(self) -> None:
        """``backend`` is one of :data:`BACKENDS` (a ``vllm-server`` one has its URL)."""
        self._choose("backend", BACKENDS)
        if self.backend == "vllm-server" and not (self.generator_url or dict(self.policy_kwargs or {}).get("generator_url")):
            raise ValueError("backend 'vllm-server' needs generator_url: the running generator's URL (--generator-url http://host:8000; docs/scaling.md)")

    def _check_micro_batches(self) -> None:
        """Concurrency and the micro-batches' bounds."""
        self._at_least("concurrency", 1, allow_none=True)
        self._at_least("micro_batch_tokens", 1, allow_none=True)
        if self.micro_batch_tokens is not None and not isinstance(self.micro_batch_tokens, int):
            raise ValueError(f"micro_batch_tokens must be an integer or None; got {self.micro_batch_tokens!r}")
        if not (isinstance(self.packed_update, bool) or self.packed_update == "auto"):
            raise ValueError(f"packed_update must be true, false or 'auto'; got {self.packed_update!r}")

    def _check_top_p(self) -> None:
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p!r}")

    def _check_mapping(self, name: str) -> None:
        if not isinstance(getattr(self, name), Mapping):
            raise ValueError(f"{name} must be a mapping; got {type(getattr(self, name)).__name__}")

    def _check_air_weights(self) -> None:
        for source, weight in self.air_weights.items():
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise ValueError(f"air_weights[{source!r}] must be a finite number; got {weight!r}")

    def _check_agent_match(self) -> None:
        """``agent_match`` is a pattern or a mapping that parses (a config is saved, a function is not)."""
        if self.agent_match is not None:
            if not isinstance(self.agent_match, (str, Mapping)):
                raise ValueError(
                    f"agent_match must be a regular expression or a mapping (agent/role/name/variables), not "
                    f"{type(self.agent_match).__name__}: the config is saved with every checkpoint, so a function "
                    "filter goes in the env instead (AgentEnv(agent_match=fn))"
                )
            from agentgym_lightning.agent_match import as_agent_match

            as_agent_match(self.agent_match)  # names a bad pattern or key now, not at the first update

    def _check_adapter_routes(self) -> None:
        """``lora_per_agent`` names what to write now (the caller sets ``use_peft``)."""
        agent_routes(self.lora_per_agent, self.agent_match)

    def _check_reporting(self) -> None:
        """The held-out env's kwargs and the loggers (``report_to`` as a list)."""
        if self.eval_env_kwargs is not None and not isinstance(self.eval_env_kwargs, Mapping):
            raise ValueError("eval_env_kwargs must be a mapping or None")
        if isinstance(self.report_to, str):
            self.report_to = [] if self.report_to in ("none", "") else [self.report_to]
        unknown = [r for r in self.report_to if r not in ("wandb",)]
        if unknown:
            raise ValueError(f"report_to accepts 'wandb' (or nothing); got {unknown}")


def restated(name: str, *, help: str | None = None, **default: Any) -> Any:
    """:class:`RunConfig`'s field ``name`` restated in a subclass, with another ``default`` /
    ``default_factory`` or ``help`` where the subclass means something more specific (the field
    keeps its place among the shared ones)."""
    base = {f.name: f for f in dataclasses.fields(RunConfig)}[name]
    if not default:
        default = {"default_factory": base.default_factory} if base.default_factory is not dataclasses.MISSING else {"default": base.default}
    return field(**default, metadata={"help": help if help is not None else base.metadata["help"]})
