"""``SFTConfig``: every option of a supervised fine-tuning run, typed, defaulted and documented.

The same idiom as :class:`~agentgym_lightning.training.config.LightningRLConfig` (a dataclass
whose fields carry their help, validated on construction, from YAML or flags, saved with every
checkpoint), and the same base: the model, its backend, the optimizer, LoRA (or an adapter per
agent), micro-batching, evaluation, checkpoints and logging are
:class:`~agentgym_lightning.training.run_config.RunConfig`'s fields, restated here only where SFT
means something more specific (:func:`~agentgym_lightning.training.run_config.restated`), so the
two commands read alike and a value means one thing. What is SFT's own: the sources and which of their episodes
are chosen (``min_reward``, ``top_k``, ``success_only``, ``agent_match``), how many rows a step
trains on, whether to re-tokenize (a teacher's text), and the rounds of rollouts (rejection
sampling; with a ``teacher``, distillation).

The shared update machinery (the models, the memory plan, the token-tree micro-batches) reads
this config itself: the shared fields as they are, and what it asks of every run
(:attr:`SFTConfig.logprob_temperature`, :attr:`SFTConfig.loss_options`, ...) answered at SFT's
values; SFT is the same update with another loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.training.loss_options import LossOptions
from agentgym_lightning.training.run_config import OPTIMIZERS, RunConfig, restated

__all__ = ["SFTConfig", "RETOKENIZE", "SFT_RUN_IDENTITY"]

#: When a call's text is tokenized again with the student's chat template.
RETOKENIZE = ("auto", "always", "never")

#: Config fields that decide what an SFT run computes: a resumed run must not change them.
SFT_RUN_IDENTITY = (
    "sources", "min_reward", "top_k", "success_only", "agent_match", "retokenize", "env", "env_kwargs", "model", "seed", "max_steps",
    "rows_per_step", "rounds", "tasks_per_round", "num_generations", "temperature", "top_p", "max_completion_length", "air_weights",
    "teacher", "use_peft", "lora_r", "lora_alpha", "lora_target_modules", "lora_per_agent", "learning_rate", "optim", "init_from",
)

#: The order of a saved SFT config's keys (:meth:`~agentgym_lightning.training.run_config.DataclassConfig.to_dict`), as it has always been.
_SAVED_ORDER = (
    "sources", "min_reward", "top_k", "success_only", "agent_match", "retokenize", "model", "backend",
    "generator_url", "policy_kwargs", "init_from", "output_dir", "max_steps", "rows_per_step", "seed", "rounds",
    "tasks_per_round", "num_generations", "teacher", "concurrency", "temperature", "top_p",
    "max_completion_length", "air_weights", "env", "env_kwargs", "optim", "learning_rate", "lr_scheduler_type",
    "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
    "per_device_train_batch_size", "micro_batch_tokens", "packed_update", "gradient_checkpointing", "dtype",
    "device", "num_threads", "check_memory", "use_peft", "lora_r", "lora_alpha", "lora_dropout",
    "lora_target_modules", "lora_per_agent", "eval_env_kwargs", "eval_episodes", "eval_steps",
    "eval_temperature", "eval_samples", "save_steps", "save_total_limit", "logging_steps", "report_to",
    "run_name", "progress",
)


@dataclass
class SFTConfig(RunConfig):
    """Configuration of :class:`~agentgym_lightning.training.sft.trainer.SFTTrainer`.

    Build it in Python, from a YAML file (:meth:`from_yaml`), or from the ``sft`` command's flags;
    :meth:`validate` runs on construction and names any bad value."""

    _saved_order = _SAVED_ORDER

    # ------------------------------------------------------------------ what to learn from
    sources: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Episodes to learn from: run folders (their trajectories/ and rollouts/; never eval/, the held-out episodes) or trajectory "
            "JSONL files (what `eval --output` writes). May be empty when `rounds` roll episodes out."
        },
    )
    min_reward: float | None = field(
        default=None, metadata={"help": "Keep episodes whose return (final reward plus AIR and emitted rewards) is at least this."}
    )
    top_k: int | None = field(
        default=None, metadata={"help": "Keep at most the K best episodes (by return) of each task (None: all that pass)."}
    )
    success_only: bool = field(
        default=False, metadata={"help": "Keep only successful episodes (status succeeded and a positive final reward)."}
    )
    agent_match: str | dict[str, Any] | None = restated(
        "agent_match",
        help="Which calls of a kept episode are trained (the RL config's `agent_match`): a regular expression matched in "
        "full against the call's agent name or role (`writer|rewriter`), or a mapping of `agent`, `role`, `name`, "
        "`variables`. None: every trainable call.",
    )
    retokenize: str = field(
        default="auto",
        metadata={
            "help": "Tokenize a call again with the student's chat template: `auto` (the calls recorded without token ids: "
            "an API backend's, a teacher's), `always` (every call: a teacher with a tokenizer of its own that returned its "
            "ids), `never` (such calls are skipped). The one place text is re-tokenized; each such row says so."
        },
    )

    # ------------------------------------------------------------------ the run folder
    output_dir: str = restated("output_dir", default="runs/sft", help="Where checkpoints, metrics.jsonl, the rows, rollouts and the final model go.")

    # ------------------------------------------------------------------ the steps
    max_steps: int = restated(
        "max_steps", default=20,
        help="Optimizer steps per round (with `rounds` 0: of the run), each on `rows_per_step` rows of the chosen episodes.",
    )
    rows_per_step: int = field(
        default=16,
        metadata={"help": "Rows (one trained LLM call each) per optimizer step, walked in epochs of a seeded permutation."},
    )
    seed: int = restated("seed", help="Seeds the rows' order, the rounds' tasks and sampling, and torch.")

    # ------------------------------------------------------------------ rounds: rejection sampling, distillation
    rounds: int = field(
        default=0,
        metadata={
            "help": "Rounds of rollouts (0: none, learn from `sources` alone). Each round rolls `tasks_per_round` x "
            "`num_generations` episodes out with the current student (rejection sampling) or the `teacher` "
            "(distillation), adds them to the pool, keeps the best as chosen, and trains `max_steps` steps."
        },
    )
    tasks_per_round: int = field(default=24, metadata={"help": "Distinct tasks each round rolls out."})
    num_generations: int = restated("num_generations", default=8, help="Episodes per task in a round (1 or more).")
    teacher: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "Roll the rounds out with an OpenAI-compatible teacher instead of the student (distillation): the "
            "`openai` backend's options, `base_url` and optionally `model`, `api_key`, `max_concurrency`. Its text is "
            "re-tokenized with the student's chat template (`retokenize`)."
        },
    )
    concurrency: int | None = restated("concurrency", help="Episodes running at once in a round (default: all of it).")
    temperature: float = restated("temperature", help="Sampling temperature of the rounds' calls (the loss is at temperature 1).")
    max_completion_length: int | None = restated("max_completion_length", help="Caps `max_tokens` of every call of a round or evaluation.")
    air_weights: dict[str, float] = restated("air_weights", help="AIR weights of the rounds' env (their returns choose the episodes).")
    env: str = restated("env", help="The environment the rounds roll out and the held-out evaluation runs on.")
    env_kwargs: dict[str, Any] = restated("env_kwargs", help="Keyword arguments of the rounds' env (`gym.make(env, **env_kwargs)`).")

    # ------------------------------------------------------------------ evaluation, checkpoints (the rest: RunConfig's)
    eval_steps: int | None = restated("eval_steps", help="Also evaluate every K steps (always before, after each round, and at the end).")
    save_steps: int = restated("save_steps", help="Checkpoint every N steps (and at the end of each round, and on Ctrl-C).")

    def validate(self) -> None:
        """Raise :class:`ValueError` naming the first bad option and what it accepts: SFT's own
        options, the rounds' temperature, then the shared fields (:meth:`_check_shared`)."""
        if isinstance(self.sources, str):
            self.sources = [self.sources]
        if not isinstance(self.sources, list) or not all(isinstance(s, str) for s in self.sources):
            raise ValueError(f"sources must be a list of paths; got {self.sources!r}")
        for name, low in (("rows_per_step", 1), ("tasks_per_round", 1), ("num_generations", 1), ("rounds", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None; got {self.top_k!r}")
        if self.min_reward is not None and (isinstance(self.min_reward, bool) or not isinstance(self.min_reward, (int, float))
                                            or not math.isfinite(self.min_reward)):
            raise ValueError(f"min_reward must be a finite number or None; got {self.min_reward!r}")
        if self.retokenize not in RETOKENIZE:
            raise ValueError(f"retokenize must be one of {', '.join(RETOKENIZE)}; got {self.retokenize!r}")
        if self.teacher is not None:
            if not isinstance(self.teacher, Mapping) or not self.teacher.get("base_url"):
                raise ValueError(f"teacher must be a mapping with a base_url (the OpenAI-compatible endpoint); got {self.teacher!r}")
            if self.rounds < 1:
                raise ValueError("a teacher rolls the rounds out: set rounds >= 1 (--rounds 1 distills once)")
        if not self.sources and self.rounds < 1:
            raise ValueError("nothing to learn from: give sources (run folders or trajectory JSONL files) or rounds >= 1 to roll episodes out")
        if not (isinstance(self.temperature, (int, float)) and 0.0 < self.temperature <= 2.0):
            raise ValueError(f"temperature must be in (0, 2] (the rounds' sampling); got {self.temperature!r}")
        self._check_shared()

    def _check_shared(self) -> None:
        """:class:`~agentgym_lightning.training.run_config.RunConfig`'s fields, checked with the
        RL config's messages and in its order (``max_steps``: the whole run's steps), so that a bad
        shared value reads the same from either command."""
        self._check_backend()
        self._choose("optim", OPTIMIZERS)
        self._check_count("max_steps", self.total_steps)
        for name in ("per_device_train_batch_size", "logging_steps", "save_steps", "eval_episodes", "lora_r"):
            self._check_count(name)
        self._check_micro_batches()
        for name, low, allow_none in (
            ("max_completion_length", 1, True), ("eval_steps", 1, True), ("num_threads", 1, True), ("save_total_limit", 1, True),
            ("learning_rate", 0.0, False), ("max_grad_norm", 0.0, False), ("warmup_steps", 0, False), ("weight_decay", 0.0, False),
            ("eval_temperature", 0.0, False), ("eval_samples", 0, False),
        ):
            self._at_least(name, low, allow_none=allow_none)
        if not isinstance(self.eval_samples, int):
            raise ValueError(f"eval_samples must be an integer; got {self.eval_samples!r}")
        self._check_top_p()
        for name in ("env_kwargs", "policy_kwargs", "air_weights"):
            self._check_mapping(name)
        self._check_air_weights()
        self._check_agent_match()
        if self.lora_per_agent is not False:
            self._check_adapter_routes()
            self.use_peft = True
        self._check_reporting()

    # ------------------------------------------------------------------ derived values

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole run: ``max_steps`` per round (one pass without rounds)."""
        return self.max_steps * max(self.rounds, 1)

    # ------------------------------------------------------------------ what the shared machinery asks of an SFT run

    @property
    def logprob_temperature(self) -> float:
        """1: the loss is the model's own likelihood of the chosen tokens (``temperature`` is the rounds' sampling)."""
        return 1.0

    @property
    def loss_options(self) -> LossOptions:
        """A token-sum normaliser (``dapo``'s: the step's token mean), no KL term (so no reference model), no
        sampling correction: the only options :func:`~agentgym_lightning.training.loss.sft_loss` and its normaliser read."""
        return LossOptions(loss_type="dapo", beta=0.0, sampling_correction=False)

    @property
    def update_iterations(self) -> int:
        """1: one pass over a step's rows (there is no proximal policy to recompute)."""
        return 1

    @property
    def asynchronous(self) -> bool:
        """False: the rounds roll out between steps, never during an update."""
        return False
