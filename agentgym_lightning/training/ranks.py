"""The update on N ranks: data-parallel with PyTorch FSDP2, rank 0 leading.

A run started by ``torchrun`` / ``accelerate launch`` / ``agentgym-lightning train
--nproc-per-node N`` (torch's elastic launcher, :func:`launch`) has ``WORLD_SIZE`` ranks, and
:meth:`Ranks.from_environment` joins them (gloo on CPU, NCCL on CUDA). Rank 0 **leads**: it
alone runs the rollouts (gateway, driver, Ray workers), the evaluations, the generator, the logs
and the checkpoints. The other ranks **follow** (:meth:`Ranks.follow`): they hold their shard of
the trained model and wait for rank 0's next command — each command is one collective every rank
runs together (an update, a gather of the weights, a gather of the optimizer state, a restore,
the end), announced with ``broadcast_object_list`` (:meth:`Ranks.announce`).

* **Sharding.** The trained model (and a full fine-tune's KL reference) is sharded with FSDP2's
  ``fully_shard``, one unit per decoder layer (the model's ``_no_split_modules``) and the root:
  weights, gradients and the optimizer's state are split over the ranks (:meth:`Ranks.shard`).
  FSDP2 works over gloo on CPU; only its default gradient reduction does not (``PREMUL_SUM``), so
  the reduction is a plain sum on every backend (``set_force_sum_reduction_for_comms``).
* **The step's rows.** Every rank receives the step's whole batch; each part (an adapter's rows, or
  all of them) is split into one contiguous share per rank balanced by tokens (rows sorted by
  their token ids, so a group's shared prefix stays on one rank; :func:`split_by_tokens`), and each
  rank runs its share as token trees. The loss normaliser is the part's, over all ranks' rows, and
  the gradients are summed, not averaged: N ranks compute the update one rank computes, within
  fp32 rounding. Every rank must run as many forwards as the others (each is a collective), so a
  rank with fewer micro-batches runs padding ones whose loss counts zero (:meth:`Ranks.share`).
* **The generator and checkpoints.** Rank 0 keeps an unsharded copy of the trained model (for the
  ``hf`` backend it is the generator's own model): after every update the weights are gathered
  into it (:meth:`Ranks.gather`), and the generator syncs from it as on one rank. Checkpoints are
  **gathered**: written by rank 0 from that copy and the gathered optimizer state, in exactly the
  one-rank format, so a run saved on N ranks resumes on M (:meth:`Ranks.restore` scatters them
  back); ``final/model.safetensors`` is that copy.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentgym_lightning.memory import release_freed_memory
from agentgym_lightning.training.models import trainable_model
from agentgym_lightning.training.run_config import RunConfig
from agentgym_lightning.training.samples import Sample

__all__ = ["Ranks", "RankLostError", "split_by_tokens", "launch", "LaunchFailure", "launcher_reports_lost_ranks"]

#: How long a collective waits for a rank (a rollout on rank 0 happens while the others wait).
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)


class RankLostError(OSError):
    """A collective failed: another rank is gone (killed, out of memory, its node lost)."""


#: Set by :func:`launch` for the ranks it starts: it reports a lost rank itself (which rank, how it
#: died, the checkpoint to resume from), so a rank that sees the loss need not say it again.
LAUNCHER_REPORTS_ENV = "AGENTGYM_LIGHTNING_LAUNCHER_REPORTS"


def launcher_reports_lost_ranks() -> bool:
    """Whether this process is a rank :func:`launch` started, whose launcher reports a lost rank
    (under ``torchrun`` or ``accelerate launch`` rank 0 must report it itself)."""
    return os.environ.get(LAUNCHER_REPORTS_ENV) == "1"


#: The most :func:`settle_gloo_workers` waits for gloo's worker threads, in seconds.
GLOO_SETTLE_LIMIT_S = 5.0


def gloo_worker_states() -> dict[str, tuple[str, ...]] | None:
    """Each of gloo's worker threads in this process (named ``pt_gloo…``) by thread id: its
    scheduler state and context-switch counts, from Linux's ``/proc``; ``None`` without it."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return None
    states: dict[str, tuple[str, ...]] = {}
    for task in tasks.iterdir():
        try:
            if not (task / "comm").read_text().startswith("pt_gloo"):
                continue
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            switches = tuple(line for line in (task / "status").read_text().splitlines() if "ctxt_switches" in line)
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        states[task.name] = (state, *switches)
    return states


def settle_gloo_workers(
    limit: float = GLOO_SETTLE_LIMIT_S,
    interval: float = 0.01,
    read_states: Callable[[], dict[str, tuple[str, ...]] | None] = gloo_worker_states,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait, at most ``limit`` seconds, until gloo's worker threads are idle: asleep (``S``) and
    not woken across one ``interval``. Returns whether they settled.

    Why: ``destroy_process_group`` does not end them (FSDP2's device mesh keeps the process group,
    so they live until the interpreter tears down), and the barrier before it does not cover them:
    a collective counts as done before its worker lets go of it. A worker still letting go of a
    collective's tensors when the interpreter finalizes takes the GIL of a dying interpreter and
    aborts the process ("terminate called without an active exception": 8 of 140 two-rank runs
    of a minimal FSDP2 script ended so, none of 100 with this wait; ``bench/bench_rank_exit.py``).
    Without ``/proc`` it sleeps ``10 * interval`` instead."""
    last = read_states()
    if last is None:
        sleep(10 * interval)
        return True
    waited = 0.0
    while waited < limit:
        sleep(interval)
        waited += interval
        now = read_states() or {}
        if now == last and all(state[0] == "S" for state in now.values()):
            return True
        last = now
    return False


def split_by_tokens(rows: Sequence[Sample], n: int) -> list[list[Sample]]:
    """``rows`` as ``n`` contiguous shares of about equal tokens, after sorting them by their
    token ids (rows that share a prefix, a task's group, are neighbours and stay together unless a
    share must cut them). Deterministic: every rank computes every rank's share."""
    ordered = sorted(rows, key=lambda s: (list(s.prompt_ids) + list(s.completion_ids)))
    sizes = [len(s.prompt_ids) + len(s.completion_ids) for s in ordered]
    total = sum(sizes)
    shares: list[list[Sample]] = [[] for _ in range(n)]
    done = 0
    for row, size in zip(ordered, sizes):
        # the share whose token range holds this row's middle token
        k = min(n - 1, int((done + size / 2) * n / total)) if total else 0
        shares[k].append(row)
        done += size
    return shares


@dataclass
class Ranks:
    """This process's place among the run's ranks (one rank: every method is a no-op)."""

    rank: int = 0
    world_size: int = 1
    device: torch.device | None = None
    #: Shard with FSDP even on one rank (the bench's FSDP path on one GPU); ``None``: on N > 1.
    fsdp: bool | None = None
    #: Rank 0's unsharded copy of the trained model (:meth:`shard`).
    _full: Any = field(default=None, init=False, repr=False)
    #: A loaded optimizer state waiting for :meth:`restore` (rank 0).
    _pending_optimizer: dict[str, Any] | None = field(default=None, init=False, repr=False)
    #: Whether :meth:`from_environment` started the process group (and :meth:`stop` must end it).
    _owns_group: bool = field(default=False, init=False, repr=False)

    @classmethod
    def from_environment(cls, device: str = "auto", *, fsdp: bool | None = None) -> Ranks:
        """Join the ranks a launcher started (``WORLD_SIZE`` > 1), or one rank alone (``fsdp``:
        sharded all the same, a process group of one; ``WORLD_SIZE`` etc. must be set)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1 and not fsdp:
            return cls()
        import torch.distributed as dist

        cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
        if cuda:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)  # `cuda` is this rank's GPU from here on
        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group("nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
        here = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        ranks = cls(dist.get_rank(), dist.get_world_size(), here, fsdp)
        ranks._owns_group = owns
        return ranks

    @property
    def distributed(self) -> bool:
        """Whether the model is sharded over a process group (more than one rank, or ``fsdp``)."""
        return self.fsdp if self.fsdp is not None else self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the leader (rollouts, generator, logs, checkpoints)."""
        return self.rank == 0

    # ------------------------------------------------------------------ building the model

    def trained_model(self, policy: Any, config: RunConfig) -> tuple[Any, Any]:
        """The model to train and its tokenizer: rank 0's as on one rank
        (:func:`~.models.trainable_model`); a follower loads the same weights, in the same dtype,
        from the folder rank 0 names."""
        if not self.distributed:
            return trainable_model(policy, config)
        model = tokenizer = None
        spec: dict[str, Any] = {}
        if self.is_main:
            model, tokenizer = trainable_model(policy, config)
            spec = {"path": str(policy.path), "dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}
        spec = self.from_main(spec)
        if not self.is_main:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(spec["path"], dtype=getattr(torch, spec["dtype"])).to(self.device)
            tokenizer = AutoTokenizer.from_pretrained(spec["path"])
        return model, tokenizer

    def shard(self, model: Any, ref_model: Any | None) -> tuple[Any, Any | None]:
        """``model`` and ``ref_model`` sharded over the ranks (FSDP2); rank 0 keeps ``model``
        itself, unsharded, as the gathered copy (the generator's, for ``hf``)."""
        self._full = model
        if not self.distributed:
            return model, ref_model
        from torch.distributed.fsdp import fully_shard

        trained = copy.deepcopy(model) if self.is_main else model
        if not self.is_main:
            self._full = None
        for module in (trained, ref_model if ref_model is not None and ref_model is not model else None):
            if module is None:
                continue
            units = set(getattr(_base_model(module), "_no_split_modules", None) or ())
            for sub in module.modules():
                if type(sub).__name__ in units:
                    fully_shard(sub)
            fully_shard(module)
            for sub in module.modules():
                if hasattr(sub, "set_force_sum_reduction_for_comms"):
                    # gradients summed, not averaged (each rank's loss is over the step's normaliser);
                    # a sum reduction is what gloo can run
                    sub.set_gradient_divide_factor(1.0)
                    sub.set_force_sum_reduction_for_comms(True)
        # Every rank starts from rank 0's weights (a LoRA adapter's random init differs by rank).
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        full = model.state_dict() if self.is_main else {}
        set_model_state_dict(trained, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        release_freed_memory()  # a follower's full weights, loaded to be sharded, go back to the OS
        return trained, (trained if ref_model is model else ref_model)

    def full_model(self, model: Any) -> Any:
        """The unsharded model rank 0 checkpoints and syncs from (``model`` itself on one rank)."""
        return model if not self.distributed else self._full

    def checkpointed_optimizer(self, model: Any, optimizer: torch.optim.Optimizer) -> Any:
        """What rank 0's checkpoints save and load as the optimizer: ``optimizer`` on one rank,
        its state gathered (in the one-rank format) on N."""
        return optimizer if not self.distributed else GatheredOptimizer(self, model, optimizer)

    # ------------------------------------------------------------------ the rows

    def share(self, rows: Sequence[Sample], cut: Callable[[list[Sample]], list[list[Sample]]]) -> tuple[list[list[Sample]], int]:
        """This rank's micro-batches of ``rows`` (``cut`` makes micro-batches of a share), and how
        many of them, at the end, are padding (run so that every rank runs as many; their loss
        counts zero)."""
        if not self.distributed:
            return cut(list(rows)), 0
        per_rank = [cut(share) for share in split_by_tokens(rows, self.world_size)]
        mine, most = per_rank[self.rank], max(len(m) for m in per_rank)
        pad = most - len(mine)
        filler = mine[:1] or next(m[:1] for m in per_rank if m)
        return mine + filler * pad, pad

    def sum_stats(self, totals: dict[str, float]) -> None:
        """Sum the update's statistics over the ranks in place (gradient norms are global already)."""
        if not self.distributed:
            return
        import torch.distributed as dist

        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, dict(totals))
        for key in {k for t in every for k in t}:
            if not key.endswith("grad_norm") and key != "nonfinite_skipped":
                totals[key] = sum(t.get(key, 0.0) for t in every)

    # ------------------------------------------------------------------ commands

    def from_main(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def announce(self, command: str, payload: Any = None) -> None:
        """Rank 0: tell the followers which collective comes next (a no-op elsewhere)."""
        if self.distributed and self.is_main:
            self._send(command, payload)

    def _send(self, command: str, payload: Any) -> None:
        import torch.distributed as dist

        try:
            dist.broadcast_object_list([(command, payload)], src=0)
        except (RuntimeError, dist.DistBackendError) as exc:
            raise RankLostError(f"a rank is gone ({_first_line(exc)})") from exc

    def follow(self, trainer: Any) -> int:
        """A follower's run: do rank 0's commands until it says stop; returns the step it stopped at.

        Ctrl-C (SIGINT, sent to every rank of a terminal's job) is left to rank 0: it checkpoints
        its last step, which needs the followers, then stops them."""
        import signal

        import torch.distributed as dist

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0)
            command, payload = box[0]
            if command == "update":
                trainer.update(payload)
            elif command == "gather":
                self.gather(trainer.model)
            elif command == "gather_optimizer":
                _gather_optimizer_state(trainer.model, trainer.optimizer, self.is_main)
            elif command == "restore":
                self.restore(trainer.model, trainer.optimizer, trainer.scheduler)
            elif command == "stop":
                self._leave()
                return int(payload)
            else:
                raise RuntimeError(f"unknown command from rank 0: {command!r}")

    def stop(self, step: int) -> None:
        """Rank 0: release the followers (they return from :meth:`follow`) and end the process
        group with them; a gone rank is ignored."""
        if self.distributed and self.is_main:
            try:
                self._send("stop", step)
            except RankLostError:
                self._leave(together=False)
                return
            self._leave()

    def _leave(self, together: bool = True) -> None:
        """End the process group :meth:`from_environment` started, every rank at once (a barrier:
        no rank tears down a connection another still reads), then wait for gloo's workers to let
        go of their last collective (:func:`settle_gloo_workers`). Left to the interpreter's exit,
        gloo's threads may still hold tensors then, which aborts the process ("terminate called
        without an active exception", pytorch/pytorch#190489)."""
        if not self._owns_group:
            return
        import torch.distributed as dist

        self._owns_group = False
        if not dist.is_initialized():
            return
        if together:
            try:
                dist.barrier()
            except (RuntimeError, dist.DistBackendError):
                pass  # a rank is gone: end ours all the same
        dist.destroy_process_group()
        settle_gloo_workers()

    # ------------------------------------------------------------------ weights and state

    def gather(self, model: Any) -> Any | None:
        """The trained weights, unsharded: ``model`` on one rank; on N ranks rank 0's full copy,
        refreshed from every rank's shard (a collective rank 0 announces), ``None`` on followers."""
        if not self.distributed:
            return model
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        self.announce("gather")
        try:
            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        except (RuntimeError, torch.distributed.DistBackendError) as exc:
            raise RankLostError(f"a rank is gone ({_first_line(exc)})") from exc
        if not self.is_main:
            return None
        self._full.load_state_dict(full)
        return self._full

    def restore(self, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
        """After rank 0 loaded a checkpoint into its full copy and :meth:`checkpointed_optimizer`:
        scatter the weights and optimizer state to every rank's shard, and the scheduler's state
        to every rank (a collective rank 0 announces). A no-op on one rank."""
        if not self.distributed:
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        self.announce("restore")
        full = self._full.state_dict() if self.is_main else {}
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        pending = self._pending_optimizer if self.is_main else None
        _scatter_optimizer_state(model, optimizer, self.from_main(_without_tensors(pending)), pending)
        state = self.from_main(scheduler.state_dict() if self.is_main else None)
        if not self.is_main:
            scheduler.load_state_dict(state)



class GatheredOptimizer:
    """Rank 0's view of the sharded optimizer for checkpoints: :meth:`state_dict` gathers the
    state into the one-rank format (parameters numbered in order); :meth:`load_state_dict` keeps
    a loaded one for :meth:`Ranks.restore` to scatter."""

    def __init__(self, ranks: Ranks, model: Any, optimizer: torch.optim.Optimizer) -> None:
        self.ranks, self.model, self.optimizer = ranks, model, optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def state_dict(self) -> dict[str, Any]:
        self.ranks.announce("gather_optimizer")
        try:
            return _gather_optimizer_state(self.model, self.optimizer, True)
        except (RuntimeError, torch.distributed.DistBackendError) as exc:
            raise RankLostError(f"a rank is gone ({_first_line(exc)})") from exc

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ranks._pending_optimizer = state


def _params(optimizer: torch.optim.Optimizer) -> list[Any]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _gather_optimizer_state(model: Any, optimizer: torch.optim.Optimizer, main: bool) -> dict[str, Any]:
    """The optimizer's state, every tensor unsharded, keyed as one rank's ``state_dict()``."""
    from torch.distributed.tensor import DTensor

    state: dict[int, dict[str, Any]] = {}
    for i, param in enumerate(_params(optimizer)):
        own = optimizer.state.get(param)
        if not own:
            continue
        state[i] = {}
        for key, value in own.items():
            if isinstance(value, DTensor):
                value = value.full_tensor()  # a collective: every rank runs the same ones in the same order
            state[i][key] = value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
    groups, first = [], 0
    for group in optimizer.param_groups:
        n = len(group["params"])
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": list(range(first, first + n))})
        first += n
    return {"state": state, "param_groups": groups} if main else {}


def _without_tensors(state: dict[str, Any] | None) -> Any:
    """A one-rank optimizer ``state_dict``'s shape: its tensors as their shapes (to broadcast)."""
    if state is None:
        return None
    return {
        "state": {i: {k: ("tensor", tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v for k, v in s.items()} for i, s in state["state"].items()},
        "param_groups": state["param_groups"],
    }


def _scatter_optimizer_state(model: Any, optimizer: torch.optim.Optimizer, shape: dict[str, Any] | None, full: dict[str, Any] | None) -> None:
    """Load a one-rank optimizer ``state_dict`` (``full``, on rank 0; ``shape`` on every rank)
    into the sharded ``optimizer``: each parameter's state tensor sharded as the parameter is."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if shape is None:
        return
    params = _params(optimizer)
    state: dict[int, dict[str, Any]] = {}
    for i, entries in shape["state"].items():
        param = params[int(i)]
        state[int(i)] = {}
        for key, value in entries.items():
            if isinstance(value, tuple) and value[:1] == ("tensor",):
                source = full["state"][i][key] if full is not None else torch.empty(value[1], dtype=value[2])
                if isinstance(param, DTensor) and tuple(value[1]) == tuple(param.shape):
                    value = distribute_tensor(source.to(param.device_mesh.device_type), param.device_mesh, param.placements, src_data_rank=0)
                else:  # a scalar (step): the same on every rank
                    box = [source]
                    torch.distributed.broadcast_object_list(box, src=0)
                    value = box[0]
            state[int(i)][key] = value
    optimizer.load_state_dict({"state": state, "param_groups": shape["param_groups"]})


def _base_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


# ====================================================================== the launcher


@dataclass
class LaunchFailure:
    """Why a launched run stopped: a rank's exit code and signal (if any), or the launcher's own
    Ctrl-C / SIGTERM (``interrupted``: rank 0 checkpointed and summed up as on one rank)."""

    rank: int
    exitcode: int
    signal: str | None
    interrupted: bool = False

    def __str__(self) -> str:
        return f"rank {self.rank} exited with {self.exitcode}" + (f" ({self.signal})" if self.signal else "")


def launch(nproc_per_node: int, argv: Sequence[str]) -> LaunchFailure | None:
    """Run ``python -m agentgym_lightning ARGV`` on ``nproc_per_node`` ranks of this node through
    torch's elastic launcher (``torch.distributed.run --standalone``: a free rendezvous port, no
    restarts: a rank that dies stops the others); returns the first failed rank, or ``None``."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(
        ["--standalone", f"--nproc-per-node={nproc_per_node}", "--max-restarts=0", f"--signals-to-handle={_LAUNCHER_SIGNALS}",
         "--no-python", sys.executable, "-m", "agentgym_lightning", *argv]
    )
    before = {name: os.environ.get(name) for name in (LAUNCHER_REPORTS_ENV, _LAUNCHER_SIGNALS_ENV)}
    os.environ[LAUNCHER_REPORTS_ENV] = "1"  # the ranks inherit it
    # Ctrl-C is ours, not the launcher's: torch's sends it to the ranks again and kills them 30 s
    # later, so rank 0, still saving and summing up on a loaded machine, lost its summary (issue 50
    # item 8). A terminal's Ctrl-C reaches every rank itself; one sent to the launcher alone is
    # forwarded once; rank 0 saves its last step, stops the others and exits 130, and we wait.
    interrupted: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        if interrupted:
            return
        ranks = _child_pids()
        if not ranks:
            raise KeyboardInterrupt  # before the ranks start: nothing to save
        interrupted.append(signum)
        for pid in ranks:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)  # a rank that has it already ignores it (signals.interrupt_once)

    previous = signal.signal(signal.SIGINT, forward) if threading.current_thread() is threading.main_thread() else None
    try:
        run(args)
    except SignalException as exc:  # SIGTERM: the ranks got it too (rank 0 saves, then stops the rest)
        return LaunchFailure(rank=0, exitcode=128 + int(exc.sigval), signal=signal.Signals(exc.sigval).name, interrupted=True)
    except ChildFailedError as exc:
        main = exc.failures.get(0)
        if main is not None and main.exitcode == 130:  # Ctrl-C: rank 0 saved and summed up
            return LaunchFailure(rank=0, exitcode=130, signal="SIGINT", interrupted=True)
        # The cause first: a rank killed by a signal (other than the SIGTERM the launcher sends the
        # rest, 143 when rank 0 saved on it), then one that failed, a rank whose collective broke
        # because a peer was gone among them; the earliest of those.
        def cause(item: tuple[int, Any]) -> tuple[int, float, int]:
            rank, failure = item
            kind = 0 if failure.exitcode < 0 and failure.exitcode != -15 else 1 if failure.exitcode not in (143, -15) else 2
            return kind, failure.timestamp, rank

        rank, failure = min(exc.failures.items(), key=cause)
        return LaunchFailure(rank=int(rank), exitcode=int(failure.exitcode), signal=failure.signal_name() if failure.exitcode < 0 else None)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return None


#: The signals torch's elastic launcher turns into stopping the ranks: not SIGINT (see launch).
_LAUNCHER_SIGNALS = "SIGTERM,SIGHUP,SIGQUIT"
#: Where torch's launcher puts them (in this process's environment, restored after).
_LAUNCHER_SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"


def _child_pids() -> list[int]:
    """This process's children (the launcher's: the ranks), from Linux's /proc."""
    pids: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            pids.extend(int(pid) for pid in (task / "children").read_text().split())
    return pids
