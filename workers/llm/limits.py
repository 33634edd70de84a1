"""How long the model call in progress may still take.

The worker sets it around the app's `llm` from the job's time limit (`--llm-timeout`), and
`OpenAICompatible` reads it, so that its retries and their waits end inside that limit with the
adapter's own error, instead of being cut off by the job's timeout. Another `llm` may read it
the same way (`current_time_limit()`).
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TimeLimit:
    """A limit of `seconds` (as configured, for messages) reached at `deadline` (time.monotonic()).
    The deadline may come a little before `seconds` have passed: the worker keeps a moment to
    post the outcome."""

    seconds: float
    deadline: float

    @classmethod
    def starting_now(cls, seconds: float) -> "TimeLimit":
        return cls(seconds, time.monotonic() + seconds)

    def left(self) -> float:
        return self.deadline - time.monotonic()


_current: ContextVar[TimeLimit | None] = ContextVar("parley_llm_time_limit", default=None)


def current_time_limit() -> TimeLimit | None:
    """The time limit of the model call this code runs in, None outside a worker's job."""
    return _current.get()


@contextmanager
def time_limit(limit: TimeLimit) -> Iterator[TimeLimit]:
    token = _current.set(limit)
    try:
        yield limit
    finally:
        _current.reset(token)


def earliest(*limits: TimeLimit | None) -> TimeLimit | None:
    """The limit reached first, None when there is none."""
    given = [limit for limit in limits if limit is not None]
    return min(given, key=lambda limit: limit.deadline) if given else None
