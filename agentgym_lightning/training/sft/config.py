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

:meth:`SFTConfig.update_config` is the view the shared update reads (the models, the token-tree
micro-batches): the shared fields as they are and the RL loss's knobs fixed at SFT's values; SFT is
the same update with another loss.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.training.config import LightningRLConfig
from agentgym_lightning.training.run_config import RunConfig, restated

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
        """Raise :class:`ValueError` naming the first bad option and what it accepts. The shared
        fields are checked by the RL config they are handed to (:meth:`update_config`)."""
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
        self.update_config()  # the shared fields, checked as the RL config checks them
        if isinstance(self.report_to, str):
            self.report_to = [] if self.report_to in ("none", "") else [self.report_to]
        if self.lora_per_agent is not False:
            self.use_peft = True

    # ------------------------------------------------------------------ derived values

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole run: ``max_steps`` per round (one pass without rounds)."""
        return self.max_steps * max(self.rounds, 1)

    def update_config(self) -> LightningRLConfig:
        """The RL config the shared machinery reads (the generator and trained model, LoRA,
        adapters, the optimizer, the token-tree micro-batches): this config's shared fields, the
        logprobs at temperature 1, a token-sum normaliser (``dapo``'s: the step's token mean), one
        iteration, no reference model, no sampling correction."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(RunConfig)}
        shared.update(
            temperature=1.0,
            num_generations=max(2, self.num_generations),
            tasks_per_step=self.tasks_per_round,
            loss_type="dapo",
            num_iterations=1,
            beta=0.0,
            sampling_correction=False,
            max_steps=self.total_steps,
        )
        if not (isinstance(self.temperature, (int, float)) and 0.0 < self.temperature <= 2.0):
            raise ValueError(f"temperature must be in (0, 2] (the rounds' sampling); got {self.temperature!r}")
        return LightningRLConfig(**shared)
