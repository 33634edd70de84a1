"""Token streaming from a worker: `parley.stream_delta(text)` inside an app's `llm`.

A model adapter (or any `llm`) calls `stream_delta` with each piece of text as the model
writes it; while a worker runs the call, the pieces go to the session's deltas stream
(schemas/deltas.py), batched so that a fast model costs a write every `FLUSH_S` or
`FLUSH_CHARS`, not one per token. Outside a model call that Parley runs, `stream_delta` does
nothing: an `llm` called by the app's own code or tests still works.

Streaming is best effort: a write that fails (Redis away for a moment) drops those pieces and
the call goes on; the reply is recorded whole by the call's outcome either way.
"""

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from parley.runtime.logs import kv
from parley.schemas.deltas import MAXLEN, TTL_S, Delta, entry_fields

log = logging.getLogger("parley.worker")

#: a batch is written once this long has passed since the last write...
FLUSH_S = 0.05
#: ... or once it holds this many characters
FLUSH_CHARS = 512

Write = Callable[[list[Delta]], None]


@dataclass
class DeltaSink:
    """The pieces of one attempt of one model call, written in batches by `write`."""

    call_id: str
    attempt: int
    write: Write
    clock: Callable[[], float] = time.monotonic
    #: text not written yet, and whether a reset comes before it
    _pending: list[str] = field(default_factory=list)
    _pending_reset: bool = False
    _seq: int = 0
    _written_at: float | None = None
    _failed: bool = False

    def add(self, text: str) -> None:
        if not text:
            return
        self._pending.append(text)
        now = self.clock()
        if self._written_at is None:
            # the first piece goes at once: a watcher sees the reply start without waiting
            self.flush()
        elif now - self._written_at >= FLUSH_S or sum(map(len, self._pending)) >= FLUSH_CHARS:
            self.flush()

    def reset(self) -> None:
        """The reply starts again (the adapter retried): what was streamed is to be dropped."""
        self._pending.clear()
        self._pending_reset = self._seq > 0 or self._pending_reset
        self.flush()

    def flush(self) -> None:
        if not self._pending and not self._pending_reset:
            return
        batch: list[Delta] = []
        if self._pending_reset:
            self._seq += 1
            batch.append(Delta(call_id=self.call_id, attempt=self.attempt, seq=self._seq, text="",
                               reset=True))
        if self._pending:
            self._seq += 1
            batch.append(Delta(call_id=self.call_id, attempt=self.attempt, seq=self._seq,
                               text="".join(self._pending)))
        self._pending.clear()
        self._pending_reset = False
        self._written_at = self.clock()
        try:
            self.write(batch)
        except (RedisError, OSError) as exc:
            # best effort: the reply is recorded whole by the outcome. Only a failed write is
            # dropped: anything else (the job's time limit, raised by a signal in the middle of
            # a write) must reach the call, or a timed-out call would go on past its limit.
            if not self._failed:
                log.warning("stream deltas dropped", extra=kv(call=self.call_id,
                                                              error=f"{type(exc).__name__}: {exc}"))
            self._failed = True


def redis_writer(connection: Any, key: str) -> Write:
    """Writes a batch to the deltas stream `key` in one round trip: each piece an entry (the
    stream capped at about MAXLEN), and the stream's life renewed (TTL_S)."""

    def write(batch: list[Delta]) -> None:
        pipe = connection.pipeline(transaction=False)
        for delta in batch:
            pipe.xadd(key, entry_fields(delta), maxlen=MAXLEN, approximate=True)
        pipe.expire(key, TTL_S)
        pipe.execute()

    return write


_SINK: ContextVar[DeltaSink | None] = ContextVar("parley_delta_sink", default=None)


@contextmanager
def streaming(sink: DeltaSink) -> Iterator[DeltaSink]:
    """Run a model call with `stream_delta` writing to `sink`; what is left is written at the end."""
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)
        sink.flush()


def stream_delta(text: str) -> None:
    """Stream a piece of the reply the model is writing (a model adapter calls it per chunk).

    Watchers of the session see it at once (`parley watch --deltas`, `Client.watch(...,
    deltas=True)`); the reply the `llm` returns is what the transcript records. Does nothing
    outside a model call run by a worker or `parley.testing`."""
    sink = _SINK.get()
    if sink is not None and isinstance(text, str):
        sink.add(text)


def stream_reset() -> None:
    """The reply being streamed starts again (a retried request): watchers drop what they got
    of this attempt. Does nothing outside a model call, or before any text was streamed."""
    sink = _SINK.get()
    if sink is not None:
        sink.reset()
