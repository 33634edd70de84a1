"""The chaos run's app: the seed scenario, plus two tools whose bodies really run and leave a
trace of every execution outside the Redis under test (tests/chaos/run_chaos.py).

A message `call record_once {"key": K}` / `call record_idem {"key": K}` (one line each) asks for
those calls. Each execution appends one line to its process's own file,
`$CHAOS_RECORDS_DIR/tools-<pid>.log` (`{"tool": ..., "key": K, "token": ..., "pid": ...}`), with
O_APPEND and `os.fsync` before it sleeps a little (so kills land mid-tool) and returns: a body
that got that far is on disk whatever happens next to the worker or to Redis. The records used
to be a set in Redis itself, the one the run kills and restarts (and fails over): a Redis that
lost writes would have lost the very records that show a tool run twice. `record_once` is not
idempotent (run at most once: docs/guarantees.md); `record_idem` is, and may run again after a
lost worker (3 attempts in all). `tests.chaos.evidence` reads the files.
"""

import os
import random
import secrets
import time
from pathlib import Path

from examples.seed_app import decide, decide_on, llm, send_email
from tests.chaos.evidence import AppendOnly

__all__ = ["decide", "decide_on", "llm", "tools"]

_records: AppendOnly | None = None


def _record(tool: str, key: str) -> str:
    global _records
    if _records is None or _records.pid != os.getpid():  # a file per process (a forked one too)
        _records = AppendOnly(Path(os.environ["CHAOS_RECORDS_DIR"]) / f"tools-{os.getpid()}.log")
    _records.write({"tool": tool, "key": key, "token": secrets.token_hex(8), "pid": os.getpid()})
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
