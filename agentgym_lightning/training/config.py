"""``LightningRLConfig``: every option of an RL training run, typed, defaulted and documented.

The options every run has (the model, the optimizer, LoRA, evaluation, checkpoints, logging) are
its base's, :class:`~agentgym_lightning.training.run_config.RunConfig`, which the SFT config shares;
the fields here are RL's own.

Names follow TRL's ``GRPOConfig`` (and ``transformers.TrainingArguments``) wherever an option
means the same thing — ``learning_rate``, ``num_generations``, ``beta``, ``epsilon``,
``epsilon_high``, ``loss_type``, ``scale_rewards``, ``importance_sampling_level``,
``max_completion_length``, ``temperature``, ``mask_truncated_completions``, ``save_steps``,
``report_to``... — so a TRL user reads it without a glossary. What is new is what agents need:
the environment, tasks per step, the credit strategy, the aggregation mode, AIR weights.

The defaults are for the embedded SmolLM2-135M on a small CPU: fp32 (bf16 on CPU is ~20x
slower here), no gradient checkpointing, one optimizer step per training step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.judge.config import JudgeConfig
from agentgym_lightning.training.loss_options import LossOptions
from agentgym_lightning.training.run_config import OPTIMIZERS, DataclassConfig, RunConfig

__all__ = ["LightningRLConfig", "DataclassConfig", "RunConfig", "LOSS_TYPES", "AGGREGATIONS"]

#: Loss variants (TRL's names and definitions; see :mod:`agentgym_lightning.training.loss`).
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "cispo")
#: How an episode's LLM calls become training rows.
AGGREGATIONS = ("transition", "trajectory")
_SCALE_REWARDS = ("group", "batch", "none")
_ZERO_VARIANCE = ("skip", "keep")
_EPISODE_WEIGHTING = ("equal", "per_call")
_IS_LEVELS = ("token", "sequence")
_SAMPLING_CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
_AGENT_ADVANTAGES = ("per_agent", "episode")

#: The order of a saved RL config's keys (:meth:`DataclassConfig.to_dict`), as it has always been.
_SAVED_ORDER = (
    "env", "env_kwargs", "model", "backend", "generator_url", "policy_kwargs", "init_from", "output_dir",
    "max_steps", "tasks_per_step", "num_generations", "concurrency", "temperature", "top_p",
    "max_completion_length", "seed", "max_staleness", "dynamic_sampling", "max_sampling_rounds",
    "curriculum_min_attempts", "curriculum_min_pass_rate", "curriculum_max_pass_rate", "task_file",
    "outcome_first", "rollout_workers", "ray_address", "retry_infra_failed", "rollout_worker_timeout",
    "generation_host", "credit", "credit_kwargs", "aggregation", "air_weights", "judge", "scale_rewards",
    "zero_variance_groups", "episode_weighting", "mask_truncated_completions", "agent_match", "loss_type",
    "beta", "use_bias_correction_kl", "epsilon", "epsilon_high", "delta", "importance_sampling_level",
    "num_iterations", "sampling_correction", "sampling_correction_mode", "sampling_correction_clip_max",
    "sampling_correction_clip_min", "optim", "learning_rate", "lr_scheduler_type", "warmup_steps",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "per_device_train_batch_size",
    "micro_batch_tokens", "packed_update", "gradient_checkpointing", "dtype", "device", "num_threads",
    "check_memory", "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_per_agent",
    "agent_advantages", "eval_env_kwargs", "eval_episodes", "eval_steps", "eval_temperature", "eval_samples",
    "save_steps", "save_total_limit", "logging_steps", "report_to", "run_name", "log_episodes", "progress",
)


@dataclass
class LightningRLConfig(RunConfig):
    """Configuration of :class:`~agentgym_lightning.training.trainer.LightningRLTrainer`.

    Build it in Python, from a YAML file (:meth:`from_yaml`), or from the ``train`` command's
    flags; :meth:`validate` runs on construction and names any bad value.
    """

    _saved_order = _SAVED_ORDER

    # ------------------------------------------------------------------ rollouts
    tasks_per_step: int = field(default=4, metadata={"help": "B: distinct tasks per step."})

    max_staleness: int = field(
        default=0,
        metadata={
            "help": "Asynchronous training (k): 0 runs each step's rollouts, then its update (the synchronous loop). "
            "k >= 1 runs rollouts continuously on a thread while the update runs; a step trains on the next "
            "tasks_per_step finished groups none of whose calls was answered more than k policy versions before "
            "the version being updated (staler groups are dropped and counted). Every backend (hf, vllm, "
            "vllm-server), in this process or on rollout_workers Ray actors (docs/training.md, \"Asynchronous training\")."
        },
    )

    # ------------------------------------------------------------------ which groups a step trains on
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO's dynamic sampling: a step keeps drawing new tasks until it has tasks_per_step groups whose "
            "rewards vary (the rest carry no gradient), or max_sampling_rounds is spent (said in sampling/bound_hit). "
            "False: one draw of tasks_per_step tasks, zero-variance groups skipped (zero_variance_groups). "
            "docs/training.md, \"Groups with signal\"."
        },
    )
    max_sampling_rounds: int = field(
        default=4,
        metadata={
            "help": "dynamic_sampling's bound: draws a step may make (the first included); with max_staleness >= 1, "
            "the step examines at most this many times tasks_per_step finished groups."
        },
    )
    curriculum_min_attempts: int = field(
        default=0,
        metadata={
            "help": "Online difficulty filtering: once a task has been attempted this many times, it is no longer "
            "drawn while its pass rate is above curriculum_max_pass_rate or below curriculum_min_pass_rate "
            "(0: every task is drawn). Pass rates are kept for every task the run draws from a task list (a task "
            "function's tasks never come again), in its checkpoints."
        },
    )
    curriculum_min_pass_rate: float = field(
        default=0.0, metadata={"help": "Tasks solved less often than this (after curriculum_min_attempts) are not drawn again."}
    )
    curriculum_max_pass_rate: float = field(
        default=1.0, metadata={"help": "Tasks solved more often than this (after curriculum_min_attempts) are not drawn again."}
    )
    task_file: str | None = field(
        default=None,
        metadata={
            "help": "Train on these tasks instead of the env's: a JSONL file of {\"task\": ...} lines, such as "
            "`eval --pass-rates FILE` writes; a line's `attempts` and `successes` seed the task's pass rate. A line "
            "may name its task by `key` alone (`pass-rates --keys-only`), looked up among the env's tasks."
        },
    )
    outcome_first: bool = field(
        default=False,
        metadata={
            "help": "Shaping never outranks the outcome: within each group, an episode's shaping rewards (AIR and "
            "any reward besides the final one) are scaled down until they cannot reorder two episodes whose final "
            "rewards differ; they still break ties among equal outcomes. dynamic_sampling then looks for groups "
            "whose final rewards vary. docs/training.md, \"Outcome first\"."
        },
    )

    # ------------------------------------------------------------------ rollouts past one machine (Ray)
    rollout_workers: int = field(
        default=0,
        metadata={
            "help": "Ray actors that run the step's episodes (0: in this process). Each gets whole GRPO groups and "
            "its own envs and agents; their LLM calls come back to this trainer's generator, served over HTTP "
            "and batched across workers (`agentgym_lightning.rollouts.ray_workers`). Needs the `ray` extra."
        },
    )
    ray_address: str | None = field(
        default=None, metadata={"help": "Ray cluster to place the workers on (`auto`, `ray://head:10001`); None: a local Ray."}
    )
    retry_infra_failed: bool = field(
        default=False,
        metadata={"help": "Run again, once, the episodes lost with a rollout worker that died (else they stay infra_failed)."},
    )
    rollout_worker_timeout: float = field(
        default=600.0, metadata={"help": "Seconds a rollout worker may go without finishing an episode before it is deemed hung and killed."}
    )
    generation_host: str = field(
        default="127.0.0.1",
        metadata={
            "help": "Address the generator is served on for the rollout workers (127.0.0.1 for a local Ray; a "
            "reachable address, with a generated token, for workers on other machines)."
        },
    )

    # ------------------------------------------------------------------ from episodes to samples
    credit: str = field(
        default="identical",
        metadata={"help": "Credit-assignment strategy (a plugin): `identical` (LightningRL), `discounted`, `final-only`..."},
    )
    credit_kwargs: dict[str, Any] = field(default_factory=dict, metadata={"help": "Parameters of the strategy (`gamma`...)."})
    aggregation: str = field(
        default="transition",
        metadata={
            "help": "`transition`: every trainable call is one row (LightningRL). `trajectory`: consecutive calls "
            "whose prompt extends the previous prompt+completion merge into one row (tokens the model did not "
            "generate are masked out), falling back to a new row where it does not."
        },
    )
    judge: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "An LLM judge's options (`JudgeConfig` fields: `base_url`, `model`, `mode`, `rubric`, `weight`...): "
            "each group's episodes are scored by one judge call, and the score is the final reward (mixed with the "
            "env's by `weight`). None: the env's reward alone. docs/judge.md."
        },
    )
    scale_rewards: str = field(
        default="group",
        metadata={"help": "Divide advantages by the std of the task's group (`group`, GRPO), of the whole step (`batch`), or not (`none`, Dr. GRPO)."},
    )
    zero_variance_groups: str = field(
        default="skip",
        metadata={
            "help": "Groups whose episodes tie (the same returns, or the same episode-level values) carry no signal, "
            "whatever values their calls got: `skip` drops their rows from the update (saves compute), `keep` trains "
            "them with advantage 0 (they still count in the normaliser)."
        },
    )
    episode_weighting: str = field(
        default="equal",
        metadata={
            "help": "`equal`: each episode's rows share one unit of weight, so an episode with more calls does not "
            "weigh more (Agent Lightning v1). `per_call`: every row weighs 1."
        },
    )
    mask_truncated_completions: bool = field(
        default=False, metadata={"help": "Leave completions cut by the token limit (`finish_reason == 'length'`) out of the loss."}
    )

    # ------------------------------------------------------------------ the loss (TRL's definitions)
    loss_type: str = field(default="dapo", metadata={"help": f"One of {', '.join(LOSS_TYPES)} (TRL's definitions)."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient against the initial model: the run's starting weights, init_from's adapters included (0: no reference model is kept)."})
    use_bias_correction_kl: bool = field(
        default=True, metadata={"help": "Multiply the KL term by the policy ratio (TRL's default: the unbiased reverse-KL gradient)."}
    )
    epsilon: float = field(default=0.2, metadata={"help": "Lower clipping bound of the ratio (1 - epsilon)."})
    epsilon_high: float | None = field(
        default=None, metadata={"help": "Upper clipping bound (1 + epsilon_high); default: epsilon. For `cispo`, the ratio cap."}
    )
    delta: float | None = field(default=None, metadata={"help": "Two-sided clipping: cap the unclipped ratio at delta."})
    importance_sampling_level: str = field(
        default="token", metadata={"help": "Policy ratio per `token` (GRPO) or per `sequence` (GSPO)."}
    )
    num_iterations: int = field(
        default=1, metadata={"help": "Optimizer passes over each step's samples (mu in the GRPO paper); >1 recomputes old logprobs."}
    )
    sampling_correction: bool = field(
        default=True,
        metadata={
            "help": "Correct for the generator's sampling distribution differing from the trained model's (TRL's "
            "`vllm_importance_sampling_correction`, here for any generator) and for calls answered by older weights "
            "(AReaL's decoupled objective): multiply the loss by the behaviour weight exp(proximal - sampling "
            "logprob), truncated or masked. Off, stale rollouts go uncorrected."
        },
    )
    sampling_correction_mode: str = field(
        default="token_truncate", metadata={"help": f"One of {', '.join(_SAMPLING_CORRECTION_MODES)} (TRL's `vllm_importance_sampling_mode`)."}
    )
    sampling_correction_clip_max: float | None = field(default=3.0, metadata={"help": "Upper bound of the correction ratio."})
    sampling_correction_clip_min: float | None = field(default=None, metadata={"help": "Lower bound of the correction ratio."})

    # ------------------------------------------------------------------ LoRA per agent
    agent_advantages: str = field(
        default="per_agent",
        metadata={
            "help": "With lora_per_agent: `per_agent` normalises each agent's advantages among the group's episodes in "
            "which that agent made calls (an agent that runs in some episodes only, a rewriter, is compared with "
            "itself); `episode` gives every call its episode's advantage, shared by all agents."
        },
    )

    # ------------------------------------------------------------------ logging
    log_episodes: int = field(default=4, metadata={"help": "Sample episodes per logged step in the W&B table."})

    # ------------------------------------------------------------------ checks

    def validate(self) -> None:
        """Raise :class:`ValueError` naming the first bad option and what it accepts (the checks
        below, in this order)."""
        self._check_choices()
        self._check_counts()
        self._check_rollouts()
        self._check_bounds()
        self._check_curriculum()
        self._check_sampling_and_loss()
        self._check_mappings()
        self._check_agents()
        self._check_reporting()

    def _check_choices(self) -> None:
        """Each option with choices holds one of them (a ``vllm-server`` backend, its URL too)."""
        self._check_backend()
        self._choose("aggregation", AGGREGATIONS)
        self._choose("loss_type", LOSS_TYPES)
        self._choose("scale_rewards", _SCALE_REWARDS)
        self._choose("zero_variance_groups", _ZERO_VARIANCE)
        self._choose("episode_weighting", _EPISODE_WEIGHTING)
        self._choose("importance_sampling_level", _IS_LEVELS)
        self._choose("sampling_correction_mode", _SAMPLING_CORRECTION_MODES)
        self._choose("agent_advantages", _AGENT_ADVANTAGES)
        self._choose("optim", OPTIMIZERS)

    def _check_counts(self) -> None:
        """The counts (steps, tasks, rows, the group)."""
        for name in ("max_steps", "tasks_per_step", "per_device_train_batch_size", "num_iterations", "logging_steps", "save_steps", "eval_episodes", "lora_r"):
            self._check_count(name)
        if not isinstance(self.num_generations, int) or self.num_generations < 2:
            raise ValueError(
                f"num_generations (the group size) must be an integer >= 2: advantages compare episodes of the "
                f"same task, so one episode per task learns nothing; got {self.num_generations!r}"
            )

    def _check_rollouts(self) -> None:
        """Concurrency, micro-batches, the Ray workers and asynchronous training."""
        self._check_micro_batches()
        self._at_least("rollout_workers", 0)
        if not isinstance(self.rollout_workers, int):
            raise ValueError(f"rollout_workers must be an integer; got {self.rollout_workers!r}")
        self._at_least("rollout_worker_timeout", 1.0)
        self._at_least("max_staleness", 0)
        if not isinstance(self.max_staleness, int):
            raise ValueError(f"max_staleness must be an integer; got {self.max_staleness!r}")
        if self.max_staleness:
            self._check_async()

    def _check_bounds(self) -> None:
        """The numbers' lower bounds."""
        self._at_least("max_completion_length", 1, allow_none=True)
        self._at_least("eval_steps", 1, allow_none=True)
        self._at_least("num_threads", 1, allow_none=True)
        self._at_least("save_total_limit", 1, allow_none=True)
        self._at_least("learning_rate", 0.0)
        self._at_least("beta", 0.0)
        self._at_least("epsilon", 0.0)
        self._at_least("epsilon_high", 0.0, allow_none=True)
        self._at_least("delta", 1.0, allow_none=True)
        self._at_least("max_grad_norm", 0.0)
        self._at_least("warmup_steps", 0)
        self._at_least("weight_decay", 0.0)
        self._at_least("eval_temperature", 0.0)
        self._at_least("log_episodes", 0)
        self._at_least("eval_samples", 0)
        self._at_least("max_sampling_rounds", 1)
        self._at_least("curriculum_min_attempts", 0)

    def _check_curriculum(self) -> None:
        """The task sampling: dynamic sampling and the curriculum."""
        for name in ("eval_samples", "max_sampling_rounds", "curriculum_min_attempts"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"{name} must be an integer; got {getattr(self, name)!r}")
        for name in ("curriculum_min_pass_rate", "curriculum_max_pass_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a pass rate in [0, 1]; got {value!r}")
        if self.curriculum_min_pass_rate > self.curriculum_max_pass_rate:
            raise ValueError(
                f"curriculum_min_pass_rate ({self.curriculum_min_pass_rate}) is above curriculum_max_pass_rate "
                f"({self.curriculum_max_pass_rate}): no task could be drawn"
            )
        if self.curriculum_min_attempts and self.max_staleness:
            raise ValueError(
                "curriculum_min_attempts filters the tasks a step draws, which max_staleness >= 1 draws ahead of the "
                "pass rates it would need: use max_staleness 0 with the curriculum (dynamic_sampling works with both)"
            )

    def _check_sampling_and_loss(self) -> None:
        """The training calls' sampling and the loss's own needs."""
        if not (isinstance(self.temperature, (int, float)) and 0.0 < self.temperature <= 2.0):
            raise ValueError(f"temperature must be in (0, 2] (training samples; 0 would make every group identical); got {self.temperature!r}")
        self._check_top_p()
        if self.sampling_correction_clip_max is not None and self.sampling_correction_clip_max <= 0:
            raise ValueError("sampling_correction_clip_max must be > 0 or None")
        if self.loss_type == "cispo" and self.epsilon_high is None:
            raise ValueError("loss_type 'cispo' caps the ratio at epsilon_high: set it (the CISPO paper uses 5.0)")
        if self.loss_type == "dr_grpo" and self.max_completion_length is None:
            raise ValueError("loss_type 'dr_grpo' normalises by max_completion_length: set it")

    def _check_mappings(self) -> None:
        """Options that are mappings: kwargs, AIR weights, the judge."""
        for name in ("env_kwargs", "policy_kwargs", "credit_kwargs", "air_weights"):
            self._check_mapping(name)
        if self.judge is not None:
            if not isinstance(self.judge, Mapping):
                raise ValueError(f"judge must be a mapping of JudgeConfig options or None; got {type(self.judge).__name__}")
            JudgeConfig.from_dict(self.judge)  # names a bad option now, not at the first step
        self._check_air_weights()

    def _check_agents(self) -> None:
        """Which agents train, and their adapters (``lora_per_agent`` implies ``use_peft``)."""
        self._check_agent_match()
        if self.lora_per_agent is not False:
            self._check_adapter_routes()
            if self.aggregation != "transition":
                raise ValueError(
                    "lora_per_agent trains each adapter on its own agent's rows, and a `trajectory` row merges the calls "
                    "of several agents: use aggregation 'transition'"
                )
            self.use_peft = True

    def _check_async(self) -> None:
        """What asynchronous training (``max_staleness`` >= 1) runs with; a clear refusal for the rest."""
        if self.lora_per_agent is not False and self.backend != "hf":
            raise ValueError(
                f"max_staleness >= 1 with lora_per_agent runs on the hf backend, not {self.backend!r}: a vLLM generator drops an "
                "adapter's previous version at each sync, under the calls still running on it. Use backend hf, or max_staleness 0"
            )
        if not self.sampling_correction:
            # The behaviour weight exp(proximal - behaviour) is what corrects stale calls (training/loss.py).
            raise ValueError(
                "max_staleness >= 1 trains on calls answered by older weights, which the sampling correction "
                "corrects for (the decoupled objective): set sampling_correction true, or max_staleness 0"
            )

    # ------------------------------------------------------------------ what the shared machinery asks of a run

    @property
    def logprob_temperature(self) -> float:
        """``temperature``: the loss's logprobs are the sampling distribution's, which the ratios compare."""
        return self.temperature

    @property
    def loss_options(self) -> LossOptions:
        """The policy loss's options, as this config sets them."""
        return LossOptions(
            loss_type=self.loss_type,
            beta=self.beta,
            use_bias_correction_kl=self.use_bias_correction_kl,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_upper,
            delta=self.delta,
            importance_sampling_level=self.importance_sampling_level,
            sampling_correction=self.sampling_correction,
            sampling_correction_mode=self.sampling_correction_mode,
            sampling_correction_clip_min=self.sampling_correction_clip_min,
            sampling_correction_clip_max=self.sampling_correction_clip_max,
        )

    @property
    def update_iterations(self) -> int:
        """``num_iterations``: GRPO's mu passes over a step's rows."""
        return self.num_iterations

    @property
    def asynchronous(self) -> bool:
        """``max_staleness`` >= 1: rollouts run on a thread while the update runs."""
        return bool(self.max_staleness)

    # ------------------------------------------------------------------ derived values

    @property
    def episodes_per_step(self) -> int:
        """B * G."""
        return self.tasks_per_step * self.num_generations

    @property
    def epsilon_low(self) -> float:
        return self.epsilon

    @property
    def epsilon_upper(self) -> float:
        """The upper clipping bound's epsilon (``epsilon_high``, defaulting to ``epsilon``)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

