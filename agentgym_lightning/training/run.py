"""The run loop every trainer shares: :class:`RunLoop`, what is done around each step.

A trainer (the RL trainer, the SFT trainer, a distillation trainer) is a :class:`RunLoop` that
supplies its steps; the loop owns the rest, in this order:

1. **Resume.** ``train(resume_from=...)`` restores the checkpoint (the weights, the optimizer, the
   step, the history, then the trainer's own state: :meth:`RunLoop._restore`) and syncs the generator.
2. **Start.** The run folder, :meth:`RunLoop._prepare` (a check that fails before any step), the
   ``agentgym_train_start`` hooks and their lines, the progress bar.
3. **Steps.** The held-out evaluation before the first step (or again, when a resumed run was
   killed during the one its step was due), then :meth:`RunLoop.train_step` until
   ``config.total_steps``, each followed by the evaluation when :meth:`RunLoop._eval_due`, and the
   last evaluation after the last step. Inside a step, :meth:`RunLoop._guarded_update` runs the
   update, the sync, the log and the checkpoint as one block that Ctrl-C cannot split.
4. **Stop.** Ctrl-C, SIGTERM or an error saves the last completed step
   (:func:`~.result.run_until_stopped`, :meth:`RunLoop._save_progress`); however the run ends,
   what the trainer built is closed (:meth:`RunLoop.close`), ``final/`` is written when it
   completed, and the ``agentgym_train_end`` hooks run.

What a subclass supplies (everything else has a default):

- ``__init__``: call ``super().__init__(config)`` first, then build the models
  (:meth:`RunLoop._build_models`), set :attr:`packed_update` and :attr:`checkpoints`, and end with
  :meth:`RunLoop._ready`.
- :meth:`RunLoop.train_step`: one step: its data (the next batch of rows), then its update handed
  to :meth:`RunLoop._guarded_update`, which runs it and what follows it; returns the step's metrics.
- Optionally: :meth:`RunLoop._progress` and :attr:`RunLoop._bar_eval_metric` (what the bar shows),
  :meth:`RunLoop._eval_due`,
  :meth:`RunLoop._checkpoint_due`, :meth:`RunLoop._checkpoint_extra` and :meth:`RunLoop._restore`
  (state a checkpoint keeps besides the weights), :meth:`RunLoop._prepare`,
  :meth:`RunLoop._release` (what the trainer built besides the policy), :meth:`RunLoop._wind_down`
  (what runs beside the steps) and :meth:`RunLoop._after_update`.
- N ranks: set :attr:`RunLoop.ranks` (:meth:`Ranks.from_environment <.ranks.Ranks.from_environment>`)
  before :meth:`RunLoop._build_models`; the loop then leads from rank 0 and a follower follows it
  (one rank, the default, changes nothing).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentgym_lightning.memory import release_freed_memory, reuse_freed_memory
from agentgym_lightning.plugin_manager import get_plugin_manager
from agentgym_lightning.training.agent_adapters import AdapterRouting
from agentgym_lightning.training.checkpoint import TrainerState
from agentgym_lightning.training.generation import sync_weights
from agentgym_lightning.training.held_out import held_out_eval, held_out_written
from agentgym_lightning.training.progress import progress_bar
from agentgym_lightning.training.ranks import Ranks
from agentgym_lightning.training.result import TrainResult, run_until_stopped
from agentgym_lightning.training.run_checkpoints import RunCheckpoints
from agentgym_lightning.training.run_config import RunConfig
from agentgym_lightning.training.run_models import RunModels, build_run_models, seed_process
from agentgym_lightning.training.signals import deferred_interrupt
from agentgym_lightning.trajectory import Trajectory

__all__ = ["RunLoop"]


class RunLoop:
    """What every trainer does around a step: resume, hooks, progress, the stop rule, the
    evaluation schedule, checkpoints, close (see the module docstring for what a subclass
    supplies).

    Attributes a subclass can read: :attr:`config`, :attr:`output_dir`, :attr:`step` (steps
    completed), :attr:`history` (every step's metrics), the models of :meth:`_build_models`, and
    :attr:`checkpoints`."""

    #: The run's checkpoints (a subclass sets them in ``__init__``, once the models are built).
    checkpoints: RunCheckpoints
    #: Whether a micro-batch's rows run as one token tree (a subclass sets it in ``__init__``).
    packed_update: bool
    #: The held-out env (``None``: no evaluation).
    eval_factory: Any = None

    def __init__(self, config: RunConfig) -> None:
        """Validate ``config`` (a :class:`~.run_config.RunConfig`: the RL config, the SFT config, a subclass of yours), seed the process and take the plugins' hooks: the first lines of
        every trainer's ``__init__``."""
        config.validate()
        self.config = config
        self.output_dir = Path(config.output_dir)
        seed_process(config.seed, config.num_threads)
        reuse_freed_memory()  # a phase reuses what it frees; release_freed_memory() returns it between phases
        self._hook = get_plugin_manager().hook
        self.step = 0
        self.history: list[dict[str, float]] = []
        # True from an update's first change to the weights until its step is counted: a stop
        # then must not checkpoint half-changed weights.
        self._mid_update = False
        self._owns_policy = False
        #: The ranks of the update (:mod:`.ranks`): one unless a subclass joins N; rank 0 alone generates.
        self.ranks = Ranks()

    def _build_models(self, config: RunConfig, policy: Any, *, training_steps: int, owns: bool) -> RunModels:
        """Build the generator and the trained model as the run's ``config`` says
        (:func:`~.run_models.build_run_models`) and keep them: :attr:`policy`, :attr:`model`, :attr:`tokenizer`, :attr:`pad_token_id`,
        :attr:`device`, :attr:`adapters`, :attr:`adapter_params`, :attr:`optimizer`,
        :attr:`scheduler`. ``owns``: the trainer built the policy (then :meth:`close` closes it)."""
        self._owns_policy = owns
        built = build_run_models(config, policy, training_steps=training_steps, ranks=self.ranks)
        self.policy, self.model, self.tokenizer, self.pad_token_id = built.policy, built.model, built.tokenizer, built.pad_token_id
        self.device = next(self.model.parameters()).device
        #: lora_per_agent: which agent's calls go to which adapter (None: one set of trained weights).
        self.adapters = built.adapters
        #: Each adapter's parameters (lora_per_agent: clipped and reported per adapter).
        self.adapter_params = built.adapter_params
        self.optimizer, self.scheduler = built.optimizer, built.scheduler
        return built

    def _ready(self, built: RunModels) -> None:
        """The last line of ``__init__``: the model in generation mode between updates, and a
        generator of its own given every adapter and ``init_from``'s weights before the first call."""
        self.model.eval()  # generation mode between updates (no dropout anyway; see disable_dropout)
        if self.adapters is not None or built.initialized:
            self._sync()

    # ================================================================== what a subclass supplies

    def train_step(self) -> dict[str, float]:
        """One step: its data, then :meth:`_guarded_update` with its update; returns its metrics."""
        raise NotImplementedError(f"{type(self).__name__} must define train_step (one step; see agentgym_lightning.training.run)")

    def _progress(self, metrics: dict[str, float]) -> dict[str, str]:
        """What the progress bar shows of a step's ``metrics`` (none by default)."""
        return {}

    #: The held-out metric the progress bar shows after each evaluation (``None``: none).
    _bar_eval_metric: str | None = None

    def _eval_due(self) -> bool:
        """Whether the step just taken is due an evaluation: every ``eval_steps`` (the run's end
        has its own)."""
        cfg = self.config
        return bool(cfg.eval_steps) and self.step % cfg.eval_steps == 0 and 0 < self.step < cfg.total_steps

    def _checkpoint_due(self) -> bool:
        """Whether the step just taken is checkpointed: every ``save_steps``, and the last."""
        return self.step % self.config.save_steps == 0 or self.step == self.config.total_steps

    def _checkpoint_extra(self) -> dict[str, Any] | None:
        """What a checkpoint keeps besides the weights, step and history (JSON; none by default)."""
        return None

    def _restore(self, state: TrainerState) -> None:
        """Take back what :meth:`_checkpoint_extra` kept (``state.extra``); :attr:`step` and
        :attr:`history` are restored already, the generator is synced after."""

    def _prepare(self) -> None:
        """What must succeed before the first hook runs (the SFT rows, say); raising closes the trainer."""

    def _release(self) -> None:
        """Release what the trainer built besides the policy (before the policy: it may still use it)."""

    def _wind_down(self) -> bool:
        """On the way out: stop what runs beside the steps; returns whether the newest checkpoint
        must be written again all the same (what it keeps has changed since)."""
        return False

    def _after_update(self) -> None:
        """Right after :attr:`step` counts an update (before any log or checkpoint)."""

    @property
    def is_main_rank(self) -> bool:
        """Whether this process leads the run: rank 0 of N ranks (:mod:`.ranks`), or the only one."""
        return self.ranks.is_main

    # ================================================================== the generator

    @property
    def generator(self) -> Any:
        """What answers the agents' calls: the policy, each call routed to its agent's adapter
        under ``lora_per_agent``."""
        return self.policy if self.adapters is None else AdapterRouting(self.policy, self.adapters)

    def _sync(self) -> float:
        """Push the trained weights (or each agent's adapter) to the generator; returns seconds."""
        if not self.is_main_rank:
            return 0.0  # N ranks: rank 0 syncs the generator (a follower gathers when rank 0 says)
        names = self.adapters.names if self.adapters is not None else None
        model = self.ranks.gather(self.model)  # N ranks: the weights gathered into rank 0's full copy
        return sync_weights(self.policy, model, peft=self.config.use_peft, adapters=names)

    def evaluate(self) -> dict[str, float]:
        """Run the held-out eval (``eval_episodes`` tasks, ``eval_temperature``) and log it."""
        return held_out_eval(self.eval_factory, self.generator, self.config, output_dir=self.output_dir, step=self.step, hook=self._hook)

    # ================================================================== the loop

    def train(self, resume_from: str | Path | None = None) -> TrainResult:
        """Run :meth:`train_step` until ``config.total_steps``, evaluating before, when
        :meth:`_eval_due` and after. Ctrl-C or SIGTERM saves a checkpoint of the last completed
        step and returns (``result.interrupted``, ``result.signal``); an error (a dead policy
        backend) saves it too and raises :class:`~.result.TrainingStopped` from the error (an
        :class:`~agentgym_lightning.failed_episodes.EpisodesFailedError` is raised as is).
        However it ends, what the trainer built is closed (:meth:`close`): a policy built from
        the config among it, so pass your own ``policy`` to go on generating with it afterwards
        (:attr:`model` holds the trained weights either way). A follower rank (N ranks) does
        rank 0's updates, gathers and restores instead."""
        if not self.ranks.is_main:
            return TrainResult(output_dir=self.output_dir, steps=self.ranks.follow(self))
        messages: list[str] = []
        try:
            if resume_from is not None:
                messages = self._resume(resume_from)
            result = TrainResult(output_dir=self.output_dir, steps=self.step, messages=messages)
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._prepare()
        except BaseException:
            self.close()  # a checkpoint refused, nothing to learn: nothing ran, and what the trainer built goes all the same
            raise
        for lines in self._hook.agentgym_train_start(config=self.config.to_dict(), output_dir=str(self.output_dir), step=self.step):
            result.messages.extend(lines or [])
        for line in result.messages:
            print(line, file=sys.stderr)
        bar = progress_bar(self.config, self.step)
        completed = False
        try:
            completed = run_until_stopped(
                lambda: self._loop(result, bar), result, save_progress=self._save_progress, step=lambda: self.step,
                once=self.ranks.distributed,
            )
        finally:
            bar.close()
            self.close()
            result.steps = self.step
            result.history = list(self.history)
            if completed and (unsaved := self.checkpoints.save_final(self.step)) is not None:
                result.messages.append(unsaved)
            final_metrics = {**(result.eval_after or {}), "steps": float(self.step)}
            for lines in self._hook.agentgym_train_end(output_dir=str(self.output_dir), metrics=final_metrics, interrupted=not completed):
                result.messages.extend(lines or [])
            self.ranks.stop(self.step)
        return result

    def close(self) -> None:
        """Release what the trainer built (:meth:`_release`, then the policy it built from the
        config: an engine, a server's connections; a policy passed in is the caller's to close).
        :meth:`train` calls it when it ends; call it yourself for a trainer that never trains.
        Idempotent."""
        self._release()
        if self._owns_policy:
            self._owns_policy = False
            self.policy.close()

    def _loop(self, result: TrainResult, bar: Any) -> None:
        """The evaluations and steps of :meth:`train` (which handles how they may end)."""
        postfix: dict[str, str] = {}
        if self.eval_factory is not None and self.step == 0:
            result.eval_before = self._evaluate_on(bar, postfix)
            bar.set_postfix(postfix)
        elif self.eval_factory is not None and self._due_eval_unfinished():
            self._evaluate_on(bar, postfix)  # killed during it: run it again
        while self.step < self.config.total_steps:
            metrics = self.train_step()
            bar.update(1)
            postfix.update(self._progress(metrics))
            if self.eval_factory is not None and self._eval_due():
                self._evaluate_on(bar, postfix)
            bar.set_postfix(postfix)
        if self.eval_factory is not None:
            result.eval_after = self._evaluate_on(bar, postfix)  # the bar ends on the latest eval
            bar.set_postfix(postfix)

    def _evaluate_on(self, bar: Any, postfix: dict[str, str]) -> dict[str, float]:
        """:meth:`evaluate`, its :attr:`_bar_eval_metric` put in the bar's ``postfix``."""
        metrics = self.evaluate()
        if self._bar_eval_metric is not None:
            postfix["eval"] = f"{metrics[self._bar_eval_metric]:.3f}"
        return metrics

    def _due_eval_unfinished(self) -> bool:
        """A resumed run's step was due an evaluation that was not finished: the run was killed
        during it, after the step's checkpoint (written first)."""
        return self._eval_due() and not held_out_written(self.output_dir, self.step, self.config.eval_episodes)

    # ================================================================== a step's update and what follows it

    def _guarded_update(
        self,
        update: Callable[[], dict[str, float]],
        step_metrics: Callable[[dict[str, float], float, float], dict[str, float]],
        *,
        episodes: Sequence[Trajectory] | None = None,
    ) -> dict[str, float]:
        """The step's ``update()`` (its statistics), then the sync, the step counted, its
        metrics (``step_metrics(update statistics, update seconds, sync seconds)``) in the
        history and logged every ``logging_steps`` (and ``episodes``, the first
        ``log_episodes`` of them, with them), and the checkpoint when :meth:`_checkpoint_due`;
        returns the metrics. Ctrl-C and SIGTERM wait until the block has ended: a stop never
        falls between an update and its checkpoint."""
        cfg = self.config
        with deferred_interrupt() as interrupted:
            t0 = time.perf_counter()
            self._mid_update = True  # an error from here to the step's end leaves half-changed weights
            statistics = update()
            update_s = time.perf_counter() - t0
            release_freed_memory()  # the update's activations, before the next rollout's KV caches
            sync_s = self._sync()
            self.step += 1
            self._after_update()
            self._mid_update = False
            metrics = step_metrics(statistics, update_s, sync_s)
            self.history.append({"step": float(self.step), **metrics})
            if self.step % cfg.logging_steps == 0 or self.step == cfg.total_steps:
                self._hook.agentgym_log_metrics(metrics=metrics, step=self.step)
                if episodes is not None and cfg.log_episodes:
                    self._hook.agentgym_log_episodes(trajectories=episodes[: cfg.log_episodes], step=self.step)
            if self._checkpoint_due():
                self.checkpoints.save(self.step, self.history, self._checkpoint_extra())
        interrupted.raise_if_received()
        return metrics

    # ================================================================== checkpoints

    def _save_progress(self) -> Path | None:
        """On the way out (a signal, an error): checkpoint the last completed step unless it is
        saved already; returns the newest checkpoint. Nothing is saved when the stop struck
        mid-update (the weights may be half-changed: the previous checkpoint stands)."""
        write_again = self._wind_down()
        if self._mid_update or (self.checkpoints.is_saved(self.step) and not write_again):
            return self.checkpoints.newest()
        return self.checkpoints.save(self.step, self.history, self._checkpoint_extra())

    def _resume(self, path: str | Path) -> list[str]:
        """Continue from the checkpoint at ``path``; returns what it says about the run folder."""
        state = self.checkpoints.resume(path)
        self.ranks.restore(self.model, self.optimizer, self.scheduler)  # N ranks: the checkpoint to every shard
        self.step = state.step
        self.history = [dict(h) for h in state.history]
        self._restore(state)
        self._sync()
        return self.checkpoints.set_aside_message(self.step, self.checkpoints.set_aside_after(self.step))
