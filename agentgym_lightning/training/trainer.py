"""LightningRL: reinforcement learning for any agent, one module, read top to bottom.

Each training step:

1. **Tasks.** Pick ``tasks_per_step`` (B) tasks — a function of the seed and the step
   (:mod:`agentgym_lightning.rollouts.schedule`), so a resumed run sees the same data.
2. **Rollouts.** Run ``num_generations`` (G) episodes of each through
   :func:`~agentgym_lightning.rollouts.in_process.rollout` (or on ``rollout_workers`` Ray actors:
   :mod:`agentgym_lightning.rollouts.served_policy`): the agents run unmodified, and the current policy
   answers every pending LLM call in batches, sampling at the training temperature, each call
   seeded from its episode (reproducible however the calls were batched).
3. **Samples.** Credit assignment gives every call a value, advantages are normalised within each
   task's group at the level of episodes, and the calls become rows (``transition`` or
   ``trajectory`` aggregation; :mod:`.samples`). Infrastructure failures never reach the update.
4. **Update.** One AdamW step on TRL's GRPO-family loss (:mod:`.loss`), gradients accumulated
   over micro-batches of at most ``micro_batch_tokens`` token positions, each run as one token
   tree (:mod:`.token_tree`: shared prefixes once, the same loss and gradients) or, with
   ``packed_update=False`` or a model that cannot take the tree's mask, as padded rows (at most
   ``per_device_train_batch_size`` of them) (``num_iterations`` steps when > 1). :meth:`update`
   is the optimizer loop; the micro-batches, their logprobs, loss and statistics are
   :mod:`.update`'s. The gradients are freed once applied, and each phase's freed memory is
   returned to the OS before the next (:mod:`agentgym_lightning.memory`), so a step peaks at its
   largest phase, not their sum. With
   ``lora_per_agent`` each trained agent has a LoRA adapter of its own: its calls are generated
   with it, and its rows train it alone (:mod:`.agent_adapters`).
5. **Sync.** The generator gets the new weights (``hf`` shares the model: nothing to do; ``vllm``
   reloads them).

With ``max_staleness`` k >= 1, moves 1-2 run continuously on a thread instead
(:mod:`agentgym_lightning.rollouts.async_rollouts`): a step trains on the next B finished groups none of whose calls was
answered more than k policy versions before the one being updated (``Step.policy_version``),
and the sync reaches running episodes (``hf`` then generates on a copy of its own, refreshed
between two decode steps), in this process or on ``rollout_workers`` Ray actors (each answer
carries its version back to the worker's episode). k = 0 is the loop above, unchanged.
6. **Log, evaluate, checkpoint.** Metrics go to the ``agentgym_log_metrics`` hook (W&B and the
   local ``metrics.jsonl`` are plugins on it); the held-out eval runs before training, every
   ``eval_steps`` and at the end; checkpoints every ``save_steps``, at the end, and on Ctrl-C.

**The loss and stale rollouts.** Every call carries the logprobs of the policy that answered it
(the *behaviour* policy, up to ``max_staleness`` versions older than the weights being updated).
The loss is AReaL's decoupled PPO objective: the PPO ratio against the weights before this update
(the *proximal* policy, recomputed by the update), times the truncated weight ``π_prox / π_behav``
(no gradient), which corrects the generator/trainer mismatch and the staleness at once; with
current calls (k = 0) it is TRL's mismatch correction, unchanged. :mod:`.loss` has the derivation.

What is not the step has rooms of its own: the loop around it (resume, hooks, progress, the
evaluations, checkpoints, close: :class:`~agentgym_lightning.training.run.RunLoop`, the SFT
trainer's too), the models built from the config (:mod:`.models`), checkpoints as the run takes and
resumes them (:mod:`.run_checkpoints`), Ctrl-C and SIGTERM (:mod:`.signals`), what a run returns or
raises (:mod:`.result`, :mod:`agentgym_lightning.failed_episodes`) and its progress bar (:mod:`.progress`).

Python API and CLI are the same thing::

    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    config = LightningRLConfig(env="lightning/Arithmetic-v0", max_steps=20, eval_env_kwargs={"split": "test"})
    result = LightningRLTrainer(config).train()

    # agentgym-lightning train --env lightning/Arithmetic-v0 --steps 20
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentgym_lightning.cpu_threads import share_cores
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.failed_episodes import check_episodes_ran
from agentgym_lightning.memory import release_freed_memory
from agentgym_lightning.metrics import episode_metrics
from agentgym_lightning.judge import JudgeConfig
from agentgym_lightning.registration import env_kwargs_refused
from agentgym_lightning.rollouts.async_rollouts import AsyncRollouts, running_time
from agentgym_lightning.rollouts.base import Rollouts
from agentgym_lightning.rollouts.in_process import InProcessRollouts
from agentgym_lightning.rollouts.schedule import TaskSchedule
from agentgym_lightning.training.agent_adapters import AdapterRouting, adapter_rollout_metrics, warn_if_air_reaches_every_adapter
from agentgym_lightning.training.config import LightningRLConfig
from agentgym_lightning.training.dynamic_sampling import DynamicSampler, group_has_signal, shaping_only, split_groups
from agentgym_lightning.training.env_factories import held_out_env_factory, training_env_factory
from agentgym_lightning.training.checkpoint import TrainerState
from agentgym_lightning.training.generation import SamplingOverride, VersionStamping, generator_counts, generator_metrics
from agentgym_lightning.training.judging import JudgingService
from agentgym_lightning.training.memory_plan import check_run_memory
from agentgym_lightning.training.pass_rates import PassRates, load_task_file
from agentgym_lightning.training.ranks import Ranks
from agentgym_lightning.training.result import TrainResult  # noqa: F401 - what train() returns, importable from here as before
from agentgym_lightning.training.run import RunLoop
from agentgym_lightning.training.run_checkpoints import RunCheckpoints
from agentgym_lightning.training.samples import SampleBatch, configured_samples
from agentgym_lightning.training.update import MicroBatches, optimize, packed_update, warn_if_prefixes_repeated
from agentgym_lightning.trajectory import Trajectory, TrajectoryWriter

__all__ = ["LightningRLTrainer"]


class LightningRLTrainer(RunLoop):
    """Trains the policy that answers an environment's agent on that environment's reward.

    The loop around each step (resume, hooks, progress, evaluations, checkpoints, close) is
    :class:`~agentgym_lightning.training.run.RunLoop`'s; this class supplies the step.

    Args:
        config: The run's options (:class:`~agentgym_lightning.training.config.LightningRLConfig`).
        env: An env id or a factory returning an :class:`~agentgym_lightning.env.AgentEnv`
            (default: ``config.env`` with ``config.env_kwargs``).
        policy: The generator (default: built from ``config.backend`` and ``config.model``). An
            ``hf`` policy is trained in place (its model is the trained model); a ``vllm`` policy
            gets the new weights after every update.
        eval_env: The held-out env (id or factory; default: ``config.env`` with
            ``config.eval_env_kwargs``, none when that is ``None``).
    """

    config: LightningRLConfig
    _bar_eval_metric = "eval/reward/mean"

    def __init__(
        self,
        config: LightningRLConfig,
        *,
        env: str | Callable[[], AgentEnv] | None = None,
        policy: Any = None,
        eval_env: str | Callable[[], AgentEnv] | None = None,
    ) -> None:
        super().__init__(config)
        cfg = config

        # The envs: every call of a training episode is seeded from its episode (reproducible).
        target = env or cfg.env
        self.env_factory = training_env_factory(target, cfg.env_kwargs, cfg.air_weights)
        self.eval_factory: Callable[[], AgentEnv] | None = held_out_env_factory(cfg.env, cfg.env_kwargs, cfg.eval_env_kwargs, eval_env)
        # The one env built at the start, before the model loads: a misspelt env kwarg fails here (EnvKwargsError).
        with env_kwargs_refused(target, self.env_factory.kwargs) if isinstance(target, str) else contextlib.nullcontext():
            probe = self.env_factory()
        #: Every task's attempts and successes over the run, and the curriculum's filter (:mod:`.pass_rates`).
        self.pass_rates = PassRates(cfg.curriculum_min_attempts, cfg.curriculum_min_pass_rate, cfg.curriculum_max_pass_rate)
        if cfg.task_file:  # a file of keys alone is looked up among the env's tasks (a task function has none)
            source = load_task_file(cfg.task_file, self.pass_rates, tasks=None if callable(probe.tasks) else probe.tasks)
        else:
            source = probe.tasks
        self.schedule = TaskSchedule(source, cfg.tasks_per_step, cfg.seed)
        probe.close()
        #: Dynamic sampling's rounds (:mod:`.dynamic_sampling`); with neither it nor the curriculum,
        #: each step runs the schedule's B tasks of that step, as before.
        self.sampler = DynamicSampler(cfg.tasks_per_step, cfg.max_sampling_rounds, outcome_only=cfg.outcome_first, enabled=cfg.dynamic_sampling)
        self._draws = cfg.dynamic_sampling or bool(cfg.curriculum_min_attempts)
        #: The position of the next task a drawing step takes in the schedule's endless sequence.
        self.task_cursor = 0

        #: The ranks of the update (:mod:`.ranks`: one unless launched on N); rank 0 alone generates.
        self.ranks = Ranks.from_environment(cfg.device)
        if self.ranks.distributed and cfg.max_staleness:
            raise ValueError(
                f"max_staleness >= 1 runs its producer beside a one-rank update; got {self.ranks.world_size} ranks: "
                "use max_staleness 0 with --nproc-per-node, or one rank"
            )
        #: What each rank will hold (printed; a plan that cannot fit is refused before any weight loads).
        self.memory_plan = check_run_memory(cfg, policy, ranks=self.ranks.world_size, device=self.ranks.device, main=self.ranks.is_main)
        # The generator and the trained model (the same object for hf), its LoRA, the reference, the optimizer.
        built = self._build_models(cfg, policy, training_steps=cfg.max_steps * cfg.num_iterations, owns=policy is None and self.ranks.is_main)
        warn_if_air_reaches_every_adapter(cfg, self.adapters)
        self.ref_model = built.ref_model
        self.packed_update = packed_update(self.model, cfg.packed_update)
        self._warned_repeated_prefixes = False
        self.checkpoints = RunCheckpoints(
            self.output_dir, cfg, model=self.ranks.full_model(self.model), tokenizer=self.tokenizer, scheduler=self.scheduler,
            optimizer=self.ranks.checkpointed_optimizer(self.model, self.optimizer),
            adapters=self.adapters.names if self.adapters is not None else None,
        )
        self._remote: Any = None  # rollouts on Ray workers (config.rollout_workers), made on first use
        self._stamped: VersionStamping | None = None  # the generator, stamping each answer with its version (made on first use)
        self._sampling: SamplingOverride | None = None  # that, sampling the training way: what rollouts call
        self._judge: Any = None  # the LLM judge (config.judge), made on first use
        self._async: AsyncRollouts | None = None  # max_staleness >= 1: the producer and its buffer, made on first use
        self._async_state: dict[str, Any] | None = None  # a resumed checkpoint's buffer, for it
        self._cores_back: Callable[[], None] = _nothing  # max_staleness >= 1 on CPU: the torch threads as they were
        # A generator of its own must hold every adapter before the first call names one, and the
        # weights the run starts from (init_from) before the first rollout.
        self._ready(built)

    # ================================================================== what the run loop asks of the RL trainer

    def _release(self) -> None:
        """The asynchronous rollouts, the cores they shared, the Ray rollout workers and the judge (the
        policy is the run loop's to close)."""
        if self._async is not None:  # the producer first: it still uses the policy
            self._async.close()
            self._async = None
        self._cores_back()  # the update's and the generator's torch threads as they were
        self._cores_back = _nothing
        if self._remote is not None:
            self._remote.close()
            self._remote = None
        if self._judge is not None:
            self._judge.close()
            self._judge = None

    def _progress(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"reward": f"{metrics['train/reward/mean']:.3f}"}

    def _after_update(self) -> None:
        if self._async is not None:
            self._async.advance(self.step)  # the next call of a running episode gets the new version

    # ================================================================== a step

    def train_step(self) -> dict[str, float]:
        """One training step (the six moves of the module docstring); returns its metrics."""
        cfg = self.config
        step_start, cpu_start = time.perf_counter(), time.process_time()
        counts = generator_counts(self.policy)
        if cfg.max_staleness:
            trajectories, rollout_s, written, async_metrics = self._take_async()
        elif self._draws:
            trajectories, rollout_s, written, async_metrics = self._rollout_rounds()
        else:
            trajectories, rollout_s, written = self._rollout()
            self._record_pass_rates(split_groups(trajectories))
            async_metrics = {}
        release_freed_memory()  # the rollout's KV caches, before the update's gradients
        check_episodes_ran(trajectories, f"step {self.step + 1}", written)
        # 3. samples (episodes in seed order: the same rows whatever order they finished in)
        trajectories.sort(key=lambda t: t.seed or 0)
        batch = self.samples(trajectories)

        def step_metrics(update: dict[str, float], update_s: float, sync_s: float) -> dict[str, float]:
            # asynchronous: rates over the time the episodes ran, not the update's wait for them
            episodes_s = async_metrics.get("async/episodes_s", rollout_s) if cfg.max_staleness else rollout_s
            return {
                **episode_metrics(trajectories, episodes_s, prefix="train/"),
                **{f"samples/{k}": v for k, v in batch.stats.items()},
                **update,
                **(adapter_rollout_metrics(trajectories, self.adapters) if self.adapters is not None else {}),
                **(self._remote.metrics() if self._remote is not None else {}),
                **(self._judge.take_stats().metrics() if self._judge is not None else {}),
                **async_metrics,
                **(self.pass_rates.metrics() if self._tracks_pass_rates else {}),
                "time/rollout_s": rollout_s,
                "time/update_s": update_s,
                "time/sync_s": sync_s,
                **generator_metrics(self.policy, counts),
                "time/step_s": time.perf_counter() - step_start,
                # CPU-seconds of this process's threads (rollout, update, sync); agents' subprocesses not counted
                "time/step_cpu_s": time.process_time() - cpu_start,
                "epoch": self._epoch(),
            }

        # 4. update, 5. sync, 6. log and checkpoint: the run loop's guarded block
        return self._guarded_update(lambda: self.update(batch), step_metrics, episodes=trajectories)

    def _trajectory_file(self) -> Path:
        """Where the episodes the coming step trains on are written (the viewer reads them there)."""
        return self.output_dir / "trajectories" / f"step-{self.step + 1:06d}.jsonl"

    def _rollout(self) -> tuple[list[Trajectory], float, Path]:
        """1-2. The step's tasks and rollouts (Ctrl-C here loses nothing: the step is simply not
        taken); returns the trajectories, the seconds they took and the file they are in."""
        cfg = self.config
        tasks = self.schedule.tasks_for(self.step)
        t0 = time.perf_counter()
        rollouts = self._rollouts()
        written = self._trajectory_file()
        with TrajectoryWriter(written) as writer, self._judged(writer.write) as on_trajectory:
            trajectories = rollouts.rollout(
                episodes=cfg.episodes_per_step,
                group_size=cfg.num_generations,
                concurrency=cfg.concurrency or cfg.episodes_per_step,
                seed=_step_seed(cfg.seed, self.step),
                tasks=tasks,
                progress=False,
                on_trajectory=on_trajectory,
            )
        return trajectories, time.perf_counter() - t0, written

    def _rollout_rounds(self) -> tuple[list[Trajectory], float, Path, dict[str, float]]:
        """1-2 with ``dynamic_sampling`` or the curriculum: rounds of new tasks from the task
        cursor (those the curriculum holds back passed over) until the step has B groups with
        signal or the rounds are spent (:class:`.dynamic_sampling.DynamicSampler`). Returns the
        kept groups' trajectories, the seconds, the step's file and the ``sampling/`` metrics; the
        step's file holds what it trains on, the groups set aside go to
        ``trajectories/set-aside.jsonl``."""
        cfg = self.config
        t0 = time.perf_counter()
        rollouts = self._rollouts()
        cursor, passed_over = self.task_cursor, 0

        def run_round(index: int, count: int) -> list[Trajectory]:
            nonlocal cursor, passed_over
            tasks, cursor, skipped = self.schedule.draw(cursor, count, skip=self.pass_rates.filtered)
            passed_over += skipped
            finished: list[Trajectory] = []
            with self._judged(finished.append) as on_trajectory:  # judged before the group's signal is read
                rollouts.rollout(
                    episodes=len(tasks) * cfg.num_generations,
                    group_size=cfg.num_generations,
                    concurrency=cfg.concurrency or len(tasks) * cfg.num_generations,
                    seed=_round_seed(cfg.seed, self.step, index),
                    tasks=tasks,
                    progress=False,
                    on_trajectory=on_trajectory,
                )
            return finished

        # Ctrl-C in a round loses nothing: the step is not taken, and the cursor and the counts move
        # only once every round has finished.
        filled = self.sampler.fill(run_round)
        self.task_cursor = cursor
        self._record_pass_rates(filled.drawn)
        written = self._trajectory_file()
        kept = {id(group) for group in filled.kept}
        self._write_groups(written, filled.kept, [g for g in filled.drawn if id(g) not in kept])
        ran = [t for group in filled.drawn for t in group]
        # Every drawn episode failing before its first call is a dead backend, not a step without signal.
        check_episodes_ran(ran, f"step {self.step + 1}", written.parent)
        elapsed = time.perf_counter() - t0
        metrics = {
            # train/...: every episode the policy ran this step, not only the groups it trains on
            **episode_metrics(ran, elapsed, prefix="train/"),
            **filled.metrics,
            "curriculum/tasks_passed_over": float(passed_over),
        }
        return filled.trajectories, elapsed, written, metrics

    def _write_groups(self, written: Path, trained: list[list[Trajectory]], set_aside: list[list[Trajectory]]) -> None:
        """The step's trained groups to its file, the groups it set aside (dynamic sampling) to
        ``trajectories/set-aside.jsonl``, each marked with the step (``variables["set_aside_at_step"]``)."""
        with TrajectoryWriter(written) as writer:
            for trajectory in (t for group in trained for t in group):
                writer.write(trajectory)
        if set_aside:
            with TrajectoryWriter(self.output_dir / "trajectories" / "set-aside.jsonl", append=True) as writer:
                for trajectory in (t for group in set_aside for t in group):
                    trajectory.variables["set_aside_at_step"] = self.step + 1
                    writer.write(trajectory)

    @property
    def _tracks_pass_rates(self) -> bool:
        """Whether tasks can come again: a task list (a task function's tasks are new each time,
        so their history would only grow)."""
        return not callable(self.schedule.source)

    def _record_pass_rates(self, groups: Sequence[list[Trajectory]]) -> None:
        if self._tracks_pass_rates:
            for group in groups:
                self.pass_rates.record_group(group)

    def _epoch(self) -> float:
        """Passes over the task list so far (NaN for a task function)."""
        return self.schedule.epoch_at(self.task_cursor) if self._draws else self.schedule.epoch_of(self.step)

    def _take_async(self) -> tuple[list[Trajectory], float, Path, dict[str, float]]:
        """1-2 with ``max_staleness`` >= 1: the next groups within the bound from the rollouts
        running in the background (:mod:`agentgym_lightning.rollouts.async_rollouts`, started on first use), written to the
        step's file; returns them, the seconds the update waited, the file and the ``async/``
        metrics."""
        cfg = self.config
        if self._async is None:
            rollouts = self._rollouts()  # in this process, or on Ray workers served this generator
            assert self._stamped is not None  # made by _rollouts()
            self._async = AsyncRollouts(
                rollouts, self._stamped, self.schedule, functools.partial(_step_seed, cfg.seed),
                max_staleness=cfg.max_staleness, group_size=cfg.num_generations,
                concurrency=cfg.concurrency or cfg.episodes_per_step, output_dir=self.output_dir,
            )
            if self._async_state is not None:
                self._async.restore(self._async_state)
                self._async_state = None
            # The update and a CPU generator now run at once: split the cores, not 2 threads per core.
            self._cores_back = share_cores(self.policy, update_on_cpu=self.device.type == "cpu")
            self._async.start(self.step)
        t0 = time.perf_counter()
        judge = self._judging().judge_groups if cfg.judge is not None else None
        signal = functools.partial(group_has_signal, outcome_only=cfg.outcome_first) if cfg.dynamic_sampling else None
        # Judged when taken rather than as they finish: the policy as judge then answers with the
        # version being updated, as in the synchronous loop (the judge's time is not hidden).
        fallback = shaping_only if cfg.dynamic_sampling and cfg.outcome_first else None
        taken = self._async.take(cfg.tasks_per_step, judge=judge, signal=signal, fallback=fallback, max_rounds=cfg.max_sampling_rounds)
        self._record_pass_rates(taken.examined)
        written = self._trajectory_file()
        kept = {t.episode_id for t in taken.trajectories}
        self._write_groups(written, [taken.trajectories], [g for g in taken.examined if g[0].episode_id not in kept])
        if cfg.dynamic_sampling:  # train/...: every group the step looked at, not only those it trains on
            examined = [t for group in taken.examined for t in group]
            taken.metrics.update(episode_metrics(examined, running_time(examined), prefix="train/"))
        return taken.trajectories, time.perf_counter() - t0, written, taken.metrics

    def _rollouts(self) -> Rollouts:
        """1-2's front-end, its calls sampled the training way and stamped with the generator's
        version (:attr:`step`, set here; the asynchronous rollouts advance it after each sync):
        in this process, or on ``rollout_workers`` Ray actors the generator is served to (made
        once; their answers carry the stamp back to the workers' episodes)."""
        cfg = self.config
        if self._stamped is None:
            self._stamped = VersionStamping(self.generator, self.step)
            self._sampling = SamplingOverride(self._stamped, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_completion_length)
        self._stamped.version = self.step
        if cfg.rollout_workers and self._remote is None:
            from agentgym_lightning.rollouts.served_policy import ServedPolicyRollouts

            self._remote = ServedPolicyRollouts(
                self.env_factory, self._sampling, workers=cfg.rollout_workers, host=cfg.generation_host, ray_address=cfg.ray_address,
                worker_timeout=cfg.rollout_worker_timeout, retry_infra_failed=cfg.retry_infra_failed,
                wrap_worker_policy=functools.partial(AdapterRouting, adapters=self.adapters) if self.adapters is not None else None,
            )
        return self._remote if self._remote is not None else InProcessRollouts(self.env_factory, self._sampling)

    def _checkpoint_extra(self) -> dict[str, Any]:
        """What a checkpoint keeps besides the weights: every task's pass rate, the task cursor and
        dynamic sampling's counts, and the asynchronous rollouts' buffer."""
        extra: dict[str, Any] = {
            "pass_rates": self.pass_rates.state(),
            "task_sampling": {"cursor": self.task_cursor, **self.sampler.state()},
        }
        if self._async is not None:
            extra["async_rollouts"] = self._async.state()
        elif self._async_state is not None:
            extra["async_rollouts"] = self._async_state
        return extra

    def _judged(self, on_trajectory: Callable[[Trajectory], Any]) -> Any:
        """``on_trajectory`` as the rollout's callback, behind the LLM judge when the config has
        one: each group is judged as it completes, while the rollout goes on."""
        if self.config.judge is None:
            return contextlib.nullcontext(on_trajectory)
        return self._judging().streaming(on_trajectory, self.config.num_generations)

    def _judging(self) -> JudgingService:
        """The run's LLM judge (``config.judge``), started on first use."""
        if self._judge is None:
            self._judge = JudgingService.start(JudgeConfig.from_dict(self.config.judge), self.policy, self.tokenizer, self.output_dir)
        return self._judge

    # ================================================================== the update

    def samples(self, trajectories: Sequence[Trajectory]) -> SampleBatch:
        """The training rows of ``trajectories`` as this trainer's config builds them (credit,
        aggregation, advantages, ``agent_match``, adapters), in the order given: a step passes
        its episodes in seed order, so the rows do not depend on which episode finished first."""
        return configured_samples(trajectories, self.config)

    def update(self, batch: SampleBatch) -> dict[str, float]:
        """One optimizer step (``num_iterations`` of them) on ``batch``'s rows; returns the loss
        statistics. The loop calls it on each step's rollouts; call it yourself to train on
        episodes from elsewhere (``trainer.samples(load_trajectories(path))``)."""
        cfg = self.config
        self.ranks.announce("update", batch)  # N ranks: every rank runs this update on its share
        if not batch.samples:
            return {"update/skipped": 1.0}
        micro = MicroBatches(batch.samples, cfg, packed=self.packed_update, pad_token_id=self.pad_token_id, device=self.device,
                             adapters=self.adapters, share=self.ranks.share if self.ranks.distributed else None)
        fixed = micro.fixed_logps(self.model, self.ref_model)  # the old policy's and the reference's, no gradients
        stats = optimize(
            micro, lambda i: micro.loss(self.model, i, fixed), model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            adapter_params=self.adapter_params, max_grad_norm=cfg.max_grad_norm, iterations=cfg.num_iterations, step=self.step + 1,
        )
        self.ranks.sum_stats(stats.totals)  # the step's loss over every rank's rows
        if not self._warned_repeated_prefixes:
            self._warned_repeated_prefixes = warn_if_prefixes_repeated(micro, self.step + 1)
        return stats.metrics(micro, learning_rate=float(self.scheduler.get_last_lr()[0]))

    # ================================================================== checkpoints

    def _wind_down(self) -> bool:
        """The asynchronous rollouts stop (their running episodes end truncated; what finished is
        in the buffer, which the newest checkpoint must then keep: written again)."""
        if self._async is None:
            return False
        self._async.close()
        return True

    def _restore(self, state: TrainerState) -> None:
        """The asynchronous rollouts' buffer, the pass rates, the task cursor
        and dynamic sampling's counts of a resumed checkpoint."""
        self._async_state = state.extra.get("async_rollouts")
        if "pass_rates" in state.extra:
            self.pass_rates.restore(state.extra["pass_rates"])
        sampling = state.extra.get("task_sampling") or {}
        # A checkpoint from before the cursor was kept: the plain loop's position at its step.
        self.task_cursor = int(sampling.get("cursor", self.step * self.config.tasks_per_step))
        self.sampler.restore(sampling)


# ====================================================================== building blocks


def _nothing() -> None:
    pass


def _step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 10_007) % 2**31


def _round_seed(seed: int, step: int, round_index: int) -> int:
    """The reset seeds of a step's round (the first round's are the plain step's)."""
    return (_step_seed(seed, step) + round_index * 100_003) % 2**31
