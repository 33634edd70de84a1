"""The producers a dispatcher reads: the registry (`parley:producers`), re-read every few seconds.

Each registered producer writes input streams of its own (one a partition); the dispatcher
holding a partition reads them besides the engine's own input and results streams
(docs/design.md, "Consuming streams"). A producer removed from the registry is still read
until its streams are empty, so removing one never strands inputs it had written.

A producer's stream key that exists as another type than a stream (a hash, say: made by an
administrator, or by a producer login from before the ACL split of docs/operations.md) would
make every command that names it fail: XGROUP CREATE, XRANGE, and the one XREADGROUP that reads
all of a partition's streams, so every producer's inputs would stop. Such a stream is checked
for at each refresh and left out of what is read (`unusable`: logged, counted in the gauge
`parley_producer_streams_unusable`); its producer is not served until the key is deleted, and
every other producer is.
"""

import logging
import time
from typing import Any

from redis import Redis

from parley.runtime import metrics
from parley.runtime.logs import kv
from parley.schemas.keys import Keys
from parley.schemas.producers import Producer, parse_registry

log = logging.getLogger("parley.dispatcher")


class ProducerRegistry:
    """The registered producers (and those removed but not yet drained), as last read."""

    REFRESH_S = 2.0

    def __init__(self, redis: Redis, keys: Keys):
        self.redis = redis
        self.keys = keys
        self.registered: dict[str, Producer] = {}
        # removed from the registry while their streams still held entries: read until empty
        self.draining: dict[str, Producer] = {}
        self.read_at = float("-inf")
        self._bad: set[str] = set()
        # stream name -> its producer, for the streams of every partition (rebuilt on change)
        self._by_stream: dict[str, Producer] = {}
        self._partitions = 0
        # producers' streams whose key is another type than a stream: not read
        self.unusable: set[str] = set()

    def expire(self) -> None:
        """Read the registry (and check its streams' types) at the next refresh, not a period
        later: after an outage, or a stream found of another type while read."""
        self.read_at = float("-inf")

    def refresh(self, partitions: int) -> bool:
        """Read the registry again when due; True when the set of streams to read changed."""
        now = time.monotonic()
        if now - self.read_at < self.REFRESH_S:
            return False
        self.read_at = now
        raw: Any = self.redis.hgetall(self.keys.producers)
        registered, errors = parse_registry(raw)
        for error in set(errors) - self._bad:
            log.error("producer registration ignored", extra=kv(error=error))
        self._bad = set(errors)
        before = set(self.registered) | set(self.draining)
        for name, p in self.registered.items():
            if name not in registered:
                self.draining[name] = p
        for name in list(self.draining):
            if name in registered or self._drained(self.draining[name], partitions):
                del self.draining[name]
                if name not in registered:
                    log.info("removed producer drained; no longer read", extra=kv(producer=name))
        self.registered = registered
        changed = before != set(self.registered) | set(self.draining) or partitions != self._partitions
        self._partitions = partitions
        # rebuilt every time: a producer removed and added again may have another tenant
        self._by_stream = {s: p for p in self.all() for s in self._streams_of(p)}
        unusable = self._check_types(list(self._by_stream))
        changed = changed or unusable != self.unusable
        self.unusable = unusable
        return changed

    def _check_types(self, streams: list[str]) -> set[str]:
        """The streams of `streams` whose key exists as another type than a stream."""
        if not streams:
            bad: set[str] = set()
        else:
            pipe = self.redis.pipeline(transaction=False)
            for stream in streams:
                pipe.type(stream)
            bad = {stream for stream, t in zip(streams, pipe.execute(), strict=True)
                   if _text(t) not in ("stream", "none")}
        for stream in sorted(bad - self.unusable):
            p = self._by_stream.get(stream)
            log.error("a producer's input stream is not a stream: not read, its producer is not "
                      "served until the key is deleted (DEL it once its content is saved)",
                      extra=kv(stream=stream, producer=p.name if p else None))
        for stream in sorted(self.unusable - bad):
            log.info("a producer's input stream is usable again", extra=kv(stream=stream))
        metrics.PRODUCER_STREAMS_UNUSABLE.set(len(bad))
        return bad

    def all(self) -> list[Producer]:
        return sorted([*self.registered.values(), *self.draining.values()], key=lambda p: p.name)

    def streams(self, partition: int, partitions: int) -> list[str]:
        """The producers' input streams of one partition, in name order, but unusable ones."""
        return [s for p in self.all()
                if (s := self.keys.producer_inputs(p.name, partition, partitions)) not in self.unusable]

    def producer_of(self, stream: str) -> Producer | None:
        """The producer whose stream this is; None for the engine's own streams."""
        return self._by_stream.get(stream)

    def _streams_of(self, p: Producer) -> list[str]:
        n = max(1, self._partitions)
        return [self.keys.producer_inputs(p.name, i, n) for i in range(n)]

    def _drained(self, p: Producer, partitions: int) -> bool:
        n = max(1, partitions)
        # an unusable stream (not a stream) holds nothing a dispatcher could read: drained
        streams = [s for i in range(n) if (s := self.keys.producer_inputs(p.name, i, n)) not in self.unusable]
        if not streams:
            return True
        pipe = self.redis.pipeline(transaction=False)
        for stream in streams:
            # XRANGE, not XLEN: the dispatcher's login reads streams with XRANGE already
            pipe.xrange(stream, count=1)
        # a key that became another type since the last check holds nothing readable either
        return not any(r for r in pipe.execute(raise_on_error=False) if not isinstance(r, Exception))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
