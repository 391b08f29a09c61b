"""Which rewards may enter an episode: finite numbers no larger than :data:`MAX_ABS_REWARD`.

A reward that is NaN, infinite or absurdly large poisons everything after it: one NaN makes its
group's advantages, then the loss, then the weights NaN; one ``1e308`` overflows the group's
statistics. So every way a reward enters — ``emit_reward`` (in the agent or over HTTP), the
env's ``reward_fn`` or ``agentgym_episode_reward`` hook, an AIR plugin, a remote agent's
``done`` — checks it with :func:`checked_reward`. A refused reward never lands; its episode ends
``infra_failed`` with an error starting ``"reward refused"`` (:func:`reward_refused`), so the
trainer never uses it and counts it (``samples/episodes/reward_refused``); and the first refusal
of each source warns once, in one line naming the source (:class:`RewardRefusedWarning`).
"""

from __future__ import annotations

import math
import threading
import warnings
from typing import Any

from agentgym_lightning.trajectory import Status, Trajectory

__all__ = ["MAX_ABS_REWARD", "RewardRefused", "RewardRefusedWarning", "checked_reward", "reward_refused", "REFUSED_PREFIX"]

#: The largest reward magnitude accepted. Rewards are task scores (0/1, a few tenths of AIR);
#: a million leaves room for any sane scale while a sum of thousands of them stays exact.
MAX_ABS_REWARD = 1e6

#: How a refused reward's episode error starts.
REFUSED_PREFIX = "reward refused"


class RewardRefused(ValueError):
    """A reward was not a finite number within ``±MAX_ABS_REWARD``."""


class RewardRefusedWarning(UserWarning):
    """A source gave a reward that was refused (warned once per source)."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def checked_reward(value: Any, source: str) -> float:
    """``value`` as a float, or :class:`RewardRefused` (warning once for ``source``) when it is
    not a finite number within ``±MAX_ABS_REWARD``. ``source`` names where it came from
    (``"reward_fn of my/Env-v0"``, ``"emit_reward(source='judge')"``)."""
    if isinstance(value, bool):
        value = float(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _refuse(source, f"{value!r:.60}, not a number") from None
    if not math.isfinite(number):
        raise _refuse(source, f"{number}, not finite")
    if abs(number) > MAX_ABS_REWARD:
        raise _refuse(source, f"{number:g}, beyond the bound")
    return number


def _refuse(source: str, why: str) -> RewardRefused:
    message = (
        f"{REFUSED_PREFIX}: {source} gave {why} (rewards must be finite numbers within ±{MAX_ABS_REWARD:g}); "
        "the episode is excluded from training"
    )
    with _warned_lock:
        first = source not in _warned
        _warned.add(source)
    if first:
        warnings.warn(message, RewardRefusedWarning, stacklevel=3)
    return RewardRefused(message)


def reward_refused(trajectory: Trajectory) -> bool:
    """Whether ``trajectory`` was excluded because one of its rewards was refused."""
    return trajectory.status is Status.INFRA_FAILED and str(trajectory.error or "").startswith(REFUSED_PREFIX)
