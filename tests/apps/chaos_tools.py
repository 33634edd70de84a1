"""The chaos run's app: the seed scenario, plus two tools whose bodies really run and leave a
trace of every execution in Redis (tests/chaos/run_chaos.py).

A message `call record_once {"key": K}` / `call record_idem {"key": K}` (one line each) asks for
those calls. Each execution adds a fresh token to the set `chaos:ran:<tool>:<K>` before it
sleeps a little (so kills land mid-tool), then returns. SADD of its own token, retried through
Redis outages, counts one execution once even when a reply is lost: SCARD is the number of
executions whose body got that far. `record_once` is not idempotent (run at most once:
docs/guarantees.md); `record_idem` is, and may run again after a lost worker (3 attempts in all).
"""

import os
import random
import secrets
import time

import redis

from examples.seed_app import decide, decide_on, llm, send_email

__all__ = ["decide", "decide_on", "llm", "tools"]

_redis: redis.Redis | None = None


def ran_key(tool: str, key: str) -> str:
    return f"chaos:ran:{tool}:{key}"


def _record(tool: str, key: str) -> str:
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(os.environ["PARLEY_REDIS_URL"], socket_timeout=5)
    token = secrets.token_hex(8)
    for _ in range(300):  # Redis is restarted once during the run
        try:
            _redis.sadd(ran_key(tool, key), token)
            break
        except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
            time.sleep(0.1)
    else:
        raise RuntimeError("redis stayed unavailable")
    time.sleep(random.uniform(0, 1.0))
    return f"ran {key}"


def record_once(key: str) -> str:
    """Record one execution, then work a little (not idempotent: at most once).

    Args:
        key: the call's own key
    """
    return _record("record_once", key)


def record_idem(key: str) -> str:
    """Record one execution, then work a little (idempotent: retried after a lost worker).

    Args:
        key: the call's own key
    """
    return _record("record_idem", key)


record_idem.idempotent = True  # type: ignore[attr-defined]

tools = [send_email, record_once, record_idem]
