"""One backoff for every retry loop of the dispatcher, the workers and the CLI.

Each loop that waits out a Redis outage or a flaky LLM endpoint asks this pure function how
long to wait, so the delays are written (and unit-tested, tests/unit/test_retry.py) once,
after Dramatiq's `compute_backoff`. It sits below dispatcher/, workers/ and parley/cli/, and
imports nothing of Parley.
"""

import random

# 2**32 times any sensible base is past every cap: the exponent stops growing there, so a loop
# that has retried for days never overflows a float.
MAX_EXPONENT = 32


def backoff(attempt: int, *, base: float, cap: float, jitter: bool = False,
            growth: float = 2.0) -> float:
    """Seconds to wait before the next try, after `attempt` earlier failed ones (0, 1, 2, ...).

    Exponential: `base * growth**attempt`, never more than `cap`. With `jitter`, a uniform draw
    in [0, that] ("full jitter"): clients retrying together spread out instead of hitting a
    recovering server in lockstep. Every loop of the fleet passes it (tests/unit/test_retry.py
    checks each call): after a failover or a Redis restart every dispatcher, worker, notifier and
    inbox of a shard waits out the same outage at once. Without it the delay is exact, for
    the schedules the tests pin down.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, not {attempt}")
    delay = min(cap, base * growth ** min(attempt, MAX_EXPONENT))
    return random.uniform(0, delay) if jitter else delay
