"""Helpers shared by the backends' tests."""

from __future__ import annotations

import random
import threading
import time
from typing import Any


def submitted_at_random_times(policy: Any, requests: list[Any], seed: int, max_delay: float = 0.3, timeout: float = 120) -> list[Any]:
    """Each request submitted (``policy.submit``) from a thread of its own after a random delay
    (some while others decode, some together), in a random order; their completions, in order."""
    rng = random.Random(seed)
    delays = [rng.choice([0.0, 0.0, rng.uniform(0.0, max_delay)]) for _ in requests]
    futures: list[Any] = [None] * len(requests)

    def send(i: int) -> None:
        time.sleep(delays[i])
        futures[i] = policy.submit(requests[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in rng.sample(range(len(requests)), len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [f.result(timeout=timeout) for f in futures]
