"""Supervised fine-tuning on chosen episodes: SFT, rejection sampling and distillation, one loop.

Each round (one, without ``rounds``):

1. **Episodes.** The pool is the ``sources``' episodes (run folders, trajectory files) plus, with
   ``rounds``, every round's rollouts so far: ``tasks_per_round`` tasks (a function of the seed and
   the round, :class:`~agentgym_lightning.rollouts.schedule.TaskSchedule`) times
   ``num_generations`` episodes, rolled out with the current student — *rejection sampling* — or
   with an OpenAI-compatible ``teacher`` — *distillation* — and written to
   ``rollouts/round-NN.jsonl``.
2. **Choice.** The best are kept (:mod:`.episodes`: ``success_only``, ``min_reward``, ``top_k``
   per task) and their trained calls become rows (:mod:`.rows`: ``agent_match``, adapters; a
   teacher's text re-tokenized once, :mod:`.retokenize`), written to ``rows/round-NN.jsonl``.
3. **Steps.** ``max_steps`` optimizer steps of ``rows_per_step`` rows each, walked in epochs of a
   seeded permutation (so a resumed run takes the same rows), the negative log-likelihood of the
   completion tokens (:func:`~agentgym_lightning.training.loss.sft_loss`) through the same update as
   RL: the token-tree micro-batches (shared prefixes once) and the optimizer loop of
   :mod:`~agentgym_lightning.training.update`, full weights, LoRA or an adapter per agent.

The run folder is ``train``'s: ``metrics.jsonl`` (and W&B) through the same hooks, checkpoints
every ``save_steps`` and at each round's end (``--resume`` continues exactly: a finished round's
rollouts are read back, not rolled again), the held-out ``eval/`` before, every ``eval_steps``,
after each round and at the end, ``final/`` (``train --init-from`` starts RL from it) and the report.

::

    from agentgym_lightning.training.sft import SFTConfig, SFTTrainer

    SFTTrainer(SFTConfig(sources=["runs/main"], top_k=1, min_reward=1.0, output_dir="runs/sft")).train()
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.failed_episodes import check_episodes_ran
from agentgym_lightning.memory import release_freed_memory
from agentgym_lightning.metrics import episode_metrics
from agentgym_lightning.rollouts.in_process import InProcessRollouts
from agentgym_lightning.training.env_factories import held_out_env_factory, training_env_factory
from agentgym_lightning.training.generation import SamplingOverride
from agentgym_lightning.training.memory_plan import check_run_memory
from agentgym_lightning.training.run import RunLoop
from agentgym_lightning.training.run_checkpoints import RunCheckpoints
from agentgym_lightning.training.samples import Sample
from agentgym_lightning.rollouts.schedule import TaskSchedule
from agentgym_lightning.training.sft.config import SFT_RUN_IDENTITY, SFTConfig
from agentgym_lightning.training.sft.episodes import choose_episodes, load_sources, nothing_chosen
from agentgym_lightning.training.sft.rows import row_record, sft_rows
from agentgym_lightning.training.update import MicroBatches, optimize, packed_update
from agentgym_lightning.trajectory import Trajectory, TrajectoryWriter, load_trajectories

__all__ = ["SFTTrainer"]

#: The update's statistics that mean something for SFT (the policy loss's clip and ratio ones do not).
_SFT_METRICS = ("loss", "grad_norm", "entropy", "learning_rate", "update/nonfinite_skipped", "update/tokens/forward",
                "update/tokens/unique", "update/packed")


class SFTTrainer(RunLoop):
    """Fine-tunes the policy of an environment's agent on chosen episodes (see the module docstring).

    The loop around each step (resume, hooks, progress, evaluations, checkpoints, close) is
    :class:`~agentgym_lightning.training.run.RunLoop`'s; this class supplies the rounds' rows and
    the step on them.

    Args:
        config: The run's options (:class:`~agentgym_lightning.training.sft.config.SFTConfig`).
        env: The rounds' env: an id or a factory returning an
            :class:`~agentgym_lightning.env.AgentEnv` (default: ``config.env`` with ``config.env_kwargs``).
        policy: The student's generator (default: built from ``config.backend`` and ``config.model``).
        eval_env: The held-out env (default: ``config.env`` with ``config.eval_env_kwargs``; none when that is ``None``).
        teacher: The policy that rolls the rounds out instead of the student (default: the
            ``openai`` backend at ``config.teacher``'s ``base_url``, when given).
    """

    config: SFTConfig

    def __init__(
        self,
        config: SFTConfig,
        *,
        env: str | Callable[[], AgentEnv] | None = None,
        policy: Any = None,
        eval_env: str | Callable[[], AgentEnv] | None = None,
        teacher: Any = None,
    ) -> None:
        super().__init__(config)
        cfg = config
        self.sources = load_sources(cfg.sources)  # read first: a missing source is an error before the model loads
        self.env_factory = training_env_factory(env or cfg.env, cfg.env_kwargs, cfg.air_weights) if cfg.rounds else None
        self.eval_factory = held_out_env_factory(cfg.env, cfg.env_kwargs, cfg.eval_env_kwargs, eval_env)
        self._schedule: TaskSchedule | None = None

        #: What the run will hold (printed; a plan that cannot fit is refused before any weight loads).
        self.memory_plan = check_run_memory(cfg, policy, ranks=1, device=None, main=True)
        built = self._build_models(cfg, policy, training_steps=cfg.total_steps, owns=policy is None)
        self.packed_update = packed_update(self.model, cfg.packed_update)
        self.checkpoints = RunCheckpoints(
            self.output_dir, cfg, model=self.model, tokenizer=self.tokenizer, optimizer=self.optimizer, scheduler=self.scheduler,
            adapters=self.adapters.names if self.adapters is not None else None, identity=SFT_RUN_IDENTITY,
        )
        self._owns_teacher = teacher is None and cfg.teacher is not None
        self.teacher = teacher if teacher is not None else _teacher_policy(cfg.teacher)
        self._rollouts: dict[int, list[Trajectory]] = {}
        self._rows: dict[int, tuple[list[Sample], dict[str, float]]] = {}  # a round's rows made ahead, taken once
        self._round: _Round | None = None  # the round the steps are in, made at its first step
        self._ready(built)

    @property
    def rounds(self) -> int:
        """Rounds of the run (one without ``rounds``)."""
        return max(self.config.rounds, 1)

    # ================================================================== what the run loop asks of the SFT trainer

    def _release(self) -> None:
        """The teacher built from ``config.teacher`` (one passed in is the caller's to close)."""
        if self._owns_teacher:
            self._owns_teacher = False
            self.teacher.close()

    def _prepare(self) -> None:
        if not self.config.rounds:  # the sources alone make the rows: none means nothing to learn, said before any step
            self._rows[1] = self.round_rows(1)

    def _progress(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"loss": f"{metrics.get('loss', float('nan')):.3f}"}

    def _eval_due(self) -> bool:
        """Whether the step just taken is due an evaluation: every ``eval_steps``, and at the end of
        each round but the last (the run's end has its own)."""
        cfg = self.config
        due = bool(cfg.eval_steps) and self.step % cfg.eval_steps == 0
        return 0 < self.step < cfg.total_steps and (due or self.step % cfg.max_steps == 0)

    def _checkpoint_due(self) -> bool:
        """Every ``save_steps``, and at the end of each round (the last is the run's)."""
        return self.step % self.config.save_steps == 0 or self.step % self.config.max_steps == 0

    # ================================================================== a round's data

    def rollout(self, round_: int) -> list[Trajectory]:
        """Round ``round_``'s episodes (1-based): read back when its file is complete (a resumed
        run), else rolled out with the teacher or the current student and written."""
        if round_ in self._rollouts:
            return self._rollouts[round_]
        cfg = self.config
        assert self.env_factory is not None
        path = self.output_dir / "rollouts" / f"round-{round_:02d}.jsonl"
        expected = cfg.tasks_per_round * cfg.num_generations
        if path.is_file():
            saved = list(load_trajectories(path, on_error="skip"))
            if len(saved) == expected:
                self._rollouts[round_] = sorted(saved, key=lambda t: t.seed or 0)
                return self._rollouts[round_]
        if self.step != (round_ - 1) * cfg.max_steps:
            raise ValueError(
                f"cannot resume at step {self.step}: {path} does not hold round {round_}'s {expected} episodes, and they "
                "cannot be rolled out again with the weights they were rolled out with; start the run over"
            )
        if self._schedule is None:
            probe = self.env_factory()
            self._schedule = TaskSchedule(probe.tasks, cfg.tasks_per_round, cfg.seed)
            probe.close()
        generator = self.teacher if self.teacher is not None else self.generator
        sampling = SamplingOverride(generator, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_completion_length)
        started = time.perf_counter()
        with TrajectoryWriter(path) as writer:
            episodes = InProcessRollouts(self.env_factory, sampling).rollout(
                episodes=expected, group_size=cfg.num_generations, concurrency=cfg.concurrency or expected,
                seed=_round_seed(cfg.seed, round_), tasks=self._schedule.tasks_for(round_ - 1), progress=False,
                on_trajectory=writer.write,
            )
        seconds = time.perf_counter() - started
        release_freed_memory()
        check_episodes_ran(episodes, f"round {round_}'s rollout", path)
        episodes.sort(key=lambda t: t.seed or 0)
        self._hook.agentgym_log_metrics(metrics={**episode_metrics(episodes, seconds, prefix="rollout/"), "round": float(round_)}, step=self.step)
        self._rollouts[round_] = episodes
        return episodes

    def round_rows(self, round_: int) -> tuple[list[Sample], dict[str, float]]:
        """Round ``round_``'s rows (the pool chosen and made rows, written to
        ``rows/round-NN.jsonl``) and the counts of how (``data/...``)."""
        if (held := self._rows.pop(round_, None)) is not None:  # made before the first step
            return held
        cfg = self.config
        pool = list(self.sources)
        for earlier in range(1, round_ + 1 if cfg.rounds else 1):
            pool.extend(self.rollout(earlier))
        choice = choose_episodes(pool, min_reward=cfg.min_reward, top_k=cfg.top_k, success_only=cfg.success_only)
        made = sft_rows(
            choice.episodes, tokenizer=self.tokenizer, agent_match=cfg.agent_match, adapters=self.adapters, retokenize=cfg.retokenize,
            tool_prompt=getattr(self.policy, "tool_prompt", "full"),
        )
        if not made.samples:
            # Steps without rows would update nothing, log loss=nan and still write final/.
            raise nothing_chosen({**choice.counts, **made.counts}, cfg.min_reward)
        path = self.output_dir / "rows" / f"round-{round_:02d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row_record(r)) + "\n" for r in made.samples), encoding="utf-8")
        counts = {f"data/{k}": float(v) for k, v in {**choice.counts, **made.counts}.items()}
        return made.samples, counts

    # ================================================================== a step

    def _next_round(self) -> _Round:
        """The round the coming step is in: made at its first step (its rows, their seeded order)."""
        cfg = self.config
        if self._round is None or self.step >= self._round.end:
            number = self.step // cfg.max_steps + 1
            rows, counts = self.round_rows(number)
            order = TaskSchedule(rows, cfg.rows_per_step, _round_seed(cfg.seed, number)) if rows else None
            self._round = _Round(number, order, counts, end=number * cfg.max_steps)
        return self._round

    def train_step(self) -> dict[str, float]:
        """One optimizer step on the next ``rows_per_step`` rows of the round (none when the
        round has no rows: nothing is updated); returns its metrics."""
        cfg = self.config
        round_ = self._next_round()
        started, cpu_start = time.perf_counter(), time.process_time()
        in_round = self.step - (round_.number - 1) * cfg.max_steps
        rows: Sequence[Sample] = round_.order.tasks_for(in_round) if round_.order is not None else []

        def update() -> dict[str, float]:
            if not rows:
                return {"update/skipped": 1.0}
            micro = MicroBatches(rows, cfg, packed=self.packed_update, pad_token_id=self.pad_token_id,
                                 device=self.device, adapters=self.adapters)
            stats = optimize(
                micro, lambda i: micro.sft_loss(self.model, i), model=self.model, optimizer=self.optimizer,
                scheduler=self.scheduler, adapter_params=self.adapter_params, max_grad_norm=cfg.max_grad_norm, step=self.step + 1,
            )
            every = stats.metrics(micro, learning_rate=float(self.scheduler.get_last_lr()[0]))
            return {k: v for k, v in every.items() if k in _SFT_METRICS or k.startswith("adapters/")}

        def step_metrics(update: dict[str, float], update_s: float, sync_s: float) -> dict[str, float]:
            return {
                **round_.counts,
                **update,
                "samples/rows": float(len(rows)),
                "samples/loss_tokens": float(sum(r.num_loss_tokens for r in rows)),
                "round": float(round_.number),
                "epoch": round_.order.epoch_of(in_round) if round_.order is not None else float("nan"),
                "time/update_s": update_s,
                "time/sync_s": sync_s,
                "time/step_s": time.perf_counter() - started,
                "time/step_cpu_s": time.process_time() - cpu_start,  # this process's threads
            }

        return self._guarded_update(update, step_metrics)


@dataclass(frozen=True)
class _Round:
    """A round as its steps take it: its number (1-based), its rows' seeded order (``None``: no
    rows), the counts of how they were chosen (``data/...``) and the step it ends at."""

    number: int
    order: TaskSchedule | None
    counts: dict[str, float]
    end: int


def _teacher_policy(options: dict[str, Any] | None) -> Any:
    """The ``openai`` policy of ``config.teacher`` (``None`` without one). Its token ids are not
    asked for: they would be the teacher's vocabulary; its text is re-tokenized instead."""
    if options is None:
        return None
    from agentgym_lightning.policies import make_policy

    kwargs = {k: v for k, v in options.items() if k != "model"}
    kwargs.setdefault("return_token_ids", False)
    return make_policy("openai", options.get("model") or "", **kwargs)


def _round_seed(seed: int, round_: int) -> int:
    return (seed * 1_000_003 + round_ * 7_919 + 17) % 2**31
