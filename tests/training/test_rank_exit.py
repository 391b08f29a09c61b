"""A rank's end (training/ranks.py): after the process group is destroyed, gloo's worker threads
must be idle before the interpreter finalizes, or a worker still letting go of a collective's
tensors aborts the process. ``settle_gloo_workers`` waits for that; here on scripted thread states
(no clock: the sleeps are counted) and once on a real gloo group."""

from __future__ import annotations

import sys

import pytest

from agentgym_lightning.training.ranks import gloo_worker_states, settle_gloo_workers


class Script:
    """``read_states`` answering a list of snapshots in turn (the last one from then on), and a
    ``sleep`` that only counts."""

    def __init__(self, *snapshots):
        self.snapshots = list(snapshots)
        self.reads = 0
        self.slept: list[float] = []

    def read_states(self):
        snapshot = self.snapshots[min(self.reads, len(self.snapshots) - 1)]
        self.reads += 1
        return snapshot

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_it_waits_until_every_worker_is_asleep_and_not_woken_across_an_interval():
    busy = {"11": ("R", "voluntary_ctxt_switches: 4"), "12": ("S", "voluntary_ctxt_switches: 9")}
    woken = {"11": ("S", "voluntary_ctxt_switches: 5"), "12": ("S", "voluntary_ctxt_switches: 9")}
    script = Script(busy, busy, woken, woken)
    assert settle_gloo_workers(limit=1.0, interval=0.01, read_states=script.read_states, sleep=script.sleep)
    # busy -> busy (one running), -> woken (a switch since), -> woken again: settled on the 3rd look
    assert script.slept == [0.01, 0.01, 0.01]


def test_a_worker_that_never_settles_is_waited_for_only_up_to_the_limit():
    running = [{"11": ("R", f"nonvoluntary_ctxt_switches: {k}")} for k in range(100)]
    script = Script(*running)
    assert not settle_gloo_workers(limit=0.05, interval=0.01, read_states=script.read_states, sleep=script.sleep)
    assert len(script.slept) == 5


def test_no_gloo_threads_settle_at_the_first_look_and_no_proc_means_one_short_sleep():
    script = Script({}, {})
    assert settle_gloo_workers(interval=0.01, read_states=script.read_states, sleep=script.sleep)
    assert script.slept == [0.01]
    script = Script(None)
    assert settle_gloo_workers(interval=0.01, read_states=script.read_states, sleep=script.sleep)
    assert script.slept == [0.1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_a_real_gloo_groups_workers_are_seen_and_settle_after_it_is_destroyed():
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already running in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = dist.group.WORLD  # held, as FSDP2's mesh holds it: its workers outlive the destroy
        tensor = torch.ones(3)
        dist.all_reduce(tensor)
    finally:
        dist.destroy_process_group()
    states = gloo_worker_states()
    assert states, "a gloo group's worker threads (pt_gloo...) should be listed while the group is held"
    assert all(len(state) == 3 for state in states.values())  # the state and two switch counts
    assert settle_gloo_workers(limit=5.0)
    del group
