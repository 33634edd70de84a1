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
from parley.shards import connect

__all__ = ["decide", "decide_on", "llm", "tools"]

_redis: redis.Redis | None = None


def ran_key(tool: str, key: str) -> str:
    return f"chaos:ran:{tool}:{key}"


def _record(tool: str, key: str) -> str:
    global _redis
    if _redis is None:
        # the deployment's Redis (a Sentinel URL too), or the one the driver names for them
        # (CHAOS_RECORDS_URL: with several shards, all records are on one)
        url = os.environ.get("CHAOS_RECORDS_URL") or os.environ["PARLEY_REDIS_URL"]
        _redis = connect(url, socket_timeout=5)
    token = secrets.token_hex(8)
    # with a failover in the run, a record counts once a replica holds it (WAIT on the same
    # connection: one pipeline), else a promoted replica could lack it; 0: no WAIT at all
    replicas = int(os.environ.get("CHAOS_WAIT_REPLICAS", "0"))
    for _ in range(300):  # Redis is restarted (or fails over) once during the run
        try:
            pipe = _redis.pipeline(transaction=False)
            pipe.sadd(ran_key(tool, key), token)
            pipe.execute_command("WAIT", replicas, 2000)
            if int(pipe.execute()[-1]) < replicas:
                continue  # not on a replica yet: again (the same token, so counted once)
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
